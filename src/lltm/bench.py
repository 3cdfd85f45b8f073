"""``python -m lltm bench``: lltm against the LLTM in plain PyTorch and its rivals.

With no arguments: the tutorial's configuration (batch 16, 32 features, state
128, float32) on the best available device (CUDA when lltm's CUDA kernels are
active), in well under a minute. Implementations, all modules with the same
weights, called the way the tutorial calls them, rnn(input, (h, c)):

  reference  the tutorial's pure-PyTorch LLTM (lltm.reference.LLTM), eager
  compiled   the same module under torch.compile
  lltm       lltm.LLTM, the fused operator
  lstmcell   torch.nn.LSTMCell(features, state), the stock recurrent cell
  gemm       not a cell: only the matrix products one LLTM step needs
             (forward [old_h, input] @ W^T; backward d_gates^T @ [old_h, input]
             and d_gates @ W), the floor under any implementation

Phases: forward (recording the autograd graph), backward (gradients of new_h
and new_cell, all ones, with respect to every input and parameter, from a
retained graph) and step (both, on a fresh graph each time). The inputs
require grad, as in a recurrent network where old_h and old_cell come from the
previous step. Each measurement is a block of calls timed by
torch.utils.benchmark (warm-up, GPU synchronisation); the implementations take
turns block by block so that machine noise hits them alike. The table gives
min / median over blocks, and speed-ups of medians against the reference.

Memory: bytes of the distinct storages that one forward's autograd graph keeps
for backward (torch.autograd.graph.saved_tensors_hooks), in all and beyond the
inputs and parameters themselves.

Extras (pip install 'lltm[bench]'): rich for the table and progress bar,
matplotlib for --plot.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils import benchmark

from . import reference
from ._version import __version__
from .module import LLTM

IMPLEMENTATIONS = ("reference", "compiled", "lltm", "lstmcell", "gemm")
DEFAULT_IMPLEMENTATIONS = ("reference", "compiled", "lltm", "lstmcell")
PHASES = ("forward", "backward", "step")
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}
# --sweep: (batch, features, state) from below the tutorial's size to a large layer.
SWEEP = (
    (4, 32, 64),
    (16, 32, 128),
    (32, 64, 256),
    (64, 128, 512),
    (128, 256, 1024),
    (256, 1024, 1024),
)
# Wall time one block aims at: long enough to dwarf the timer's own cost,
# short enough for many interleaved blocks.
BLOCK_SECONDS = 0.02


@dataclass(frozen=True)
class Size:
    batch: int
    features: int
    state: int

    def __str__(self) -> str:
        return f"{self.batch}x{self.features}x{self.state}"


@dataclass
class Result:
    """Seconds per call of one implementation at one size, one entry per block."""

    size: Size
    impl: str
    times: dict[str, list[float]] = field(default_factory=dict)
    saved_bytes: int | None = None
    saved_beyond_inputs_bytes: int | None = None
    error: str | None = None

    def min(self, phase: str) -> float | None:
        return min(self.times[phase]) if self.times.get(phase) else None

    def median(self, phase: str) -> float | None:
        values = sorted(self.times.get(phase) or [])
        if not values:
            return None
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


# --- What is timed ---------------------------------------------------------------


class Case:
    """One implementation at one size: a callable per phase."""

    def __init__(self, impl: str, call: Callable[[], Any], leaves: list[torch.Tensor]) -> None:
        self.impl = impl
        self.leaves = leaves
        self._call = call
        self._graph: tuple[torch.Tensor, ...] | None = None
        self._ones: tuple[torch.Tensor, ...] | None = None

    def forward(self) -> Any:
        return self._call()

    def backward(self) -> Any:
        if self._graph is None:  # one graph, kept for every backward block
            self._graph = tuple(self._call())
            self._ones = tuple(torch.ones_like(t) for t in self._graph)
        return torch.autograd.grad(self._graph, self.leaves, self._ones, retain_graph=True)

    def step(self) -> Any:
        outputs = tuple(self._call())
        if self._ones is None:
            self._ones = tuple(torch.ones_like(t) for t in outputs)
        return torch.autograd.grad(outputs, self.leaves, self._ones)

    def phase(self, name: str) -> Callable[[], Any]:
        return getattr(self, name)


class GemmCase(Case):
    """The matrix products of one LLTM step, nothing else."""

    def __init__(self, weights: torch.Tensor, x: torch.Tensor, d_gates: torch.Tensor) -> None:
        super().__init__("gemm", lambda: None, [])
        self.weights, self.x, self.d_gates = weights, x, d_gates

    def forward(self) -> Any:
        return torch.mm(self.x, self.weights.t())

    def backward(self) -> Any:
        return torch.mm(self.d_gates.t(), self.x), torch.mm(self.d_gates, self.weights)

    def step(self) -> Any:
        return self.forward(), self.backward()


def make_case(
    impl: str, size: Size, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> Case:
    torch.manual_seed(seed)
    b, f, s = size.batch, size.features, size.state
    ref = reference.LLTM(f, s).to(device=device, dtype=dtype)
    if impl == "gemm":
        x = torch.randn(b, s + f, device=device, dtype=dtype)
        d_gates = torch.randn(b, 3 * s, device=device, dtype=dtype)
        return GemmCase(ref.weights.detach(), x, d_gates)
    if impl == "lstmcell":
        module = torch.nn.LSTMCell(f, s).to(device=device, dtype=dtype)
    elif impl == "lltm":
        module = LLTM(f, s).to(device=device, dtype=dtype)
        module.load_state_dict(ref.state_dict())
    elif impl == "compiled":
        # One static graph per size: after a shape change, automatic dynamic
        # shapes make AOTAutograd donate buffers, which forbids the retained
        # graph that the backward phase is timed on.
        module = torch.compile(copy.deepcopy(ref), dynamic=False)
    else:
        module = ref

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)

    x, h, c = leaf(b, f), leaf(b, s), leaf(b, s)
    return Case(impl, lambda: module(x, (h, c)), [x, h, c, *module.parameters()])


def saved_for_backward(case: Case) -> tuple[int, int]:
    """Bytes of the distinct storages one forward saves for backward: in all,
    and beyond those of the inputs and parameters."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        case.forward()
    inputs = {t.untyped_storage().data_ptr() for t in case.leaves}
    beyond = sum(n for ptr, n in storages.items() if ptr not in inputs)
    return sum(storages.values()), beyond


