"""lltm's CPU library, loaded.

Importing this module registers lltm's op schemas (csrc/lltm_ops.cpp) and
CPU kernels with torch. The library is ``lltm/lib/lltm_cpu.so`` (``.dll`` on
Windows), a plain shared library with no CPython API (see lltm/_native.py);
this module holds what it says of itself.
"""

from __future__ import annotations

from pathlib import Path

from . import _native

_library = _native.CpuLibrary(_native.library_file(Path(__file__).parent, "lltm_cpu"))

library: Path = _library.path
"""The library file."""
lltm_version: str = _library.lltm_version
"""The lltm version the library was built from."""
torch_target_version: str = _library.torch_target_version
"""TORCH_TARGET_VERSION of the build: the oldest torch it loads in (0x020a... is 2.10)."""


def cpu_isa() -> str:
    """The instruction set lltm's CPU kernels run.

    baseline, avx2 or avx512 on x86-64, baseline or neon on arm64; chosen now
    if no kernel has run yet. Raises the ValueError a kernel call would while
    LLTM_CPU_ISA is invalid.
    """
    return _library.cpu_isa()
