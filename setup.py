"""Build script: the one place that decides which variant of lltm is built.

    LLTM_VARIANT=cpu  (default)  ->  distribution ``lltm``: the Python package
                                     and the CPU library lltm/lib/lltm_cpu
                                     (op schemas + CPU kernels).
    LLTM_VARIANT=cuda            ->  distribution ``lltm-cuda<major>``: the
                                     import package lltm_cuda<major> holding
                                     only the CUDA kernels, named after the
                                     CUDA toolkit found, pinned to this exact
                                     lltm version.

Both variants are built against the LibTorch stable ABI with
TORCH_TARGET_VERSION = torch 2.10, and their libraries use no CPython API
(csrc/lltm_library.h; Python loads them with torch.ops.load_library), so a
single py3-none-<platform> wheel per platform serves every CPython >= 3.10,
free-threaded 3.14t included, and every torch >= 2.10. The choice never
depends on torch.cuda.is_available(): build machines have no GPU.

Where pip has no wheel for a platform it builds this from the sdist; what
such a build cannot do without (an interpreter torch supports, torch >= 2.10,
a C++17 compiler) is checked first, and a missing piece is named with what
to install, before any compiler output.
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.resolve()
# setup.py's helpers, tools/setup_helpers/ (what a build from source needs;
# the C++ runtime lltm shares with torch): PEP 517 backends run this file
# without its directory on sys.path.
sys.path.insert(0, str(ROOT))
from tools.setup_helpers import cxx_runtime, source_build  # noqa: E402

# Checks the interpreter and torch first: what is missing is named, with
# what to install, before anything else runs.
cpp_extension = source_build.import_cpp_extension()

from setuptools import Extension, find_packages, setup  # noqa: E402
from setuptools.command.bdist_wheel import bdist_wheel  # noqa: E402
from setuptools.command.build import build  # noqa: E402

# src/lltm/_version.py is the one statement of the version; everything reads it.
VERSION = runpy.run_path(str(ROOT / "src/lltm/_version.py"))["__version__"]
VARIANT = os.environ.get("LLTM_VARIANT", "cpu").strip().lower()

# Oldest torch the binaries must load in (0xMMmmpp...: 2.10.0).
TORCH_TARGET_VERSION = "0x020a000000000000"
# The libraries' file suffix: what the dynamic loader takes (lltm/_native.py
# looks for the same name).
LIBRARY_SUFFIX = ".dll" if sys.platform == "win32" else ".so"

# GPUs compiled for when TORCH_CUDA_ARCH_LIST is unset, with the newest
# toolkit of each CUDA major: Volta/Turing to Blackwell, plus PTX of the
# newest for GPUs yet to come. CUDA 13 dropped everything before Turing
# (sm_75). Older toolkits of a major get the part they know (ARCH_SINCE).
DEFAULT_ARCH_LIST = {
    12: "7.0;7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX",
    13: "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX",
}
# The first nvcc release that knows an architecture, where that is later than
# the first release of a major: Blackwell came with CUDA 12.8 (older nvcc
# stops with "Unsupported gpu architecture 'compute_100'").
ARCH_SINCE = {"10.0": (12, 8), "12.0": (12, 8)}


def default_arch_list(major: int, minor: int) -> str:
    """TORCH_CUDA_ARCH_LIST for nvcc major.minor: DEFAULT_ARCH_LIST[major]
    without what that nvcc does not know, PTX on the newest that remains."""
    archs = [a.removesuffix("+PTX") for a in DEFAULT_ARCH_LIST[major].split(";")]
    known = [a for a in archs if ARCH_SINCE.get(a, (0, 0)) <= (major, minor)]
    return ";".join([*known[:-1], known[-1] + "+PTX"])


MACROS = [("TORCH_TARGET_VERSION", TORCH_TARGET_VERSION)]
# C++ flags per compiler family: torch.utils.cpp_extension passes
# extra_compile_args["cxx"] to whichever compiler builds the extension, and
# MSVC ignores GCC's spellings (warning D9002). The standard is always given:
# torch's default differs between releases (C++20 from 2.13 on).
CXX_FLAGS = {
    # GCC and Clang (Linux, macOS).
    "unix": ["-O3", "-std=c++17", "-fdiagnostics-color=always"],
    # MSVC (Windows): /O2 is its optimisation for speed (setuptools passes it
    # too); with /std: given, torch adds no /std:c++20 of its own.
    "msvc": ["/O2", "/std:c++17"],
}


def cxx_flags(family: str) -> list[str]:
    """CXX_FLAGS[family]; without its -O3 where CFLAGS asks for a sanitizer
    and sets a level of its own (nox -s sanitize: -O1), which -O3, coming
    after CFLAGS on the compiler's command line, would override: ASan's
    instrumentation makes -O3's compile of the sequence kernels three times
    as long. Other builds keep -O3 whatever CFLAGS says (a conda build's
    CFLAGS has -O2)."""
    chosen = os.environ.get("CFLAGS", "").split()
    sanitized = any(w.startswith("-fsanitize=") for w in chosen)
    if family == "unix" and sanitized and any(re.fullmatch(r"-O[0-3sgz]?", w) for w in chosen):
        return [f for f in CXX_FLAGS[family] if not f.startswith("-O")]
    return CXX_FLAGS[family]


BUILD_OPTIONS = {
    # One build tree per variant: a wheel never picks up the other's files.
    "build": {"build_base": f"build/{VARIANT}"},
}
# Where lltm-cuda12/lltm-cuda13 exist: they are built for Linux x86_64 only.
# Elsewhere the CUDA extras add nothing to lltm, rather than asking pip for a
# distribution that has no wheel or sdist there.
CUDA_PLATFORM = "sys_platform == 'linux' and platform_machine == 'x86_64'"
CLASSIFIERS = [
    "Programming Language :: Python :: 3",
    "Programming Language :: C++",
    "Intended Audience :: Science/Research",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
]


class Build(build):
    """setuptools' build, checking the compiler before it copies a file."""

    def run(self) -> None:
        source_build.check_compiler()
        super().run()


