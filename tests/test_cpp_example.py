"""lltm from C++: the CMake package the wheel ships (``lltm.cmake_prefix_path``),
its header ``<lltm/lltm.h>``, and examples/cpp built against them.

The slow tests (``nox -s slow``, which installs CMake and ninja from PyPI: the
``cpp`` dependency group) build examples/cpp with CMake and ninja against the
torch and lltm this interpreter imports (the installed wheel, in that session)
and run it with no Python in the process: an AOTInductor package and a traced
TorchScript module of a model holding ``lltm.LLTMSequence`` give eager's
outputs, and the same program built without lltm stops with a message that
names what to link or load. The package's choices (which CUDA plugin, the
version check, the components) and its link line (the libraries kept under
``--as-needed``) are tested on stand-in layouts, configure only or with
stand-in libraries: no GPU, no CUDA torch.

A missing prerequisite (cmake, ninja, a C compiler) skips these tests, with
the reason; with LLTM_TEST_REQUIRE_INSTALLS=1 (CI sets it) it fails them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import needed_libraries

import lltm
from lltm import info

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cpp"
PREFIX = Path(lltm.cmake_prefix_path)
PACKAGE = Path(lltm.__file__).resolve().parent
# Deadline of each command: the slowest, the AOTInductor compile, takes about
# 20 s on two cores, building the example about 30 s.
COMMAND_TIMEOUT_S = 600

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="lltm's CMake package is for Linux"
)


def _missing_prerequisite(reason: str) -> None:
    """Skips the test, or fails it where CI asks for every install test to run."""
    if os.environ.get("LLTM_TEST_REQUIRE_INSTALLS") == "1":
        pytest.fail(f"{reason} (LLTM_TEST_REQUIRE_INSTALLS=1: install tests must run)")
    pytest.skip(reason)


def _tool(name: str, why: str) -> str:
    found = shutil.which(name)
    if found is None:
        _missing_prerequisite(f"{name} is not installed: {why}")
    return str(found)


def _run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, **kwargs
    )


def _check(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _without_python() -> dict[str, str]:
    """This environment less what Python reads: the programs run on their own."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


# --- What the wheel ships (fast) ------------------------------------------------------


def test_the_package_ships_the_cmake_package_and_header():
    assert PREFIX == PACKAGE / "share" / "cmake"
    for name in ("lltmConfig.cmake", "lltmConfigVersion.cmake"):
        assert (PREFIX / "lltm" / name).is_file(), name
    assert (PACKAGE / "include" / "lltm" / "lltm.h").is_file()
    assert lltm.cmake_prefix_path in info.render(info.collect())


@pytest.mark.skipif(not (ROOT / "csrc").is_dir(), reason="needs the source tree")
def test_the_header_lists_every_operator_the_library_declares():
    declared = re.findall(r'm\.def\(\s*"(\w+)\(', (ROOT / "csrc" / "lltm_ops.cpp").read_text())
    header = (PACKAGE / "include" / "lltm" / "lltm.h").read_text()
    body = header[header.index("operator_names()") :]
    listed = re.findall(r'"lltm::(\w+)"', body[: body.index("return names;")])
    assert sorted(listed) == sorted(declared)


@linux_only
def test_the_library_has_its_file_name_as_soname():
    # A program linked with it then needs it by name, found through its
    # runpath, not at the path it was linked from.
    readelf = _tool("readelf", "reads the library's dynamic section")
    library = PACKAGE / "lib" / "lltm_cpu.so"
    dynamic = _check(_run(readelf, "-d", library))
    assert "Library soname: [lltm_cpu.so]" in dynamic, dynamic


# --- The CMake package's choices, on stand-in layouts (slow: CMake) ------------------