# --- Timing ----------------------------------------------------------------------


def _calls_per_block(timer: benchmark.Timer, block_seconds: float) -> int:
    start = time.perf_counter()
    first = timer.timeit(1).mean  # also the warm-up: compiles, allocates
    if time.perf_counter() - start > 4 * block_seconds:
        return 1
    per_call = timer.timeit(max(1, int(0.25 * block_seconds / first))).mean
    return max(1, round(block_seconds / per_call))


def measure(
    cases: Sequence[Case],
    rounds: int,
    threads: int,
    block_seconds: float = BLOCK_SECONDS,
    on_block: Callable[[], None] = lambda: None,
) -> dict[str, dict[str, list[float]]]:
    """Seconds per call, per implementation and phase, one entry per round.

    Each round times one block of every (implementation, phase) in turn, so
    that noise (other processes, clock changes) spreads over all of them.
    """
    timers = {
        (case.impl, phase): benchmark.Timer(
            stmt="fn()", globals={"fn": case.phase(phase)}, num_threads=threads
        )
        for case in cases
        for phase in PHASES
    }
    calls = {key: _calls_per_block(timer, block_seconds) for key, timer in timers.items()}
    times: dict[str, dict[str, list[float]]] = {c.impl: {p: [] for p in PHASES} for c in cases}
    for _ in range(rounds):
        for (impl, phase), timer in timers.items():
            times[impl][phase].append(timer.timeit(calls[impl, phase]).mean)
            on_block()
    return times


