"""Interleaved measurement: every case takes its turn, block by block.

Timings on a shared machine move by tens of per cent from one second to the
next. Timing each implementation in one go would give that drift to whichever
ran at the wrong moment; taking turns one block at a time spreads it over all
of them, and the minimum and median over blocks show how much there was.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch.utils import benchmark

from .cases import Case
from .kinds import PHASES, Size

# Wall time one block aims at: long enough to dwarf the timer's own cost,
# short enough for many interleaved blocks.
BLOCK_SECONDS = 0.02


@dataclass
class Result:
    """Seconds per call of one implementation at one size, one entry per block."""

    size: Size
    impl: str
    times: dict[str, list[float]] = field(default_factory=dict)
    host: dict[str, list[float]] = field(default_factory=dict)
    """Host seconds per call of each phase, one entry per block: the wall time
    of a loop of calls that waits on nothing (a GPU's work only queued). On a
    GPU, a step whose host time is near its time waits on the host."""
    peak_bytes: dict[str, int] | None = None
    """With --memory: how far one call of each memory phase (bench/memory.py:
    ``no_grad``, ``step``) raised the memory in use, measured apart."""
    saved_bytes: int | None = None
    saved_beyond_inputs_bytes: int | None = None
    error: str | None = None
    flops: dict[str, int] | None = None
    """Operations of the products per phase (flops.product_flops), if counted."""
    path: dict[str, str] | None = None
    """How it ran, where it can run more than one way: lltm's sequence op on a
    GPU, ``{"forward": ..., "backward": ...}`` (the persistent kernels' mode
    and split, or the per-step path and why)."""

    def gflops(self, phase: str) -> float | None:
        """The products' rate at the median time of a phase, in GFLOP/s."""
        median = self.median(phase)
        if not self.flops or phase not in self.flops or not median:
            return None
        return self.flops[phase] / median / 1e9

    def min(self, phase: str) -> float | None:
        """The fastest block's seconds per call of ``phase``, or None if it was not timed."""
        return min(self.times[phase]) if self.times.get(phase) else None

    def median(self, phase: str) -> float | None:
        """The median block's seconds per call of ``phase``, or None if it was not timed."""
        return _median(self.times.get(phase))

    def host_median(self, phase: str) -> float | None:
        """The median block's host seconds per call of ``phase``, or None if not measured."""
        return _median(self.host.get(phase))


def _median(values: Sequence[float] | None) -> float | None:
    ordered = sorted(values or [])
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def host_seconds(fn: Callable[[], object], calls: int, threads: int) -> float:
    """Host seconds per call of ``fn`` over ``calls`` calls that wait on nothing.

    On ``threads`` CPU threads, as the timed blocks run. The GPU is idle when the loop starts and is waited for after the clock
    stops: what is timed is the host's side alone, the Python layer, the
    dispatcher, the launches and whatever synchronises by itself. On a CPU
    that is all the work.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        seconds = time.perf_counter() - start
        _synchronize()
    finally:
        torch.set_num_threads(before)
    return seconds / calls


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


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
    phases: Sequence[str] = PHASES,
    extra: Mapping[str, Callable[[], object]] | None = None,
    host: dict[str, dict[str, list[float]]] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Seconds per call, per implementation and phase, one entry per round.

    Each round times one block of every (implementation, phase) in turn,
    for the ``phases`` asked for, then one block of each ``extra`` callable
    (returned under its name, as phase "step").
    torch.utils.benchmark does the warm-up, sets the thread count and
    synchronises the GPU around each block. Where ``host`` is given, each
    block of an implementation is followed by one of as many calls that wait
    on nothing (:func:`host_seconds`), into ``host[impl][phase]``.
    """
    timers = {
        (case.impl, phase): benchmark.Timer(
            stmt="fn()", globals={"fn": case.phase(phase)}, num_threads=threads
        )
        for case in cases
        for phase in phases
    }
    for name, fn in (extra or {}).items():
        timers[name, "step"] = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    calls = {key: _calls_per_block(timer, block_seconds) for key, timer in timers.items()}
    times: dict[str, dict[str, list[float]]] = {c.impl: {p: [] for p in phases} for c in cases}
    times.update({name: {"step": []} for name in extra or {}})
    functions = {(case.impl, phase): case.phase(phase) for case in cases for phase in phases}
    if host is not None:
        host.update({c.impl: {p: [] for p in phases} for c in cases})
    for _ in range(rounds):
        for (impl, phase), timer in timers.items():
            times[impl][phase].append(timer.timeit(calls[impl, phase]).mean)
            if impl in (extra or {}):
                continue
            if host is not None:
                seconds = host_seconds(functions[impl, phase], calls[impl, phase], threads)
                host[impl][phase].append(seconds)
            on_block()
    return times


@contextlib.contextmanager
def progress(total: int, enabled: bool) -> Iterator[Callable[[str], Callable[[], None]]]:
    """Yields start(label) -> advance: a rich progress bar over ``total`` blocks, or no-ops."""

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
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("", total=total)

        def start(label: str) -> Callable[[], None]:
            bar.update(task, description=label)
            return lambda: bar.advance(task)

        yield start
