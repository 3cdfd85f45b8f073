"""The sanitizer builds catch what they are for (``nox -s sanitize`` runs these).

A copy of the kernels gets one index moved one element past the edge of what
it may touch (a textual substitution the test first checks applied), is
built with the sanitizers' flags (tools/setup_helpers/sanitizers.py) and run
in an interpreter with their runtimes preloaded, as ``nox -s sanitize`` runs
the real ones; the process must die with a report that names the planted
file and line. In the CPU kernels: the cell's forward span reads the old cell
state one column past the span, which at the last span of the last row is
past the tensor's memory. In the CUDA sources built for the host: the
persistent forward kernel writes its running h one element past the end of
its block's dynamic shared memory (the emulation follows each block's shared
memory with memory ASan knows as unusable).

And the report reaches the log: a planted overrun in a test run by pytest,
in its own process and in pytest-xdist's workers, as ``nox -s sanitize``
runs its suites (tools/sanitized_run.py), is printed whole, with the planted
file and line, where pytest alone would show "worker crashed" or nothing.

Each builds only what it needs, at -O1: the CPU library's schemas and cell
kernel (seconds), and the host build whole (a few minutes on two cores).
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
TESTS = Path(__file__).resolve().parent
HELPER = ROOT / "tools" / "setup_helpers" / "sanitizers.py"

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and HELPER.exists() and (ROOT / "csrc").is_dir()),
    reason="GCC's sanitizer runtimes on Linux, and the source tree",
)


def _sanitizers() -> dict:
    return runpy.run_path(str(HELPER))


def _runtimes() -> list[str]:
    found = _sanitizers()["compiler_runtimes"]()
    if found is None:
        message = "the C++ compiler has no sanitizer runtimes (libasan, libubsan)"
        if os.environ.get("LLTM_TEST_REQUIRE_INSTALLS") == "1":
            pytest.fail(f"{message} (LLTM_TEST_REQUIRE_INSTALLS=1: these tests must run)")
        pytest.skip(message)
    return found


def _plant(tree: Path, relative: str, old: str, new: str) -> int:
    """Replaces the one occurrence of ``old`` in the tree's file by ``new``;
    the line it is on."""
    path = tree / relative
    text = path.read_text()
    assert text.count(old) == 1, f"{relative} no longer has exactly one {old!r}: update the test"
    path.write_text(text.replace(old, new))
    return text[: text.index(old)].count("\n") + 1


def _sanitized_environment() -> dict[str, str]:
    """This process's environment with the sanitizers' runtimes preloaded,
    their reports on stderr (the last log_path wins over one a caller set)."""
    env = _sanitizers()["environment"](_runtimes())
    for variable in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
        env[variable] = f"{env[variable]}:log_path=stderr"
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *sys.path])
    env.setdefault("MAX_JOBS", "2")
    return env


def _run_sanitized(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=_sanitized_environment(),
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip


def _assert_reported(result: subprocess.CompletedProcess[str], kind: str, where: str) -> None:
    report = _sanitizers()["report"](result.stderr)
    assert result.returncode != 0 and report is not None, (
        f"no sanitizer report (exit status {result.returncode}):\n{result.stdout[-3000:]}"
        f"\n{result.stderr[-6000:]}"
    )
    assert kind in report, report[:6000]
    assert re.search(rf"{re.escape(where)}\b", report), (
        f"{where} not in the report:\n{report[:6000]}"
    )


# --- The build's library check ------------------------------------------------------


def test_runtimes_are_preloaded_asan_first_and_options_kept():
    helper = _sanitizers()
    needed = ["libubsan.so.1", "libstdc++.so.6", "libasan.so.8", "libc.so.6"]
    assert helper["runtimes"](needed) == ["libasan.so.8", "libubsan.so.1"]
    env = helper["environment"](
        ["/x/libasan.so"], {"LD_PRELOAD": "/y/other.so", "ASAN_OPTIONS": "detect_leaks=1"}
    )
    assert env["LD_PRELOAD"] == "/x/libasan.so /y/other.so"
    # Later options win: the caller's own over the defaults.
    assert env["ASAN_OPTIONS"] == "detect_leaks=0:detect_leaks=1"
    assert env["UBSAN_OPTIONS"] == "halt_on_error=1:print_stacktrace=1"
    assert helper["requested"]({"CFLAGS": "-O2 -fsanitize=address", "PATH": "-fsanitize=x"}) == [
        "CFLAGS=-fsanitize=address"
    ]


def test_a_library_that_cannot_load_is_named_for_that_not_for_the_cxx_runtime(tmp_path):
    """An undefined symbol is no C++ runtime's fault: the check says what the
    loader said, and does not prescribe the runtime's fix."""
    compiler = shutil.which(os.environ.get("CXX", "c++").split()[0])
    if compiler is None:
        pytest.skip("no C++ compiler")
    source = tmp_path / "unloadable.cpp"
    source.write_text(
        'void lltm_missing_symbol();\nextern "C" void f() { lltm_missing_symbol(); }\n'
    )
    library = tmp_path / "unloadable.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", str(source), "-o", str(library),
         "-Wl,--no-as-needed", "-lstdc++", "-lgcc_s"],
        check=True,
    )  # fmt: skip
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # the check imports its sibling helpers as setup.py does
    cxx_runtime = runpy.run_path(str(ROOT / "tools" / "setup_helpers" / "cxx_runtime.py"))
    with pytest.raises(SystemExit) as raised:
        cxx_runtime["check_library"](library, "cpu", ROOT / "csrc" / "lltm_ops.cpp", log=print)
    message = str(raised.value)
    assert type(raised.value).__name__ == "UnloadableLibrary", message
    assert "undefined symbol" in message and "lltm_missing_symbol" in message, message
    assert "static-libstdc++" not in message, message


