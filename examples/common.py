"""What the two examples share: the command line, the model, training an LLTM and
an LSTM side by side, checkpoints, tables and plots.

Both models are trained on the same batches in the same order, from the same
seed, with the same optimizer (Adam), learning rate and gradient clipping.
Training is interleaved epoch by epoch (an epoch of the LLTM, then one of the
LSTM), so that a busy machine slows both alike and their times per epoch stay
comparable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

import lltm

MODELS = ("LLTM", "LSTM")
RESULTS = Path(__file__).resolve().parent / "results"
COLORS = {"LLTM": "tab:red", "LSTM": "tab:blue"}


def build_parser(script: str, doc: str, **defaults: object) -> argparse.ArgumentParser:
    """The options both examples take, for the example ``script`` (its
    ``__file__``) described by ``doc``; ``defaults`` sets its own values."""
    parser = argparse.ArgumentParser(
        prog=Path(script).name,
        description=doc.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--hidden-size", type=int, default=32, help="state size of both models")
    model.add_argument("--num-layers", type=int, default=1, help="stacked recurrent layers")
    model.add_argument(
        "--dropout", type=float, default=0.0, help="dropout between layers (with --num-layers > 1)"
    )
    model.add_argument(
        "--models", nargs="+", choices=MODELS, default=list(MODELS), help="which models to train"
    )
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int, default=10, help="epochs of training")
    train.add_argument("--batch-size", type=int, default=32, help="examples per step")
    train.add_argument("--lr", type=float, default=1e-2, help="Adam's learning rate")
    train.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping")
    train.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    run = parser.add_argument_group("running")
    run.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda"
    )
    run.add_argument(
        "--threads", type=int, default=0, metavar="N", help="torch.set_num_threads(N); 0: torch's"
    )
    run.add_argument("--compile", action="store_true", help="train through torch.compile")
    run.add_argument(
        "--autocast",
        choices=["bfloat16", "float16"],
        help="mixed precision: bfloat16 on the CPU; bfloat16 or float16 on CUDA",
    )
    run.add_argument(
        "--out-dir", type=Path, default=RESULTS, help="tables, plots and checkpoints go here"
    )
    parser.set_defaults(**defaults)
    return parser


def setup(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parses and checks the options, and applies the global ones (threads)."""
    args = parser.parse_args(argv)
    # As typed (relative paths stay relative), for the tables' record.
    command = sys.argv if argv is None else [parser.prog, *argv]
    args.command = shlex.join(["python", *command])
    args.device = torch.device(args.device)
    if args.autocast == "float16" and args.device.type != "cuda":
        parser.error("--autocast float16 needs --device cuda (use bfloat16 on the CPU)")
    if args.dropout and args.num_layers < 2:
        parser.error("--dropout acts between layers: it needs --num-layers 2 or more")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    return args


# --- The model --------------------------------------------------------------


