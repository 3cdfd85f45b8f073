"""lltm's CUDA sources, built for the host and run on CPU tensors (tests only).

CI's machines have no GPU. Everything under csrc/cuda but the kernels is host
code calling torch's C shim, and the kernels are C++ but for a few of CUDA's
names, so the same files compiled by the host C++ compiler against an
emulation of the CUDA runtime (this folder: each file of sources/ includes
runtime/runtime.h, then the CUDA source it compiles) compute what the GPU
computes: plain launches run every block and thread of a grid in turn;
cudaLaunchKernelEx runs every thread as a fiber, with each block's shared
memory, block, cluster and grid barriers, the threads in a schedule's order
between barriers (forward, reverse or seeded random), after the checks a GPU
makes (shared memory, clusters, co-residency of a cooperative grid); the GPU's
launch limits and alignment rules are checked, GEMMs run on torch's CPU shim.
The library built here registers the kernels as ``lltm_cuda_host::forward``,
``backward``, ``sequence_forward``, ``sequence_inference``,
``sequence_backward`` and ``sequence_gate_grads`` for CPU tensors, with the schemas of
csrc/lltm_ops.cpp (compiled again under that namespace), and carries the CUDA
plugin's own C functions (csrc/cuda/lltm_cuda_library_exports.cpp, read as the
plugin's ``_C`` reads them) and a Python module, ``emulation``, the controls of
the emulated GPU (an H100 until a test sets otherwise; ``reset()`` restores
it), its schedules (``set_schedule``, ``drop_barrier``), the counts of the
launches and torch shim calls the CUDA sources make (``calls()``), the clock
that CUDA events read (``set_costs``: microseconds per call, by name), whether
a CUDA graph is being captured (``set_capturing``) and the probes of
tests/test_cuda_host.py.

:func:`routed` makes lltm's own ops run them: for its duration the CPU
kernels of ``lltm::forward``, ... are these, registered with the public
``torch.library`` API over lltm's (the dispatcher keeps the kernel it
replaced and puts it back when the registration goes). Every entry point
then reaches the CUDA sources, as on a GPU: ``lltm.lltm_cell`` and the
modules, autograd, ``torch.compile``, ``torch.library.opcheck``, the fuzzer;
the tests run unchanged (conftest.py's ``kernels`` fixture).

Built only where ``LLTM_CUDA_HOST=1`` (``nox -s cuda_host`` sets it), into
build/cuda_host/ of the source tree (with the flags of
``LLTM_CUDA_HOST_CFLAGS`` added, as ``nox -s sanitize`` adds the sanitizers',
into a folder of their own); never part of a wheel, an sdist's build or the
conda package.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest
import torch

import lltm
from lltm import _native

ROOT = Path(__file__).resolve().parents[2]
OPS = (
    "forward",
    "backward",
    "sequence_forward",
    "sequence_inference",
    "sequence_backward",
    "sequence_gate_grads",
)
NAMESPACE = "lltm_cuda_host"
ENABLED = os.environ.get("LLTM_CUDA_HOST") == "1"
WHERE = "nox -s cuda_host (LLTM_CUDA_HOST=1 builds and runs it anywhere)"
SKIPPED = f"the CUDA sources built for the host run in {WHERE}"
# The marks of a test module that runs on the host build alone:
# ``pytestmark = cuda_host.ONLY``.
ONLY = [pytest.mark.cuda_host, pytest.mark.skipif(not ENABLED, reason=SKIPPED)]


def _setup_constant(name: str) -> str:
    """A string constant of setup.py (the build's one source of them)."""
    match = re.search(rf'^{name} = "([^"]+)"', (ROOT / "setup.py").read_text(), re.MULTILINE)
    assert match, f"setup.py defines no {name}"
    return match.group(1)


# Flags added to the build's (nox -s sanitize: the sanitizers'); a build
# with others has a folder of its own.
EXTRA_FLAGS = os.environ.get("LLTM_CUDA_HOST_CFLAGS", "").split()


def build(root: Path, extra_flags: list[str], directory: Path) -> Path:
    """Builds the library of the tree at ``root`` (its csrc/ and
    tests/cuda_host/) into ``directory``, with ``extra_flags`` after the
    build's own, and loads it into this process."""
    from torch.utils import cpp_extension

    here = root / "tests" / "cuda_host"
    # The schemas, csrc/cuda's sources (sources/: each includes the emulated
    # runtime, then the CUDA file it compiles), the emulated runtime (runtime/)
    # and the Python module `emulation` with its probe kernels (emulation/).
    sources = [
        root / "csrc/lltm_ops.cpp",
        *sorted((here / "sources").glob("*.cpp")),
        *sorted((here / "runtime").glob("*.cpp")),
        *sorted((here / "emulation").glob("*.cpp")),
    ]
    directory.mkdir(parents=True, exist_ok=True)
    flags = [
        "-O2",
        "-std=c++17",
        # `#pragma unroll` is nvcc's.
        "-Wno-unknown-pragmas",
        "-DLLTM_CUDA_HOST",
        f"-DLLTM_OPS_NAMESPACE={NAMESPACE}",
        # The plugin's own rules: the stable ABI of the oldest torch it supports.
        f"-DTORCH_TARGET_VERSION={_setup_constant('TORCH_TARGET_VERSION')}",
        f"-DLLTM_VERSION={lltm.__version__}",
        "-DLLTM_CUDA_ARCHS=host",
        *extra_flags,
    ]
    with _compilers_without_preload():
        return Path(
            cpp_extension.load(
                name=NAMESPACE,
                sources=[str(s) for s in sources],
                extra_cflags=flags,
                # A sanitizer's runtime is linked as it is compiled for.
                extra_ldflags=[f for f in extra_flags if f.startswith("-fsanitize")],
                # `#include "cuda/lltm_cuda.cu"`, "lltm_library.h": csrc's own paths.
                extra_include_paths=[str(root / "csrc")],
                build_directory=str(directory),
                is_python_module=False,  # loads the library: the ops register
                verbose=os.environ.get("LLTM_CUDA_HOST_VERBOSE") == "1",
            )
        )


@contextlib.contextmanager
def _compilers_without_preload() -> Iterator[None]:
    """The compilers a build runs start without this process's LD_PRELOAD: a
    process under the sanitizers (nox -s sanitize) has their runtimes loaded
    already, and the compilers, no programs of lltm's, need none of it."""
    preload = os.environ.pop("LD_PRELOAD", None)
    try:
        yield
    finally:
        if preload is not None:
            os.environ["LD_PRELOAD"] = preload


@cache
def _build() -> Path:
    folder = "cuda_host"
    if EXTRA_FLAGS:
        digest = hashlib.sha256(" ".join(EXTRA_FLAGS).encode()).hexdigest()[:12]
        folder = f"cuda_host-{digest}"
    return build(ROOT, EXTRA_FLAGS, ROOT / "build" / folder)


def _module(name: str, library: Path) -> ModuleType:
    """The Python module `name` of the library."""
    loader = importlib.machinery.ExtensionFileLoader(f"{NAMESPACE}.{name}", str(library))
    spec = importlib.util.spec_from_file_location(loader.name, library, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@cache
def modules() -> tuple[_native.CudaLibrary, ModuleType]:
    """(the plugin's library, read as its ``_C`` module reads it; ``emulation``),
    building the library first; skips the calling test where the host build
    is not enabled."""
    if not ENABLED:
        pytest.skip(SKIPPED)
    if not (ROOT / "csrc" / "cuda").is_dir():
        pytest.skip("csrc/cuda/ is not in this tree: the host build compiles its sources")
    library = _build()
    # No autograd formula of their own: at the Autograd key they let the call
    # through, so that a kernel sees the dispatcher state it sees on a GPU,
    # below lltm's own Autograd kernels (src/lltm/ops/dispatch.py), which
    # redispatch past that key.
    autograd = torch.library.Library(NAMESPACE, "IMPL")
    for op in OPS:
        autograd.impl(op, torch.library.fallthrough_kernel, "Autograd")
    _keep.append(autograd)
    # Built here, never installed: no installer's record to check it against.
    return _native.CudaLibrary(library, NAMESPACE), _module("emulation", library)


# Registrations that last as long as the process.
_keep: list[torch.library.Library] = []


def emulation() -> ModuleType:
    return modules()[1]


@contextlib.contextmanager
def routed() -> Iterator[ModuleType]:
    """lltm's ops on CPU tensors served by the host-built CUDA kernels, until
    the block ends; yields the emulation module, its GPU as it starts."""
    emulated = emulation()
    emulated.reset()
    library = torch.library.Library("lltm", "IMPL")
    try:
        with warnings.catch_warnings():
            # The dispatcher warns (once) that a kernel is overridden: that is the point.
            warnings.filterwarnings("ignore", "Warning only once for all operators")
            for op in OPS:
                if not hasattr(torch.ops.lltm, op):
                    continue  # an lltm built before the op was declared
                kernel = getattr(getattr(torch.ops, NAMESPACE), op).default
                library.impl(op, kernel, "CPU")
        yield emulated
    finally:
        # Unregisters the kernels: lltm's CPU kernels serve the ops again.
        library._destroy()
        emulated.reset()
