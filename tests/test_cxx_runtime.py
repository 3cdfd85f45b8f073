"""lltm's libraries share torch's C++ runtime, whatever toolchain builds them.

A kernel reports a bad argument by a C++ exception that unwinds into libtorch
(tools/setup_helpers/cxx_runtime.py says why): a library linked with a
private copy of the runtime kills the interpreter at the first bad argument.
setup.py links torch's shared runtime by name, so that flags asking for a
static one find nothing left to link, and checks every library it links: a
build whose library would crash stops, naming the reason and the fix.
"""

from __future__ import annotations

import importlib
import os
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


def _helper(name: str = "cxx_runtime"):
    """One of setup.py's helpers, imported as setup.py imports it."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    return importlib.import_module(f"tools.setup_helpers.{name}")


@needs_sources
def test_flags_that_ask_for_a_private_runtime_are_found_in_every_variable():
    found = _helper().requested_static_runtime(
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
    assert helper.static_problems(library) == []
    # The runtime torch's own library links, which lltm's links too.
    assert "libstdc++.so.6" in helper.torch_runtime()
    assert helper.load_problem(library, "cpu", ROOT / "csrc" / "lltm_ops.cpp") is None


@linux_only
@needs_sources
def test_torchs_runtime_is_linked_by_its_file_name():
    # "-l:libstdc++.so.6": the linker looks that exact name up in every
    # folder, so a static libstdc++.a ahead of it (a wrapper's -B folder)
    # cannot answer it, as it answers "-lstdc++".
    helper = _helper()
    libraries = helper.link_libraries()
    assert libraries == [":" + soname for soname in helper.torch_runtime()]
    assert ":libstdc++.so.6" in libraries and "stdc++" not in libraries
    # What the linker is given for them, by setuptools' own compiler class.
    from setuptools._distutils.unixccompiler import UnixCCompiler

    assert "-l:libstdc++.so.6" in UnixCCompiler().library_option(":libstdc++.so.6")


def _pyelftools_read(path: Path) -> tuple[str, tuple[str, ...], frozenset[str]]:
    """(machine, DT_NEEDED, defined symbols) of ``path``, as pyelftools reads them."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with path.open("rb") as stream:
        elf = ELFFile(stream)
        sections = list(elf.iter_sections())
        needed = tuple(
            tag.needed
            for section in sections
            if isinstance(section, DynamicSection)
            for tag in section.iter_tags()
            if tag.entry.d_tag == "DT_NEEDED"
        )
        defined = frozenset(
            symbol.name
            for section in sections
            if isinstance(section, SymbolTableSection)
            for symbol in section.iter_symbols()
            if symbol.name and symbol["st_shndx"] != "SHN_UNDEF"
        )
        machine = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64"}.get(
            elf["e_machine"], elf["e_machine"]
        )
    return machine, needed, defined


@linux_only
@needs_sources
def test_the_builds_elf_reader_agrees_with_pyelftools(tmp_path):
    pytest.importorskip("elftools", reason="pyelftools (the test group) is the reference")
    read = _helper("elf_headers").read
    torch_lib = Path(torch.__file__).parent / "lib"
    libraries = [Path(lltm.__file__).parent / "lib" / "lltm_cpu.so", torch_lib / "libc10.so"]
    runtime = subprocess.run(
        ["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if runtime and Path(runtime).is_file():
        libraries.append(Path(runtime))
    for library in libraries:
        mine = read(library)
        assert mine is not None, library
        assert (mine.machine, mine.needed, mine.defined) == _pyelftools_read(library), library
        assert mine.defined, library
    # libtorch_cpu's DT_NEEDED (its half a million symbols are not read).
    torch_cpu = read(torch_lib / "libtorch_cpu.so", symbols=False)
    assert torch_cpu is not None and "libstdc++.so.6" in torch_cpu.needed
    assert torch_cpu.defined == frozenset()
    # Not ELF, or cut short: None, never an exception.
    assert read(ROOT / "setup.py") is None
    prefix = tmp_path / "prefix.so"
    prefix.write_bytes(libraries[0].read_bytes()[:4096])
    assert read(prefix) is None


# --- Whole builds (slow) ---------------------------------------------------------------

# What setup.py reads to build the CPU library.
# (and the GPU run's script, whose first step builds it).
SOURCES = ["setup.py", "pyproject.toml", "README.md", "LICENSE", "src", "csrc", "tools",
           "benchmarks/gpu.sh"]  # fmt: skip
# A compiler wrapper of the kind some toolchains ship. With FORCE_STATIC=1 it
# links the C++ runtime into every shared library, whatever it is asked (the
# runtime's libraries named on the command line dropped, the static flags
# added). With STATIC_RUNTIME_DIR set it is a GPU image's GCC: a -B folder
# ahead of the system's holding the runtime's static archives only, which
# answer "-lstdc++" before the shared library is looked at. Otherwise it is
# the compiler itself. Every build of the module uses it (the mode is not on
# the command line), so that ninja sees the same compile commands and later
# builds link the first one's objects instead of compiling everything again.
WRAPPER = """#!/bin/sh
if [ "$FORCE_STATIC" = 1 ]; then
  for arg do
    shift
    case "$arg" in -lstdc++|-lgcc_s|-l:libstdc++.so.6|-l:libgcc_s.so.1) ;; *) set -- "$@" "$arg" ;; esac
  done
  set -- "$@" -static-libstdc++ -static-libgcc
fi
if [ -n "$STATIC_RUNTIME_DIR" ]; then
  set -- -B"$STATIC_RUNTIME_DIR"/ "$@"
fi
exec {compiler} "$@"
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(a copy of the sources, the wrappers as CC and CXX)."""
    root = tmp_path_factory.mktemp("cxx-runtime")
    compilers = {}
    for variable, name in (("CC", "gcc"), ("CXX", "g++")):
        compiler = shutil.which(name)
        if compiler is None:
            pytest.skip("needs gcc and g++ (the wrappers force GCC's static runtime)")
        wrapper = root / f"{name}-wrapper"
        wrapper.write_text(WRAPPER.format(compiler=compiler))
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        compilers[variable] = str(wrapper)
    copy = root / "lltm-src"
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "lib")
            )
        else:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy, compilers


