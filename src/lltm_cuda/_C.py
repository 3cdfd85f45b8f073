"""The CUDA plugin's library, loaded.

Importing this module registers lltm's CUDA kernels with torch (for the op
schemas lltm._C declares). The library is ``lib/lltm_cuda.so`` beside this
module, a plain shared library with no CPython API (see lltm/_native.py); this
module holds what it says of itself, and its probe of a GPU.
"""

from __future__ import annotations

from pathlib import Path

from lltm import _native

# Installed as lltm_cuda<major> by the distribution lltm-cuda<major>.
_library = _native.CudaLibrary(
    _native.library_file(Path(__file__).parent, "lltm_cuda"), __package__.replace("_", "-")
)

library: Path = _library.path
"""The library file."""
lltm_version: str = _library.lltm_version
"""The lltm version the kernels were built from."""
torch_target_version: str = _library.torch_target_version
"""TORCH_TARGET_VERSION of the build: the oldest torch it loads in."""
cuda_version: str = _library.cuda_version
"""CUDA runtime version the kernels were compiled with, e.g. ``"13.0"``."""
cuda_archs: str = _library.cuda_archs
"""TORCH_CUDA_ARCH_LIST of the build, ``/`` between entries (``7.5/.../12.0+PTX``)."""


def kernel_image_problem(device: int) -> str:
    """Why the kernels cannot run on CUDA device ``device``, or "" when they can.

    RuntimeError where that cannot be told now. Creates that device's context.
    """
    return _library.kernel_image_problem(device)


def sequence_path(
    device: int, element_size: int, batch: int, state: int, tf32: bool = False
) -> str:
    """How a sequence call runs on CUDA device ``device``: two lines, forward and backward.

    The persistent kernels' mode and split, or the per-step path and why.
    ``element_size``: 4 for float32, 8 for float64, 2 for 16-bit; ``tf32``:
    the call's ``allow_tf32``. RuntimeError where the device cannot be queried.
    """
    return _library.sequence_path(device, element_size, batch, state, tf32)


def set_measuring(on: bool) -> bool:
    """Whether sequence calls measure their plans: torch.backends.cudnn.benchmark, mirrored.

    lltm calls this when it sees the flag change (lltm/_backends.py).
    """
    return _library.set_measuring(on)


def measured_plans() -> str:
    """The measured plans remembered, as tab-separated lines (lltm/_backends.py formats them)."""
    return _library.measured_plans()
