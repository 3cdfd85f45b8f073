"""Markdown tables (and plots) from ``python -m lltm bench --json`` files.

    python benchmarks/render.py data/run.json [more.json ...] [--plot out.png]

One table per file in the bench's own layout (min / median per phase timed,
speed-ups of medians against the baseline, and for sequences and per-sample
gradients against nn.LSTM), under the exact command that produced it and a title that says
which case and configuration ran. --plot draws the last file as
``lltm bench --plot`` would. This is how benchmarks/RESULTS.md is written from
benchmarks/data/. Files written before the sequence case and --inputs-grad
existed measured one cell step with inputs requiring grad, and are read so.
"""

from __future__ import annotations

import argparse
import json
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--plot", metavar="FILE.png")
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.reports]
    for data in reports:
        print(markdown(data), end="\n\n")
    if args.plot:
        results, env = report.from_json(reports[-1])
        report.plot(results, env, args.plot, report.pick_unit(results, "auto"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
