"""lltm's libraries share torch's C++ runtime, whatever toolchain builds them.

A kernel reports a bad argument by a C++ exception that unwinds into libtorch
(tools/setup_helpers/cxx_runtime.py says why): a library linked with a
private copy of the runtime kills the interpreter at the first bad argument.
setup.py links torch's shared runtime by name, so that flags asking for a
static one find nothing left to link, and checks every library it links: a
build whose library would crash stops, naming the reason and the fix.
"""

from __future__ import annotations

import os
import runpy
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lltm

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "tools" / "setup_helpers" / "cxx_runtime.py"
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="ELF and GCC's runtime flags: Linux"
)
needs_sources = pytest.mark.skipif(
    not (HELPER.exists() and (ROOT / "csrc").is_dir()), reason="needs the source tree"
)


def _helper() -> dict:
    # It imports its sibling helpers as setup.py does: from the source tree's root.
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    return runpy.run_path(str(HELPER))


@needs_sources
def test_flags_that_ask_for_a_private_runtime_are_found_in_every_variable():
    found = _helper()["requested_static_runtime"](
        {
            "LDFLAGS": "-Wl,-O1 -static-libstdc++",
            "CXX": "g++ -static-libgcc",
            "CFLAGS": "-O2 -static-libstdc++x",  # another flag, merely alike
            "PATH": "-static",  # not a variable the build reads flags from
        }
    )
    assert found == ["LDFLAGS=-static-libstdc++", "CXX=-static-libgcc"]


@linux_only
@needs_sources
def test_the_library_in_use_shares_torchs_runtime():
    helper = _helper()
    library = Path(lltm.__file__).parent / "lib" / "lltm_cpu.so"
    assert helper["static_problems"](library) == []
    # The runtime torch's own library links, which lltm's links too.
    assert "libstdc++.so.6" in helper["torch_runtime"]()
    assert helper["load_problem"](library, "cpu", ROOT / "csrc" / "lltm_ops.cpp") is None


# --- Whole builds (slow) ---------------------------------------------------------------

# What setup.py reads to build the CPU library.
SOURCES = ["setup.py", "pyproject.toml", "README.md", "LICENSE", "src", "csrc", "tools"]
# A compiler wrapper of the kind some toolchains ship: with FORCE_STATIC=1 it
# links the C++ runtime into every shared library, whatever it is asked
# (the runtime's libraries named on the command line dropped, the static
# flags added); otherwise it is the compiler itself. Both tests build with
# it, so that the second links the first one's objects (ninja sees the same
# compile commands) instead of compiling everything again.
WRAPPER = """#!/bin/sh
if [ "$FORCE_STATIC" = 1 ]; then
  for arg do
    shift
    case "$arg" in -lstdc++|-lgcc_s) ;; *) set -- "$@" "$arg" ;; esac
  done
  set -- "$@" -static-libstdc++ -static-libgcc
fi
exec {cxx} "$@"
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a copy of the sources, the compiler wrapper)."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("needs g++ (the wrapper forces GCC's static runtime flags)")
    root = tmp_path_factory.mktemp("cxx-runtime")
    wrapper = root / "g++-wrapper"
    wrapper.write_text(WRAPPER.format(cxx=cxx))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    copy = root / "lltm-src"
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "lib")
            )
        else:
            copy.mkdir(exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy, wrapper


def _build_in_place(tree: tuple[Path, Path], **env: str) -> tuple[int, str, Path]:
    """(exit status, output, the library put in place) of an in-place build."""
    source, wrapper = tree
    library = source / "src" / "lltm" / "lib" / "lltm_cpu.so"
    library.unlink(missing_ok=True)
    result = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=source,
        env={**os.environ, "LLTM_VARIANT": "cpu", "MAX_JOBS": "2", "CXX": str(wrapper), **env},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr, library


@linux_only
@needs_sources
@pytest.mark.slow
def test_a_toolchain_that_forces_a_private_runtime_is_refused(tree):
    status, output, library = _build_in_place(tree, FORCE_STATIC="1")
    assert status != 0, output[-3000:]
    assert "would crash or garble lltm's errors" in output, output[-3000:]
    assert "carries a copy of the C++ runtime of its own (it defines __cxa_throw" in output
    assert "a kernel's argument error killed the interpreter (SIG" in output
    assert "No flag of the environment asks for it: the compiler" in output
    assert "Fix: link the C++ runtime shared" in output
    # Nothing was put in place for Python to load.
    assert not library.exists()
    # This process, which loaded the healthy library, is unharmed.
    assert lltm.lltm_cell is not None and torch.ones(1).item() == 1


@linux_only
@needs_sources
@pytest.mark.slow
def test_static_runtime_flags_are_overridden_and_errors_stay_documented(tree):
    status, output, library = _build_in_place(tree, LDFLAGS="-static-libstdc++ -static-libgcc")
    assert status == 0, output[-3000:]
    assert "LDFLAGS=-static-libstdc++ asks for a private C++ runtime" in output
    assert "checked lltm_cpu.so: its C++ runtime is torch's" in output
    assert _helper()["static_problems"](library) == []
    # The documented errors, every one, from that library.
    errors = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         str(ROOT / "tests" / "test_errors.py")],
        cwd=library.parents[3], env={**os.environ, "PYTHONPATH": str(library.parents[2])},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert errors.returncode == 0, errors.stdout[-3000:] + errors.stderr[-2000:]
    assert " passed" in errors.stdout and "failed" not in errors.stdout
