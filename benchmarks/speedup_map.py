"""The GPU speed-up map: lltm's sequence op against nn.LSTM over a grid of sizes.

    python benchmarks/speedup_map.py SWEEP.json [SWEEP.json ...] --png map.png [--json all.json]
    python benchmarks/speedup_map.py all.json --markdown

Each SWEEP.json is a ``python -m lltm bench --json`` file of sequences of one
length with rows of ``lltm-sequence`` and ``lstm`` at every size of a grid,
batch x state (the features half the state), as benchmarks/gpu.sh writes
them: one in float32 (with ``lstm-notf32`` rows too: nn.LSTM with cuDNN's
TF32 off), one under ``--autocast bf16``, one under ``--autocast fp16``. The
picture has a row of panels per file and nn.LSTM it holds (in float32: TF32
on, torch's default, and off) and a panel per phase (the training step, the
forward): each cell is the speed-up of lltm against that nn.LSTM at that size
(nn.LSTM's median time over lltm's, measured side by side: above 1, lltm is
faster), coloured on a log scale, with the path lltm's sequence op took there
(C: the persistent kernels in thread-block clusters, G: in a cooperative
grid, P: the per-step path; "forward/backward" where the two differ).
``--json`` writes the reports together, ``{"reports": [...]}``, which this
script reads as well (gpu.sh joins its three sweeps into such a file);
``--markdown`` prints a summary (for each map, the sizes where lltm is slower
than nn.LSTM and those where it is 2x as fast or more), then each map as a
table.
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
OURS = "lltm-sequence"
# nn.LSTM as the bench times it: with torch's cuDNN defaults (TF32 on), and,
# where a float32 run has it, with TF32 off (exact float32 products, as lltm's).
RIVALS = ("lstm", "lstm-notf32")
# The summary's bounds, on the speed-ups as the tables print them (2 decimals):
# below SLOWER lltm is slower; from FAST on it is at least twice as fast.
SLOWER, FAST = 1.0, 2.0
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


def rivals(data: dict[str, Any]) -> list[str]:
    """The nn.LSTM implementations a report holds rows of (``lstm`` if none)."""
    present = {row["impl"] for row in data["results"]}
    return [rival for rival in RIVALS if rival in present] or [RIVALS[0]]


def rival_name(data: dict[str, Any], rival: str) -> str:
    """nn.LSTM, named by its TF32 setting where the report holds both settings."""
    if rival == "lstm-notf32":
        return "nn.LSTM (TF32 off)"
    return "nn.LSTM (TF32 on)" if "lstm-notf32" in rivals(data) else "nn.LSTM"


def grid(
    data: dict[str, Any], phase: str, rival: str = RIVALS[0]
) -> tuple[list[int], list[int], dict, dict]:
    """(batches, states, {(batch, state): speed-up}, {(batch, state): path letters}).

    The speed-up is ``rival``'s median time over lltm's at the same size (the
    bench's own ``speedup_vs_lstm`` for ``lstm``). A size whose lltm row
    failed, or whose ``rival`` row failed or is missing, has none. Rows of
    the first loss in the file only.
    """
    rows = data["results"]
    loss = rows[0].get("loss") if rows else None

    def at(row: dict[str, Any]) -> tuple[int, int, int, int | None]:
        return row["batch"], row["features"], row["state"], row.get("seq_len")

    theirs = {at(r): r for r in rows if r["impl"] == rival and r.get("loss") == loss}
    mine = [r for r in rows if r["impl"] == OURS and r.get("loss") == loss]
    speedups, paths = {}, {}
    for row in mine:
        key = (row["batch"], row["state"])
        other = theirs.get(at(row))
        ours = None if row["error"] else row[phase].get("median_s")
        their = None if other is None or other["error"] else other[phase].get("median_s")
        speedups[key] = their / ours if ours and their else None
        paths[key] = path_letters(row.get("path"))
    batches = sorted({b for b, _ in speedups})
    states = sorted({s for _, s in speedups})
    return batches, states, speedups, paths


def heading(data: dict[str, Any], phase: str) -> str:
    """What one map shows: precision, phase, sequence length."""
    env = data["environment"]
    length = ",".join(map(str, env.get("seq_len") or []))
    return f"{report.precision(env)}, {phase_name(phase)}, T = {length}"


def phase_name(phase: str) -> str:
    """A phase as the maps name it."""
    return "training step" if phase == "step" else "forward"


def maps(reports: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """(report, rival) for each map: a report's, one per nn.LSTM it holds."""
    return [(data, rival) for data in reports for rival in rivals(data)]


def cell_text(value: float | None, path: str) -> str:
    """A speed-up as the tables print it: ``1.23x (C)``, ``-`` where there is none."""
    if value is None:
        return "-"
    return f"{value:.2f}x" + (f" ({path})" if path else "")


def markdown(data: dict[str, Any], phase: str, rival: str = RIVALS[0]) -> str:
    """One map as a markdown table: a row per batch, a column per state."""
    batches, states, speedups, paths = grid(data, phase, rival)
    lines = [
        f"{heading(data, phase)}: {rival_name(data, rival)} time / lltm time",
        "",
        "| batch \\ state (features) | " + " | ".join(f"{s} ({s // 2})" for s in states) + " |",
        "|---|" + "---:|" * len(states),
    ]
    for b in batches:
        cells = [cell_text(speedups.get((b, s)), paths.get((b, s), "")) for s in states]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(reports: list[dict[str, Any]]) -> str:
    """Each map's sizes where lltm is slower than nn.LSTM and where it is 2x as fast or more.

    A markdown table, a row per map and phase; the speed-ups are classed as
    the tables print them (1.00x is not slower). Sizes with no speed-up (a
    row failed or is missing) are listed after it.
    """
    lines = [
        f"Where lltm is slower than nn.LSTM (below {SLOWER:.2f}x) and where it is "
        f"{FAST:g}x as fast or more; sizes (B, F, S): nn.LSTM time / lltm time (path)",
        "",
        f"| precision | against | phase | below {SLOWER:.2f}x: lltm slower | {FAST:.2f}x or more |",
        "|---|---|---|---|---|",
    ]
    missing = []
    for data, rival in maps(reports):
        for phase in PHASES:
            _, _, speedups, paths = grid(data, phase, rival)
            slower, fast, none = [], [], []
            for b, s in sorted(speedups, key=lambda key: (key[1], key[0])):
                value = speedups[b, s]
                point = f"({b}, {s // 2}, {s})"
                if value is None:
                    none.append(point)
                elif round(value, 2) < SLOWER:
                    slower.append(f"{point} {cell_text(value, paths[b, s])}")
                elif round(value, 2) >= FAST:
                    fast.append(f"{point} {cell_text(value, paths[b, s])}")
            what = [report.precision(data["environment"]), rival_name(data, rival)]
            what.append(phase_name(phase))
            lines.append(
                f"| {' | '.join(what)} | {'; '.join(slower) or 'none'} | "
                f"{'; '.join(fast) or 'none'} |"
            )
            if none:
                missing.append(f"{what[0]}, against {what[1]}, {what[2]}: {'; '.join(none)}")
    if missing:
        lines += ["", "No speed-up (a row failed or is missing) at:", ""]
        lines += [f"- {line}" for line in missing]
    return "\n".join(lines)


def draw(reports: list[dict[str, Any]], png: Path) -> None:
    """The maps, a row of panels per report and nn.LSTM it holds, into ``png``."""
    try:
        import matplotlib
    except ImportError as error:
        raise SystemExit("speedup_map.py needs matplotlib (pip install matplotlib)") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Speed-ups from 1/8 to 8 on a log scale, 1 in the middle (white).
    limit = 3.0
    rows = maps(reports)
    fig, axes = plt.subplots(
        len(rows),
        len(PHASES),
        figsize=(5.5 * len(PHASES), 4.2 * len(rows)),
        layout="constrained",
        squeeze=False,
    )
    image = None
    for row_axes, (data, rival) in zip(axes, rows, strict=True):
        against = f" against {rival_name(data, rival)}\n"
        for ax, phase in zip(row_axes, PHASES, strict=True):
            batches, states, speedups, paths = grid(data, phase, rival)
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
            ax.set_title(heading(data, phase).replace(", ", against, 1), fontsize="medium")
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
    parser.add_argument(
        "--markdown", action="store_true", help="print a summary, then each map as a table"
    )
    args = parser.parse_args(argv)
    reports = load(args.files)
    if not reports:  # gpu.sh's join of sweeps of which none ran
        parser.error(f"no bench report in {', '.join(map(str, args.files))}")
    if args.json:
        args.json.write_text(json.dumps({"reports": reports}, indent=2) + "\n")
    if args.png:
        draw(reports, args.png)
    if args.markdown:
        print(summary(reports), end="\n\n")
        for data, rival in maps(reports):
            for phase in PHASES:
                print(markdown(data, phase, rival), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
