"""How lltm loads its compiled libraries and reads what they export.

lltm's libraries (``lltm/lib/lltm_cpu``, and the CUDA plugin's
``lltm_cuda<major>/lib/lltm_cuda``) are plain shared libraries, not Python
extension modules: they use no CPython API (csrc/lltm_library.h). One file
therefore serves every interpreter, CPython 3.10 to 3.14, the free-threaded
3.14t (where importing an extension module that does not declare itself
GIL-free would turn the GIL back on) and those to come, and the wheels are
tagged ``py3-none-<platform>``.

Before loading, a library installed from a wheel is checked against what the
installer recorded (lltm/_integrity.py): a damaged one is never loaded, the
one place where that is decided.

Loading a library with ``torch.ops.load_library`` runs its static
initialisers, which register lltm's operators with torch. The few facts and
diagnostics it exports are C functions, called through ctypes, which
releases the GIL (where there is one) for the duration of each call. Loading
happens when the modules ``lltm._C`` and ``lltm_cuda<major>._C`` are imported,
under the import system's lock, so it happens once whatever the threads.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import _errors, _integrity
from ._version import __version__

# Where a package keeps its library, and the library's file name: not an
# importable name (a .so beside the package's modules would be taken for an
# extension module by tools that walk the package).
LIBRARY_DIR = "lib"
SUFFIX = ".dll" if sys.platform == "win32" else ".so"
# Room for a string a library writes into a caller's buffer: its longest, an
# error message naming an environment variable's value, is far shorter.
_BUFFER_SIZE = 4096
# Room for the measured plans' listing: a few hundred plans, each with up to
# two dozen candidates of a line each.
_MEASURED_PLANS_SIZE = 4 << 20


def library_file(package_dir: Path, name: str) -> Path:
    """Where the library `name` of the package at `package_dir` is (it may be missing)."""
    return package_dir / LIBRARY_DIR / f"{name}{SUFFIX}"


class DamagedLibrary(ImportError):
    """A library that differs from what its installer recorded: it is never loaded."""

    def __init__(self, path: Path, distribution: str, damage: str) -> None:
        self.damage = damage
        """How it differs, e.g. ``lltm_cpu.so is 4096 bytes where the installer wrote ...``."""
        self.reinstall = f"pip install --force-reinstall --no-deps '{distribution}=={__version__}'"
        """The command that repairs it."""
        super().__init__(
            f"lltm: the installed library {path} is damaged ({damage}). Reinstall it: "
            f"{self.reinstall}"
        )


class Library:
    """A loaded lltm library whose C functions are named ``<prefix>_<name>``.

    Every lltm library says which lltm it was built from and the oldest torch
    it loads in (its TORCH_TARGET_VERSION). ``distribution`` installed it:
    DamagedLibrary, and nothing loaded, where the file differs from that
    installer's record.
    """

    def __init__(self, path: Path, prefix: str, distribution: str) -> None:
        damage = _integrity.damage(path, path.parent.parent, distribution)
        if damage is not None:
            raise DamagedLibrary(path, distribution, damage)
        # The operators register here, as torch.ops.load_library records.
        torch.ops.load_library(str(path))
        self.path = path
        self._prefix = prefix
        # The same library, already loaded. CDLL, not PyDLL: ctypes releases
        # the GIL around each call, which the CUDA plugin's device probe needs
        # (it may create a context, which takes a while).
        self._handle = ctypes.CDLL(str(path))
        self.lltm_version = self.text("lltm_version")
        self.torch_target_version = self.text("torch_target_version")

    def _function(self, name: str, restype: Any, *argtypes: Any) -> Callable[..., Any]:
        # A new function object per call site, its signature set before any
        # thread can see it: nothing shared is mutated after loading.
        function = self._handle[f"{self._prefix}_{name}"]
        function.restype = restype
        function.argtypes = list(argtypes)
        return function

    def text(self, name: str) -> str:
        """The constant string that ``const char* <prefix>_<name>(void)`` returns."""
        value: bytes = self._function(name, ctypes.c_char_p)()
        return value.decode()

    def reporter(
        self, name: str, *argtypes: Any, size: int = _BUFFER_SIZE
    ) -> Callable[..., tuple[bool, str]]:
        """A reporting C function as a Python function.

        ``int <prefix>_<name>(args..., char* out, size_t size)`` becomes a
        function of args returning (succeeded, text), text of at most ``size``
        - 1 bytes.
        """
        function = self._function(name, ctypes.c_int, *argtypes, ctypes.c_char_p, ctypes.c_size_t)

        def call(*args: object) -> tuple[bool, str]:
            out = ctypes.create_string_buffer(size)
            failed = function(*args, out, size)
            return failed == 0, out.value.decode(errors="replace")

        return call


class CpuLibrary(Library):
    """lltm's CPU library: the op schemas, the CPU kernels, csrc/cpu/library_exports.cpp."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "lltm_cpu", "lltm")
        self._cpu_isa = self.reporter("isa")

    def cpu_isa(self) -> str:
        ok, text = self._cpu_isa()
        if not ok:
            raise _errors.from_message(text)
        return text