_FAKE_TORCH = """\
set(TORCH_INSTALL_PREFIX "{prefix}")
add_library(torch INTERFACE IMPORTED)
set(Torch_FOUND TRUE)
"""
_PROBE = """\
cmake_minimum_required(VERSION 3.18)
project(probe {languages})
find_package(lltm {request})
foreach(target lltm::lltm lltm::cpu lltm::cuda lltm::headers)
  if(TARGET ${{target}})
    message(STATUS "target ${{target}}")
  endif()
endforeach()
get_target_property(links lltm::lltm INTERFACE_LINK_LIBRARIES)
message(STATUS "lltm::lltm links ${{links}}")
message(STATUS "status ${{lltm_CUDA_STATUS}}")
{extra}
"""


def _layout(
    root: Path, torch_cuda: str | None, plugins: dict[str, str], cpu: Path | None = None
) -> tuple[Path, Path]:
    """A site-packages with this lltm's CMake package and header, its library
    (``cpu``, else an empty file), CUDA plugins ({"13": version} gives
    lltm_cuda13, an empty library, and its dist-info) and a stand-in torch
    (CUDA ``torch_cuda``, None: CPU-only). Returns (lltm's prefix, torch's)."""
    site = root / "site-packages"
    package = site / "lltm"
    shutil.copytree(PACKAGE / "share", package / "share")
    shutil.copytree(PACKAGE / "include", package / "include")
    shutil.copy(PACKAGE / "_version.py", package / "_version.py")
    (package / "lib").mkdir()
    if cpu is None:
        (package / "lib" / "lltm_cpu.so").touch()
    else:
        shutil.copy(cpu, package / "lib" / "lltm_cpu.so")
    for major, version in plugins.items():
        (site / f"lltm_cuda{major}" / "lib").mkdir(parents=True)
        (site / f"lltm_cuda{major}" / "lib" / "lltm_cuda.so").touch()
        (site / f"lltm_cuda{major}-{version}.dist-info").mkdir()
    torch_package = site / "torch"
    (torch_package / "share" / "cmake" / "Torch").mkdir(parents=True)
    cuda = repr(torch_cuda) if torch_cuda else "None"
    (torch_package / "version.py").write_text(f"cuda: Optional[str] = {cuda}\n")
    config = torch_package / "share" / "cmake" / "Torch" / "TorchConfig.cmake"
    config.write_text(_FAKE_TORCH.format(prefix=torch_package.as_posix()))
    return package / "share" / "cmake", torch_package / "share" / "cmake"


def _configure(
    root: Path, prefixes: tuple[Path, Path], request: str = "", languages: str = "NONE", extra=""
) -> subprocess.CompletedProcess[str]:
    cmake = _tool("cmake", "the C++ tests need CMake (pip install --group cpp)")
    probe = root / "probe"
    probe.mkdir(exist_ok=True)
    text = _PROBE.format(languages=languages, request=request, extra=extra)
    (probe / "CMakeLists.txt").write_text(text)
    return _run(
        cmake, "-S", probe, "-B", root / "build",
        f"-DCMAKE_PREFIX_PATH={';'.join(p.as_posix() for p in prefixes)}",
    )  # fmt: skip


@pytest.mark.slow
@linux_only
@pytest.mark.parametrize(
    ("torch_cuda", "plugins", "plugin", "status"),
    [
        (None, {"13": lltm.__version__}, None, "torch is a CPU-only build"),
        ("13.0", {"13": lltm.__version__}, "lltm_cuda13", "CUDA kernels: "),
        ("12.8", {"13": lltm.__version__}, None, "lltm_cuda12 is not installed"),
        ("13.0", {"12": lltm.__version__}, None, f"pip install 'lltm[cuda13]=={lltm.__version__}'"),
    ],
    ids=["cpu-torch", "cuda13", "cuda12-without-its-plugin", "cuda13-without-its-plugin"],
)
def test_the_cuda_plugin_is_the_one_python_would_load(
    tmp_path, torch_cuda, plugins, plugin, status
):
    result = _configure(tmp_path, _layout(tmp_path, torch_cuda, plugins))
    out = _check(result)
    assert "-- target lltm::lltm" in out and "-- target lltm::cpu" in out
    assert "-- target lltm::headers" in out
    assert ("-- target lltm::cuda" in out) == (plugin is not None), out
    (links,) = re.findall(r"-- lltm::lltm links (.*)", out)
    libraries = "lltm::cpu;lltm::cuda" if plugin else "lltm::cpu"
    assert links == f"lltm::headers;-Wl,--push-state,--no-as-needed;{libraries};-Wl,--pop-state"
    assert status in out, out


