"""Which instruction set the CPU kernels run, and every variant of them.

On x86-64 the kernels are compiled for the baseline ISA, AVX2+FMA and AVX-512
and the widest the CPU supports is chosen at the first call; on arm64 for the
baseline and NEON, NEON being every arm64 CPU's. LLTM_CPU_ISA caps the choice.
The variants compute the same values (AVX2 and AVX-512 even bit for bit), so
results cannot tell which one ran: lltm._C.cpu_isa() says, and the tests here
hold it to /proc/cpuinfo and to LLTM_CPU_ISA. Then the parity, sequence,
fused-step and thread suites run again in a subprocess per variant below the
default one: each set has its own vector width and tile height in the
sequence kernels' fused steps (csrc/cpu/fused_steps/dispatch.h; on arm64 the baseline's
tiles are 4 rows of 16-byte vectors, NEON's 6).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import lltm
from lltm import _C

TESTS = Path(__file__).parent
MACHINE = platform.machine().lower()
X86_64 = MACHINE in ("x86_64", "amd64")
ARM64 = MACHINE in ("aarch64", "arm64")
# This architecture's sets, narrowest first, as LLTM_CPU_ISA's error lists them.
if X86_64:
    ORDER, CHOICES = ("baseline", "avx2", "avx512"), "baseline, avx2 or avx512"
elif ARM64:
    ORDER, CHOICES = ("baseline", "neon"), "baseline or neon"
else:
    ORDER, CHOICES = ("baseline",), "baseline"
# What the ISA flags of an x86-64 CPU are named in /proc/cpuinfo.
NEEDS = {
    "avx2": {"avx2", "fma"},
    "avx512": {"avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512dq"},
}


def _cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def _best() -> str:
    """The widest set of this CPU, found independently of lltm."""
    if ARM64:
        return "neon"  # Advanced SIMD is part of every arm64 CPU
    if not X86_64:
        return "baseline"
    flags = _cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo to tell which instruction sets this CPU has")
    return max(
        ("baseline", *(isa for isa, needed in NEEDS.items() if needed <= flags)), key=ORDER.index
    )


def _expected(cap: str | None) -> str:
    best = _best()
    return best if not cap else min(cap, best, key=ORDER.index)


def _run(code: str, isa: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LLTM_CPU_ISA"}
    if isa is not None:
        env["LLTM_CPU_ISA"] = isa
    return subprocess.run(
        [sys.executable, *(["-c", code] if code else []), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_this_process_runs_the_set_the_environment_asks_for():
    # Also run inside each per-variant suite below, where LLTM_CPU_ISA is set.
    assert _C.cpu_isa() == _expected(os.environ.get("LLTM_CPU_ISA"))


@pytest.mark.parametrize("cap", [None, "", *ORDER], ids=["unset", "empty", *ORDER])
def test_cap_lowers_the_choice_and_info_reports_it(cap):
    result = _run(
        "import json, lltm; from lltm import info; "
        "print(json.dumps([lltm._C.cpu_isa(), info.collect()['cpu_isa']]))",
        cap,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [_expected(cap)] * 2


# Misspellings, and the sets of the other architecture.
INVALID = ["avx3", "AVX2", " avx2", "sse2", "avx2,avx512", "NEON"] + [
    isa for isa in ("avx2", "avx512", "neon") if isa not in ORDER
]

_INVALID_SCRIPT = """
import json, lltm, torch
from lltm import info, reference

caught = []
def attempt(fn):
    try:
        fn()
    except ValueError as error:
        caught.append(str(error))

input, weights, bias, h, c = reference.example_inputs()  # batch 4, features 3, state 5
gates = torch.zeros(4, 15, dtype=h.dtype)
attempt(lltm._C.cpu_isa)
attempt(lambda: lltm.lltm_cell(input, weights, bias, h, c))
attempt(lambda: lltm.lltm_cell(input, weights, bias, h, c))  # every time, not once
attempt(lambda: torch.ops.lltm.backward(h, c, c, gates, input, h, weights, [True] * 5))
attempt(lambda: lltm.lltm_sequence(input[None], weights, bias, h, c))
report = info.collect()
print(json.dumps({"caught": caught, "cpu_isa": report["cpu_isa"],
                  "cpu_isa_error": report["cpu_isa_error"]}))
"""


@pytest.mark.parametrize("value", INVALID)
def test_invalid_value_is_an_error_at_every_kernel_call(value):
    result = _run(_INVALID_SCRIPT, value)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    message = (
        f"lltm: LLTM_CPU_ISA={value} is not an instruction set of lltm's CPU kernels; use {CHOICES}"
    )
    assert len(report["caught"]) == 5, report
    assert all(m.startswith(message) for m in report["caught"]), report["caught"]
    assert report["cpu_isa"] is None and report["cpu_isa_error"].startswith(message)
    for marker in ("Exception raised from", "frame #", "terminate called"):
        assert marker not in result.stderr, result.stderr


def test_invalid_value_does_not_stop_import_or_info():
    # `import lltm` still works and `lltm info` says what is wrong.
    result = _run("", "avx3", "-m", "lltm", "info")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("CPU instruction"))
    assert "none: lltm: LLTM_CPU_ISA=avx3 is not an instruction set" in row


def test_info_names_the_set_in_use():
    result = _run("", None, "-m", "lltm", "info")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("CPU instruction"))
    assert row.split()[-1] == _expected(None) == lltm._C.cpu_isa()


# The suites that reach the kernels' ISA-specific code: the pointwise spans
# of every dtype and layout, the sequence kernels' fused steps (their own
# tests at every tile, vector and pass boundary, the sequence suite and the
# inference forward's, bit for bit the training forward's), and
# the split of the work between threads. Compilation and opcheck test the
# Python registration, the same for every variant: left to the default run.
SUITES = [
    "test_parity.py",
    "test_sequence.py",
    "test_inference.py",
    "test_fused_steps.py",
    "test_threads.py",
    "test_layouts.py",
]


@pytest.mark.skipif(len(ORDER) < 2, reason="this architecture has one instruction set of lltm's")
@pytest.mark.parametrize("isa", ORDER[:-1])
def test_suites_pass_with_every_lower_isa(isa):
    best = _best()
    if ORDER.index(isa) > ORDER.index(best):
        pytest.skip(f"this CPU lacks {isa}")
    if isa == best:
        pytest.skip(f"{isa} is this CPU's default: the main test run covers it")
    result = _run(
        "",
        isa,
        *("-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not compile and not opcheck"),
        f"{TESTS / 'test_cpu_isa.py'}::test_this_process_runs_the_set_the_environment_asks_for",
        *(str(TESTS / suite) for suite in SUITES),
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