# --- A run -----------------------------------------------------------------------


def pick_device(name: str) -> torch.device:
    from . import _backends

    if name == "auto":
        active, _why = _backends.cuda_status()
        return torch.device("cuda" if active else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("lltm bench: CUDA was asked for, but no CUDA device is available")
    return torch.device(name)


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(device: torch.device, dtype: torch.dtype, threads: int) -> dict[str, Any]:
    env: dict[str, Any] = {
        "lltm": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "threads": threads,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[str], Callable[[], None]]]:
    """Yields start(label) -> advance: a rich progress bar, or no-ops."""

    def quiet(_label: str) -> Callable[[], None]:
        return lambda: None

    if not enabled:
        yield quiet
        return
    try:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
    except ImportError:
        print("lltm bench: pip install rich for a progress bar", file=sys.stderr)
        yield quiet
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task("", total=total)

        def start(label: str) -> Callable[[], None]:
            progress.update(task, description=label)
            return lambda: progress.advance(task)

        yield start


def run(args: argparse.Namespace) -> tuple[list[Result], dict[str, Any]]:
    device = pick_device("cuda" if args.cuda else args.device)
    dtype = torch.float64 if args.double else DTYPES[args.dtype]
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    if args.sizes:
        sizes = args.sizes
    elif args.sweep:
        sizes = [Size(*s) for s in SWEEP]
    else:
        sizes = [Size(args.batch_size, args.features, args.state_size)]
    impls = list(dict.fromkeys(["reference", *args.impl]))  # speed-ups are against it
    blocks_per_impl = len(PHASES) * args.runs
    results: list[Result] = []
    with _progress(
        len(sizes) * len(impls) * blocks_per_impl, len(sizes) > 1 and not args.quiet
    ) as start:
        for size in sizes:
            advance = start(f"{size} {dtype} {device}")
            cases: list[Case] = []
            for impl in impls:
                try:
                    case = make_case(impl, size, device, dtype, args.seed)
                    for phase in PHASES:  # fail early: compile errors, unsupported dtypes
                        case.phase(phase)()
                    cases.append(case)
                except Exception as error:  # noqa: BLE001 - one failing implementation must not end the run
                    message = f"{type(error).__name__}: {error}".splitlines()[0]
                    results.append(Result(size, impl, error=message))
                    for _ in range(blocks_per_impl):
                        advance()
            times = measure(cases, args.runs, threads, args.block_seconds, advance)
            for case in cases:
                result = Result(size, case.impl, times=times[case.impl])
                if case.impl != "gemm":
                    with contextlib.suppress(Exception):
                        result.saved_bytes, result.saved_beyond_inputs_bytes = saved_for_backward(
                            case
                        )
                results.append(result)
    results.sort(key=lambda r: (sizes.index(r.size), impls.index(r.impl)))
    env = environment(device, dtype, threads)
    env["blocks"] = args.runs
    env["command"] = " ".join(["python -m lltm bench", *args.argv])
    return results, env


# --- Reports ---------------------------------------------------------------------


def speedup(results: Sequence[Result], result: Result, phase: str) -> float | None:
    """Median time of the reference over that of `result`, at the same size."""
    ref = next((r for r in results if r.size == result.size and r.impl == "reference"), None)
    ours, theirs = result.median(phase), ref.median(phase) if ref else None
    return theirs / ours if ours and theirs else None