@pytest.mark.slow
@linux_only
def test_the_cuda_component_says_why_it_is_missing(tmp_path):
    prefixes = _layout(tmp_path, None, {})
    result = _configure(tmp_path, prefixes, request="REQUIRED COMPONENTS cuda")
    assert result.returncode != 0
    text = " ".join((result.stdout + result.stderr).split())
    assert "the component cuda was asked for: no CUDA kernels: torch is a CPU-only build" in text


@pytest.mark.slow
@linux_only
def test_a_plugin_of_another_version_is_loaded_with_a_warning(tmp_path):
    result = _configure(tmp_path, _layout(tmp_path, "13.0", {"13": "0.0.1"}))
    out = _check(result)
    assert "-- target lltm::cuda" in out
    text = " ".join(result.stderr.split())
    assert f"pip install --force-reinstall --no-deps 'lltm-cuda13=={lltm.__version__}'" in text


@pytest.mark.slow
@linux_only
@pytest.mark.parametrize(
    ("request_", "found"),
    [
        ("", True),
        ("{v}", True),
        ("{v} EXACT", True),
        ("{major}.{minor}", True),
        ("{major}.{later}", False),
        ("{v}.1 EXACT", False),
        ("99", False),
    ],
)
def test_the_version_request(tmp_path, request_, found):
    major, minor = lltm.__version__.split(".")[:2]
    request = request_.format(v=lltm.__version__, major=major, minor=minor, later=int(minor) + 1)
    result = _configure(tmp_path, _layout(tmp_path, None, {}), request=request)
    assert (result.returncode == 0) == found, result.stdout + result.stderr


# --- The link line, with stand-in libraries (slow: CMake and a C compiler) -------------

_STAND_IN = """\
#include <stdio.h>
__attribute__((constructor)) static void loaded(void) {{ puts("{name} loaded"); }}
"""
_LINKED = """\
file(WRITE "${{CMAKE_BINARY_DIR}}/main.cpp" "int main() {{ return 0; }}\\n")
add_executable(app "${{CMAKE_BINARY_DIR}}/main.cpp")
target_link_libraries(app PRIVATE {target})
# Debian's and Ubuntu's default, stated: libraries nothing references are dropped.
target_link_options(app PRIVATE "LINKER:--as-needed")
"""


def _stand_in(cc: str, directory: Path, name: str) -> Path:
    """A library with soname ``name``.so that prints "<name> loaded" when loaded."""
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"{name}.c"
    source.write_text(_STAND_IN.format(name=name))
    library = directory / f"{name}.so"
    _check(_run(cc, "-shared", "-fPIC", f"-Wl,-soname,{name}.so", "-o", library, source))
    return library


@pytest.mark.slow
@linux_only
@pytest.mark.parametrize("target", ["lltm::lltm", "lltm::cpu"])
def test_lltm_lltm_keeps_the_libraries_nothing_references(tmp_path, target):
    cc = _tool("cc", "builds stand-in libraries")
    _tool("ninja", "the C++ tests build with ninja (pip install --group cpp)")
    cpu = _stand_in(cc, tmp_path / "libs", "lltm_cpu")
    cuda = _stand_in(cc, tmp_path / "libs", "lltm_cuda")
    prefixes = _layout(tmp_path, "13.0", {"13": lltm.__version__}, cpu=cpu)
    shutil.copy(cuda, prefixes[0].parent.parent.parent / "lltm_cuda13" / "lib" / "lltm_cuda.so")
    result = _configure(tmp_path, prefixes, languages="CXX", extra=_LINKED.format(target=target))
    _check(result)
    _check(_run(_tool("cmake", "the C++ tests need CMake"), "--build", tmp_path / "build"))
    app = tmp_path / "build" / "app"
    needed = needed_libraries(app)
    ran = _check(_run(app, env=_without_python()))
    if target == "lltm::cpu":
        # Linked plainly, the linker drops it: why lltm::lltm is the target to link.
        assert "lltm_cpu.so" not in needed and ran == "", (needed, ran)
        return
    # By soname, found through the program's runpath; CPU library first.
    assert needed[:2] == ["lltm_cpu.so", "lltm_cuda.so"], needed
    assert sorted(ran.splitlines()) == ["lltm_cpu loaded", "lltm_cuda loaded"], ran


