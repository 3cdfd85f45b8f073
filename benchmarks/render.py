"""Markdown tables (and plots) from ``python -m lltm bench --json`` files.

    python benchmarks/render.py data/run.json [more.json ...] [--plot out.png]
    python benchmarks/render.py --across data/run1.json data/run2.json ... [--phase no_grad]

One table per file in the bench's own layout (min / median per phase timed,
speed-ups of medians against the baseline, and for sequences and per-sample
gradients against nn.LSTM), under the exact command that produced it and a title that says
which case and configuration ran. --plot draws the last file: step time
against size or sequence length, and the speed-ups against the baseline (and
nn.LSTM or nn.LSTMCell, where the run has them), as the figures of
docs/performance.md are drawn. This is how benchmarks/RESULTS.md is written from
benchmarks/data/. Files written before the sequence case and --inputs-grad
existed measured one cell step with inputs requiring grad, and are read so.

--across summarises repeated runs of one case at one size instead: a row per
run with each implementation's step median (or that of the phase --phase
names) and its speed-ups, measured side by side in that run, and a last row
with the median over the runs of each.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lltm.bench import report
from lltm.bench.kinds import NO_GRAD, PER_SAMPLE, Size
from lltm.bench.timing import Result

# What files written before these fields existed measured: one cell step with
# inputs that require grad.
OLD_ENVIRONMENT = {"case": "cell", "inputs_grad": True, "seq_len": None}


def from_json(data: dict[str, Any]) -> tuple[list[Result], dict[str, Any]]:
    """Results and environment of a ``lltm bench --json`` file.

    Such that min() and median() give back the recorded values (speed-ups
    follow from those).
    """
    env = {**OLD_ENVIRONMENT, **data["environment"]}
    results = []
    for row in data["results"]:
        times = {
            phase: [row[phase]["min_s"], row[phase]["median_s"], row[phase]["median_s"]]
            for phase in report.kind_of_env(env).phases
            if row[phase]["min_s"] is not None
        }
        # Files written before the loss was a choice differentiated dense ones.
        size = Size(
            row["batch"],
            row["features"],
            row["state"],
            row.get("seq_len"),
            row.get("loss", "dense"),
        )
        host = {
            phase: [row[phase]["host_median_s"]]
            for phase in report.kind_of_env(env).phases
            if row[phase].get("host_median_s") is not None
        }
        results.append(
            Result(
                size,
                row["impl"],
                times,
                host=host,
                saved_bytes=row["saved_for_backward_bytes"],
                saved_beyond_inputs_bytes=row["saved_beyond_inputs_bytes"],
                error=row["error"],
                flops=row.get("flops"),
                path=row.get("path"),
            )
        )
    return results, env


def pick_unit(results: Sequence[Result], unit: str = "auto") -> str:
    """One unit for a whole plot or summary: us, or ms when some step takes over 10 ms."""
    if unit != "auto":
        return unit
    slowest = max((r.median("step") or 0.0 for r in results), default=0.0)
    return "ms" if slowest > 0.01 else "us"


def markdown(data: dict[str, Any]) -> str:
    results, env = from_json(data)
    header, rows = report.table_rows(results, env)
    labels = report.label_columns(header)
    lines = [
        f"`{env['command']}`",
        "",
        report.title(env),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i < labels else "---:" for i in range(len(header))) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    return "\n".join(lines)


def across(reports: dict[str, dict[str, Any]], phase: str = "step") -> str:
    """Repeated runs (file name -> report) of one kind of case at one size:
    medians and speed-ups of ``phase``."""
    mixed = SystemExit("render.py --across: the runs must be of one kind of case at one size")
    kinds = {
        report.kind_of_env({**OLD_ENVIRONMENT, **data["environment"]}) for data in reports.values()
    }
    if len(kinds) != 1:
        raise mixed
    runs = {name: from_json(data)[0] for name, data in reports.items()}
    sizes = {r.size for results in runs.values() for r in results}
    if len(sizes) != 1:
        raise mixed
    [kind], [size] = kinds, sizes
    if phase not in kind.phases:
        raise SystemExit(f"render.py --across: {kind.name} runs time no {phase} phase")
    comparisons = [kind.baseline, *([kind.rival] if kind.rival else [])]
    impls = list(dict.fromkeys(r.impl for results in runs.values() for r in results))
    unit = pick_unit([r for results in runs.values() for r in results])

    # Per run and implementation: the phase's median, and its speed-ups.
    entries: dict[str, list[list[float | None]]] = {}
    for name, results in runs.items():
        mine = {r.impl: r for r in results}
        entries[name] = [
            [
                mine[impl].median(phase),
                *(report.speedup(results, mine[impl], phase, c) for c in comparisons),
            ]
            if impl in mine
            else [None] * (1 + len(comparisons))
            for impl in impls
        ]

    def median(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    medians = [
        [median([entries[name][i][j] for name in entries]) for j in range(1 + len(comparisons))]
        for i in range(len(impls))
    ]

    def cell(entry: list[float | None]) -> str:
        time, *ratios = entry
        if time is None:
            return "-"
        shown = "; ".join("-" if x is None else f"{x:.2f}x" for x in ratios)
        return f"{time * report.UNITS[unit]:,.1f} ({shown})"

    where = f"{size}" + (f", T={size.seq_len}" if kind.sequences else "")
    against = " and against ".join(report.NAMES[c] for c in comparisons)
    lines = [
        f"{len(runs)} runs of {kind.name} at {where}: {phase} medians in {unit}, in parentheses "
        f"the speed-ups against {against}, measured side by side in each run",
        "",
        "| run | " + " | ".join(impls) + " |",
        "|---|" + "---:|" * len(impls),
        *(f"| {name} | " + " | ".join(map(cell, row)) + " |" for name, row in entries.items()),
        "| median over the runs | " + " | ".join(map(cell, medians)) + " |",
    ]
    return "\n".join(lines)


# --- Plot ------------------------------------------------------------------------


def _axis(sizes: Sequence[Size], batch: str) -> tuple[list[str], str]:
    """Tick labels and axis label for the points of a run.

    Sizes, lengths or both; ``batch`` names the first dimension of a size.
    """
    if all(s.seq_len is None for s in sizes):
        return [str(s) for s in sizes], f"{batch} x features x state"
    if len({str(s) for s in sizes}) == 1:
        return [str(s.seq_len) for s in sizes], f"sequence length T (at {sizes[0]})"
    if len({s.seq_len for s in sizes}) == 1:
        return [str(s) for s in sizes], f"{batch} x features x state (T={sizes[0].seq_len})"
    return [f"{s} T={s.seq_len}" for s in sizes], f"{batch} x features x state, sequence length"


# The time panel of a plot, per kind: title and what is timed.
TIME_PANELS = {
    "cell": ("time per step", "forward + backward"),
    "sequence": ("time per sequence (all T steps)", "forward + backward"),
    "per-sample": ("time per batch of samples", "every sample's gradients"),
    "overhead": ("time per step", "forward + backward"),
}
# Speed-up lines of a plot, per phase (when the kind times it): line style, marker.
SPEEDUP_LINES = {"step": ("-", "o"), "forward": (":", "."), NO_GRAD: ("--", "x")}


def plot(results: Sequence[Result], env: dict[str, Any], path: str, unit: str) -> None:
    """Step time per size (or sequence length), and speed-ups.

    Against the baseline, and against the rival if the kind has one and it ran.
    """
    try:
        import matplotlib
    except ImportError as error:
        raise SystemExit("render.py: --plot needs matplotlib (pip install matplotlib)") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = report.kind_of_env(env)
    rival = report.rival_in(kind, results)
    comparisons = [kind.baseline, *([rival] if rival else [])]
    lines = {phase: style for phase, style in SPEEDUP_LINES.items() if phase in kind.phases}
    # One loss per plot: the run's first (the tutorial's, by default).
    loss = results[0].size.loss if results else "dense"
    results = [r for r in results if r.size.loss == loss]
    sizes = list(dict.fromkeys(r.size for r in results))
    ticks, xlabel = _axis(sizes, "samples" if kind is PER_SAMPLE else "batch")
    impls = list(dict.fromkeys(r.impl for r in results if not r.error))
    fig, axes = plt.subplots(
        1, 1 + len(comparisons), figsize=(6 * (1 + len(comparisons)), 4.8), layout="constrained"
    )
    ax_time, speed_axes = axes[0], axes[1:]
    # One colour per implementation, the same in every panel.
    colours = {impl: f"C{i}" for i, impl in enumerate(impls)}
    for impl in impls:
        mine = {r.size: r for r in results if r.impl == impl and not r.error}
        xs = [i for i, s in enumerate(sizes) if s in mine]
        floor = impl == "gemm"
        ax_time.plot(
            xs,
            [(mine[sizes[i]].median("step") or math.nan) * report.UNITS[unit] for i in xs],
            "--" if floor else "-",
            marker="o",
            color=colours[impl],
            label="GEMMs only" if floor else impl,
        )
        for ax, against in zip(speed_axes, comparisons, strict=True):
            if impl in (against, "gemm"):
                continue
            for phase, (style, marker) in lines.items():
                ax.plot(
                    xs,
                    [
                        report.speedup(results, mine[sizes[i]], phase, against) or math.nan
                        for i in xs
                    ],
                    style,
                    marker=marker,
                    color=colours[impl],
                    label=f"{impl} {phase}",
                )
    time_title, timed = TIME_PANELS[kind.name]
    ax_time.set(yscale="log", ylabel=f"{timed}, median ({unit})", title=time_title)
    for ax, against in zip(speed_axes, comparisons, strict=True):
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(
            ylabel=f"{against} time / time (medians)",
            title=f"speed-up against {report.NAMES[against]}",
        )
    for ax in axes:
        ax.set_xticks(range(len(sizes)), ticks, rotation=20)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    # About 65 characters per panel fit on a line.
    fig.suptitle(textwrap.fill(report.title(env), 65 * len(axes)), fontsize="medium")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--plot", metavar="FILE.png")
    parser.add_argument(
        "--across", action="store_true", help="one summary table over repeated runs"
    )
    parser.add_argument(
        "--phase", default="step", help="with --across: the phase summarised (default step)"
    )
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.reports]
    if args.across:
        named = {path.name: data for path, data in zip(args.reports, reports, strict=True)}
        print(across(named, args.phase))
        return 0
    for data in reports:
        print(markdown(data), end="\n\n")
    if args.plot:
        results, env = from_json(reports[-1])
        plot(results, env, args.plot, pick_unit(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
