"""Markdown tables (and plots) from ``python -m lltm bench --json`` files.

    python benchmarks/render.py data/run.json [more.json ...] [--plot out.png]
    python benchmarks/render.py --across data/run1.json data/run2.json ... [--phase no_grad]

One table per file in the bench's own layout (min / median per phase timed,
speed-ups of medians against the baseline, and for sequences and per-sample
gradients against nn.LSTM), under the exact command that produced it and a title that says
which case and configuration ran. --plot draws the last file as
``lltm bench --plot`` would. This is how benchmarks/RESULTS.md is written from
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
import statistics
import sys
from pathlib import Path
from typing import Any

from lltm.bench import report


def markdown(data: dict[str, Any]) -> str:
    results, env = report.from_json(data)
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
    kinds = {report.kind_of_env(data["environment"]) for data in reports.values()}
    if len(kinds) != 1:
        raise mixed
    runs = {name: report.from_json(data)[0] for name, data in reports.items()}
    sizes = {r.size for results in runs.values() for r in results}
    if len(sizes) != 1:
        raise mixed
    [kind], [size] = kinds, sizes
    if phase not in kind.phases:
        raise SystemExit(f"render.py --across: {kind.name} runs time no {phase} phase")
    comparisons = [kind.baseline, *([kind.rival] if kind.rival else [])]
    impls = list(dict.fromkeys(r.impl for results in runs.values() for r in results))
    unit = report.pick_unit([r for results in runs.values() for r in results], "auto")

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
        results, env = report.from_json(reports[-1])
        report.plot(results, env, args.plot, report.pick_unit(results, "auto"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