# --- examples/cpp, built against this torch and lltm, run (slow) ------------------------


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """The AOTInductor package, the traced module and eager's outputs
    (examples/cpp/make_artifacts.py)."""
    out = tmp_path_factory.mktemp("cpp-artifacts")
    start = time.perf_counter()
    # From another directory: the installed lltm, not a source tree's.
    _check(_run(sys.executable, EXAMPLE / "make_artifacts.py", out, cwd=out))
    print(f"make_artifacts.py: {time.perf_counter() - start:.1f} s")
    return out


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    """examples/cpp built with CMake and ninja: the folder holding its programs."""
    cmake = _tool("cmake", "the C++ example builds with CMake (pip install --group cpp)")
    _tool("ninja", "the C++ example builds with ninja (pip install --group cpp)")
    build = tmp_path_factory.mktemp("cpp-example")
    prefixes = f"{torch.utils.cmake_prefix_path};{lltm.cmake_prefix_path}"
    start = time.perf_counter()
    _check(
        _run(
            cmake, "-S", EXAMPLE, "-B", build, "-G", "Ninja",
            f"-DCMAKE_PREFIX_PATH={prefixes}",
        )
    )  # fmt: skip
    _check(_run(cmake, "--build", build, "-j", os.environ.get("MAX_JOBS", "2")))
    print(f"examples/cpp: configured and built in {time.perf_counter() - start:.1f} s")
    return build