# --- Teeth: planted overruns are reported -----------------------------------------------

# Builds the CPU library's schemas and cell kernel from the tree given, with
# the sanitizers (compilers run without the preload: this process has the
# runtimes already); _CPU_SCRIPT then calls the cell's forward in float32.
_CPU_BUILD_SCRIPT = """
import os
from pathlib import Path
import torch
from torch.utils import cpp_extension
tree, flags = Path({tree!r}), {flags!r}
preload = os.environ.pop("LD_PRELOAD")
(tree / "build").mkdir()
cpp_extension.load(
    name="lltm_cpu_planted",
    sources=[str(tree / "csrc/lltm_ops.cpp"), str(tree / "csrc/cpu/cell_kernel.cpp")],
    extra_cflags=["-std=c++17", "-DTORCH_TARGET_VERSION={target}", "-DLLTM_VERSION=planted", *flags, "-O1"],
    extra_ldflags=[flags[0]],
    build_directory=str(tree / "build"),
    is_python_module=False,
)
"""
_CPU_SCRIPT = (
    _CPU_BUILD_SCRIPT
    + """
os.environ["LD_PRELOAD"] = preload
batch, features, state = 3, 5, 37
x, h, c = torch.randn(batch, features), torch.randn(batch, state), torch.randn(batch, state)
w, b = torch.randn(3 * state, state + features), torch.randn(3 * state)
torch.ops.lltm.forward(x, w, b, h, c)
print("no report")
"""
)


def _target_version() -> str:
    match = re.search(r'^TORCH_TARGET_VERSION = "([^"]+)"', (ROOT / "setup.py").read_text(), re.M)
    assert match
    return match.group(1)


@pytest.mark.slow
def test_an_overrun_at_a_span_edge_of_the_cpu_kernels_is_reported(tmp_path):
    _runtimes()
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "csrc", tree / "csrc")
    relative = "csrc/cpu/pointwise/span_kernels.h"
    line = _plant(
        tree, relative, "const T c = old_cell[j] + g * i;", "const T c = old_cell[j + 1] + g * i;"
    )
    flags = list(_sanitizers()["FLAGS"])
    script = _CPU_SCRIPT.format(tree=str(tree), flags=flags, target=_target_version())
    result = _run_sanitized(script, tmp_path)
    _assert_reported(result, "heap-buffer-overflow", f"span_kernels.h:{line}")


_CUDA_HOST_SCRIPT = """
import torch
from pathlib import Path
import cuda_host
cuda_host.build(Path({tree!r}), {flags!r}, Path({tree!r}) / "build")
steps, batch, state, features = 3, 3, 5, 4
g = torch.Generator().manual_seed(0)
draw = lambda *shape: torch.randn(shape, generator=g, dtype=torch.float64)
args = [draw(steps, batch, features), draw(3 * state, state + features), draw(3 * state),
        draw(batch, state), draw(batch, state), None, False]
torch.ops.lltm_cuda_host.sequence_forward(*args)
print("no report")
"""