class CudaLibrary(Library):
    """The CUDA plugin's library: the CUDA kernels, csrc/cuda/lltm_cuda_library_exports.cpp."""

    def __init__(self, path: Path, distribution: str) -> None:
        super().__init__(path, "lltm_cuda", distribution)
        self.cuda_version = self.text("runtime_version")
        self.cuda_archs = self.text("archs")
        self._kernel_image_problem = self.reporter("kernel_image_problem", ctypes.c_int)
        # Absent from plugins built before the persistent sequence kernels.
        self._sequence_path = (
            self.reporter(
                "sequence_path",
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_longlong,
                ctypes.c_longlong,
            )
            if hasattr(self._handle, f"{self._prefix}_sequence_path")
            else None
        )
        # Absent from plugins built before measured plans.
        self._set_measuring = (
            self._function("set_measuring", None, ctypes.c_int)
            if hasattr(self._handle, f"{self._prefix}_set_measuring")
            else None
        )
        self._measured_plans = (
            self.reporter("measured_plans", size=_MEASURED_PLANS_SIZE)
            if hasattr(self._handle, f"{self._prefix}_measured_plans")
            else None
        )

    def kernel_image_problem(self, device: int) -> str:
        ok, text = self._kernel_image_problem(int(device))
        if not ok:
            raise RuntimeError(text)
        return text

    def sequence_path(
        self, device: int, element_size: int, batch: int, state: int, tf32: bool = False
    ) -> str:
        """How a sequence call runs on ``device``: the forward's path and the backward's.

        Two lines (``forward: ...``, ``backward: ...``): the persistent kernels'
        mode and split, or the per-step path and why (csrc/cuda/
        lltm_cuda_persistent_plan.h). ``element_size``: 4 for float32, 8 for
        float64, 2 for 16-bit; ``tf32``: the call's ``allow_tf32``.
        RuntimeError where the device cannot be queried.
        """
        if self._sequence_path is None:
            raise RuntimeError(f"{self.path} predates the persistent sequence kernels")
        ok, text = self._sequence_path(
            int(device), int(element_size), int(bool(tf32)), int(batch), int(state)
        )
        if not ok:
            raise RuntimeError(text)
        return text

    def set_measuring(self, on: bool) -> bool:
        """Whether sequence calls measure their plans (torch.backends.cudnn.benchmark).

        False, and nothing set, where the plugin predates measured plans.
        """
        if self._set_measuring is None:
            return False
        self._set_measuring(1 if on else 0)
        return True

    def measured_plans(self) -> str:
        """The measured plans remembered, most recently used first, as the plugin lists them.

        Tab-separated lines (csrc/cuda/lltm_cuda_persistent_measuring.h):
        ``plan``, then one ``candidate`` line per plan timed. "" where the
        plugin predates measured plans.
        """
        if self._measured_plans is None:
            return ""
        ok, text = self._measured_plans()
        if not ok:
            raise RuntimeError(text)
        return text
