"""The adding problem: does the LLTM remember as far back as an LSTM?

Hochreiter and Schmidhuber's test of long memory (Long Short-Term Memory,
1997, experiment 4), in the form most later work uses (e.g. Le, Jaitly and
Hinton, 2015). Each input is a sequence of T steps with two channels: a value
drawn uniformly from [0, 1], and a marker that is 1 at two steps (one in the
first half of the sequence, one in the second) and 0 elsewhere. The target is
the sum of the two marked values. Predicting the constant 1 gives a
mean squared error of 1/6 (about 0.167), the baseline to beat; a network that
solves the task has to carry the first value across up to T steps.

    python adding_problem.py                            # T = 100
    python adding_problem.py --seq-len 10 25 50 100 200 400   # a sweep over T

Each T trains lltm.LLTMSequence and torch.nn.LSTM side by side (see
common.py) on fresh batches drawn on the fly, and writes the tables
(adding_problem.md, .json), the learning curves (adding_problem_curves.png)
and, for a sweep, the final test error against T (adding_problem_sweep.png).
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import Tensor

import common

BASELINE = 1 / 6  # the variance of the target: the error of always predicting its mean, 1


def adding_batch(
    batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Inputs (batch, seq_len, 2): value and marker channels; targets (batch, 1)."""
    values = torch.rand(batch_size, seq_len, generator=generator)
    half = seq_len // 2
    first = torch.randint(0, half, (batch_size,), generator=generator)
    second = torch.randint(half, seq_len, (batch_size,), generator=generator)
    markers = torch.zeros(batch_size, seq_len)
    rows = torch.arange(batch_size)
    markers[rows, first] = 1.0
    markers[rows, second] = 1.0
    target = (values * markers).sum(dim=1, keepdim=True)
    return torch.stack([values, markers], dim=2), target


def adding_task(seq_len: int, args: argparse.Namespace) -> common.Task:
    def train_epoch(generator: torch.Generator):
        for _ in range(args.steps_per_epoch):
            yield adding_batch(args.batch_size, seq_len, generator)

    # Fixed test sequences, from a generator of their own.
    test = adding_batch(args.test_size, seq_len, torch.Generator().manual_seed(args.seed + 1))
    return common.Task(
        name=f"adding T={seq_len}",
        input_size=2,
        output_size=1,
        loss=F.mse_loss,
        train_epoch=train_epoch,
        steps_per_epoch=args.steps_per_epoch,
        train_size=args.steps_per_epoch * args.batch_size,
        test=test,
    )


def report(results: dict[int, dict[str, common.Run]], args: argparse.Namespace) -> None:
    header = ["T", "model", "parameters", "train MSE", "test MSE", "test / baseline"]
    header += ["median abs(c_T): init, trained", "s / epoch"]
    rows = [
        [
            seq_len,
            kind,
            f"{run.parameters:,}",
            run.final["train_loss"],
            run.final["test_loss"],
            f"{run.final['test_loss'] / BASELINE:.3f}",
            f"{run.cell_before:.2f}, {run.cell_after:.2f}",
            f"{run.seconds_per_epoch:.2f}",
        ]
        for seq_len, runs in results.items()
        for kind, run in runs.items()
    ]
    markdown = (
        f"Adding problem: {common.training_summary(args, args.steps_per_epoch)}; "
        f"test: {args.test_size:,} sequences. Baseline (predict 1): MSE {BASELINE:.3f}.\n\n"
        + common.markdown_table(header, rows)
    )
    data = {
        "baseline": BASELINE,
        "results": {
            str(seq_len): {kind: common.run_record(run) for kind, run in runs.items()}
            for seq_len, runs in results.items()
        },
    }
    common.write_results("adding_problem", args, markdown, data)
    plot(results, args)


def plot(results: dict[int, dict[str, common.Run]], args: argparse.Namespace) -> None:
    plt = common.pyplot()
    count = len(results)
    columns = min(count, 3)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(4.2 * columns, 3.4 * rows),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for ax, (seq_len, runs) in zip(axes.flat, results.items(), strict=False):
        common.plot_history(ax, runs, "loss", "MSE")
        ax.axhline(BASELINE, color="gray", linestyle=":", label="baseline")
        ax.set_yscale("log")
        ax.set_title(f"T = {seq_len}")
    for ax in list(axes.flat)[count:]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="small")
    fig.suptitle(f"Adding problem: hidden size {args.hidden_size}, {args.epochs} epochs")
    common.save_figure(fig, args, "adding_problem_curves")
    plt.close(fig)
    if count > 1:
        plot_sweep(results, args)


def plot_sweep(results: dict[int, dict[str, common.Run]], args: argparse.Namespace) -> None:
    plt = common.pyplot()
    fig, (error, cell) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    lengths = list(results)
    for kind in args.models:
        runs = [results[t][kind] for t in lengths]
        color = common.COLORS[kind]
        error.plot(lengths, [r.final["test_loss"] for r in runs], "o-", color=color, label=kind)
        cell.plot(lengths, [r.cell_before for r in runs], "o-", color=color, label=kind)
    error.axhline(BASELINE, color="gray", linestyle=":", label="baseline (predict 1)")
    error.set(yscale="log", ylabel="test MSE after training", title="Error against T")
    cell.axhline(3.0, color="gray", linestyle=":", label="tanh saturates")
    cell.set(ylabel="median abs(c_T)", title="Cell state at initialisation")
    for ax in (error, cell):
        ax.set(xscale="log", xlabel="sequence length T")
        ax.set_xticks(lengths, [str(t) for t in lengths])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    common.save_figure(fig, args, "adding_problem_sweep")
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[int, dict[str, common.Run]]:
    parser = common.build_parser(__file__, __doc__, epochs=15)
    task = parser.add_argument_group("adding problem")
    task.add_argument(
        "--seq-len", type=int, nargs="+", default=[100], help="T; several for a sweep"
    )
    task.add_argument("--steps-per-epoch", type=int, default=100, help="batches per epoch")
    task.add_argument("--test-size", type=int, default=1000, help="test sequences")
    args = common.setup(parser, argv)
    if min(args.seq_len) < 2:
        parser.error("--seq-len: T must be 2 or more (two steps are marked)")
    results = {t: common.train_side_by_side(adding_task(t, args), args) for t in args.seq_len}
    report(results, args)
    return results


if __name__ == "__main__":
    main()
