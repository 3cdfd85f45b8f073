"""Handwritten digits, one pixel at a time: the LLTM against an LSTM.

scikit-learn's 8x8 digits (1,797 images, bundled with the package: nothing
to download) read as sequences of 64 pixels, row by row, and classified from
the last step's state: the small, offline cousin of pixel-by-pixel MNIST.
The network sees one grey level per step and must hold what it has seen of
the digit for up to 64 steps.

    python digits.py
    python digits.py --num-layers 2 --lr 3e-3

Trains lltm.LLTMSequence and torch.nn.LSTM side by side (see common.py) on
a fixed split (a quarter of the images, stratified, held out for testing) and
writes the table (digits.md, .json) and the learning curves (digits_curves.png).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import common


def digits_task(args: argparse.Namespace) -> common.Task:
    images, labels = load_digits(return_X_y=True)
    # The same split whatever --seed: the test set is part of the benchmark.
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=0.25, stratify=labels, random_state=0
    )

    def as_sequences(x, y):
        # Grey levels 0..16 scaled to [0, 1]; (images, 64 steps, 1 feature).
        return torch.tensor(x / 16.0, dtype=torch.float32).unsqueeze(2), torch.tensor(y)

    train_x, train_y = as_sequences(train_x, train_y)

    def train_epoch(generator: torch.Generator):
        order = torch.randperm(len(train_x), generator=generator)
        for start in range(0, len(order), args.batch_size):
            batch = order[start : start + args.batch_size]
            yield train_x[batch], train_y[batch]

    return common.Task(
        name="digits",
        input_size=1,
        output_size=10,
        loss=F.cross_entropy,
        train_epoch=train_epoch,
        steps_per_epoch=-(-len(train_x) // args.batch_size),
        train_size=len(train_x),
        test=as_sequences(test_x, test_y),
        classify=True,
    )


def report(runs: dict[str, common.Run], task: common.Task, args: argparse.Namespace) -> None:
    header = ["model", "parameters", "train loss", "test loss", "train accuracy"]
    header += ["test accuracy", "median abs(c_T): init, trained", "s / epoch"]
    rows = [
        [
            kind,
            f"{run.parameters:,}",
            run.final["train_loss"],
            run.final["test_loss"],
            f"{run.final['train_accuracy']:.1%}",
            f"{run.final['test_accuracy']:.1%}",
            f"{run.cell_before:.2f}, {run.cell_after:.2f}",
            f"{run.seconds_per_epoch:.2f}",
        ]
        for kind, run in runs.items()
    ]
    markdown = (
        f"Digits, pixel by pixel: {common.training_summary(args, task.steps_per_epoch)}; "
        f"{task.train_size:,} training and {len(task.test[1])} test images.\n\n"
        + common.markdown_table(header, rows)
    )
    data = {"results": {kind: common.run_record(run) for kind, run in runs.items()}}
    common.write_results("digits", args, markdown, data)

    plt = common.pyplot()
    fig, (loss, accuracy) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    common.plot_history(loss, runs, "loss", "cross-entropy")
    loss.set_yscale("log")
    common.plot_history(accuracy, runs, "accuracy", "accuracy")
    accuracy.axhline(0.1, color="gray", linestyle=":", label="chance")
    accuracy.legend(fontsize="small")
    fig.suptitle(f"Digits, pixel by pixel: hidden size {args.hidden_size}")
    common.save_figure(fig, args, "digits_curves")
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, common.Run]:
    parser = common.build_parser(__file__, __doc__, hidden_size=64, epochs=40)
    args = common.setup(parser, argv)
    task = digits_task(args)
    runs = common.train_side_by_side(task, args)
    report(runs, task, args)
    return runs


if __name__ == "__main__":
    main()