def to_json(results: Sequence[Result], env: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for r in results:
        row: dict[str, Any] = {**asdict(r.size), "impl": r.impl, "error": r.error}
        for phase in PHASES:
            row[phase] = {
                "min_s": r.min(phase),
                "median_s": r.median(phase),
                "blocks": len(r.times.get(phase) or []),
                "speedup_vs_reference": speedup(results, r, phase),
            }
        row["saved_for_backward_bytes"] = r.saved_bytes
        row["saved_beyond_inputs_bytes"] = r.saved_beyond_inputs_bytes
        rows.append(row)
    return {"environment": env, "results": rows}


def pick_unit(results: Sequence[Result], unit: str) -> str:
    """One unit for a whole plot: us, or ms when some step takes over 10 ms."""
    if unit != "auto":
        return unit
    slowest = max((r.median("step") or 0.0 for r in results), default=0.0)
    return "ms" if slowest > 0.01 else "us"


def table_rows(results: Sequence[Result], unit: str = "auto") -> tuple[list[str], list[list[str]]]:
    """Header and rows of the results table; `auto` picks us or ms per cell."""

    def timing(r: Result, phase: str) -> str:
        low, mid = r.min(phase), r.median(phase)
        if low is None or mid is None:
            return "-"
        u = unit if unit != "auto" else ("ms" if mid > 0.01 else "us")
        return f"{low * UNITS[u]:,.1f} / {mid * UNITS[u]:,.1f} {u}"

    def ratio(r: Result, phase: str) -> str:
        value = speedup(results, r, phase)
        return "-" if value is None else f"{value:.2f}"

    def kib(n: int | None) -> str:
        return "-" if n is None else f"{n / 1024:,.0f}"

    header = [
        "size",
        "impl",
        *(f"{phase} min / median" for phase in PHASES),
        "speed-up fwd / bwd / step",
        "saved KiB (beyond inputs)",
    ]
    rows = []
    for r in results:
        if r.error:
            rows.append([str(r.size), r.impl, f"failed: {r.error}", *[""] * (len(header) - 3)])
            continue
        saved = (
            "-"
            if r.saved_bytes is None
            else f"{kib(r.saved_bytes)} ({kib(r.saved_beyond_inputs_bytes)})"
        )
        speedups = " / ".join(ratio(r, phase) for phase in PHASES)
        rows.append([str(r.size), r.impl, *(timing(r, phase) for phase in PHASES), speedups, saved])
    return header, rows


def title(env: dict[str, Any]) -> str:
    where = env.get("gpu") or env["cpu"]
    return (
        f"lltm {env['lltm']}, torch {env['torch']}: {env['dtype']} on {env['device']} "
        f"({where}, {env['threads']} threads), {env['blocks']} blocks each"
    )


def print_table(results: Sequence[Result], env: dict[str, Any], unit: str) -> None:
    header, rows = table_rows(results, unit)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
        print(title(env))
        for line in (header, *rows):
            print(
                "  ".join(
                    c.ljust(w) if i < 2 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(line, widths, strict=True))
                )
            )
        return
    table = Table(title=title(env), title_justify="left")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=max(150, len(title(env)))).print(table)


def plot(results: Sequence[Result], env: dict[str, Any], path: str, unit: str) -> None:
    """Step time and speed-up against the reference, per size."""
    try:
        import matplotlib
    except ImportError as error:
        raise SystemExit(
            "lltm bench: --plot needs matplotlib (pip install 'lltm[bench]')"
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(r.size for r in results))
    fig, (ax_time, ax_speed) = plt.subplots(1, 2, figsize=(12, 4.8), layout="constrained")
    for impl in dict.fromkeys(r.impl for r in results if not r.error):
        mine = {r.size: r for r in results if r.impl == impl and not r.error}
        xs = [i for i, s in enumerate(sizes) if s in mine]
        step = [mine[sizes[i]].median("step") * UNITS[unit] for i in xs]
        floor = impl == "gemm"
        ax_time.plot(
            xs, step, "--" if floor else "-", marker="o", label="GEMMs only" if floor else impl
        )
        if impl not in ("reference", "gemm"):
            line = ax_speed.plot(
                xs,
                [speedup(results, mine[sizes[i]], "step") or math.nan for i in xs],
                marker="o",
                label=f"{impl} step",
            )
            ax_speed.plot(
                xs,
                [speedup(results, mine[sizes[i]], "forward") or math.nan for i in xs],
                ":",
                marker=".",
                color=line[0].get_color(),
                label=f"{impl} forward",
            )
    ax_time.set(yscale="log", ylabel=f"forward + backward, median ({unit})", title="time per step")
    ax_speed.axhline(1.0, color="grey", linewidth=0.8)
    ax_speed.set(
        ylabel="reference time / time (medians)", title="speed-up against the eager reference"
    )
    for ax in (ax_time, ax_speed):
        ax.set_xticks(range(len(sizes)), [str(s) for s in sizes], rotation=20)
        ax.set_xlabel("batch x features x state")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title(env), fontsize="medium")
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- Command line ----------------------------------------------------------------


