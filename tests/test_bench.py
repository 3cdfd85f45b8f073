"""``python -m lltm bench`` runs end to end: functional checks at tiny sizes.

No timing is asserted: these tests only prove that every output the README
and benchmarks/RESULTS.md rely on (table, --json, --plot, --sweep) is
produced. torch.compile is left out (its warm-up alone takes seconds) except
in one test marked slow.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lltm import bench

# Tiny and quick: two blocks of about a millisecond per implementation and phase.
FAST = ["-b", "2", "-f", "3", "-s", "4", "-r", "2", "--block-seconds", "0.001", "--device", "cpu"]
EAGER = ["--impl", "lltm,lstmcell,gemm"]


def _run_json(capsys, *args: str) -> dict:
    assert bench.main([*FAST, *EAGER, "--json", "-", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_output_parses_and_covers_every_phase(capsys):
    report = _run_json(capsys)
    env = report["environment"]
    assert env["device"] == "cpu" and env["dtype"] == "float32" and env["blocks"] == 2
    assert env["command"].startswith("python -m lltm bench")
    rows = {row["impl"]: row for row in report["results"]}
    assert list(rows) == ["reference", "lltm", "lstmcell", "gemm"]  # reference always runs
    for impl, row in rows.items():
        assert (row["batch"], row["features"], row["state"]) == (2, 3, 4)
        assert row["error"] is None
        for phase in bench.PHASES:
            timing = row[phase]
            assert timing["blocks"] == 2
            assert 0 < timing["min_s"] <= timing["median_s"]
            assert timing["speedup_vs_reference"] > 0
        if impl == "gemm":
            assert row["saved_for_backward_bytes"] is None
        else:
            assert row["saved_for_backward_bytes"] >= row["saved_beyond_inputs_bytes"] > 0
    assert rows["reference"]["step"]["speedup_vs_reference"] == pytest.approx(1.0)


def test_json_to_file_and_table(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main([*FAST, *EAGER, "--dtype", "float64", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["environment"]["dtype"] == "float64"
    table = capsys.readouterr().out
    assert "2x3x4" in table and "lltm" in table and "speed-up" in table


def test_table_without_rich(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich.console", None)  # import fails
    assert bench.main([*FAST, "--impl", "lltm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("lltm ") and any(line.startswith("2x3x4  lltm") for line in lines)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    assert bench.main([*FAST, *EAGER, "--sizes", "2x3x4,3x2x5", "-q", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_runs_every_size(monkeypatch, capsys):
    monkeypatch.setattr(bench, "SWEEP", ((1, 2, 3), (2, 3, 4), (3, 1, 2)))
    report = _run_json(capsys, "--sweep")
    sizes = {(r["batch"], r["features"], r["state"]) for r in report["results"]}
    assert sizes == {(1, 2, 3), (2, 3, 4), (3, 1, 2)}
    assert len(report["results"]) == 3 * 4


def test_sweep_with_a_progress_bar(monkeypatch, capsys):
    pytest.importorskip("rich")
    monkeypatch.setattr(bench, "SWEEP", ((1, 2, 3), (2, 3, 4)))
    assert bench.main([*FAST, "--impl", "lltm", "--sweep"]) == 0
    assert "1x2x3" in capsys.readouterr().out


def test_threads_flag_is_applied(capsys, restore_num_threads):
    report = _run_json(capsys, "--threads", "1")
    assert report["environment"]["threads"] == 1


def test_failing_implementation_is_reported_not_fatal(monkeypatch, capsys):
    real = bench.make_case

    def make_case(impl, *args, **kwargs):
        if impl == "lstmcell":
            raise RuntimeError("not on this machine")
        return real(impl, *args, **kwargs)

    monkeypatch.setattr(bench, "make_case", make_case)
    rows = {r["impl"]: r for r in _run_json(capsys)["results"]}
    assert rows["lstmcell"]["error"] == "RuntimeError: not on this machine"
    assert rows["lltm"]["error"] is None


@pytest.mark.parametrize(
    "args",
    [["--impl", "nope"], ["--sizes", "2x3"], ["--dtype", "int8"], ["-r", "0"]],
    ids=["impl", "sizes", "dtype", "runs"],
)
def test_bad_arguments_exit_with_a_message(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(args)
    assert exit_info.value.code != 0


def test_command_line_entry_point():
    # The README's command, through `python -m lltm`, at a tiny size.
    out = subprocess.run(
        [sys.executable, "-m", "lltm", "bench", *FAST, *EAGER, "--json", "-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert {r["impl"] for r in json.loads(out)["results"]} == {
        "reference",
        "lltm",
        "lstmcell",
        "gemm",
    }


@pytest.mark.slow
def test_compiled_reference_runs(capsys):
    report = _run_json(capsys, "--impl", "compiled,lltm")
    rows = {r["impl"]: r for r in report["results"]}
    assert rows["compiled"]["error"] is None and rows["compiled"]["step"]["min_s"] > 0
