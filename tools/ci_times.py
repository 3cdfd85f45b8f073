"""Where a CI run's time went: one table of every nox session it ran.

``.ci/run`` runs each of its steps as ``nox --report DIR/STEP.json ...``
(``bg-NAME.json`` for the sessions it starts in the background) and notes
each step's start and end in ``DIR/steps.tsv``; at its end, whether it passed
or not, this prints every session with its wall time, its result and whether
it ran in the background, each step's own wall time (its sessions, plus
nox's start), and the run's total from its first second::

    python -m tools.ci_times DIR --started EPOCH_SECONDS
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Step:
    name: str
    background: bool
    started: float
    ended: float | None
    status: str


def minutes(seconds: float) -> str:
    """``seconds`` as m:ss."""
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def read_steps(folder: Path) -> list[Step]:
    """steps.tsv's lines: name, background (0/1), start, end (or -), exit status (or -)."""
    steps = []
    table = folder / "steps.tsv"
    for line in table.read_text().splitlines() if table.exists() else []:
        name, background, started, ended, status = line.split("\t")
        steps.append(
            Step(
                name=name,
                background=background == "1",
                started=float(started),
                ended=None if ended == "-" else float(ended),
                status=status,
            )
        )
    return steps


def sessions(report: Path) -> list[tuple[str, float, str]]:
    """(session, seconds, result) of a nox --report file; none if it is missing
    or unreadable (a step stopped before nox wrote it)."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return []
    found = []
    for entry in data.get("sessions", []):
        name = entry.get("signatures", [None])[0] or entry.get("name", "?")
        found.append((str(name), float(entry.get("duration") or 0.0), str(entry.get("result"))))
    return found


def render(folder: Path, started: float, now: float) -> str:
    steps = read_steps(folder)
    rows = [("step / session", "wall", "result", "where")]

    def wall(step: Step) -> float:  # a step still running: until now
        return (step.ended if step.ended is not None else now) - step.started

    for step in steps:
        where = "background" if step.background else "foreground"
        result = {"-": "running", "0": "passed"}.get(step.status, f"failed ({step.status})")
        rows.append((step.name, minutes(wall(step)), result, where))
        prefix = "bg-" if step.background else ""
        for name, seconds, outcome in sessions(folder / f"{prefix}{step.name}.json"):
            if name.startswith("pythons-"):
                continue  # the matrix's check for its Pythons: seconds
            rows.append((f"  {name}", minutes(seconds), outcome, ""))
    foreground = sum(wall(s) for s in steps if not s.background)
    background = sum(wall(s) for s in steps if s.background)
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["Where the run's time went (m:ss of wall time)"]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines.append(
        f"total {minutes(now - started)} from the run's start; the foreground steps "
        f"{minutes(foreground)} one after another, the background ones {minutes(background)} "
        "beside them"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the reports and steps.tsv")
    parser.add_argument("--started", type=float, required=True, help="the run's start (epoch s)")
    options = parser.parse_args()
    print(render(options.folder, options.started, time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
