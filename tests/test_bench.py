"""``python -m lltm bench`` runs end to end: functional checks at tiny sizes.

No timing is asserted: these tests only prove that every output the README
and benchmarks/RESULTS.md rely on (table, --json, --sweep, --seq-len,
--per-sample, --autocast; benchmarks/render.py's tables and plots,
benchmarks/speedup_map.py's map, benchmarks/gpu.sh's commands) is produced,
and that what is timed is
what the table says: which tensors require grad, the same weights for every
LLTM implementation, the matrix products of the GEMM floor, per-sample
gradients that are each sample's own. torch.compile is left
out (its warm-up alone takes seconds) except in one test marked slow.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lltm import bench, reference
from lltm.bench import cases, cli, flops, kinds, timing

# Tiny and quick: two blocks of about a millisecond per implementation and
# phase, on one thread (a second thread only adds waits on a busy machine).
FAST = [
    *("-b", "2", "-f", "3", "-s", "4", "-r", "2", "--block-seconds", "0.001"),
    *("--device", "cpu", "--threads", "1"),
]
EAGER = ["--impl", "lltm,lstmcell,gemm"]
SEQUENCE_IMPLS = [
    *("reference-loop", "lltm-loop", "lltm-sequence", "lltm-sequence-per-step"),
    *("lstm", "lstm-notf32", "gemm"),
]
PER_SAMPLE_IMPLS = ["lltm-loop", "lltm-vmap", "lltm-batched", "lstm-vmap", "lstm-loop"]
ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")

pytestmark = [
    # The bench sets torch's thread count (--threads); put it back after each
    # test. The large GEMM at a small size (small_large_gemm).
    pytest.mark.usefixtures("restore_num_threads", "small_large_gemm"),
    # Every op has native CPU kernels: what is timed must not be the fallback.
    pytest.mark.filterwarnings("error:lltm.*no native cpu kernel:RuntimeWarning"),
]


@pytest.fixture
def small_large_gemm(monkeypatch):
    """The large GEMM every sequence run times beside its rows, at 64 rather
    than 1024 on the CPU: the same code, at a size whose 16-bit product under
    autocast takes milliseconds rather than most of a minute on a CPU without
    16-bit units (where the autocast tests spent their time)."""
    monkeypatch.setitem(kinds.LARGE_GEMM, "cpu", 64)


def _run_json(capsys, *args: str) -> dict:
    assert bench.main([*FAST, "--json", "-", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _rows(report: dict) -> dict[tuple[int | None, str], dict]:
    return {(row["seq_len"], row["impl"]): row for row in report["results"]}


def _check_timings(
    row: dict, comparisons: tuple[str, ...] = ("speedup_vs_reference",), kind=kinds.CELL
) -> None:
    assert row["error"] is None
    # A field for each phase the kind times, and none for the others.
    assert [phase for phase in (bench.NO_GRAD, *bench.PHASES) if phase in row] == list(kind.phases)
    for phase in kind.phases:
        timing = row[phase]
        assert timing["blocks"] == 2
        assert 0 < timing["min_s"] <= timing["median_s"]
        for key in comparisons:
            assert timing[key] > 0
    if row["impl"] == "gemm" or not kind.saved_memory:
        assert row["saved_for_backward_bytes"] is None
    else:
        assert row["saved_for_backward_bytes"] >= row["saved_beyond_inputs_bytes"] >= 0


# --- The cell (default) ----------------------------------------------------------


def test_json_output_parses_and_covers_every_phase(capsys):
    report = _run_json(capsys, *EAGER)
    env = report["environment"]
    assert env["device"] == "cpu" and env["dtype"] == "float32" and env["blocks"] == 2
    assert env["command"].startswith("python -m lltm bench")
    rows = {row["impl"]: row for row in report["results"]}
    assert list(rows) == ["reference", "lltm", "lstmcell", "gemm"]  # reference always runs
    for row in rows.values():
        assert (row["batch"], row["features"], row["state"], row["seq_len"]) == (2, 3, 4, None)
        _check_timings(row)
        assert "speedup_vs_lstm" not in row["step"]
    assert rows["reference"]["step"]["speedup_vs_reference"] == pytest.approx(1.0)


def test_default_is_the_tutorials_configuration(capsys):
    env = _run_json(capsys, *EAGER)["environment"]
    assert (env["case"], env["inputs_grad"], env["seq_len"]) == ("cell", False, None)
    assert "tutorial's configuration" in bench.report.title(env)
    # Only the parameters require grad, and only they are differentiated.
    for impl in ("reference", "lltm", "lstmcell"):
        case = cases.make_case(impl, kinds.Size(2, 3, 4), CPU, torch.float32)
        x, h, c, *parameters = case.inputs
        assert not (x.requires_grad or h.requires_grad or c.requires_grad)
        assert case.leaves == parameters and len(case.step()) == len(parameters)
        assert all(isinstance(t, torch.nn.Parameter) for t in case.leaves)


@pytest.mark.parametrize("seq_len", [None, 3])
@pytest.mark.parametrize("impl", ["reference", "lltm", "lltm-sequence"])
def test_both_losses_give_the_same_gradients(impl, seq_len):
    # The tutorial's loss, (new_h.sum() + new_cell.sum()).backward(), and
    # dense ones handed to autograd: the same gradients, reaching the cell
    # as broadcasts in the first case.
    if (impl == "lltm-sequence") != (seq_len is not None):
        impl = "lltm-loop" if seq_len else impl.removesuffix("-sequence")
    grads = {}
    for loss in kinds.LOSSES:
        size = kinds.Size(2, 3, 4, seq_len, loss)
        case = cases.make_case(impl, size, CPU, torch.float64, inputs_grad=True)
        returned = case.step()
        if loss == "sum":
            assert returned is None  # .backward(): into .grad
            returned = [t.grad for t in case.leaves]
        grads[loss] = returned
    for ours, theirs in zip(grads["sum"], grads["dense"], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_the_loss_is_a_column_and_speed_ups_compare_the_same_loss(render, capsys):
    report = _run_json(capsys, "--impl", "lltm")
    assert report["environment"]["losses"] == ["sum", "dense"]
    assert [(r["loss"], r["impl"]) for r in report["results"]] == [
        ("sum", "reference"),
        ("sum", "lltm"),
        ("dense", "reference"),
        ("dense", "lltm"),
    ]
    for row in report["results"]:
        if row["impl"] == "reference":
            assert row["step"]["speedup_vs_reference"] == pytest.approx(1.0)
    header, rows = bench.report.table_rows(*render.from_json(report))
    assert header[:3] == ["size", "loss", "impl"]
    assert [row[1] for row in rows] == ["sum", "sum", "dense", "dense"]
    with pytest.raises(SystemExit):
        cli.parse(["--overhead", "--loss", "sum"])  # the fixed cost: dense gradients only


def test_inputs_grad_differentiates_the_inputs_too(capsys):
    env = _run_json(capsys, *EAGER, "--inputs-grad")["environment"]
    assert (env["case"], env["inputs_grad"]) == ("cell", True)
    assert "--inputs-grad" in bench.report.title(env)
    case = cases.make_case("lltm", kinds.Size(2, 3, 4), CPU, torch.float32, inputs_grad=True)
    assert case.leaves == case.inputs and len(case.step()) == 5


def test_json_to_file_and_table(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main([*FAST, *EAGER, "--dtype", "float64", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["environment"]["dtype"] == "float64"
    table = capsys.readouterr().out
    assert "2x3x4" in table and "lltm" in table and "speed-up" in table
    assert "tutorial's configuration" in table


def test_table_without_rich(monkeypatch, capsys):
    # Imports of rich fail (the progress bar's too: two losses, two rows of sizes).
    monkeypatch.setitem(sys.modules, "rich.console", None)
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    assert bench.main([*FAST, "--impl", "lltm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("lltm ")
    assert any(line.split()[:3] == ["2x3x4", "sum", "lltm"] for line in lines)


@pytest.fixture
def saved_figures(monkeypatch):
    """The matplotlib figures the bench saves, as they are saved."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    figures = []
    real_savefig = Figure.savefig

    def savefig(self, *args, **kwargs):
        figures.append(self)
        return real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def _panels(figure):
    """Per panel: (x label, tick labels, {line label: y values})."""
    return [
        (
            ax.get_xlabel(),
            [t.get_text() for t in ax.get_xticklabels()],
            {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()},
        )
        for ax in figure.axes
    ]


PNG = b"\x89PNG\r\n\x1a\n"


