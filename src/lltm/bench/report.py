"""Results as ``lltm bench`` prints them (a table) and writes them (``--json``).

benchmarks/render.py reads such files back into the project's own pages
(markdown tables, plots); it imports the table's rows from here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .kinds import KINDS, NO_GRAD, OVERHEAD, PER_SAMPLE, Kind
from .timing import Result

UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}
# How the comparisons read in titles and column headers.
NAMES = {
    "reference": "the eager reference",
    "reference-loop": "the reference loop",
    "lstm": "nn.LSTM",
    "lstmcell": "nn.LSTMCell",
    "lltm-loop": "a loop over the samples",
    "lstm-vmap": "nn.LSTM under vmap",
}
SHORT = {"forward": "fwd", "backward": "bwd", "step": "step", NO_GRAD: "no-grad fwd"}
# Column names of the phases, where not the phase's own name.
LONG = {NO_GRAD: "no-grad forward"}


def kind_of_env(env: dict[str, Any]) -> Kind:
    """The kind of case of a run (one run measures one kind)."""
    return KINDS[env["case"]]


def speedup(results: Sequence[Result], result: Result, phase: str, against: str) -> float | None:
    """Median time of ``against`` over that of ``result``, at the same size."""
    other = next((r for r in results if r.size == result.size and r.impl == against), None)
    ours, theirs = result.median(phase), other.median(phase) if other else None
    return theirs / ours if ours and theirs else None


def of_large_gemm(result: Result, phase: str, env: dict[str, Any]) -> float | None:
    """A row's GFLOP/s as a fraction of the large GEMM's, timed in the same run.

    None where either is unknown.
    """
    gflops, large = result.gflops(phase), env.get("large_gemm")
    return gflops / large["gflops"] if gflops and large and large.get("gflops") else None


def _comparisons(kind: Kind) -> dict[str, str]:
    """JSON field name -> implementation compared with.

    The baseline keeps the name ``speedup_vs_reference`` whatever the case (reference,
    reference-loop): readers of older files look for it.
    """
    fields = {"speedup_vs_reference": kind.baseline}
    if kind.rival:
        fields[f"speedup_vs_{kind.rival.replace('-', '_')}"] = kind.rival
    return fields


def rival_in(kind: Kind, results: Sequence[Result]) -> str | None:
    """The rival, if it is among the implementations of the run (timed or failed).

    Tables and plots compare with it only then.
    """
    return kind.rival if any(r.impl == kind.rival for r in results) else None


# --- JSON ------------------------------------------------------------------------


def to_json(results: Sequence[Result], env: dict[str, Any]) -> dict[str, Any]:
    """``{"environment": env, "results": [one row per size and implementation]}``.

    A row has a field per phase its kind times.
    """
    kind = kind_of_env(env)
    comparisons = _comparisons(kind)
    rows = []
    for r in results:
        row: dict[str, Any] = {**asdict(r.size), "impl": r.impl, "error": r.error}
        for phase in kind.phases:
            row[phase] = {
                "min_s": r.min(phase),
                "median_s": r.median(phase),
                "blocks": len(r.times.get(phase) or []),
                **{key: speedup(results, r, phase, impl) for key, impl in comparisons.items()},
            }
            if r.host:
                row[phase]["host_median_s"] = r.host_median(phase)
            if kind.counts_flops:
                row[phase]["gflops"] = r.gflops(phase)
                row[phase]["of_large_gemm"] = of_large_gemm(r, phase, env)
        if kind.counts_flops:
            row["flops"] = r.flops
        if r.path is not None:
            row["path"] = r.path
        if r.peak_bytes is not None:
            row["peak_bytes"] = r.peak_bytes
        row["saved_for_backward_bytes"] = r.saved_bytes
        row["saved_beyond_inputs_bytes"] = r.saved_beyond_inputs_bytes
        rows.append(row)
    return {"environment": env, "results": rows}


# --- Table -----------------------------------------------------------------------


def configuration(env: dict[str, Any]) -> str:
    """Which case ran, and which gradients its backward computes."""
    if kind_of_env(env) is PER_SAMPLE:
        return (
            "per-sample gradients of the parameters (one sequence per sample, mean squared "
            "error against a random target), speed-ups against lltm-loop"
        )
    if kind_of_env(env) is OVERHEAD:
        grads = "parameters, input, h and c" if env["inputs_grad"] else "parameters only"
        return (
            "per-call overhead, one cell step at the smallest size (lltm-sequence and lstm: "
            "a sequence of one step): the forward under "
            f"torch.no_grad(), and forward + backward with gradients of the {grads}"
        )
    sequence = env["case"] == "sequence"
    if env["inputs_grad"]:
        state = "input, h_0 and c_0" if sequence else "input, h and c"
        return f"{env['case']}, gradients of the parameters, {state} (--inputs-grad)"
    return f"{env['case']}, gradients of the parameters only" + (
        "" if sequence else " (the tutorial's configuration)"
    )


def precision(env: dict[str, Any]) -> str:
    """The run's dtype, and the autocast it ran under, if any."""
    autocast = env.get("autocast")
    return f"{env['dtype']} under torch.autocast({autocast})" if autocast else env["dtype"]


