"""The build itself, as a user without a wheel meets it.

setup.py runs without numpy in the environment, silently: torch warns
"Failed to initialize NumPy" at import when numpy is missing; setup.py
imports torch and needs nothing of numpy, so build environments (which have
none) must not print that warning to users building lltm.

A build that cannot work (no compiler, one that cannot compile C++17, no
torch or one older than 2.10) fails with lltm's message naming what is
missing and what to install, among the first lines pip prints, before any
file is copied or compiled: not in a wall of compiler errors.
"""

from __future__ import annotations

import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not (ROOT / "setup.py").exists(), reason="needs the source tree's setup.py")
def test_setup_py_without_numpy_does_not_warn():
    # numpy made unimportable, as in a build environment without it.
    code = (
        "import sys; sys.modules['numpy'] = None; sys.argv = ['setup.py', '--version']; "
        "import runpy; runpy.run_path('setup.py', run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert "NumPy" not in result.stderr, result.stderr
    import lltm

    assert result.stdout.split()[-1] == lltm.__version__


# --- A source build that cannot work says why, first ----------------------------------

# What a build from the sdist reads (MANIFEST.in's selection, minus tests and examples).
SOURCES = [
    "setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "src", "csrc",
    "tools/__init__.py", "tools/setup_helpers",
]  # fmt: skip


def _source_copy(tmp_path: Path) -> Path:
    tree = tmp_path / "lltm-src"
    tree.mkdir()
    for name in SOURCES:
        source = ROOT / name
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(
                source,
                tree / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.dll", "lib"),
            )
        else:
            shutil.copy2(source, tree / name)
    return tree


def _pip_wheel(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """pip building a wheel from a copy of the source tree, as it builds an
    sdist where no wheel fits (without build isolation: this torch)."""
    tree = _source_copy(tmp_path)
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
         "--no-cache-dir", "-w", str(tmp_path / "out"), str(tree)],
        env={**os.environ, "MAX_JOBS": "1", **env},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def _first_lines_say(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """The build failed with lltm's message among the first lines of its
    output, before anything was copied or compiled."""
    assert result.returncode != 0, result.stdout
    output = (result.stdout + result.stderr).splitlines()
    (first,) = [i for i, line in enumerate(output) if "lltm: cannot build from source:" in line]
    message = "\n".join(output[first : first + 3])
    for text in expected:
        assert text in message, message
    before = output[:first]
    assert len(before) < 20, "\n".join(before)
    assert not [line for line in before if "copying" in line or "-std=c++17" in line], before
    assert not re.search(r"error: command .* failed|ninja: build stopped", result.stderr)
    return message


@pytest.mark.skipif(sys.platform == "win32", reason="MSVC is found (or not) by setuptools")
@pytest.mark.skipif(not (ROOT / "csrc").is_dir(), reason="needs the source tree")
def test_without_a_compiler_the_error_says_what_to_install(tmp_path):
    result = _pip_wheel(tmp_path, CXX=str(tmp_path / "no-such-c++"))
    message = _first_lines_say(result, "no C++ compiler", "no-such-c++ is not found", "Fix:")
    if sys.platform.startswith("linux"):
        assert "apt-get install g++" in message


@pytest.mark.skipif(sys.platform == "win32", reason="MSVC is found (or not) by setuptools")
@pytest.mark.skipif(not (ROOT / "csrc").is_dir(), reason="needs the source tree")
def test_a_compiler_that_cannot_compile_is_named_with_its_error(tmp_path):
    # A compiler without its standard headers, as after a partial install.
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("needs a C++ compiler to break")
    result = _pip_wheel(tmp_path, CXX=f"{cxx} -include no_such_header.h")
    _first_lines_say(result, "cannot compile a C++17 test program", "no_such_header.h")


@pytest.mark.skipif(not (ROOT / "setup.py").exists(), reason="needs the source tree's setup.py")
def test_without_torch_the_error_says_what_to_install(tmp_path):
    # A bare environment: no torch, no setuptools either (the check comes first).
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    result = subprocess.run(
        [str(python), "setup.py", "--version"],
        cwd=_source_copy(tmp_path), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert lines[0] == (
        "lltm: cannot build from source: torch is not installed in the build environment "
        "(setup.py compiles against it)."
    ), result.stderr
    assert lines[1].strip().startswith("Fix: pip install 'torch>=2.10'"), lines


SOURCE_BUILD = ROOT / "tools" / "setup_helpers" / "source_build.py"


@pytest.mark.skipif(not SOURCE_BUILD.exists(), reason="needs the source tree's setup helpers")
@pytest.mark.parametrize(
    ("version", "refused"),
    [("1.13.1", True), ("2.9.1+cu128", True), ("2.10.0", False), ("2.13.0+cpu", False),
     ("2.15.0.dev20260101+cu132", False), ("3.0.0", False)],
)  # fmt: skip
def test_torch_older_than_2_10_is_refused(version, refused):
    problem = runpy.run_path(str(SOURCE_BUILD))["torch_version_problem"](version)
    if refused:
        assert problem == (
            f"torch {version} is installed; lltm is built against the LibTorch stable ABI, "
            "which torch 2.10 introduced"
        )
    else:
        assert problem is None