def _impl_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(IMPLEMENTATIONS)
    if not names or any(n not in IMPLEMENTATIONS for n in names):
        raise argparse.ArgumentTypeError(
            f"choose among {', '.join(IMPLEMENTATIONS)} (or all), got {text!r}"
        )
    return names


def _size_list(text: str) -> list[Size]:
    try:
        sizes = [
            Size(*(int(n) for n in item.lower().split("x")))
            for item in text.split(",")
            if item.strip()
        ]
    except (TypeError, ValueError):
        sizes = []
    if not sizes or any(min(s.batch, s.features, s.state) < 0 for s in sizes):
        raise argparse.ArgumentTypeError(
            f"expected BxFxS[,BxFxS...] (batch x features x state), got {text!r}"
        )
    return sizes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lltm bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = p.add_argument_group("size (the tutorial's flags)")
    size.add_argument("-b", "--batch-size", type=int, default=16)
    size.add_argument("-f", "--features", type=int, default=32)
    size.add_argument("-s", "--state-size", type=int, default=128)
    size.add_argument(
        "--sweep",
        action="store_true",
        help="instead, the sizes " + ", ".join(str(Size(*s)) for s in SWEEP),
    )
    size.add_argument(
        "--sizes",
        type=_size_list,
        metavar="BxFxS,...",
        help="instead, these sizes, e.g. 16x32x128,256x1024x1024",
    )
    what = p.add_argument_group("what and where")
    what.add_argument("--impl", type=_impl_list, default=list(DEFAULT_IMPLEMENTATIONS), metavar="NAMES",
                      help=f"comma-separated subset of {','.join(IMPLEMENTATIONS)}, or all (default {','.join(DEFAULT_IMPLEMENTATIONS)}); the reference always runs")  # fmt: skip
    what.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto (default): CUDA if lltm's CUDA kernels are active, else CPU",
    )
    what.add_argument("-c", "--cuda", action="store_true", help="same as --device cuda")
    what.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    what.add_argument("-d", "--double", action="store_true", help="same as --dtype float64")
    what.add_argument(
        "--threads", type=int, default=0, help="CPU threads (default: torch's current number)"
    )
    how = p.add_argument_group("measurement and output")
    how.add_argument(
        "-r",
        "--runs",
        type=int,
        default=15,
        help="interleaved blocks per implementation and phase (default 15)",
    )
    how.add_argument(
        "--block-seconds",
        type=float,
        default=BLOCK_SECONDS,
        help=f"target length of one block (default {BLOCK_SECONDS})",
    )
    how.add_argument("--seed", type=int, default=0)
    how.add_argument(
        "--scale",
        choices=("auto", *UNITS),
        default="auto",
        help="time unit of the table (default auto: us, or ms from 10 ms on)",
    )
    how.add_argument(
        "--json", metavar="FILE", help="write results and environment as JSON (- for stdout)"
    )
    how.add_argument(
        "--plot", metavar="FILE.png", help="plot time and speed-up against size (needs matplotlib)"
    )
    how.add_argument("-q", "--quiet", action="store_true", help="no table, no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    if args.runs < 1:
        raise SystemExit("lltm bench: --runs must be at least 1")
    results, env = run(args)
    unit = args.scale
    if args.json:
        text = json.dumps(to_json(results, env), indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as out:
                out.write(text + "\n")
    if not args.quiet and args.json != "-":
        print_table(results, env, unit)
    if args.plot:
        plot(results, env, args.plot, pick_unit(results, unit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