class SequenceModel(nn.Module):
    """A recurrent network read out from its last step by a linear layer.

    ``kind`` picks the recurrent part: ``"LLTM"`` (``lltm.LLTMSequence``) or
    ``"LSTM"`` (``torch.nn.LSTM``), of the same hidden size and layout.
    """

    def __init__(
        self,
        kind: str,
        input_size: int,
        hidden_size: int,
        output_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        options: dict = {"num_layers": num_layers, "batch_first": True}
        if dropout:
            options["dropout"] = dropout
        if kind == "LLTM":
            self.rnn = lltm.LLTMSequence(input_size, hidden_size, **options)
        elif kind == "LSTM":
            self.rnn = nn.LSTM(input_size, hidden_size, **options)
        else:
            raise ValueError(f"kind must be one of {MODELS}, got {kind!r}")
        self.head = nn.Linear(hidden_size, output_size)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (batch, seq_len, input_size) -> (batch, output_size)."""
        output, _ = self.rnn(x)
        return self.head(output[:, -1])


# --- The task and the training loop ----------------------------------------


@dataclass
class Task:
    """What an example trains on.

    ``train_epoch(generator)`` yields one epoch of (input, target) batches; both
    models get generators seeded alike, hence the same batches in the same
    order. ``test`` is the held-out (input, target) pair.
    """

    name: str
    input_size: int
    output_size: int
    loss: Callable[..., Tensor]  # F.mse_loss, F.cross_entropy: (output, target, reduction=)
    train_epoch: Callable[[torch.Generator], Iterable[tuple[Tensor, Tensor]]]
    steps_per_epoch: int
    train_size: int  # training examples per epoch
    test: tuple[Tensor, Tensor]
    classify: bool = False  # report accuracy too


@dataclass
class Run:
    """One model's training: its metrics per epoch (epoch 0: before training)."""

    model: str
    parameters: int
    history: list[dict] = field(default_factory=list)
    cell_before: float = float("nan")  # median |c_T| on the test set, at initialisation
    cell_after: float = float("nan")  # and after training
    checkpoint: str = ""
    reloaded: dict = field(default_factory=dict)

    @property
    def final(self) -> dict:
        return self.history[-1]

    @property
    def seconds_per_epoch(self) -> float:
        """Median training time of an epoch (evaluation left out)."""
        return statistics.median(h["seconds"] for h in self.history[1:])


def autocast(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    if not args.autocast:
        return contextlib.nullcontext()
    return torch.autocast(args.device.type, dtype=getattr(torch, args.autocast))


class Metrics:
    """Sums of the loss (and correct predictions) over batches, then means."""

    def __init__(self, task: Task) -> None:
        self.task, self.loss, self.correct, self.count = task, 0.0, 0, 0

    def add(self, output: Tensor, target: Tensor) -> None:
        output = output.detach().float()
        self.loss += self.task.loss(output, target, reduction="sum").item()
        if self.task.classify:
            self.correct += (output.argmax(dim=1) == target).sum().item()
        self.count += target.shape[0]

    def means(self, prefix: str) -> dict[str, float]:
        means = {f"{prefix}_loss": self.loss / self.count}
        if self.task.classify:
            means[f"{prefix}_accuracy"] = self.correct / self.count
        return means


@contextlib.contextmanager
def evaluating(model: nn.Module):
    """Evaluation mode (no dropout) and no autograd graph, for the duration."""
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train()


def evaluate(model: nn.Module, task: Task, args: argparse.Namespace, batch: int = 1000) -> dict:
    """Mean test loss (and accuracy) of ``model``."""
    metrics = Metrics(task)
    inputs, targets = task.test
    with evaluating(model):
        for start in range(0, len(inputs), batch):
            x = inputs[start : start + batch].to(args.device)
            y = targets[start : start + batch].to(args.device)
            with autocast(args):
                output = model(x)
            metrics.add(output, y)
    return metrics.means("test")


def median_cell(model: SequenceModel, task: Task, args: argparse.Namespace) -> float:
    """Median |c_T| of the last layer on (up to 1,000) test inputs. tanh(c)
    saturates beyond about 3, and with it the gradients that pass through it."""
    with evaluating(model):
        _, (_, c_n) = model.rnn(task.test[0][:1000].to(args.device))
    return c_n[-1].abs().median().item()


def make_model(kind: str, task: Task, args: argparse.Namespace) -> SequenceModel:
    torch.manual_seed(args.seed)
    model = SequenceModel(
        kind, task.input_size, args.hidden_size, task.output_size, args.num_layers, args.dropout
    )
    return model.to(args.device)


def train_side_by_side(task: Task, args: argparse.Namespace) -> dict[str, Run]:
    """Trains each model of ``args.models`` on ``task``, interleaved by epoch,
    then saves, reloads and re-evaluates each one (see :func:`checkpoint`)."""
    models, trained, optimizers, scalers, generators, runs = {}, {}, {}, {}, {}, {}
    for kind in args.models:
        model = models[kind] = make_model(kind, task, args)
        trained[kind] = torch.compile(model) if args.compile else model
        optimizers[kind] = torch.optim.Adam(model.parameters(), lr=args.lr)
        # Loss scaling keeps float16 gradients from underflowing; a no-op otherwise.
        scalers[kind] = torch.amp.GradScaler(args.device.type, enabled=args.autocast == "float16")
        generators[kind] = torch.Generator().manual_seed(args.seed)
        runs[kind] = Run(kind, sum(p.numel() for p in model.parameters()))
        runs[kind].cell_before = median_cell(model, task, args)
        runs[kind].history.append({"epoch": 0, **evaluate(trained[kind], task, args)})

    with progress_bar() as bar:
        tasks = {
            kind: bar.add_task(f"{task.name}: {kind}", total=args.epochs * task.steps_per_epoch)
            for kind in args.models
        }
        for epoch in range(1, args.epochs + 1):
            for kind in args.models:
                model, optimizer, scaler = trained[kind], optimizers[kind], scalers[kind]
                metrics = Metrics(task)
                start = time.perf_counter()
                for x, y in task.train_epoch(generators[kind]):
                    x, y = x.to(args.device), y.to(args.device)
                    with autocast(args):
                        output = model(x)
                    loss = task.loss(output.float(), y)
                    optimizer.zero_grad(set_to_none=True)
                    scaler.scale(loss).backward()
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(models[kind].parameters(), args.clip)
                    scaler.step(optimizer)
                    scaler.update()
                    metrics.add(output, y)
                    bar.advance(tasks[kind])
                if args.device.type == "cuda":
                    torch.cuda.synchronize(args.device)
                seconds = time.perf_counter() - start
                row = {"epoch": epoch, **metrics.means("train"), **evaluate(model, task, args)}
                row["seconds"] = seconds
                runs[kind].history.append(row)
                bar.console.print(epoch_line(task, kind, row, args.epochs), soft_wrap=True)

    for kind, model in models.items():
        runs[kind].cell_after = median_cell(model, task, args)
        checkpoint(model, runs[kind], task, args)
    return runs


def epoch_line(task: Task, kind: str, row: dict, epochs: int) -> str:
    """``digits | epoch  3/30 | LSTM | train 1.1325 59.5% | test 1.2001 57.1% | 0.28 s``"""
    cells = [task.name, f"epoch {row['epoch']:>{len(str(epochs))}}/{epochs}", kind]
    for split in ("train", "test"):
        accuracy = row.get(f"{split}_accuracy")
        cells.append(
            f"{split} {row[f'{split}_loss']:.4f}" + ("" if accuracy is None else f" {accuracy:.1%}")
        )
    cells.append(f"{row['seconds']:.2f} s")
    return " | ".join(cells)


def progress_bar():  # rich.progress.Progress
    from rich.progress import MofNCompleteColumn, Progress, TimeRemainingColumn

    columns = (*Progress.get_default_columns()[:2], MofNCompleteColumn(), TimeRemainingColumn())
    return Progress(*columns)


def checkpoint(model: SequenceModel, run: Run, task: Task, args: argparse.Namespace) -> None:
    """Saves the model's state_dict, loads it into a freshly built model and
    checks that this one evaluates exactly as the trained one."""
    path = args.out_dir / "checkpoints" / f"{slug(task.name)}-{run.model.lower()}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)

    reloaded = make_model(run.model, task, args)
    reloaded.load_state_dict(torch.load(path, weights_only=True))
    # Both eager, so the same kernels in the same order: the same numbers.
    before, after = evaluate(model, task, args), evaluate(reloaded, task, args)
    if before != after:
        raise RuntimeError(f"{path}: the reloaded model evaluates to {after}, not {before}")
    run.checkpoint, run.reloaded = path.relative_to(args.out_dir).as_posix(), after
    print(f"{path}: saved and reloaded, test loss {after['test_loss']:.4f} as trained")


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


# --- Reports ----------------------------------------------------------------


def environment(args: argparse.Namespace) -> dict[str, str]:
    """What the timings depend on."""
    processor = platform.processor()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        processor = next(
            (line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
            processor,
        )
    device = str(args.device)
    if args.device.type == "cuda":
        device += f" ({torch.cuda.get_device_name(args.device)})"
    return {
        "command": args.command,
        "machine": f"{processor or platform.machine()}, {os.cpu_count()} cores",
        "device": device,
        "threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "lltm": lltm.__version__,
        "python": platform.python_version(),
    }


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    def cell(value: object) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def training_summary(args: argparse.Namespace, steps_per_epoch: int) -> str:
    """The model and training options, as the tables' caption gives them."""
    steps = args.epochs * steps_per_epoch
    return (
        f"hidden size {args.hidden_size}, {plural(args.num_layers, 'layer')}, "
        f"{args.epochs} epochs of {steps_per_epoch} batches of {args.batch_size} "
        f"({steps:,} steps), Adam lr {args.lr:g}, gradient norm clipped at {args.clip:g}, "
        f"seed {args.seed}"
    )


def environment_note(args: argparse.Namespace) -> str:
    env = environment(args)
    threads = plural(int(env["threads"]), "thread")
    return (
        f"`{env['command']}` on {env['machine']} ({env['device']}, {threads}), "
        f"torch {env['torch']}, lltm {env['lltm']}, Python {env['python']}."
    )


def write_results(name: str, args: argparse.Namespace, markdown: str, data: dict) -> None:
    """``<name>.md`` (the tables) and ``<name>.json`` (every number) in --out-dir."""
    (args.out_dir / f"{name}.md").write_text(markdown + "\n\n" + environment_note(args) + "\n")
    # The options, but not where this file is: no path of this machine.
    options = {k: v for k, v in vars(args).items() if k not in ("out_dir", "command")}
    payload = {"environment": environment(args), "options": options, **data}
    (args.out_dir / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {args.out_dir / name}.md, .json")


def run_record(run: Run) -> dict:
    return {**vars(run), "seconds_per_epoch": run.seconds_per_epoch}


def plot_history(ax, runs: dict[str, Run], metric: str, ylabel: str) -> None:
    """Train (dashed) and test (solid) ``metric`` per epoch of each model."""
    for kind, run in runs.items():
        for split, style in (("train", "--"), ("test", "-")):
            points = [
                (h["epoch"], h[f"{split}_{metric}"])
                for h in run.history
                if h.get(f"{split}_{metric}") is not None
            ]
            if points:
                epochs, values = zip(*points, strict=True)
                ax.plot(epochs, values, style, color=COLORS[kind], label=f"{kind} {split}")
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def save_figure(fig, args: argparse.Namespace, name: str) -> None:
    path = args.out_dir / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"wrote {path}")


def pyplot():
    """matplotlib's pyplot without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
