"""The training examples (examples/*.py), a few steps each through their
command line (``main(argv)``): both models learn, the checkpoints reload to
the same test results, and the tables and plots are written. ``nox -s
examples`` runs them at full size."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# Small enough for a few seconds each, long enough for the loss to fall well
# below what a constant output reaches (the LLTM leaves that plateau on the
# digits in its third epoch).
SHORT = ["--hidden-size", "16", "--lr", "0.02", "--threads", "1"]
CASES = {
    "adding_problem": (
        ["--seq-len", "8", "16", "--epochs", "2", "--steps-per-epoch", "15", "--test-size", "200"],
        ["adding_problem_curves.png", "adding_problem_sweep.png"],
    ),
    "digits": (["--epochs", "3", "--batch-size", "16"], ["digits_curves.png"]),
}


@pytest.fixture
def examples(monkeypatch):
    """Imports an example as its script sees its neighbours (common.py)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    # Global state the examples set: the RNG (seeds) and torch's thread count.
    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        yield importlib.import_module
    torch.set_num_threads(threads)


def runs_of(results: dict) -> list:
    """The Run objects of main()'s result: {model: Run} or {T: {model: Run}}."""
    return [
        r
        for value in results.values()
        for r in (value.values() if isinstance(value, dict) else [value])
    ]


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_learns_and_reports(examples, tmp_path: Path, name: str) -> None:
    argv, plots = CASES[name]
    results = examples(name).main([*argv, *SHORT, "--out-dir", str(tmp_path)])

    epochs = int(argv[argv.index("--epochs") + 1])
    runs = runs_of(results)
    assert sorted({run.model for run in runs}) == ["LLTM", "LSTM"]
    for run in runs:
        before, after = run.history[0], run.history[-1]
        assert len(run.history) == epochs + 1, run.history  # epoch 0: untrained
        assert after["test_loss"] < 0.9 * before["test_loss"], (run.model, run.history)
        assert after["train_loss"] < 0.9 * run.history[1]["train_loss"], (run.model, run.history)
        # The checkpoint, loaded into a new model, evaluates exactly as trained.
        assert (tmp_path / run.checkpoint).is_file()
        assert run.reloaded == {k: v for k, v in after.items() if k.startswith("test_")}

    table = (tmp_path / f"{name}.md").read_text()
    for run in runs:
        assert f"| {run.model} | {run.parameters:,} | {run.final['train_loss']:.4f} |" in table
    assert "--hidden-size 16" in table  # the command that made it
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert data["environment"]["threads"] == "1"
    for plot in plots:
        assert (tmp_path / plot).read_bytes().startswith(b"\x89PNG"), plot


@pytest.mark.parametrize(
    "name, argv, message",
    [
        ("digits", ["--autocast", "float16", "--device", "cpu"], "--autocast float16 needs"),
        ("digits", ["--dropout", "0.2"], "--dropout acts between layers"),
        ("adding_problem", ["--seq-len", "100", "1"], "T must be 2 or more"),
    ],
)
def test_example_rejects_bad_options(examples, tmp_path, capsys, name, argv, message) -> None:
    with pytest.raises(SystemExit) as exit:
        examples(name).main([*argv, "--out-dir", str(tmp_path)])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err