@pytest.mark.slow
@linux_only
def test_the_example_runs_both_models_as_eager_did(artifacts, example):
    program = example / "lltm_example"
    # No Python anywhere in the program's libraries.
    ldd = _check(_run(_tool("ldd", "lists the program's libraries"), program))
    assert "libpython" not in ldd and "libtorch_python" not in ldd, ldd
    # lltm's library by soname, through the runpath CMake gave the program.
    assert "lltm_cpu.so" in needed_libraries(program)
    assert f"lltm_cpu.so => {PACKAGE / 'lib' / 'lltm_cpu.so'}" in ldd, ldd
    start = time.perf_counter()
    out = _check(_run(program, artifacts, env=_without_python(), cwd=example))
    print(f"lltm_example: {time.perf_counter() - start:.2f} s\n{out}")
    assert "AOTInductor: 3 outputs" in out and "TorchScript: 3 outputs" in out, out
    assert "MISMATCH" not in out, out
    eager = torch.load(artifacts / "eager.pt")
    compiled, scripted = torch.load(artifacts / "cpp_outputs.pt")
    for name, outputs in (("AOTInductor", compiled), ("TorchScript", scripted)):
        for got, expected in zip(outputs, eager["output"], strict=True):
            torch.testing.assert_close(got, expected, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow
@linux_only
def test_without_lltm_the_program_names_what_to_load(artifacts, example):
    result = _run(example / "lltm_example_without_lltm", artifacts, env=_without_python())
    assert result.returncode == 1, result.stdout + result.stderr
    message = result.stderr
    assert "lltm::sequence_forward" in message and "not registered in this process" in message
    assert "lltm::lltm" in message and "lltm.cmake_prefix_path" in message, message
    assert str(PACKAGE / "lib" / "lltm_cpu.so") in message, message


@pytest.mark.slow
@linux_only
def test_without_the_check_torch_says_only_which_operator(artifacts, example):
    # What lltm::check_operators() spares its users: torch's own message
    # names the operator, not what to load (what docs/guide/deployment.md quotes).
    result = _run(
        example / "lltm_example_without_lltm", artifacts, "--skip-check", env=_without_python()
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "lltm::sequence_forward" in result.stderr, result.stderr
    assert "lltm_cpu" not in result.stderr, result.stderr


# --- The CUDA plugin, linked the same way (slow: a stand-in plugin on a CPU torch) -----

_PLUGIN = """\
// A stand-in of lltm's CUDA plugin: registers a CUDA kernel for each lltm
// operator (raising when called: no GPU here) from a static initialiser.
#include <lltm/lltm.h>
#include <torch/library.h>

static void stand_in(const c10::OperatorHandle& op, torch::jit::Stack*) {
  throw std::runtime_error(op.schema().name() + ": a stand-in of lltm's CUDA kernels");
}

TORCH_LIBRARY_IMPL(lltm, CUDA, m) {
  for (const auto& name : lltm::operator_names())
    m.impl(name.substr(6).c_str(), torch::CppFunction::makeFromBoxedFunction<&stand_in>());
}
"""
_CHECK = """\
#include <lltm/lltm.h>
#include <cstdio>

int main() {
  lltm::check_operators();
  lltm::check_operators(c10::DeviceType::CUDA);
  std::puts("lltm's CPU and CUDA kernels are registered");
}
"""
_CHECKED = """\
add_executable(check "${CMAKE_CURRENT_SOURCE_DIR}/check.cpp")
target_link_libraries(check PRIVATE lltm::lltm)
"""
# torch's CMake package as found, but torch's version.py saying CUDA 13.0.
_CUDA_TORCH = """\
include("{real}/Torch/TorchConfig.cmake")
set(TORCH_INSTALL_PREFIX "{prefix}")
"""


@pytest.mark.slow
@linux_only
def test_lltm_lltm_loads_the_cuda_plugin_for_torchs_cuda(tmp_path):
    from torch.utils import cpp_extension

    cxx = _tool("c++", "builds a stand-in CUDA plugin")
    _tool("ninja", "the C++ tests build with ninja (pip install --group cpp)")
    lltm_prefix, torch_prefix = _layout(
        tmp_path, "13.0", {"13": lltm.__version__}, cpu=PACKAGE / "lib" / "lltm_cpu.so"
    )
    config = torch_prefix / "Torch" / "TorchConfig.cmake"
    real = Path(torch.utils.cmake_prefix_path).as_posix()
    config.write_text(_CUDA_TORCH.format(real=real, prefix=config.parents[3].as_posix()))
    plugin = lltm_prefix.parents[2] / "lltm_cuda13" / "lib" / "lltm_cuda.so"
    source = tmp_path / "plugin.cpp"
    source.write_text(_PLUGIN)
    includes = [f"-I{p}" for p in [PACKAGE / "include", *cpp_extension.include_paths()]]
    (torch_lib,) = cpp_extension.library_paths()
    _check(
        _run(
            cxx, "-std=c++20", "-shared", "-fPIC", *includes, "-o", plugin, source,
            f"-L{torch_lib}", "-ltorch_cpu", "-lc10", "-Wl,-soname,lltm_cuda.so",
        )
    )  # fmt: skip
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "check.cpp").write_text(_CHECK)
    result = _configure(tmp_path, (torch_prefix, lltm_prefix), languages="CXX", extra=_CHECKED)
    _check(result)
    assert "-- target lltm::cuda" in result.stdout, result.stdout
    _check(_run(_tool("cmake", "the C++ tests need CMake"), "--build", tmp_path / "build"))
    program = tmp_path / "build" / "check"
    needed = needed_libraries(program)
    # After torch's, which lltm's need.
    assert needed.index("lltm_cpu.so") > needed.index("libtorch_cpu.so"), needed
    assert needed.index("lltm_cuda.so") == needed.index("lltm_cpu.so") + 1, needed
    out = _check(_run(program, env=_without_python()))
    assert out == "lltm's CPU and CUDA kernels are registered\n", out