def _plotted(render, args: list[str], path: Path, saved_figures: list) -> list:
    """The panels of the one figure `render.py RUN.json --plot PATH` saves as a
    PNG, of the run `lltm bench ARGS` writes."""
    data = path.with_suffix(".json")
    assert bench.main([*FAST, *args, "-q", "--json", str(data)]) == 0
    with contextlib.redirect_stdout(io.StringIO()):  # its markdown
        assert render.main([str(data), "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == PNG
    [figure] = saved_figures
    return _panels(figure)


def test_plot_writes_a_png(render, tmp_path, saved_figures):
    args = [*EAGER, "--sizes", "2x3x4,3x2x5"]
    # What is drawn: time per size for every implementation, speed-ups
    # against the reference for the others.
    panels = _plotted(render, args, tmp_path / "bench.png", saved_figures)
    (xlabel, ticks, times), (_, _, speedups) = panels
    assert (xlabel, ticks) == ("batch x features x state", ["2x3x4", "3x2x5"])
    assert set(times) == {"reference", "lltm", "lstmcell", "GEMMs only"}
    assert all(len(ys) == 2 and min(ys) > 0 for ys in times.values())
    assert {"lltm step", "lltm forward", "lstmcell step"} <= set(speedups)
    assert "reference step" not in speedups


def test_plot_axis_names_what_varies(render):
    axis = render._axis
    cells = [kinds.Size(2, 3, 4), kinds.Size(3, 2, 5)]
    assert axis(cells, "batch") == (["2x3x4", "3x2x5"], "batch x features x state")
    lengths = [kinds.Size(2, 3, 4, t) for t in (5, 10)]
    assert axis(lengths, "batch") == (["5", "10"], "sequence length T (at 2x3x4)")
    samples = [kinds.Size(b, 3, 4, 50) for b in (1, 8)]
    assert axis(samples, "samples") == (["1x3x4", "8x3x4"], "samples x features x state (T=50)")
    both = [kinds.Size(1, 3, 4, 5), kinds.Size(8, 3, 4, 10)]
    assert axis(both, "batch")[1] == "batch x features x state, sequence length"


def test_sweep_runs_every_size(monkeypatch, capsys):
    monkeypatch.setattr(kinds, "SWEEP", ((1, 2, 3), (2, 3, 4), (3, 1, 2)))
    report = _run_json(capsys, *EAGER, "--sweep")
    sizes = {(r["batch"], r["features"], r["state"]) for r in report["results"]}
    assert sizes == {(1, 2, 3), (2, 3, 4), (3, 1, 2)}
    assert len(report["results"]) == 3 * 2 * 4  # sizes x losses x implementations


def test_sweep_with_a_progress_bar(monkeypatch, capsys):
    rich_progress = pytest.importorskip("rich.progress")
    monkeypatch.setattr(kinds, "SWEEP", ((1, 2, 3), (2, 3, 4)))
    # The bar is transient (gone from the output once done): count what it is
    # told instead, through rich's own Progress.
    descriptions, advances = [], []
    real_update, real_advance = rich_progress.Progress.update, rich_progress.Progress.advance

    def update(self, task, *args, description=None, **kwargs):
        if description is not None:
            descriptions.append(description)
        return real_update(self, task, *args, description=description, **kwargs)

    def advance(self, task, amount=1):
        advances.append(amount)
        return real_advance(self, task, amount)

    monkeypatch.setattr(rich_progress.Progress, "update", update)
    monkeypatch.setattr(rich_progress.Progress, "advance", advance)
    assert bench.main([*FAST, "--impl", "lltm", "--sweep"]) == 0
    # One label per size and loss; one step per block: 2 sizes x 2 losses x 2
    # implementations (reference always runs) x 3 phases x 2 blocks.
    assert [d.split()[:2] for d in descriptions] == [
        ["1x2x3", "sum"],
        ["1x2x3", "dense"],
        ["2x3x4", "sum"],
        ["2x3x4", "dense"],
    ]
    assert sum(advances) == 2 * 2 * 2 * len(bench.PHASES) * 2
    table = capsys.readouterr().out
    assert "1x2x3" in table and "2x3x4" in table


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_flag_is_applied(threads, monkeypatch, capsys):
    # The thread count the timed calls run with, not only the one reported.
    seen = set()
    real = cases.make_case

    def make_case(*args, **kwargs):
        case = real(*args, **kwargs)
        for phase in ("forward", "step"):
            timed = getattr(case, phase)

            def record(timed=timed):
                seen.add(torch.get_num_threads())
                return timed()

            setattr(case, phase, record)
        return case

    monkeypatch.setattr(cases, "make_case", make_case)
    report = _run_json(capsys, *EAGER, "--threads", str(threads))  # after FAST's --threads 1
    assert report["environment"]["threads"] == threads
    assert seen == {threads}


def test_failing_implementation_is_reported_not_fatal(monkeypatch, capsys):
    real = cases.make_case

    def make_case(impl, *args, **kwargs):
        if impl in ("lstmcell", "lstm"):
            raise RuntimeError("not on this machine")
        return real(impl, *args, **kwargs)

    monkeypatch.setattr(cases, "make_case", make_case)
    rows = {r["impl"]: r for r in _run_json(capsys, *EAGER)["results"]}
    assert rows["lstmcell"]["error"] == "RuntimeError: not on this machine"
    assert rows["lltm"]["error"] is None
    # The sequence table keeps its rival column without the rival.
    report = _run_json(capsys, "--seq-len", "2", "--impl", "lltm-sequence,lstm")
    rows = {r["impl"]: r for r in report["results"]}
    assert rows["lstm"]["error"] == "RuntimeError: not on this machine"
    assert rows["lltm-sequence"]["step"]["speedup_vs_lstm"] is None


# --- Sequences -------------------------------------------------------------------


def test_sequence_runs_every_implementation_per_length(capsys):
    report = _run_json(capsys, "--seq-len", "2,3", "--impl", "all")
    env = report["environment"]
    assert (env["case"], env["inputs_grad"], env["seq_len"]) == ("sequence", False, [2, 3])
    rows = _rows(report)
    assert list(rows) == [(t, impl) for t in (2, 3) for impl in SEQUENCE_IMPLS]
    for row in rows.values():
        _check_timings(row, ("speedup_vs_reference", "speedup_vs_lstm"))
    for t in (2, 3):
        assert rows[t, "reference-loop"]["step"]["speedup_vs_reference"] == pytest.approx(1.0)
        assert rows[t, "lstm"]["step"]["speedup_vs_lstm"] == pytest.approx(1.0)


def test_sequence_default_implementations_and_table(capsys):
    assert bench.main([*FAST, "--seq-len", "2", "--inputs-grad"]) == 0
    table = capsys.readouterr().out
    assert "sequence, gradients of the parameters, input, h_0 and c_0" in table
    assert "vs nn.LSTM" in table
    for impl in kinds.SEQUENCE.defaults:
        assert impl in table
    # The floor and the variants are opt-in, as for the cell.
    for impl in ("gemm", "lltm-sequence-per-step", "lstm-notf32"):
        assert impl not in table


@pytest.mark.parametrize("inputs_grad", [False, True], ids=["parameters", "inputs-grad"])
def test_sequence_implementations_compute_the_same_thing(inputs_grad):
    # Same weights (loaded from the reference) and inputs: same outputs and
    # gradients, so the table compares like with like.
    size = kinds.Size(3, 5, 4, seq_len=4)
    outputs, grads = {}, {}
    for impl in ("reference-loop", "lltm-loop", "lltm-sequence"):
        case = cases.make_case(impl, size, CPU, torch.float64, inputs_grad=inputs_grad)
        assert len(case.leaves) == (5 if inputs_grad else 2)
        outputs[impl] = [t.detach() for t in case.forward()]
        grads[impl] = case.step()
    for impl in ("lltm-loop", "lltm-sequence"):
        h_n, c_n = outputs[impl][1:]
        torch.testing.assert_close(outputs[impl][0], outputs["reference-loop"][0])
        torch.testing.assert_close(h_n.reshape(3, 4), outputs["reference-loop"][1])
        torch.testing.assert_close(c_n.reshape(3, 4), outputs["reference-loop"][2])
        for ours, theirs in zip(grads[impl], grads["reference-loop"], strict=True):
            torch.testing.assert_close(ours, theirs)
    lstm = cases.make_case("lstm", size, CPU, torch.float64, inputs_grad=inputs_grad)
    assert len(lstm.step()) == (7 if inputs_grad else 4)


@pytest.mark.parametrize(
    ("impl", "same_as", "setting", "during"),
    [
        ("lltm-sequence-per-step", "lltm-sequence", lambda: os.environ.get("LLTM_CUDA_PERSISTENT"),
         "0"),
        ("lstm-notf32", "lstm", lambda: torch.backends.cudnn.allow_tf32, False),
    ],
)  # fmt: skip
def test_scoped_implementations_are_another_in_a_setting(impl, same_as, setting, during):
    # Each phase runs in the setting, which is back as it was after; the
    # results are those of the implementation it varies.
    size = kinds.Size(3, 5, 4, seq_len=4)
    case = cases.make_case(impl, size, CPU, torch.float64)
    other = cases.make_case(same_as, size, CPU, torch.float64)
    before = setting()
    seen = []
    call = case.call
    case.call = lambda: (seen.append(setting()), call())[1]
    for phase in kinds.SEQUENCE.phases:
        got, want = case.phase(phase)(), other.phase(phase)()
        for ours, theirs in zip(got, want, strict=True):
            torch.testing.assert_close(ours, theirs)
        assert setting() == before
    assert seen and all(value == during for value in seen)
    assert case.saved_for_backward() == other.saved_for_backward()


def test_the_table_names_the_sequence_ops_path(render):
    # On a GPU, lltm-sequence's rows say which path ran (clusters, a
    # cooperative grid or per-step); the JSON keeps the plugin's description.
    size = kinds.Size(16, 32, 128, seq_len=50)
    persistent = "persistent, clusters: 8 groups x 16 blocks (...)"
    paths = {
        "lltm-sequence": {"forward": persistent, "backward": persistent},
        "lltm-sequence-per-step": {"forward": "per-step (x)", "backward": "per-step (x)"},
        "lltm-loop": None,
    }
    mixed = {"forward": "per-step (16-bit)", "backward": "persistent, cooperative grid: 1 x 2"}
    assert bench.report.short_path(mixed) == "fwd per-step, bwd cooperative"
    results = [
        timing.Result(size, impl, {p: [1e-3] for p in kinds.PHASES}, path=path)
        for impl, path in paths.items()
    ]
    env = {**cli.environment(CPU, torch.float32, 1), "blocks": 1, "command": "x", "case": "sequence",
           "inputs_grad": False, "seq_len": [50]}  # fmt: skip
    report = bench.report.to_json(results, env)
    assert [row.get("path") for row in report["results"]] == list(paths.values())
    header, rows = bench.report.table_rows(*render.from_json(report))
    labels = [row[header.index("impl")] for row in rows]
    assert labels == ["lltm-sequence (clusters)", "lltm-sequence-per-step (per-step)", "lltm-loop"]
    # On the CPU there is nothing to name.
    assert cli.sequence_path("lltm-sequence", size, CPU, torch.float32) is None


@pytest.mark.parametrize("inputs_grad", [False, True], ids=["parameters", "inputs-grad"])
def test_sequence_rates_of_the_products_against_a_large_gemm(render, inputs_grad, capsys):
    # Every LLTM implementation's step rate in GFLOP/s of the products it
    # needs, and that against a large GEMM timed in the same run.
    report = _run_json(
        capsys,
        *("--seq-len", "3", "--impl", "all", "--loss", "sum"),
        *(["--inputs-grad"] if inputs_grad else []),
    )
    large = report["environment"]["large_gemm"]
    assert large["n"] == kinds.LARGE_GEMM["cpu"] and large["blocks"] == 2
    assert large["gflops"] > 0
    size = kinds.Size(2, 3, 4, seq_len=3)
    for (_, impl), row in _rows(report).items():
        if impl.startswith("lstm"):  # four gates: other products
            assert row["flops"] is None
            assert row["step"]["gflops"] is None and row["step"]["of_large_gemm"] is None
            continue
        assert row["flops"] == flops.product_flops(size, inputs_grad)
        for phase in kinds.PHASES:
            gflops = row["flops"][phase] / row[phase]["median_s"] / 1e9
            assert row[phase]["gflops"] == pytest.approx(gflops)
            assert row[phase]["of_large_gemm"] == pytest.approx(gflops / large["gflops"])
    # The table: the step's rate and fraction, the large GEMM's in the title.
    header, rows = bench.report.table_rows(*render.from_json(report))
    column = header.index("step GFLOP/s (of the large GEMM's)")
    by_impl = {row[header.index("impl")]: row[column] for row in rows}
    assert by_impl["lstm"] == by_impl["lstm-notf32"] == "-"
    assert all("(" in by_impl[impl] for impl in SEQUENCE_IMPLS if not impl.startswith("lstm"))
    title = bench.report.title(render.from_json(report)[1])
    assert f"a large GEMM (torch.mm, {large['n']}^3) ran at" in title


@pytest.mark.parametrize("inputs_grad", [False, True], ids=["parameters", "inputs-grad"])
def test_product_flops_are_those_of_the_gemm_floor(inputs_grad):
    # The count is what the gemm case computes, measured by torch's counter.
    size = kinds.Size(2, 3, 4, seq_len=5)
    case = cases.make_case("gemm", size, CPU, torch.float32, inputs_grad=inputs_grad)
    forward, backward = _flops(case)
    counted = flops.product_flops(size, inputs_grad)
    assert (counted["forward"], counted["backward"]) == (forward, backward)
    assert counted["step"] == forward + backward


def test_cells_and_per_sample_count_no_products(render, capsys):
    for args in ([], ["--per-sample", "--seq-len", "2", "--impl", "lltm-vmap"]):
        report = _run_json(capsys, *args)
        assert "large_gemm" not in report["environment"]
        assert all("flops" not in row for row in report["results"])
        header, _ = bench.report.table_rows(*render.from_json(report))
        assert not any("GFLOP/s" in column for column in header)


def test_large_gemm_is_square_of_the_runs_dtype():
    fn, n, operations = flops.large_gemm(CPU, torch.float64)
    out = fn()
    assert out.shape == (n, n) and out.dtype == torch.float64 and operations == 2 * n**3


def test_sequence_plot_against_length(render, tmp_path, saved_figures):
    # Time, speed-up against the reference loop and against nn.LSTM, each
    # against the sequence length.
    panels = _plotted(
        render, ["--seq-len", "2,3", "--impl", "all"], tmp_path / "seq.png", saved_figures
    )
    assert len(panels) == 3
    for xlabel, ticks, lines in panels:
        assert xlabel == "sequence length T (at 2x3x4)" and ticks == ["2", "3"]
        assert all(len(ys) == 2 for ys in lines.values())
    assert set(panels[0][2]) == {*SEQUENCE_IMPLS[:-1], "GEMMs only"}
    assert "lltm-sequence step" in panels[1][2] and "lltm-sequence step" in panels[2][2]


def test_sequence_with_several_sizes(render, capsys):
    report = _run_json(
        capsys, "--sizes", "2x3x4,1x2x3", "--seq-len", "2", "--impl", "lltm-loop", "--loss", "sum"
    )
    assert [(r["batch"], r["seq_len"], r["loss"], r["impl"]) for r in report["results"]] == [
        (2, 2, "sum", "reference-loop"),
        (2, 2, "sum", "lltm-loop"),
        (1, 2, "sum", "reference-loop"),
        (1, 2, "sum", "lltm-loop"),
    ]
    # nn.LSTM not asked for: no column compares with it.
    header, _ = bench.report.table_rows(*render.from_json(report))
    assert not any("nn.LSTM" in column for column in header)


# --- Per-sample gradients --------------------------------------------------------


def test_per_sample_runs_every_implementation(capsys):
    report = _run_json(capsys, "--per-sample", "--seq-len", "2", "--impl", "all")
    env = report["environment"]
    assert (env["case"], env["inputs_grad"], env["seq_len"]) == ("per-sample", False, [2])
    rows = _rows(report)
    assert list(rows) == [(2, impl) for impl in PER_SAMPLE_IMPLS]
    for row in rows.values():
        assert (row["batch"], row["features"], row["state"]) == (2, 3, 4)
        _check_timings(row, ("speedup_vs_reference", "speedup_vs_lstm_vmap"), kinds.PER_SAMPLE)
    assert rows[2, "lltm-loop"]["step"]["speedup_vs_reference"] == pytest.approx(1.0)
    assert rows[2, "lstm-vmap"]["step"]["speedup_vs_lstm_vmap"] == pytest.approx(1.0)


def test_per_sample_defaults():
    # 32 samples of 50 steps unless -b or --seq-len say otherwise; the other
    # kinds keep their batch of 16.
    args = cli.parse(["--per-sample"])
    assert cli.sizes_of(args) == [kinds.Size(32, 32, 128, seq_len=50)]
    assert args.impl == ["lltm-loop", "lltm-vmap", "lltm-batched", "lstm-vmap"]
    args = cli.parse(["--per-sample", "-b", "8", "--seq-len", "10,20"])
    assert cli.sizes_of(args) == [kinds.Size(8, 32, 128, t) for t in (10, 20)]
    # Cells and sequences: the tutorial's loss, then dense gradients.
    assert cli.sizes_of(cli.parse([])) == [
        kinds.Size(16, 32, 128, loss="sum"),
        kinds.Size(16, 32, 128, loss="dense"),
    ]
    assert cli.sizes_of(cli.parse(["--seq-len", "5", "--loss", "dense"])) == [
        kinds.Size(16, 32, 128, 5, "dense")
    ]


def test_per_sample_table_has_no_columns_it_does_not_measure(capsys):
    assert bench.main([*FAST, "--per-sample", "--seq-len", "2"]) == 0
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if "impl" in line)
    assert "step min / median" in header and "vs nn.LSTM under vmap step" in header
    for absent in ("forward", "backward", "fwd", "bwd", "saved"):
        assert absent not in table
    for impl in PER_SAMPLE_IMPLS[:-1]:
        assert impl in table
    assert "lstm-loop" not in table  # opt-in


def _per_sample_cases(impls: list[str], dtype: torch.dtype) -> dict[str, cases.PerSampleCase]:
    size = kinds.Size(3, 5, 4, seq_len=4)
    return {impl: cases.make_case(impl, size, CPU, dtype, kind=kinds.PER_SAMPLE) for impl in impls}


def test_per_sample_gradients_are_each_samples_own():
    per_impl = _per_sample_cases(PER_SAMPLE_IMPLS[:3], torch.float64)
    x, target = per_impl["lltm-loop"].samples
    assert x.shape == (3, 4, 5) and target.shape == (3, 4, 4)
    for case in per_impl.values():  # the same samples for all
        assert all(torch.equal(a, b) for a, b in zip(case.samples, (x, target), strict=True))
    grads = {impl: case.gradients() for impl, case in per_impl.items()}
    loop = grads["lltm-loop"]
    assert {name: g.shape for name, g in loop.items()} == {"weights": (3, 12, 9), "bias": (3, 12)}
    # Sample 1's gradients, from the tutorial's cell stepped by hand with the
    # weights the bench gave every LLTM implementation.
    cell = reference.LLTM(5, 4).double()
    cell.load_state_dict(per_impl["lltm-loop"].module.state_dict())
    h = c = torch.zeros(1, 4, dtype=torch.float64)
    outputs = []
    for step in x[1]:
        h, c = cell(step[None], (h, c))
        outputs.append(h)
    loss = torch.nn.functional.mse_loss(torch.cat(outputs), target[1])
    expected = torch.autograd.grad(loss, [cell.weights, cell.bias])
    for name, e in zip(("weights", "bias"), expected, strict=True):
        torch.testing.assert_close(loop[name][1], e)
        # Each sample's own: no two alike.
        assert not torch.allclose(loop[name][0], loop[name][1])
        torch.testing.assert_close(grads["lltm-vmap"][name], loop[name])
        # The batched floor computes the gradient of the mean loss instead.
        torch.testing.assert_close(grads["lltm-batched"][name], loop[name].mean(0))


def test_per_sample_gradients_of_nn_lstm():
    # float32: torch 2.13's CPU LSTM runs under vmap(grad) only through
    # oneDNN (its other path fails there: lstm-vmap then reports an error).
    per_impl = _per_sample_cases(["lstm-loop", "lstm-vmap"], torch.float32)
    loop, vmapped = (case.gradients() for case in per_impl.values())
    assert len(loop) == 4 and all(g.shape[0] == 3 for g in loop.values())
    for name, g in loop.items():
        torch.testing.assert_close(vmapped[name], g)


def test_per_sample_plot_and_render(render, tmp_path, saved_figures, capsys):
    data = tmp_path / "per_sample.json"
    args = ["--per-sample", "--seq-len", "2,3", "--json", str(data)]
    # Time, speed-up against lltm-loop and against nn.LSTM under vmap, each
    # against the sequence length; speed-ups of the step only.
    panels = _plotted(render, args, tmp_path / "per_sample.png", saved_figures)
    assert len(panels) == 3
    for xlabel, ticks, _ in panels:
        assert xlabel == "sequence length T (at 2x3x4)" and ticks == ["2", "3"]
    drawn = [{label for label in lines if not label.startswith("_")} for _, _, lines in panels]
    assert drawn[0] == set(PER_SAMPLE_IMPLS[:-1])
    assert drawn[1] == {"lltm-vmap step", "lltm-batched step", "lstm-vmap step"}
    assert drawn[2] == {"lltm-loop step", "lltm-vmap step", "lltm-batched step"}
    assert render.main([str(data)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "per-sample gradients of the parameters" in lines[2]
    assert (
        "| size | T | impl | step min / median | speed-up step | vs nn.LSTM under vmap step |"
        in lines
    )
    assert sum(line.startswith("| 2x3x4 | 3 |") for line in lines) == 4


# --- Per-call overhead -----------------------------------------------------------

OVERHEAD_IMPLS = ["reference", "lltm", "lstmcell", "lltm-sequence", "lstm"]


def test_overhead_runs_every_implementation(capsys):
    report = _run_json(capsys, "--overhead")
    env = report["environment"]
    assert (env["case"], env["inputs_grad"], env["seq_len"]) == ("overhead", False, None)
    rows = {row["impl"]: row for row in report["results"]}
    assert list(rows) == OVERHEAD_IMPLS
    for row in rows.values():
        assert (row["batch"], row["features"], row["state"]) == (2, 3, 4)  # FAST's -b -f -s
        _check_timings(row, ("speedup_vs_reference", "speedup_vs_lstmcell"), kinds.OVERHEAD)
    assert rows["reference"]["no_grad"]["speedup_vs_reference"] == pytest.approx(1.0)
    assert rows["lstmcell"]["step"]["speedup_vs_lstmcell"] == pytest.approx(1.0)


def test_overhead_defaults_to_the_smallest_cell():
    args = cli.parse(["--overhead"])
    assert cli.sizes_of(args) == [kinds.Size(1, 2, 2)]
    assert args.impl == OVERHEAD_IMPLS
    assert cli.sizes_of(cli.parse(["--overhead", "-s", "8"])) == [kinds.Size(1, 2, 8)]
    assert cli.sizes_of(cli.parse(["--overhead", "--sizes", "3x4x5"])) == [kinds.Size(3, 4, 5)]
    # The other kinds keep their sizes (and their losses).
    assert cli.sizes_of(cli.parse(["-s", "8"])) == [
        kinds.Size(16, 32, 8, loss="sum"),
        kinds.Size(16, 32, 8, loss="dense"),
    ]


@pytest.mark.parametrize("inputs_grad", [False, True], ids=["parameters", "inputs-grad"])
def test_overhead_phases_time_what_they_say(inputs_grad):
    size = kinds.Size(1, 2, 2)
    per_impl = {
        impl: cases.make_case(
            impl, size, CPU, torch.float64, inputs_grad=inputs_grad, kind=kinds.OVERHEAD
        )
        for impl in OVERHEAD_IMPLS
    }
    # The forward under no_grad records no graph; the step's forward does.
    for case in per_impl.values():
        assert all(t.grad_fn is None and not t.requires_grad for t in case.no_grad())
        assert all(t.grad_fn is not None for t in case.forward())
        _x, _h, _c, *parameters = case.inputs
        differentiated = case.inputs if inputs_grad else parameters
        assert list(map(id, case.leaves)) == list(map(id, differentiated))
        assert len(case.step()) == len(differentiated)
    # The same weights and inputs for both LLTM implementations.
    reference_case, lltm_case = per_impl["reference"], per_impl["lltm"]
    torch.testing.assert_close(lltm_case.no_grad(), reference_case.no_grad())
    torch.testing.assert_close(lltm_case.step(), reference_case.step())
    # The sequence rows: one step of the same cell, on the same values.
    for impl in kinds.OVERHEAD_SEQUENCES:
        assert per_impl[impl].inputs[0].shape == (kinds.OVERHEAD_SEQ_LEN, 1, 2)
    output, h_n, c_n = per_impl["lltm-sequence"].no_grad()
    new_h, new_cell = reference_case.no_grad()
    torch.testing.assert_close((output[0], h_n[0], c_n[0]), (new_h, new_h, new_cell))


def test_overhead_table(capsys):
    assert bench.main([*FAST, "--overhead"]) == 0
    table = capsys.readouterr().out
    assert "per-call overhead, one cell step at the smallest size" in table
    header = next(line for line in table.splitlines() if "impl" in line)
    assert "no-grad forward min / median" in header and "step min / median" in header
    assert "vs nn.LSTMCell no-grad fwd / step" in header
    for absent in ("backward min", "bwd", "saved"):
        assert absent not in table
    for impl in OVERHEAD_IMPLS:
        assert impl in table


def test_overhead_plot_and_render(render, tmp_path, saved_figures, capsys):
    data = tmp_path / "overhead.json"
    args = ["--overhead", "--sizes", "1x2x2,2x2x2", "--json", str(data)]
    panels = _plotted(render, args, tmp_path / "overhead.png", saved_figures)
    assert len(panels) == 3  # time, against the reference, against nn.LSTMCell
    drawn = [{label for label in lines if not label.startswith("_")} for _, _, lines in panels]
    assert drawn[0] == set(OVERHEAD_IMPLS)
    assert drawn[2] == {
        f"{impl} {phase}"
        for impl in ("lltm", "reference", "lltm-sequence", "lstm")
        for phase in ("no_grad", "step")
    }
    assert render.main([str(data)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "per-call overhead" in lines[2]
    assert sum(line.startswith("| 2x2x2 |") for line in lines) == len(OVERHEAD_IMPLS)


def test_render_across_runs_of_another_phase(render, tmp_path, capsys):
    runs = [tmp_path / f"run{i}.json" for i in (1, 2)]
    for run in runs:
        assert bench.main([*FAST, "--overhead", "-q", "--json", str(run)]) == 0
    assert render.main(["--across", "--phase", "no_grad", *map(str, runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("2 runs of overhead at 2x3x4: no_grad medians in ")
    assert "against the eager reference and against nn.LSTMCell" in lines[0]
    assert lines[2] == "| run | reference | lltm | lstmcell | lltm-sequence | lstm |"
    # Every row: the reference's no-grad speed-up against itself, 1.
    assert len(lines) == 7
    assert all("(1.00x; " in line.split(" | ")[1] for line in lines[4:])
    with pytest.raises(SystemExit, match="overhead runs time no backward phase"):
        render.main(["--across", "--phase", "backward", *map(str, runs)])


# --- The GEMM floor --------------------------------------------------------------


def _flops(case: bench.Case) -> tuple[int, int]:
    counts = []
    for phase in ("forward", "backward"):
        with FlopCounterMode(display=False) as counter:
            case.phase(phase)()
        counts.append(counter.get_total_flops())
    return counts[0], counts[1]


@pytest.mark.parametrize("inputs_grad", [False, True], ids=["parameters", "inputs-grad"])
def test_gemm_floor_of_a_cell(inputs_grad):
    b, f, s = 2, 3, 4
    case = cases.make_case("gemm", kinds.Size(b, f, s), CPU, torch.float32, inputs_grad=inputs_grad)
    gemm = 2 * b * (s + f) * 3 * s  # multiply-adds of one (b, s+f) x (s+f, 3s) product, x2
    # Forward: [h, x] @ W^T. Backward: the weight gradient, and the input
    # gradient d_gates @ W only when the inputs need it.
    assert _flops(case) == (gemm, gemm * (2 if inputs_grad else 1))


@pytest.mark.parametrize("inputs_grad", [False, True], ids=["parameters", "inputs-grad"])
def test_gemm_floor_of_a_sequence(inputs_grad):
    t, b, f, s = 5, 2, 3, 4
    size = kinds.Size(b, f, s, seq_len=t)
    case = cases.make_case("gemm", size, CPU, torch.float32, inputs_grad=inputs_grad)
    projection, recurrent = 2 * t * b * f * 3 * s, 2 * b * s * 3 * s
    weight_grad = 2 * 3 * s * t * b * (s + f)
    forward = projection + t * recurrent
    backward = (t if inputs_grad else t - 1) * recurrent + weight_grad
    if inputs_grad:
        backward += projection  # d_gates @ W_x
    assert _flops(case) == (forward, backward)


# --- Mixed precision (--autocast) -----------------------------------------------


@functools.cache
def _lstm_refused_under(autocast: torch.dtype) -> str | None:
    """The first line of the error nn.LSTM raises under CPU autocast to
    ``autocast`` on this machine, or None where it runs: oneDNN has no float16
    LSTM primitive on CPUs, and no bfloat16 one on CPUs without AVX-512."""
    lstm = torch.nn.LSTM(3, 4)
    try:
        with torch.autocast("cpu", dtype=autocast):
            lstm(torch.randn(2, 1, 3))
    except RuntimeError as error:
        return str(error).splitlines()[0][:60]
    return None


@pytest.mark.parametrize("seq_len", [None, 2], ids=["cell", "sequence"])
def test_autocast_runs_every_implementation_in_16_bits(render, seq_len, capsys):
    lengths = [] if seq_len is None else ["--seq-len", str(seq_len)]
    impls = "lltm,lstmcell,gemm" if seq_len is None else "lltm-sequence,lstm,gemm"
    report = _run_json(capsys, *lengths, "--impl", impls, "--loss", "sum", "--autocast", "bf16")
    env = report["environment"]
    assert (env["dtype"], env["autocast"]) == ("float32", "bfloat16")
    refused = _lstm_refused_under(torch.bfloat16)
    for row in report["results"]:
        if row["impl"] == "lstm" and refused is not None:
            # nn.LSTM itself cannot run so here: the row says why.
            assert row["error"] is not None and refused in row["error"], row["error"]
        else:
            assert row["error"] is None, (row["impl"], row["error"])
    assert "float32 under torch.autocast(bfloat16) on cpu" in bench.report.title(env)
    if seq_len is not None:  # the products' rate against a 16-bit large GEMM
        assert report["environment"]["large_gemm"]["gflops"] > 0
    # render.py reads it back with the same title.
    assert render.from_json(report)[1]["autocast"] == "bfloat16"


@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl", ["lltm-sequence", "lstm", "gemm"])
def test_autocast_holds_the_model_and_loss_not_the_backward(impl, autocast, monkeypatch):
    # As mixed-precision training runs them: the model and its loss inside
    # torch.autocast, the backward outside; float32 weights and inputs.
    if impl == "lstm" and (refused := _lstm_refused_under(autocast)) is not None:
        pytest.skip(f"nn.LSTM cannot run under {autocast} autocast on this CPU: {refused}")
    size = kinds.Size(2, 3, 4, seq_len=2, loss="sum")
    case = cases.make_case(impl, size, CPU, torch.float32, autocast=autocast)
    if impl == "gemm":
        assert all(t.dtype == autocast for t in case.forward() + case.backward())
        return
    assert all(t.dtype == torch.float32 for t in case.inputs)
    outputs = case.forward()
    assert all(t.dtype == autocast for t in outputs)
    seen = []
    real_call = case.call

    def call():
        seen.append(("model", torch.is_autocast_enabled("cpu")))
        outputs = real_call()
        outputs[0].register_hook(
            lambda grad: seen.append(("backward", torch.is_autocast_enabled("cpu")))
        )
        return outputs

    monkeypatch.setattr(case, "call", call)
    case.step()
    assert seen == [("model", True), ("backward", False)]
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in case.leaves)
    # Without autocast, all in float32.
    plain = cases.make_case(impl, size, CPU, torch.float32)
    assert all(t.dtype == torch.float32 for t in plain.forward())


def test_autocast_names_the_16_bit_path(monkeypatch, capsys):
    # On a GPU the sequence op's path is the plugin's answer for the dtype it
    # runs in: the autocast's.
    asked = []

    def sequence_path(impl, size, device, dtype):
        asked.append(dtype)

    monkeypatch.setattr(cli, "sequence_path", sequence_path)
    _run_json(capsys, "--seq-len", "2", "--impl", "lltm-sequence", "--autocast", "fp16")
    assert asked and set(asked) == {torch.float16}


# --- Arguments -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--impl", "nope"], "no cell implementation nope"),
        (["--impl", "lstm"], "no cell implementation lstm"),
        (["--seq-len", "2", "--impl", "lstmcell"], "no sequence implementation lstmcell"),
        (["--sizes", "2x3"], "expected BxFxS"),
        (["--sizes", "2x3x4x5"], "expected BxFxS"),
        (["--dtype", "int8"], "invalid choice"),
        (["-r", "0"], "--runs must be at least 1"),
        (["--seq-len", "0"], "sequence lengths of at least 1"),
        (["--seq-len", "x"], "sequence lengths of at least 1"),
        (["--seq-len", ""], "sequence lengths of at least 1"),
        (["--per-sample", "--impl", "lstm"], "no per-sample implementation lstm"),
        (["--per-sample", "--inputs-grad"], "per-sample gradients are those of the parameters"),
        (["--overhead", "--impl", "gemm"], "no overhead implementation gemm"),
        (["--overhead", "--seq-len", "2"], "--overhead times one cell step"),
        (["--overhead", "--per-sample"], "one kind of case per run"),
        (["--autocast", "int8"], "invalid choice"),
        (["--autocast", "bf16", "--dtype", "float64"], "--dtype float32 only"),
        (["--autocast", "bf16", "-d"], "--dtype float32 only"),
        (["--autocast", "bf16", "--per-sample"], "run under autocast, not per-sample"),
        (["--autocast", "fp16", "--overhead"], "run under autocast, not overhead"),
        (["--plot", "x.png"], "unrecognized arguments: --plot"),
    ],
    ids=["impl", "impl-case", "impl-sequence", "sizes", "sizes-4", "dtype", "runs", "seq-0", "seq-x", "seq-empty", "impl-per-sample", "per-sample-inputs-grad", "overhead-impl", "overhead-seq", "overhead-per-sample", "autocast", "autocast-float64", "autocast-double", "autocast-per-sample", "autocast-overhead", "plot-moved"],
)  # fmt: skip
def test_bad_arguments_exit_with_a_message(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(args)
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err


def test_help_describes_every_kind(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for word in (
        *("--seq-len", "--inputs-grad", "--per-sample", "--overhead"),
        *("reference-loop", "lltm-sequence", "lstmcell", "lltm-vmap", "lstm-vmap"),
    ):
        assert word in text


def test_command_line_entry_point():
    # The README's command, through `python -m lltm`, at a tiny size.
    out = subprocess.run(
        [sys.executable, "-m", "lltm", "bench", *FAST, *EAGER, "--json", "-"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert {r["impl"] for r in json.loads(out)["results"]} == {
        "reference",
        "lltm",
        "lstmcell",
        "gemm",
    }


# --- benchmarks/render.py --------------------------------------------------------


def _benchmark_script(name: str):
    """benchmarks/<name>.py, imported as a module (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def render():
    return _benchmark_script("render")


def test_render_reads_files_from_before_the_sequence_case(render, capsys):
    # Written when the bench timed one cell step with inputs requiring grad.
    old = ROOT / "tests" / "data" / "bench_cell_before_sequences.json"
    assert render.main([str(old)]) == 0
    text = capsys.readouterr().out
    assert "cell, gradients of the parameters, input, h and c (--inputs-grad)" in text
    assert "| size | impl | forward min / median |" in text
    assert "| 16x32x128 | lltm | 80.7 / 82.5 us | 113.8 / 120.8 us | 229.0 / 242.6 us |" in text


def test_render_a_sequence_run(render, tmp_path, capsys):
    data = tmp_path / "seq.json"
    assert bench.main([*FAST, "--seq-len", "2,3", "--impl", "all", "-q", "--json", str(data)]) == 0
    plot = tmp_path / "seq.png"
    assert render.main([str(data), "--plot", str(plot)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "sequence, gradients of the parameters only" in lines[2]
    header = next(line for line in lines if line.startswith("| size"))
    assert header.startswith("| size | T | loss | impl |") and "vs nn.LSTM" in header
    assert sum(line.startswith("| 2x3x4 | 3 |") for line in lines) == 2 * len(SEQUENCE_IMPLS)
    assert plot.read_bytes()[:8] == PNG


def test_render_across_repeated_runs(render, tmp_path, capsys):
    first = tmp_path / "run1.json"
    assert bench.main([*FAST, "--per-sample", "--seq-len", "2", "-q", "--json", str(first)]) == 0
    data = json.loads(first.read_text())
    rows = {row["impl"]: row["step"] for row in data["results"]}
    loop, vmapped = rows["lltm-loop"]["median_s"], rows["lltm-vmap"]["median_s"]
    # A second run in which lltm-vmap took twice as long.
    for key in ("min_s", "median_s"):
        rows["lltm-vmap"][key] *= 2
    second = tmp_path / "run2.json"
    second.write_text(json.dumps(data))
    assert render.main(["--across", str(first), str(second)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("2 runs of per-sample at 2x3x4, T=2: step medians in ")
    assert lines[2] == "| run | lltm-loop | lltm-vmap | lltm-batched | lstm-vmap |"
    assert [line.split(" | ")[0] for line in lines[4:]] == [
        "| run1.json",
        "| run2.json",
        "| median over the runs",
    ]
    # Medians of the two runs: time 1.5x the first's, speed-up 0.75x.
    unit = lines[0].split("step medians in ")[1].split(",")[0]
    median = lines[-1].split(" | ")[2]
    scale = bench.report.UNITS[unit]
    assert median.startswith(f"{1.5 * vmapped * scale:,.1f} ({0.75 * loop / vmapped:.2f}x; ")
    # Runs of different kinds or sizes do not mix.
    data["environment"]["case"] = "sequence"
    second.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="one kind of case at one size"):
        render.main(["--across", str(first), str(second)])


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["--seq-len", "2", "--impl", "lltm-sequence"], kinds.SEQUENCE),
        (["--per-sample", "--seq-len", "2", "--impl", "lltm-vmap"], kinds.PER_SAMPLE),
        (["--overhead"], kinds.OVERHEAD),
    ],
    ids=["sequence", "per-sample", "overhead"],
)
def test_json_round_trip(render, args, kind, capsys):
    report = _run_json(capsys, *args)
    results, env = render.from_json(report)
    again = bench.to_json(results, env)
    assert again["environment"] == env == report["environment"]
    for old, new in zip(report["results"], again["results"], strict=True):
        for phase in kind.phases:  # all but the number of blocks, which is not kept
            del old[phase]["blocks"], new[phase]["blocks"]
        assert new == old


@pytest.mark.slow
@pytest.mark.parametrize("config", [[], ["--inputs-grad"]], ids=["parameters", "inputs-grad"])
def test_compiled_reference_runs(config, capsys):
    report = _run_json(capsys, "--impl", "compiled,lltm", *config)
    rows = {r["impl"]: r for r in report["results"]}
    assert rows["compiled"]["error"] is None and rows["compiled"]["step"]["min_s"] > 0


# --- benchmarks/speedup_map.py --------------------------------------------------


@pytest.fixture(scope="module")
def speedup_map():
    return _benchmark_script("speedup_map")


@pytest.fixture(scope="module")
def gpu_calibrate():
    return _benchmark_script("gpu_calibrate")


def test_the_calibration_on_the_cpu(gpu_calibrate, tmp_path, capsys):
    # Every section at tiny sizes: the rule alone (no plans to force on a
    # CPU), lltm against the float64 model in float32, the summary printed.
    out = tmp_path / "calibration.json"
    assert gpu_calibrate.main(
        ["--device", "cpu", "--json", str(out), "--grid", "2x4x8,1x3x5", "--sizes", "2x4x8",
         "--seq-len", "3", "--repeats", "1", "--precisions", "float32,bf16-autocast"]
    ) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert data["complete"] and data["captured"] == []  # no CUDA graphs on a CPU
    assert [(e["batch"], e["state"], e["precision"]) for e in data["plans"]] == [
        (1, 5, "float32"), (1, 5, "bf16-autocast"), (2, 8, "float32"), (2, 8, "bf16-autocast")
    ]  # fmt: skip
    for entry in data["plans"]:
        assert list(entry["plans"]) == ["auto"]
        assert entry["forward_best"] == entry["step_best"] == "auto"
        assert entry["plans"]["auto"]["forward_us"] > 0 and entry["plans"]["auto"]["step_us"] > 0
    rows = {(r["impl"], r["matmul_precision"]): r for r in data["float32"]}
    assert set(rows) == {(i, p) for i in ("lltm", "lstm") for p in ("highest", "high")}
    for (impl, precision), row in rows.items():
        assert row["cudnn_tf32"] == (precision == "high")
        # None where torch predates torch.backends.cudnn.rnn.fp32_precision.
        rnn = row["cudnn_rnn_fp32_precision"]
        assert rnn in (None, "tf32" if precision == "high" else "none")
        assert 0 < row["relative_rms_error"] < 1e-5, (impl, precision)  # float32, no TF32 on a CPU
    assert rows["lltm", "high"]["lltm_follows_high"] is False
    printed = capsys.readouterr().out
    assert "(2, 4, 8) float32: forward auto (rule 1.00x)" in printed
    assert gpu_calibrate.main(["--summary", str(out)]) == 0
    assert capsys.readouterr().out == printed


def test_the_calibration_stops_at_its_deadline(gpu_calibrate, tmp_path):
    out = tmp_path / "calibration.json"
    gpu_calibrate.main(["--device", "cpu", "--json", str(out), "--deadline-s", "0"])
    data = json.loads(out.read_text())
    assert not data["complete"] and "deadline" in data["stopped"]
    assert list(tmp_path.iterdir()) == [out]  # no half-written file left beside it


def test_the_fastest_plan_ran_as_forced_in_every_pass_of_its_phase(gpu_calibrate):
    fit, forward_only = {"forward": True, "backward": True}, {"forward": True, "backward": False}
    plans = {
        "auto": {"fits": fit, "forward_us": 10.0, "step_us": 30.0},
        # Fastest in the step, but its backward was the rule's: no candidate there.
        "cooperative": {"fits": forward_only, "forward_us": 8.0, "step_us": 20.0},
        "clusters": {"fits": fit, "same_as": "auto"},
        "per-step": {"fits": fit, "forward_us": 50.0, "step_us": 25.0},
        "waves=2": {"fits": {"forward": False, "backward": False}},
    }
    assert gpu_calibrate.fastest(plans) == {
        "forward_best": "cooperative",
        "forward_rule_over_best": 10.0 / 8.0,
        "step_best": "per-step",
        "step_rule_over_best": 30.0 / 25.0,
    }


# A grid of batch x state, the features half the state, as gpu.sh sweeps it.
GRID = "1x2x4,2x2x4,1x4x8,2x4x8"


def _under_autocast(report: dict, autocast: str, lltm_times: float) -> dict:
    """A float32 sweep's report as gpu.sh's sweep under ``autocast`` writes it.

    The environment names the autocast, nn.LSTM runs with torch's defaults
    alone (no ``lstm-notf32`` rows), and lltm's median times are ``lltm_times``
    those of ``report``: each map's speed-ups are its own report's. (The bench
    under CPU autocast times its large GEMM in 16 bits, a minute or more at
    1024^3 on a CPU without 16-bit units: the bench's autocast rows have tests
    of their own above.)
    """
    data = json.loads(json.dumps(report))
    data["environment"]["autocast"] = autocast
    data["results"] = [row for row in data["results"] if row["impl"] != "lstm-notf32"]
    for row in data["results"]:
        if row["impl"] == "lltm-sequence":
            for phase in bench.PHASES:
                row[phase]["median_s"] *= lltm_times
    return data


def _join_sweeps(joined: Path, *sweeps: Path) -> None:
    """Joins ``sweeps`` into ``joined`` with gpu.sh's own join_sweeps."""
    text = (ROOT / "benchmarks" / "gpu.sh").read_text()
    start = text.index("\njoin_sweeps() {\n") + 1
    function = text[start : text.index("\n}\n", start) + 3]
    paths = " ".join(shlex.quote(str(path)) for path in (joined, *sweeps))
    script = f"DRY_RUN=0\n{function}join_sweeps {paths}\n"
    subprocess.run(["bash", "-c", script], check=True, capture_output=True, timeout=30)


def test_speedup_map_of_the_three_sweeps(speedup_map, tmp_path, saved_figures, capsys):
    # The float32 sweep as gpu.sh makes it (here on the CPU, at tiny sizes):
    # lltm's sequence op, nn.LSTM with TF32 on (torch's default) and off.
    float32 = tmp_path / "sweep_float32.json"
    args = ["--sizes", GRID, "--seq-len", "2", "--impl", "lltm-sequence,lstm,lstm-notf32"]
    assert bench.main([*FAST, *args, "--loss", "sum", "-q", "--json", str(float32)]) == 0
    first = json.loads(float32.read_text())
    # The bf16 and fp16 sweeps, from it; each in its own file.
    runs = [float32]
    for autocast, lltm_times in (("bfloat16", 2.0), ("float16", 4.0)):
        runs.append(tmp_path / f"sweep_{autocast}.json")
        runs[-1].write_text(json.dumps(_under_autocast(first, autocast, lltm_times)))
    # gpu.sh joins them into one file (a sweep that wrote none is left out).
    joined, missing = tmp_path / "sweeps.json", tmp_path / "none.json"
    _join_sweeps(joined, runs[0], missing, *runs[1:])
    reports = [json.loads(r.read_text()) for r in runs]
    assert speedup_map.load([joined]) == reports
    # No sweep ran: no map, and an error that says so.
    empty = tmp_path / "empty.json"
    _join_sweeps(empty, missing)
    with pytest.raises(SystemExit):
        speedup_map.main([str(empty), "--markdown"])
    assert f"no bench report in {empty}" in capsys.readouterr().err
    png, combined = tmp_path / "map.png", tmp_path / "all.json"
    assert speedup_map.main([str(joined), "--png", str(png), "--json", str(combined)]) == 0
    assert png.read_bytes()[:8] == PNG
    assert speedup_map.load([combined]) == reports
    # A row of panels per sweep and nn.LSTM it holds, a panel per phase.
    [figure] = saved_figures
    maps = [ax for ax in figure.axes if ax.get_images()]
    precisions = [
        "float32 against nn.LSTM (TF32 on)",
        "float32 against nn.LSTM (TF32 off)",
        "float32 under torch.autocast(bfloat16) against nn.LSTM",
        "float32 under torch.autocast(float16) against nn.LSTM",
    ]
    assert [ax.get_title() for ax in maps] == [
        f"{precision}\n{phase}, T = 2"
        for precision in precisions
        for phase in ("training step", "forward")
    ]

    def speedups(report: dict, rival: str, phase: str) -> dict:
        medians = {
            (row["impl"], row["batch"], row["state"]): row[phase]["median_s"]
            for row in report["results"]
        }
        return {
            (b, s): medians[rival, b, s] / median
            for (impl, b, s), median in medians.items()
            if impl == "lltm-sequence"
        }

    # Each panel: its sweep's speed-ups against its nn.LSTM, the bench's own
    # figure against nn.LSTM with TF32 on.
    on = speedups(first, "lstm", "step")
    assert on == {
        (row["batch"], row["state"]): row["step"]["speedup_vs_lstm"]
        for row in first["results"]
        if row["impl"] == "lltm-sequence"
    }
    expected = [
        (first, "lstm", on),
        (first, "lstm-notf32", speedups(first, "lstm-notf32", "step")),
        (reports[1], "lstm", {key: value / 2 for key, value in on.items()}),
        (reports[2], "lstm", {key: value / 4 for key, value in on.items()}),
    ]
    for ax, (report, rival, values) in zip(maps[::2], expected, strict=True):
        batches, states, grid, _ = speedup_map.grid(report, "step", rival)
        assert (batches, states) == ([1, 2], [4, 8])
        assert grid == pytest.approx(values, rel=1e-12)
        texts = sorted(t.get_text() for t in ax.texts)
        assert texts == sorted(f"{v:.2f}" for v in grid.values())
        image = ax.get_images()[0].get_array()
        assert image[1][0] == pytest.approx(math.log2(grid[2, 4]))  # batch 2, state 4
    # The summary, then each map as a table.
    capsys.readouterr()
    assert speedup_map.main([str(joined), "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Where lltm is slower than nn.LSTM (below 1.00x)")
    assert lines[2] == "| precision | against | phase | below 1.00x: lltm slower | 2.00x or more |"
    # The panels, in order: (precision, against whom, phase).
    panels = [
        (precision, against, phase)
        for precision, against in (
            ("float32", "nn.LSTM (TF32 on)"),
            ("float32", "nn.LSTM (TF32 off)"),
            ("float32 under torch.autocast(bfloat16)", "nn.LSTM"),
            ("float32 under torch.autocast(float16)", "nn.LSTM"),
        )
        for phase in ("training step", "forward")
    ]
    assert [line.split(" | ")[:3] for line in lines[4:12]] == [
        [f"| {precision}", against, phase] for precision, against, phase in panels
    ]
    headings = [line for line in lines if line.endswith(" time / lltm time")]
    assert headings == [
        f"{precision}, {phase}, T = 2: {against} time / lltm time"
        for precision, against, phase in panels
    ]
    table = lines.index(headings[6])  # fp16, training step
    assert lines[table + 2] == "| batch \\ state (features) | 4 (2) | 8 (4) |"
    fp16 = expected[3][2]
    assert lines[table + 4] == f"| 1 | {fp16[1, 4]:.2f}x | {fp16[1, 8]:.2f}x |"


def test_speedup_map_names_the_path_and_failures(speedup_map):
    persistent = "persistent, clusters: 8 groups x 16 blocks (...)"
    per_step = "per-step (W_h does not fit)"
    cooperative = "persistent, cooperative grid: 8 groups x 16 blocks (...)"
    letters = speedup_map.path_letters
    assert letters({"forward": persistent, "backward": persistent}) == "C"
    assert letters({"forward": per_step, "backward": cooperative}) == "P/G"
    assert letters(None) == ""

    def row(batch, impl, step, error=None, path=None):
        timing = {"median_s": step, "speedup_vs_lstm": None}
        return {
            "batch": batch, "features": 4, "state": 8, "seq_len": 50, "impl": impl,
            "loss": "sum", "error": error, "forward": dict(timing), "step": timing,
            **({"path": {"forward": path, "backward": path}} if path else {}),
        }  # fmt: skip

    data = {
        "environment": {"dtype": "float32", "seq_len": [50]},
        "results": [
            row(1, "lltm-sequence", 1.0, path=persistent),
            row(1, "lstm", 2.5),
            row(2, "lltm-sequence", None, error="OOM"),
            row(2, "lstm", 1.0),
            row(4, "lltm-sequence", 1.0, path=per_step),  # nn.LSTM failed
            row(4, "lstm", None, error="OOM"),
        ],
    }
    table = speedup_map.markdown(data, "step").splitlines()
    assert table[0] == "float32, training step, T = 50: nn.LSTM time / lltm time"
    assert table[4:] == ["| 1 | 2.50x (C) |", "| 2 | - |", "| 4 | - |"]
    summary = speedup_map.summary([data]).splitlines()
    assert summary[4] == "| float32 | nn.LSTM | training step | none | (1, 4, 8) 2.50x (C) |"
    assert summary[-1] == "- float32, against nn.LSTM, forward: (2, 4, 8); (4, 4, 8)"


def test_speedup_map_summary_classes_speedups_as_the_tables_print_them(speedup_map):
    # nn.LSTM's median times over lltm's (1 s at every size): lltm is slower
    # below 1.00x as printed, and 2.00x or more as printed counts as 2x.
    speedups = {64: 0.5, 128: 0.994, 256: 0.996, 512: 1.99, 1024: 1.996}
    rows = []
    for state, speedup in speedups.items():
        for impl, median in (("lltm-sequence", 1.0), ("lstm", speedup), ("lstm-notf32", 3.0)):
            timing = {"median_s": median}
            rows.append(
                {"batch": 16, "features": state // 2, "state": state, "seq_len": 50, "impl": impl,
                 "loss": "sum", "error": None, "forward": timing, "step": timing}
            )  # fmt: skip
    data = {"environment": {"dtype": "float32", "seq_len": [50]}, "results": rows}
    assert speedup_map.rivals(data) == ["lstm", "lstm-notf32"]
    lines = speedup_map.summary([data]).splitlines()
    assert lines[4:] == [
        "| float32 | nn.LSTM (TF32 on) | training step | (16, 32, 64) 0.50x; (16, 64, 128) 0.99x "
        "| (16, 512, 1024) 2.00x |",
        "| float32 | nn.LSTM (TF32 on) | forward | (16, 32, 64) 0.50x; (16, 64, 128) 0.99x "
        "| (16, 512, 1024) 2.00x |",
        "| float32 | nn.LSTM (TF32 off) | training step | none | "
        + "; ".join(f"(16, {s // 2}, {s}) 3.00x" for s in speedups)
        + " |",
        "| float32 | nn.LSTM (TF32 off) | forward | none | "
        + "; ".join(f"(16, {s // 2}, {s}) 3.00x" for s in speedups)
        + " |",
    ]


# --- benchmarks/gpu.sh -------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="the GPU machines run Linux")
def test_the_prepared_gpu_run_in_a_dry_run(tmp_path, gpu_calibrate):
    # benchmarks/gpu.sh --dry-run prints what it would build, test and time,
    # and writes nothing. Its bench commands are checked here by the bench's
    # own parser (the script's check of them, `$PYTHON -c ...`, would import
    # lltm in another interpreter: `true` stands in for it).
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--dry-run"],
        env={**os.environ, "PYTHON": "true", "OUT": str(out)},
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    commands = [shlex.split(line[2:]) for line in lines if line[:2] == "+ "]
    assert commands[1][:3] == ["env", "LLTM_VARIANT=cuda", "TORCH_CUDA_ARCH_LIST=9.0"]
    # The budget every stage's deadline is cut to: with the last stage's grace
    # period and the tables' renders, well inside the 600 s a GPU machine
    # gives one command.
    [budget] = [int(line.split()[2]) for line in lines if line.startswith("=== budget: ")]
    assert budget <= 500
    # The tests: a crash costs one test (pytest-xdist replaces the worker);
    # the bad-argument tests on CPU tensors too.
    [tests] = [c for c in commands if c[1:3] == ["-m", "pytest"]]
    assert tests[tests.index("-m", 2) + 1] == "not slow"
    assert "-n" in tests and any(a.startswith("--max-worker-restart=") for a in tests)
    assert {"tests/test_cuda.py", "tests/test_errors.py"} <= set(tests)
    benches = [c[c.index("bench") + 1 :] for c in commands if c[1:4] == ["-m", "lltm", "bench"]]
    parsed = [cli.parse(args) for args in benches]
    for args in parsed:
        assert args.device == "cuda" and args.seq_len == [50] and args.loss == ["sum"]
    fp32, bf16, fp16, sweep32, sweep_bf16, sweep_fp16 = parsed
    sizes = ["16x32x128", "8x32x256", "64x256x512", "256x256x256"]
    assert fp32.impl == [
        "lltm-sequence", "lltm-sequence-per-step", "lstm", "lstm-notf32", "gemm"
    ]  # fmt: skip
    for args, autocast in ((fp32, None), (bf16, "bf16"), (fp16, "fp16")):
        assert [str(s) for s in args.sizes] == sizes and args.autocast == autocast
    grid = [(b, s // 2, s) for b in (1, 4, 16, 64, 256) for s in (64, 128, 256, 512, 1024)]
    # The sweeps: float32 against nn.LSTM with TF32 on and off, bf16 and fp16
    # autocast against nn.LSTM, the same grid and blocks.
    for args, autocast, impl in (
        (sweep32, None, ["lltm-sequence", "lstm", "lstm-notf32"]),
        (sweep_bf16, "bf16", ["lltm-sequence", "lstm"]),
        (sweep_fp16, "fp16", ["lltm-sequence", "lstm"]),
    ):
        assert [(s.batch, s.features, s.state) for s in args.sizes] == grid
        assert args.impl == impl and args.autocast == autocast
        assert (args.runs, args.block_seconds) == (3, 0.01)
    # The map, from the three sweeps joined into one file of the results.
    [joined] = [c for c in commands if c[0] == "join_sweeps"]
    assert joined[2:] == [sweep32.json, sweep_bf16.json, sweep_fp16.json]
    assert joined[1].startswith(str(out)) and not sweep32.json.startswith(str(out))
    [drawn] = [c for c in commands if c[1:2] == ["benchmarks/speedup_map.py"]]
    assert [a for a in drawn if a.endswith(".json")] == [joined[1]]
    # The calibration: into build/gpu/ as it goes, then copied back; it starts
    # nothing new well before its stage's deadline.
    [calibrate] = [c[2:] for c in commands if c[1:2] == ["benchmarks/gpu_calibrate.py"]]
    calibration = gpu_calibrate.parse(calibrate)
    assert not str(calibration.json).startswith(str(out))
    assert calibration.sections == list(gpu_calibrate.SECTIONS)
    assert calibration.deadline_s <= 60 and calibration.repeats == 5
    [copied] = [c for c in commands if c[0] == "cp"]
    assert copied[1] == str(calibration.json) and copied[2].startswith(str(out))
    # Seven files come back (a GPU machine returns eight at most, the run's
    # output among them), and nothing is written in a dry run.
    written = {
        a.split("=", 1)[-1] for c in commands for a in c if a.split("=", 1)[-1].startswith(str(out))
    }
    assert len(written) == 7, written
    assert list(out.iterdir()) == []


# --- Host time (--host-time) ------------------------------------------------------------


def test_host_time_is_timed_per_phase_shown_and_read_back(render, capsys):
    report = _run_json(
        capsys, "--seq-len", "2", "--impl", "lltm-sequence,lstm", "--loss", "sum", "--host-time"
    )
    for row in report["results"]:
        assert row["error"] is None
        for phase in kinds.PHASES:
            # A loop that waits on nothing: on a CPU all the work is the host's.
            assert row[phase]["host_median_s"] > 0, (row["impl"], phase)
    results, env = render.from_json(report)
    header, rows = bench.report.table_rows(results, env)
    column = header.index("host median fwd / bwd / step")
    assert column == header.index("step min / median") + 1
    assert all(row[column].count(" / ") == 2 for row in rows)
    # Without the flag: no host time, no column.
    plain = _run_json(capsys, "--seq-len", "2", "--impl", "lltm-sequence", "--loss", "sum")
    assert all("host_median_s" not in row["step"] for row in plain["results"])
    header, _ = bench.report.table_rows(*render.from_json(plain))
    assert not any(name.startswith("host") for name in header)


def test_host_seconds_times_the_calls_on_the_threads_asked_for():
    seen = []

    def call():
        seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    assert timing.host_seconds(call, 3, 1) >= 0
    assert seen == [1, 1, 1] and torch.get_num_threads() == before


# --- --memory: peak memory of one call, inference and a step ------------------------------


def test_memory_adds_a_column_and_the_peaks_to_the_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--seq-len", "2", "--impl", "lltm-sequence", "--memory", "--json", str(out)]
    assert bench.main([*FAST, *args]) == 0
    assert "peak MiB inference / step" in capsys.readouterr().out
    for row in json.loads(out.read_text())["results"]:
        peaks = row["peak_bytes"]
        assert set(peaks) == {kinds.NO_GRAD, "step"}, row["impl"]
        assert all(isinstance(v, int) and v >= 0 for v in peaks.values())


def test_memory_is_measured_for_cells_and_sequences_only():
    with pytest.raises(SystemExit):
        cli.parse(["--per-sample", "--memory"])


def test_an_inference_peaks_below_a_training_step():
    # Big enough for the allocator to take fresh pages from the system (the
    # output alone is 4 MiB): the training step keeps every step's gates and
    # cells, four times the output, which inference never makes.
    from lltm.bench import memory

    size = kinds.Size(16, 32, 128, seq_len=512)
    cpu = torch.device("cpu")
    output = size.seq_len * size.batch * size.state * 4
    served = memory.peak_bytes("lltm-sequence", size, cpu, torch.float32, phase=kinds.NO_GRAD)
    trained = memory.peak_bytes("lltm-sequence", size, cpu, torch.float32, phase="step")
    assert output <= served < 2 * output
    assert trained > served + 3 * output