class BuildExtension(cpp_extension.BuildExtension):
    """torch's BuildExtension, adding the C++ flags of the compiler in use,
    which is only known once the build runs, and building plain libraries
    (lib/<name>.so or .dll) rather than Python extension modules; each
    linked to torch's own C++ runtime, and checked once linked
    (tools/cxx_runtime.py)."""

    def build_extensions(self) -> None:
        source_build.check_compiler()  # done already when `build` ran this
        family = "msvc" if self.compiler.compiler_type == "msvc" else "unix"
        runtime = cxx_runtime.link_libraries()
        for flag in cxx_runtime.requested_static_runtime():
            print(f"lltm: {flag} asks for a private C++ runtime; lltm links torch's all the same")
        for ext in self.extensions:
            args = ext.extra_compile_args
            args = dict(args) if isinstance(args, dict) else {"cxx": list(args)}
            args["cxx"] = [*cxx_flags(family), *args.get("cxx", [])]
            ext.extra_compile_args = args
            # Named by file name, so resolved before the compiler driver's
            # own runtime libraries: a -static-libstdc++ (or a static
            # libstdc++.a a wrapper's -B folder holds) finds nothing to add.
            ext.libraries = [*ext.libraries, *(lib for lib in runtime if lib not in ext.libraries)]
            if sys.platform.startswith("linux"):
                # A soname, the file's name: a C++ program linked with the
                # library (lltm's CMake package) then needs it by that name,
                # found through the program's runpath, rather than at the
                # path it was linked from.
                name = os.path.basename(self.get_ext_filename(ext.name))
                ext.extra_link_args = [*ext.extra_link_args, f"-Wl,-soname,{name}"]
        super().build_extensions()
        for ext in self.extensions:
            cxx_runtime.check_library(
                Path(self.get_ext_fullpath(ext.name)), VARIANT, ROOT / "csrc" / "lltm_ops.cpp"
            )

    def get_ext_filename(self, fullname: str) -> str:
        # lltm.lib.lltm_cpu -> lltm/lib/lltm_cpu.so, with no interpreter tag:
        # the file is not bound to one Python.
        return os.path.join(*fullname.split(".")) + LIBRARY_SUFFIX

    def get_export_symbols(self, ext: Extension) -> list[str]:
        # No PyInit_<name>: the sources mark what they export (LLTM_EXPORT).
        return []

    def copy_extensions_to_source(self) -> None:
        # --inplace: lib/ is no package of the source tree, so may not exist.
        for ext in self.extensions:
            Path(self.get_ext_fullpath(ext.name)).parent.mkdir(parents=True, exist_ok=True)
        super().copy_extensions_to_source()


