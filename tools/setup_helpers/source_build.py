"""What a build of lltm from source needs, checked before anything is compiled.

setup.py runs these first, so that a missing piece is named with what to
install ahead of any compiler output: an interpreter torch supports, torch
>= 2.10 (read without importing it: a torch too old to build lltm may be too
old to import), a torch that imports, a C++17 compiler.
"""

from __future__ import annotations

import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from functools import cache
from pathlib import Path
from types import ModuleType

OLDEST_PYTHON = (3, 10)
OLDEST_TORCH = (2, 10)
WHEELS = (
    "lltm publishes wheels for Linux x86-64 and aarch64 (glibc), macOS arm64 and "
    "Windows x86-64, CPython >= 3.10 (3.14t included)"
)


def cannot_build(problem: str, fix: str) -> SystemExit:
    """The error of a source build that cannot work: what is missing, then
    what to install, first in the output."""
    return SystemExit(
        f"lltm: cannot build from source: {problem}.\n  Fix: {fix}\n  ({WHEELS}; pip builds "
        "from source only where none of them fits.)"
    )


def interpreter_problem() -> str | None:
    if sys.implementation.name != "cpython":
        return (
            f"this is {platform.python_implementation()} {platform.python_version()}; "
            "torch, and so lltm, exist for CPython only"
        )
    if sys.version_info[:2] < OLDEST_PYTHON:
        return f"this is Python {platform.python_version()}; lltm needs Python >= 3.10"
    return None


def torch_version_problem(version: str) -> str | None:
    """Why torch `version` (e.g. "2.13.0+cpu") cannot build lltm, or None."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return f"torch reports the version {version!r}, which is not MAJOR.MINOR..."
    if (int(match.group(1)), int(match.group(2))) < OLDEST_TORCH:
        return (
            f"torch {version} is installed; lltm is built against the LibTorch stable ABI, "
            "which torch 2.10 introduced"
        )
    return None


def torch_version() -> str:
    """The installed torch's version, stopping the build where there is none."""
    # Read without importing torch: a torch too old to build lltm may be
    # too old to import cleanly here, too.
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        raise cannot_build(
            "torch is not installed in the build environment (setup.py compiles against it)",
            "pip install 'torch>=2.10', then build without isolation so that it is used: "
            "pip install --no-build-isolation lltm",
        ) from None


def import_cpp_extension() -> ModuleType:
    """torch.utils.cpp_extension, after the interpreter's and torch's checks."""
    problem = interpreter_problem()
    if problem:
        raise cannot_build(problem, "use CPython 3.10 or newer, with a torch >= 2.10 built for it")
    problem = torch_version_problem(torch_version())
    if problem:
        raise cannot_build(problem, "pip install --upgrade 'torch>=2.10'")
    with warnings.catch_warnings():
        # Without numpy, importing torch warns "Failed to initialize NumPy". The
        # build never converts between tensors and arrays, so build environments
        # need no numpy: the warning is silenced here, for this message only,
        # rather than numpy added to every build environment to avoid it.
        warnings.filterwarnings(
            "ignore", message="Failed to initialize NumPy", category=UserWarning
        )
        try:
            from torch.utils import cpp_extension
        except ImportError as error:
            raise cannot_build(
                f"torch {torch_version()} is installed but does not import ({error})",
                "pip install --force-reinstall 'torch>=2.10'",
            ) from None
    return cpp_extension


# What to install for a C++ compiler, per platform.
COMPILER_HINTS = {
    "linux": "install g++ (Debian/Ubuntu: apt-get install g++; Fedora/RHEL: dnf install "
    "gcc-c++; Alpine: apk add g++), or set CXX to a C++17 compiler",
    "darwin": "install the Command Line Tools (xcode-select --install), or set CXX",
    "win32": "install Visual Studio Build Tools with the C++ workload and build from a "
    "Developer Command Prompt",
}
# A C++17 program that needs the standard library's headers too.
COMPILER_PROBE = "#include <optional>\nint main() { return std::optional<int>(0).value(); }\n"


def compiler_problem() -> str | None:
    """Why the C++ compiler torch's build will use cannot build lltm, or None
    (checked before anything is compiled; MSVC is found, and its absence
    reported, by setuptools itself)."""
    if sys.platform == "win32":
        return None
    from torch.utils import cpp_extension

    command = shlex.split(cpp_extension.get_cxx_compiler())
    if not command or shutil.which(command[0]) is None:
        return f"no C++ compiler: {' '.join(command) or '(empty CXX)'} is not found"
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "probe.cpp"
        source.write_text(COMPILER_PROBE)
        try:
            result = subprocess.run(
                [*command, "-std=c++17", "-c", str(source), "-o", str(source.with_suffix(".o"))],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"the C++ compiler {command[0]} does not run ({error})"
    if result.returncode != 0:
        first = (result.stderr or result.stdout).strip().splitlines()[:3]
        said = f": {' / '.join(first)}" if first else ""
        return f"the C++ compiler {command[0]} cannot compile a C++17 test program{said}"
    return None


@cache  # once per build, whichever command asks first
def check_compiler() -> None:
    problem = compiler_problem()
    if problem:
        raise cannot_build(problem, COMPILER_HINTS.get(sys.platform, "install a C++17 compiler"))
