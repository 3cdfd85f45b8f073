"""Markdown tables (and plots) from ``python -m lltm bench --json`` files.

    python benchmarks/render.py data/run.json [more.json ...] [--plot out.png]

One table per file in the bench's own layout (min / median per phase,
speed-ups of medians against the eager reference), under the exact command
that produced it. --plot draws the last file as ``lltm bench --plot`` would.
This is how benchmarks/RESULTS.md is written from benchmarks/data/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lltm.bench import PHASES, Result, Size, pick_unit, plot, table_rows, title


def results_of(report: dict) -> list[Result]:
    """Results whose min() and median() give back the recorded values."""
    results = []
    for row in report["results"]:
        times = {
            phase: [row[phase]["min_s"], row[phase]["median_s"], row[phase]["median_s"]]
            for phase in PHASES
            if row[phase]["min_s"] is not None
        }
        result = Result(Size(row["batch"], row["features"], row["state"]), row["impl"], times)
        result.saved_bytes = row["saved_for_backward_bytes"]
        result.saved_beyond_inputs_bytes = row["saved_beyond_inputs_bytes"]
        result.error = row["error"]
        results.append(result)
    return results


def markdown(report: dict) -> str:
    results = results_of(report)
    header, rows = table_rows(results)
    lines = [
        f"`{report['environment']['command']}`",
        "",
        title(report["environment"]),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--plot", metavar="FILE.png")
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.reports]
    for report in reports:
        print(markdown(report), end="\n\n")
    if args.plot:
        results = results_of(reports[-1])
        plot(results, reports[-1]["environment"], args.plot, pick_unit(results, "auto"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