class BdistWheel(bdist_wheel):
    """Tags the wheel py3-none-<platform>: its libraries use no CPython API,
    so every Python 3 interpreter that torch supports loads them."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform_tag = super().get_tag()
        return "py3", "none", platform_tag


def native_library(ext: Extension) -> Extension:
    """`ext` linked against no Python library: torch's helpers add
    torch_python (its Python bindings) unless py_limited_api is set, and
    py_limited_api would add a CPython macro and an .abi3 name."""
    ext.libraries = [lib for lib in ext.libraries if lib != "torch_python"]
    return ext


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def cpu_variant() -> dict:
    ext = cpp_extension.CppExtension(
        "lltm.lib.lltm_cpu",
        sources=[
            "csrc/lltm_ops.cpp",
            "csrc/cpu/cell_kernel.cpp",
            "csrc/cpu/sequence_forward_kernel.cpp",
            "csrc/cpu/sequence_backward_kernel.cpp",
            "csrc/cpu/library_exports.cpp",
        ],
        define_macros=[*MACROS, ("LLTM_VERSION", VERSION)],
    )
    return dict(
        name="lltm",
        description="The LLTM recurrent cell as a fused, stable-ABI PyTorch operator",
        packages=find_packages("src", include=["lltm", "lltm.*"]),
        package_dir={"": "src"},
        # py.typed: the annotations are checked (mypy --strict, nox -s lint).
        # share/cmake and include: lltm's CMake package and its C++ header,
        # for C++ programs (lltm.cmake_prefix_path).
        package_data={"lltm": ["py.typed", "share/cmake/lltm/*.cmake", "include/lltm/*.h"]},
        ext_modules=[native_library(ext)],
        install_requires=["torch>=2.10"],
        extras_require={
            "cuda": [f"lltm-cuda13=={VERSION}; {CUDA_PLATFORM}"],
            "cuda12": [f"lltm-cuda12=={VERSION}; {CUDA_PLATFORM}"],
            "cuda13": [f"lltm-cuda13=={VERSION}; {CUDA_PLATFORM}"],
            "bench": ["rich>=13"],
        },
        entry_points={"console_scripts": ["lltm=lltm.__main__:main"]},
    )


def cuda_toolkit_version() -> tuple[int, int]:
    """(major, minor) of the CUDA toolkit torch's build helpers will use."""
    cuda_home = cpp_extension.CUDA_HOME
    if cuda_home is None:
        raise SystemExit(
            "LLTM_VARIANT=cuda: no CUDA toolkit found. Install nvcc and set "
            "CUDA_HOME (e.g. export CUDA_HOME=/usr/local/cuda); the build also "
            "needs a CUDA build of torch (torch.version.cuda is "
            f"{_torch_cuda_version()!r} here)."
        )
    nvcc = Path(cuda_home) / "bin" / "nvcc"
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"release (\d+)\.(\d+)", out.stdout)
    if match is None:
        raise SystemExit(f"cannot read the CUDA version from {nvcc} --version")
    return int(match.group(1)), int(match.group(2))