def title(env: dict[str, Any]) -> str:
    """One line that says what was run, where, with which versions."""
    where = env.get("gpu") or env["cpu"]
    large = env.get("large_gemm")
    gemm = (
        f"; a large GEMM (torch.mm, {large['n']}^3) ran at {large['gflops']:,.1f} GFLOP/s"
        if large
        else ""
    )
    return (
        f"lltm {env['lltm']}, torch {env['torch']}: {configuration(env)}; "
        f"{precision(env)} on {env['device']} ({where}, {env['threads']} thread{'' if env['threads'] == 1 else 's'}), "
        f"{env['blocks']} blocks each{gemm}"
    )


def table_rows(
    results: Sequence[Result], env: dict[str, Any], unit: str = "auto"
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the results table of a run; ``auto`` picks us or ms per cell.

    Columns: size (and T for sequences), impl, min / median per phase the
    kind times, speed-ups against the baseline (and the rival, if the kind
    has one and the run includes it), the step's GFLOP/s of the products it
    needs and, in parentheses, that as a fraction of the large GEMM's rate
    in the same run (if the kind counts them), saved bytes (if the kind
    measures them); with --host-time, the host's median per phase after the
    timings. The columns up to ``impl`` are labels, the rest numbers.
    """
    kind = kind_of_env(env)
    rival = rival_in(kind, results)
    phases = " / ".join(SHORT[phase] for phase in kind.phases)

    def timing(r: Result, phase: str) -> str:
        low, mid = r.min(phase), r.median(phase)
        if low is None or mid is None:
            return "-"
        u = unit if unit != "auto" else ("ms" if mid > 0.01 else "us")
        return f"{low * UNITS[u]:,.1f} / {mid * UNITS[u]:,.1f} {u}"

    def ratios(r: Result, against: str) -> str:
        values = (speedup(results, r, phase, against) for phase in kind.phases)
        return " / ".join("-" if v is None else f"{v:.2f}" for v in values)

    def kib(n: int | None) -> str:
        return "-" if n is None else f"{n / 1024:,.0f}"

    def rate(r: Result) -> str:
        gflops, fraction = r.gflops("step"), of_large_gemm(r, "step", env)
        if gflops is None:
            return "-"
        shown = f"{gflops:,.1f}" if gflops >= 10 else f"{gflops:.3g}"
        if fraction is not None:
            shown += f" ({fraction:.2f})" if fraction >= 0.01 else f" ({fraction:.1e})"
        return shown

    # Runs that counted the products' operations (sequences; not files
    # written before they were counted).
    flops = any(r.flops for r in results)

    # Runs that timed the host's side too (--host-time).
    host = any(r.host for r in results)

    def host_timing(r: Result) -> str:
        values = [r.host_median(phase) for phase in kind.phases]
        u = unit if unit != "auto" else ("ms" if max(v or 0 for v in values) > 0.01 else "us")
        return " / ".join("-" if v is None else f"{v * UNITS[u]:,.1f}" for v in values) + f" {u}"

    # Runs that chose the loss (files written before differentiated dense ones).
    losses = "losses" in env
    # Runs that measured peak memory (--memory).
    peaks = any(r.peak_bytes is not None for r in results)
    header = [
        "size",
        *(["T"] if kind.sequences else []),
        *(["loss"] if losses else []),
        "impl",
        *(f"{LONG.get(phase, phase)} min / median" for phase in kind.phases),
        *([f"host median {phases}"] if host else []),
        f"speed-up {phases}",
        *([f"vs {NAMES[rival]} {phases}"] if rival else []),
        *(["step GFLOP/s (of the large GEMM's)"] if flops else []),
        *(["saved KiB (beyond inputs)"] if kind.saved_memory else []),
        *(["peak MiB inference / step"] if peaks else []),
    ]
    rows = []
    for r in results:
        impl = r.impl if r.path is None else f"{r.impl} ({short_path(r.path)})"
        labels = [
            str(r.size),
            *([str(r.size.seq_len)] if kind.sequences else []),
            *([r.size.loss] if losses else []),
            impl,
        ]
        if r.error:
            rows.append([*labels, f"failed: {r.error}", *[""] * (len(header) - len(labels) - 1)])
            continue
        saved = (
            "-"
            if r.saved_bytes is None
            else f"{kib(r.saved_bytes)} ({kib(r.saved_beyond_inputs_bytes)})"
        )
        rows.append(
            [
                *labels,
                *(timing(r, phase) for phase in kind.phases),
                *([host_timing(r)] if host else []),
                ratios(r, kind.baseline),
                *([ratios(r, rival)] if rival else []),
                *([rate(r)] if flops else []),
                *([saved] if kind.saved_memory else []),
                *([peak_mib(r)] if peaks else []),
            ]
        )
    return header, rows


def peak_mib(r: Result) -> str:
    """A Result's peak memory of inference and of a step (--memory), in MiB."""
    peaks = r.peak_bytes or {}
    values = [peaks.get(phase) for phase in (NO_GRAD, "step")]
    return " / ".join("-" if v is None else f"{v / 2**20:,.1f}" for v in values)


def short_path(path: dict[str, str]) -> str:
    """A Result's path in a word per pass: clusters, cooperative or per-step.

    ``measured`` follows the word where torch.backends.cudnn.benchmark chose it.
    """

    def word(text: str) -> str:
        measured = " measured" if text.startswith("measured: ") else ""
        text = text.removeprefix("measured: ")
        if text.startswith("persistent"):
            return ("clusters" if "clusters" in text else "cooperative") + measured
        return "per-step" + measured

    forward, backward = word(path.get("forward", "")), word(path.get("backward", ""))
    return forward if forward == backward else f"fwd {forward}, bwd {backward}"


def label_columns(header: Sequence[str]) -> int:
    """How many leading columns are labels (left-aligned): up to ``impl``."""
    return list(header).index("impl") + 1


def print_table(results: Sequence[Result], env: dict[str, Any], unit: str) -> None:
    """Prints the results as a table, with rich where it is installed."""
    header, rows = table_rows(results, env, unit)
    labels = label_columns(header)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title(env))
        for line in (header, *rows):
            cells = zip(line, widths, strict=True)
            print(
                "  ".join(
                    c.ljust(w) if i < labels else c.rjust(w) for i, (c, w) in enumerate(cells)
                )
            )
        return
    table = Table(title=title(env), title_justify="left")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < labels else "right")
    for row in rows:
        table.add_row(*row)
    # Wide enough for every cell on one line (rich: a space each side and a
    # border per column), whatever the terminal, or none, says.
    Console(width=max(sum(widths) + 3 * len(widths) + 1, len(title(env)))).print(table)


def write_json(results: Sequence[Result], env: dict[str, Any], path: str) -> None:
    """``path``, or stdout for ``-``."""
    text = json.dumps(to_json(results, env), indent=2)
    if path == "-":
        sys.stdout.write(text + "\n")
        return
    with open(path, "w", encoding="utf-8") as out:
        out.write(text + "\n")
