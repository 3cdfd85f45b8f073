"""The GPU speed-up map: lltm's sequence op against nn.LSTM over a grid of sizes.

    python benchmarks/speedup_map.py SWEEP.json [SWEEP.json ...] --png map.png [--json all.json]
    python benchmarks/speedup_map.py all.json --markdown

Each SWEEP.json is a ``python -m lltm bench --json`` file of sequences of one
length with rows of ``lltm-sequence`` and ``lstm`` at every size of a grid,
batch x state (the features half the state), as benchmarks/gpu.sh writes
them: one in float32, one under ``--autocast bf16``. The picture has a row of
panels per file and a panel per phase (the training step, the forward): each
cell is the speed-up of lltm against nn.LSTM at that size (nn.LSTM's median
time over lltm's, measured side by side: above 1, lltm is faster), coloured
on a log scale, with the path lltm's sequence op took there (C: the
persistent kernels in thread-block clusters, G: in a cooperative grid, P: the
per-step path; "forward/backward" where the two differ). ``--json`` writes
the reports together, ``{"reports": [...]}``, which this script reads as
well; ``--markdown`` prints each map as a table instead of drawing it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

from lltm.bench import report

PHASES = ("step", "forward")
OURS, RIVAL = "lltm-sequence", "lstm"
# The path of a pass, in a letter (report.short_path's words).
LETTERS = {"clusters": "C", "cooperative": "G", "per-step": "P"}


def load(paths: list[Path]) -> list[dict[str, Any]]:
    """The bench reports of ``paths``: bench files, or files this script wrote."""
    reports: list[dict[str, Any]] = []
    for path in paths:
        data = json.loads(path.read_text())
        reports.extend(data.get("reports", [data]))
    return reports


def path_letters(path: dict[str, str] | None) -> str:
    """C, G or P for a row's path; ``forward/backward`` where they differ."""
    if not path:
        return ""
    forward, backward = (
        LETTERS[report.short_path({"forward": path[p], "backward": path[p]})]
        for p in ("forward", "backward")
    )
    return forward if forward == backward else f"{forward}/{backward}"


def grid(data: dict[str, Any], phase: str) -> tuple[list[int], list[int], dict, dict]:
    """(batches, states, {(batch, state): speed-up}, {(batch, state): path letters}).

    A size whose lltm row failed, or whose nn.LSTM row is missing, has no
    speed-up. Rows of the first loss in the file only.
    """
    rows = data["results"]
    loss = rows[0].get("loss") if rows else None
    mine = [r for r in rows if r["impl"] == OURS and r.get("loss") == loss]
    speedups, paths = {}, {}
    for row in mine:
        key = (row["batch"], row["state"])
        value = None if row["error"] else row[phase].get(f"speedup_vs_{RIVAL}")
        speedups[key] = value
        paths[key] = path_letters(row.get("path"))
    batches = sorted({b for b, _ in speedups})
    states = sorted({s for _, s in speedups})
    return batches, states, speedups, paths


def heading(data: dict[str, Any], phase: str) -> str:
    """What one map shows: precision, phase, sequence length."""
    env = data["environment"]
    what = "training step" if phase == "step" else "forward"
    length = ",".join(map(str, env.get("seq_len") or []))
    return f"{report.precision(env)}, {what}, T = {length}"


def markdown(data: dict[str, Any], phase: str) -> str:
    """One map as a markdown table: a row per batch, a column per state."""
    batches, states, speedups, paths = grid(data, phase)

    def cell(key: tuple[int, int]) -> str:
        value = speedups.get(key)
        if value is None:
            return "-"
        return f"{value:.2f}x" + (f" ({paths[key]})" if paths.get(key) else "")

    lines = [
        f"{heading(data, phase)}: nn.LSTM time / lltm time",
        "",
        "| batch \\ state (features) | " + " | ".join(f"{s} ({s // 2})" for s in states) + " |",
        "|---|" + "---:|" * len(states),
        *(f"| {b} | " + " | ".join(cell((b, s)) for s in states) + " |" for b in batches),
    ]
    return "\n".join(lines)


def draw(reports: list[dict[str, Any]], png: Path) -> None:
    """The maps, a row of panels per report, into ``png``."""
    try:
        import matplotlib
    except ImportError as error:
        raise SystemExit("speedup_map.py needs matplotlib (pip install matplotlib)") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Speed-ups from 1/8 to 8 on a log scale, 1 in the middle (white).
    limit = 3.0
    fig, axes = plt.subplots(
        len(reports),
        len(PHASES),
        figsize=(5.5 * len(PHASES), 4.2 * len(reports)),
        layout="constrained",
        squeeze=False,
    )
    image = None
    for row_axes, data in zip(axes, reports, strict=True):
        for ax, phase in zip(row_axes, PHASES, strict=True):
            batches, states, speedups, paths = grid(data, phase)
            values = [
                [math.log2(v) if (v := speedups.get((b, s))) else math.nan for s in states]
                for b in batches
            ]
            image = ax.imshow(values, cmap="RdBu", vmin=-limit, vmax=limit, origin="lower")
            for i, b in enumerate(batches):
                for j, s in enumerate(states):
                    value = speedups.get((b, s))
                    text = "failed" if value is None else f"{value:.2f}"
                    if paths.get((b, s)):
                        text += f"\n{paths[b, s]}"
                    # Dark cells (past 4x either way) take white text.
                    dark = value is not None and abs(math.log2(value)) > 2
                    ax.text(
                        j, i, text, ha="center", va="center", fontsize="small",
                        color="white" if dark else "black",
                    )  # fmt: skip
            ax.set_xticks(range(len(states)), [f"{s}\n({s // 2})" for s in states])
            ax.set_yticks(range(len(batches)), [str(b) for b in batches])
            ax.set(xlabel="state (features)", ylabel="batch")
            ax.set_title(heading(data, phase).replace(", ", "\n", 1), fontsize="medium")
    assert image is not None
    bar = fig.colorbar(image, ax=axes, shrink=0.8)
    ticks = [-3, -2, -1, 0, 1, 2, 3]
    bar.set_ticks(ticks, labels=[f"{2.0**t:g}x" for t in ticks])
    bar.set_label("nn.LSTM time / lltm time (above 1: lltm faster)")
    env = reports[0]["environment"]
    where = env.get("gpu") or env.get("cpu", "")
    fig.suptitle(
        textwrap.fill(
            f"lltm {env['lltm']} against nn.LSTM, torch {env['torch']}, {where}; "
            "C: persistent kernels in clusters, G: in a cooperative grid, P: per-step path",
            110,
        ),
        fontsize="medium",
    )
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--png", type=Path, help="draw the maps into this PNG file")
    parser.add_argument("--json", type=Path, help="write the reports together into this file")
    parser.add_argument("--markdown", action="store_true", help="print each map as a table")
    args = parser.parse_args(argv)
    reports = load(args.files)
    if args.json:
        args.json.write_text(json.dumps({"reports": reports}, indent=2) + "\n")
    if args.png:
        draw(reports, args.png)
    if args.markdown:
        for data in reports:
            for phase in PHASES:
                print(markdown(data, phase), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