@pytest.mark.slow
def test_a_shared_memory_overrun_of_the_host_built_cuda_kernels_is_reported(tmp_path):
    _runtimes()
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "csrc", tree / "csrc")
    shutil.copytree(TESTS / "cuda_host", tree / "tests" / "cuda_host")
    relative = "csrc/cuda/lltm_cuda_persistent_forward.cuh"
    line = _plant(
        tree,
        relative,
        "shared.running_h[pair] = present ? M(args.h0[at]) : M(0);",
        "shared.running_h[pair + 1] = present ? M(args.h0[at]) : M(0);",
    )
    flags = [*_sanitizers()["FLAGS"], "-O1"]
    script = _CUDA_HOST_SCRIPT.format(tree=str(tree), flags=flags)
    result = _run_sanitized(script, tmp_path)
    _assert_reported(result, "use-after-poison", f"lltm_cuda_persistent_forward.cuh:{line}")


# --- The report reaches the log ---------------------------------------------------------


# Two tests, so that each of two pytest-xdist workers runs one; the cell's
# forward in bfloat16 converts its spans through load_span.
_PLANTED_TESTS = """
import torch

torch.ops.load_library({library!r})


def _forward():
    batch, features, state = 3, 5, 37
    x, h, c = torch.randn(batch, features), torch.randn(batch, state), torch.randn(batch, state)
    w, b = torch.randn(3 * state, state + features), torch.randn(3 * state)
    args = [t.to(torch.bfloat16) for t in (x, w, b, h, c)]
    torch.ops.lltm.forward(*args)


def test_first():
    _forward()


def test_second():
    _forward()
"""


@pytest.fixture(scope="module")
def planted_span_overrun(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The planted library's tests, and the planted line: load_span reads
    each element one further on, past the span, and at the last span of the
    last row past the tensor's memory."""
    _runtimes()
    scratch = tmp_path_factory.mktemp("planted-span")
    tree = scratch / "tree"
    shutil.copytree(ROOT / "csrc", tree / "csrc")
    line = _plant(
        tree,
        "csrc/cpu/pointwise/row_passes.h",
        "buffer[k] = static_cast<T>(data[k * stride]);",
        "buffer[k] = static_cast<T>(data[(k + 1) * stride]);",
    )
    flags = list(_sanitizers()["FLAGS"])
    script = _CPU_BUILD_SCRIPT.format(tree=str(tree), flags=flags, target=_target_version())
    built = _run_sanitized(script, scratch)
    assert built.returncode == 0, f"{built.stdout[-3000:]}\n{built.stderr[-6000:]}"
    (library,) = (tree / "build").glob("lltm_cpu_planted*.so")
    tests = scratch / "test_planted.py"
    tests.write_text(_PLANTED_TESTS.format(library=str(library)))
    return tests, line


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_report_in_a_test_reaches_the_log_whatever_the_workers(planted_span_overrun, workers):
    """As nox -s sanitize runs pytest (tools/sanitized_run.py, pytest's
    default capture): the log holds the report with its stack down to the
    planted line, and the run fails."""
    tests, line = planted_span_overrun
    env = _sanitized_environment()
    # What the sanitize session's own runner set (log_path) is the runner's
    # business here: the one under test sets its own.
    xdist = ["-p", "no:xdist"] if workers == "0" else ["-n", workers]
    result = subprocess.run(
        [sys.executable, "-m", "tools.sanitized_run", "--", sys.executable, "-m", "pytest",
         "-p", "no:cacheprovider", "-q", *xdist, "--rootdir", str(tests.parent), str(tests)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode != 0, log[-6000:]
    assert "===== sanitizer report: asan." in log, log[-6000:]
    report = _sanitizers()["report"](log)
    assert report is not None and "heap-buffer-overflow" in report, log[-6000:]
    assert re.search(rf"row_passes\.h:{line}\b", report), f"row_passes.h:{line} not in:\n{report}"
    # The stack goes on to the kernel that called load_span.
    assert "forward_row" in report, report[:6000]
    assert "sanitizer reports: " in log, log[-3000:]