# setup.py run with pyelftools made unimportable (None in sys.modules), as
# on a machine where it is not installed.
WITHOUT_PYELFTOOLS = (
    "import runpy, sys; sys.modules['elftools'] = None; "
    "sys.argv = ['setup.py', *sys.argv[1:]]; runpy.run_path('setup.py', run_name='__main__')"
)


def _build_in_place(
    tree: tuple[Path, dict[str, str]], *, pyelftools: bool = True, **env: str
) -> tuple[int, str, Path]:
    """(exit status, output, the library put in place) of an in-place build."""
    source, compilers = tree
    library = source / "src" / "lltm" / "lib" / "lltm_cpu.so"
    library.unlink(missing_ok=True)
    setup = ["setup.py"] if pyelftools else ["-c", WITHOUT_PYELFTOOLS]
    result = subprocess.run(
        [sys.executable, *setup, "build_ext", "--inplace"],
        cwd=source,
        env={**os.environ, "LLTM_VARIANT": "cpu", "MAX_JOBS": "2", **compilers, **env},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr, library


def _documented_errors(library: Path) -> None:
    """tests/test_errors.py passes against ``library`` (its package first on the path)."""
    errors = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         str(ROOT / "tests" / "test_errors.py")],
        cwd=library.parents[3], env={**os.environ, "PYTHONPATH": str(library.parents[2])},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert errors.returncode == 0, errors.stdout[-3000:] + errors.stderr[-2000:]
    assert " passed" in errors.stdout and "failed" not in errors.stdout


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
    assert _helper().static_problems(library) == []
    # The documented errors, every one, from that library.
    _documented_errors(library)


@pytest.fixture(scope="module")
def static_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding GCC's static C++ runtime archives and nothing else."""
    folder = tmp_path_factory.mktemp("static-runtime")
    for archive in ("libstdc++.a", "libsupc++.a"):
        found = subprocess.run(
            ["g++", f"-print-file-name={archive}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if not Path(found).is_file():
            pytest.skip(f"GCC's {archive} is not installed (libstdc++-dev)")
        shutil.copy2(found, folder / archive)
    return folder


@linux_only
@needs_sources
@pytest.mark.slow
@pytest.mark.parametrize("pyelftools", [True, False], ids=["with-pyelftools", "without"])
def test_a_wrapper_whose_b_folder_holds_a_static_runtime_builds_a_sound_library(
    tree, static_runtime_dir, pyelftools
):
    status, output, library = _build_in_place(
        tree, pyelftools=pyelftools, STATIC_RUNTIME_DIR=str(static_runtime_dir)
    )
    assert status == 0, output[-3000:]
    assert "checked lltm_cpu.so: its C++ runtime is torch's" in output
    assert _helper().static_problems(library) == []
    _documented_errors(library)


# Last of the module: it builds with the system's compiler, whose compile
# commands differ from the wrapper's (the tests above share their objects).
@linux_only
@needs_sources
@pytest.mark.slow
def test_the_gpu_run_builds_with_the_systems_compiler_where_the_one_in_use_cannot(tree):
    if not (Path("/usr/bin/gcc").is_file() and Path("/usr/bin/g++").is_file()):
        pytest.skip("needs the system's own GCC, /usr/bin/gcc and /usr/bin/g++")
    source, compilers = tree
    library = source / "src" / "lltm" / "lib" / "lltm_cpu.so"
    library.unlink(missing_ok=True)
    result = subprocess.run(
        ["bash", "benchmarks/gpu.sh", "--cpu-build"],
        cwd=source,
        env={**os.environ, **compilers, "FORCE_STATIC": "1", "PYTHON": sys.executable,
             "MAX_JOBS": "2"},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    # The wrapper's build was refused, said so, and the system's GCC built.
    assert "would crash or garble lltm's errors" in output
    assert "cannot build a sound lltm here (above): building with the system's own" in output
    assert "CC=/usr/bin/gcc CXX=/usr/bin/g++" in output
    assert output.count("checked lltm_cpu.so: its C++ runtime is torch's") == 1
    assert _helper().load_problem(library, "cpu", source / "csrc" / "lltm_ops.cpp") is None