def _torch_cuda_version() -> str | None:
    import torch

    return torch.version.cuda


def cuda_variant() -> dict:
    major, minor = cuda_toolkit_version()
    if major not in DEFAULT_ARCH_LIST:
        raise SystemExit(f"CUDA {major}.x is not supported; use CUDA 12 or 13")
    torch_cuda = _torch_cuda_version()
    if torch_cuda is None or int(torch_cuda.split(".")[0]) != major:
        raise SystemExit(
            f"LLTM_VARIANT=cuda: the CUDA toolkit is {major}.x but torch was built "
            f"with CUDA {torch_cuda}; install a torch built for CUDA {major}.x"
        )
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", default_arch_list(major, minor))
    package = f"lltm_cuda{major}"
    ext = cpp_extension.CUDAExtension(
        f"{package}.lib.lltm_cuda",
        sources=[
            "csrc/cuda/lltm_cuda.cu",
            "csrc/cuda/lltm_cuda_sequence_forward.cu",
            "csrc/cuda/lltm_cuda_sequence_backward.cu",
            "csrc/cuda/lltm_cuda_persistent_planning.cu",
            "csrc/cuda/lltm_cuda_persistent_measuring.cu",
            "csrc/cuda/lltm_cuda_persistent_launch.cu",
            "csrc/cuda/lltm_cuda_persistent_forward_entry.cu",
            "csrc/cuda/lltm_cuda_persistent_backward_entry.cu",
            "csrc/cuda/lltm_cuda_library_exports.cpp",
        ],
        # USE_CUDA exposes the CUDA part of torch's C shim (current stream).
        define_macros=[
            *MACROS,
            ("USE_CUDA", None),
            ("LLTM_VERSION", VERSION),
            # For diagnostics only (lltm info): the runtime decides what runs.
            # "/" between entries: ";" would end the command line's shell
            # command, "," the preprocessor macro's argument.
            (
                "LLTM_CUDA_ARCHS",
                "/".join(os.environ["TORCH_CUDA_ARCH_LIST"].replace(";", " ").split()),
            ),
        ],
        extra_compile_args={
            # No --use_fast_math: the float64 path must stay IEEE double.
            "nvcc": ["-O3", "-std=c++17", "-lineinfo"],
        },
    )
    # CUDAExtension links c10, torch and c10_cuda too; the plugin calls only
    # the C shims of libtorch_cpu and libtorch_cuda (aoti_torch_cuda_addmm_out,
    # aoti_torch_get_current_cuda_stream: both there since torch 2.10, unlike
    # the device-generic stream API of 2.13) and the CUDA runtime.
    ext.libraries = ["torch_cpu", "torch_cuda", "cudart"]
    return dict(
        name=f"lltm-cuda{major}",
        description=f"CUDA {major}.x kernels for lltm (install with: pip install lltm[cuda{major}])",
        packages=[package],
        package_dir={package: "src/lltm_cuda"},
        ext_modules=[ext],
        install_requires=[f"lltm=={VERSION}"],
    )


VARIANTS = {"cpu": cpu_variant, "cuda": cuda_variant}
if VARIANT not in VARIANTS:
    raise SystemExit(f"LLTM_VARIANT must be one of {sorted(VARIANTS)}, got {VARIANT!r}")

setup(
    version=VERSION,
    long_description=readme(),
    long_description_content_type="text/markdown",
    author="The lltm developers",
    license="BSD-3-Clause",
    url="https://github.com/lltm/lltm",
    python_requires=">=3.10",
    classifiers=CLASSIFIERS,
    cmdclass={"build": Build, "build_ext": BuildExtension, "bdist_wheel": BdistWheel},
    options=BUILD_OPTIONS,
    zip_safe=False,
    **VARIANTS[VARIANT](),
)
