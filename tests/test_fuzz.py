"""Differential fuzzing against the plain-PyTorch reference.

Hypothesis draws whole calls: shapes with 0 and 1 and odd sizes (past the
kernels' 128-column spans too), every dtype, every argument in its own
layout (contiguous, strided, transposed, broadcast-expanded with stride 0),
every subset of arguments needing a gradient, values from zero and
subnormal up to saturating the gates, upstream gradients that are random,
broadcast (a ``.sum()``) or absent; the cell (three entry points: the eager
``lltm_cell``, the registered operator under autograd, the composite kernel)
and the sequence operator (padded and packed, forward and reverse). Each call
is held to the oracle: the reference in float64, on the very values the call
saw (16-bit inputs are rounded first), differentiated by autograd.

The error of a tensor is ``max |lltm - oracle| / max(1, max |oracle|)``; it
must stay within the dtype's tolerance. How many calls run is a profile,
chosen by ``LLTM_FUZZ_PROFILE``: ``quick`` (the default, seconds) in the
ordinary test run, ``ci`` (10,000 calls, ``nox -s fuzz``). Both draw the same
calls every run, so a failure reproduces; ``LLTM_FUZZ_EXPLORE=1`` draws new
ones. The worst
error per dtype is printed at the end of the run (conftest.py) and written as
JSON to ``$LLTM_FUZZ_REPORT`` when that is set.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from oracle import CELL_ENTRY_POINTS, CompositeSequence, sequence_oracle
from torch import Tensor

import lltm
from lltm import reference

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

# --- Profiles ------------------------------------------------------------------------------

# (cell calls, sequence calls) per profile.
PROFILES = {"quick": (60, 40), "ci": (6000, 4000)}
PROFILE = os.environ.get("LLTM_FUZZ_PROFILE", "quick")
if PROFILE not in PROFILES:
    raise ValueError(f"LLTM_FUZZ_PROFILE must be one of {sorted(PROFILES)}, got {PROFILE!r}")
CELL_CALLS, SEQUENCE_CALLS = PROFILES[PROFILE]


def _settings(calls: int) -> settings:
    return settings(
        max_examples=calls,
        deadline=None,
        # Every run draws the same calls, so that a CI result reproduces;
        # LLTM_FUZZ_EXPLORE=1 draws new ones (what a fuzzing campaign wants).
        derandomize=os.environ.get("LLTM_FUZZ_EXPLORE") != "1",
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


# --- Tolerances and the record of errors ----------------------------------------------------

# Worst error allowed, relative to the tensor's magnitude: about 10 units of
# rounding of the dtype. Where a call is ill-conditioned (saturated gates,
# gradients that cancel in a sum) 16-bit arithmetic loses more than that, in
# torch as in lltm: there lltm may be up to REFERENCE_FACTOR times as far from
# the oracle as the reference computed in the same dtype. The two round at
# different places (lltm once per step, the reference once per op), and a
# recurrence amplifies either error at random: over 10,000 calls lltm's
# float16 sequences came up to 4.2 times the reference's error (and as often
# far below it), hence the factor.
TOLERANCE = {
    torch.float64: 1e-11,
    torch.float32: 5e-5,
    torch.float16: 1e-2,
    torch.bfloat16: 6e-2,
}
REFERENCE_FACTOR = 8.0


@dataclass
class Worst:
    error: float = 0.0
    where: str = ""
    calls: int = 0
    # Calls past TOLERANCE that the same-dtype reference excused, and the
    # largest ratio of lltm's error to the reference's among them.
    excused: int = 0
    ratio: float = 0.0
    # Calls past TOLERANCE where the reference overflowed in the dtype, so
    # could not be the yardstick.
    unjudged: int = 0


@dataclass
class Record:
    """Worst error per dtype over the run, and the number of calls checked."""

    by_dtype: dict[str, Worst] = field(default_factory=dict)

    def get(self, dtype: torch.dtype) -> Worst:
        return self.by_dtype.setdefault(str(dtype).removeprefix("torch."), Worst())

    def add(self, dtype: torch.dtype, error: float, where: str) -> None:
        worst = self.get(dtype)
        if error >= worst.error:
            worst.error, worst.where = error, where


RECORD = Record()


def report(terminal: Any) -> None:
    """Called by conftest.py's pytest_terminal_summary."""
    if not RECORD.by_dtype:
        return
    total = sum(w.calls for w in RECORD.by_dtype.values())
    terminal.section(f"lltm fuzz: worst error per dtype ({PROFILE} profile, {total} calls)")
    for name, w in sorted(RECORD.by_dtype.items()):
        excused = f", {w.excused} within {w.ratio:.2g}x the reference's" if w.excused else ""
        if w.unjudged:
            excused += f", {w.unjudged} within {REFERENCE_FACTOR:g}x the tolerance"
        terminal.line(f"{name:>9}: {w.error:.3g} over {w.calls} calls{excused}  [{w.where}]")
    path = os.environ.get("LLTM_FUZZ_REPORT")
    if path:
        data = {
            "profile": PROFILE,
            "calls": total,
            "tolerance": {str(k).removeprefix("torch."): v for k, v in TOLERANCE.items()},
            "worst": {name: vars(w) for name, w in RECORD.by_dtype.items()},
        }
        with open(path, "w") as f:
            json.dump(data, f, indent=2)


def _error(a: Tensor, e: Tensor, scale: float = 0.0) -> float:
    """Largest difference relative to the tensor's magnitude, or to ``scale``
    where that is larger: the sum of magnitudes behind a gradient that sums
    many terms (see gradient_scales)."""
    return (a.double() - e).abs().max().item() / max(1.0, e.abs().max().item(), scale)


def check(
    dtype: torch.dtype,
    names: tuple[str, ...],
    actual: list[Tensor | None],
    expected: list[Tensor | None],
    case: str,
    same_dtype_reference: Callable[[], list[Tensor | None]],
    scales: list[float],
) -> None:
    """Each tensor within TOLERANCE of the float64 oracle, or else within
    REFERENCE_FACTOR of the reference's own error in the dtype."""
    worst = RECORD.get(dtype)
    worst.calls += 1
    reference_results = None
    scales = [0.0] * (len(names) - len(scales)) + scales
    for k, (name, a, e) in enumerate(zip(names, actual, expected, strict=True)):
        if a is None and e is None:
            continue
        assert a is not None and e is not None, f"{name}: gradient {a} against oracle {e}"
        assert a.shape == e.shape, f"{name}: shape {tuple(a.shape)}, oracle {tuple(e.shape)}"
        assert a.dtype == dtype, f"{name}: dtype {a.dtype}"
        if a.numel() == 0:
            continue
        assert bool(a.isfinite().all()), f"{name} is not finite ({case})"
        error = _error(a, e, scales[k])
        RECORD.add(dtype, error, f"{name}, {case}")
        if error <= TOLERANCE[dtype]:
            continue
        if reference_results is None:
            reference_results = same_dtype_reference()
        if not bool(reference_results[k].isfinite().all()):
            # The reference, all its math in the dtype, overflowed (a 16-bit
            # backward through saturated gates: inf * 0) where lltm, whose
            # math runs in float32, did not: it cannot say what the dtype
            # allows here, so the allowance it would give applies to the
            # tolerance instead.
            assert error <= REFERENCE_FACTOR * TOLERANCE[dtype], (
                f"{name}: error {error:.3g} > {REFERENCE_FACTOR:g} x {TOLERANCE[dtype]:g} for "
                f"{dtype}, where the reference overflows in {dtype} ({case})"
            )
            worst.unjudged += 1
            continue
        reference_error = _error(reference_results[k], e, scales[k])
        assert error <= REFERENCE_FACTOR * reference_error, (
            f"{name}: error {error:.3g} > {TOLERANCE[dtype]:g} for {dtype}, and the reference "
            f"in {dtype} is within {reference_error:.3g} ({case})"
        )
        worst.excused += 1
        worst.ratio = max(worst.ratio, error / reference_error)


# --- Drawing arguments ---------------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Magnitudes of an argument's values: zero, subnormal in float32, tiny,
# ordinary, and large enough to saturate the gates.
SCALES = [0.0, 1e-40, 1e-8, 1e-2, 1.0, 4.0, 16.0]
LAYOUTS_2D = ["contiguous", "strided", "transposed", "expanded"]

small = st.integers(0, 5)


def sizes(odd: list[int]) -> st.SearchStrategy[int]:
    return st.one_of(small, small, small, st.sampled_from(odd))


@dataclass
class Argument:
    """One tensor argument: float64 values (already rounded to the dtype) of
    a base tensor, and the view of it that is passed (a layout)."""

    base: Tensor
    view: Callable[[Tensor], Tensor]
    layout: str


def _view(layout: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], Callable]:
    """The base shape for a layout, and the view taking it to `shape`."""
    if layout == "strided":  # every other element of the last dimension
        base = (*shape[:-1], 2 * shape[-1])
        return base, lambda t: t[..., ::2]
    if layout == "transposed":  # last two dimensions swapped in memory
        base = (*shape[:-2], shape[-1], shape[-2])
        return base, lambda t: t.transpose(-1, -2)
    if layout == "batch_major":  # (batch, steps, features) in memory
        base = (shape[1], shape[0], *shape[2:])
        return base, lambda t: t.transpose(0, 1)
    if layout == "expanded" and shape[0] > 0:  # stride 0 along the first dimension
        base = (1, *shape[1:])
        return base, lambda t: t.expand(shape)
    return shape, lambda t: t


@st.composite
def arguments(draw, shape: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0) -> Argument:
    layouts = {1: ["contiguous", "strided", "expanded"], 2: LAYOUTS_2D}.get(
        len(shape), [*LAYOUTS_2D, "batch_major"]
    )
    layout = draw(st.sampled_from(layouts))
    base_shape, view = _view(layout, shape)
    magnitude = draw(st.sampled_from(SCALES)) * scale
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    values = torch.randn(base_shape, generator=generator, dtype=torch.float64) * magnitude
    return Argument(values.to(dtype).double(), view, layout)


@st.composite
def upstream(draw, dtype: torch.dtype) -> str:
    # random: a general cotangent; ones: a .sum() (stride 0); absent: the
    # output does not reach the loss (its gradient is None).
    return draw(st.sampled_from(["random", "random", "ones", "absent"]))


def _grad_outputs(outputs, kinds, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    chosen, grads = [], []
    for out, kind in zip(outputs, kinds, strict=True):
        # Drawn for every output, so that both runs give each output the same.
        g = torch.randn(out.shape, generator=generator, dtype=torch.float64)
        if kind == "ones":
            g = torch.ones((), dtype=torch.float64).expand(out.shape)
        if kind == "absent" or out.grad_fn is None:
            continue
        chosen.append(out)
        grads.append(g.to(dtype).to(out.dtype))
    return chosen, grads


def run(fn, args: list[Argument], wants: list[bool], dtype, kinds, seed):
    """Outputs of fn on the arguments in `dtype`, then the gradients of the
    bases (None for those that need none)."""
    leaves = [a.base.to(dtype).requires_grad_(w) for a, w in zip(args, wants, strict=True)]
    outputs = fn(*[a.view(leaf) for a, leaf in zip(args, leaves, strict=True)])
    chosen, grads = _grad_outputs(outputs, kinds, dtype, seed)
    wanted = [leaf for leaf in leaves if leaf.requires_grad]
    results: list[Tensor | None] = [None] * len(leaves)
    if chosen and wanted:
        got = iter(torch.autograd.grad(chosen, wanted, grads, allow_unused=True))
        results = [next(got) if leaf.requires_grad else None for leaf in leaves]
    # A gradient that nothing reached is None in one graph and zeros in
    # another (e.g. without a step): compare as zeros.
    results = [
        torch.zeros_like(leaf) if r is None and leaf.requires_grad else r
        for leaf, r in zip(leaves, results, strict=True)
    ]
    return [o.detach() for o in outputs] + results


def gradient_scales(fn, args: list[Argument], wants: list[bool], kinds, seed) -> list[float]:
    """Per argument, the sum of the magnitudes that its gradient adds up,
    from a float64 run: an expanded argument's gradient sums the gradients of
    every element its stride-0 dimension repeats, and a sum of n terms that
    each carry a rounding error (16-bit ones round alike where the values are
    alike) is off by up to those errors times the sum of the terms'
    magnitudes, however small the sum itself comes out."""
    views = [a.view(a.base).clone().requires_grad_(w) for a, w in zip(args, wants, strict=True)]
    outputs = fn(*views)
    chosen, grads = _grad_outputs(outputs, kinds, torch.float64, seed)
    wanted = [v for v in views if v.requires_grad]
    if not (chosen and wanted):
        return [0.0] * len(args)
    got = iter(torch.autograd.grad(chosen, wanted, grads, allow_unused=True))
    scales = []
    for a, v in zip(args, views, strict=True):
        g = next(got) if v.requires_grad else None
        if g is None or g.numel() == 0:
            scales.append(0.0)
        elif a.layout == "expanded":
            scales.append(g.abs().sum(0).max().item())
        else:
            scales.append(g.abs().max().item())
    return scales


def _describe(label: str, args: list[Argument], wants, kinds, **extra) -> str:
    layouts = ",".join(a.layout for a in args)
    grads = "".join("1" if w else "0" for w in wants)
    shapes = "/".join("x".join(map(str, a.view(a.base).shape)) for a in args)
    more = " ".join(f"{k}={v}" for k, v in extra.items())
    return f"{label} {shapes} layouts={layouts} grads={grads} upstream={','.join(kinds)} {more}"


# --- The cell ------------------------------------------------------------------------------


CELL_ENTRIES = CELL_ENTRY_POINTS


@st.composite
def cell_calls(draw):
    dtype = draw(st.sampled_from(DTYPES))
    batch, features, state = draw(sizes([7, 17])), draw(sizes([9, 31])), draw(sizes([13, 129]))
    fan_in = max(1, state + features) ** 0.5
    args = [
        draw(arguments((batch, features), dtype)),
        draw(arguments((3 * state, state + features), dtype, 1 / fan_in)),
        draw(arguments((3 * state,), dtype)),
        draw(arguments((batch, state), dtype)),
        draw(arguments((batch, state), dtype)),
    ]
    wants = draw(st.lists(st.booleans(), min_size=5, max_size=5))
    kinds = [draw(upstream(dtype)) for _ in range(2)]
    entry = draw(st.sampled_from(sorted(CELL_ENTRIES)))
    return dtype, args, wants, kinds, entry, draw(st.integers(0, 2**31))


@settings(_settings(CELL_CALLS))
@given(cell_calls())
def test_cell_matches_float64_reference(call):
    dtype, args, wants, kinds, entry, seed = call
    actual = run(CELL_ENTRIES[entry], args, wants, dtype, kinds, seed)
    expected = run(reference.lltm_cell, args, wants, torch.float64, kinds, seed)
    # Values (outputs or gradients) beyond what the dtype holds are the
    # business of test_extremes.py.
    limit = torch.finfo(dtype).max / 16
    assume(all(t.abs().max() < limit for t in expected if t is not None and t.numel()))
    names = ("new_h", "new_cell", "grad_input", "grad_weights", "grad_bias", "grad_old_h",
             "grad_old_cell")  # fmt: skip
    check(dtype, names, actual, expected, _describe(entry, args, wants, kinds),
          lambda: run(reference.lltm_cell, args, wants, dtype, kinds, seed),
          gradient_scales(reference.lltm_cell, args, wants, kinds, seed))  # fmt: skip


# --- The sequence operator -----------------------------------------------------------------


def _registered_sequence(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    return torch.ops.lltm.sequence_forward(*args)[:3]


SEQUENCE_ENTRIES = {
    "lltm_sequence": lltm.ops.sequence,
    "registered_op": _registered_sequence,
    "composite": CompositeSequence.apply,
}


@st.composite
def sequence_calls(draw):
    dtype = draw(st.sampled_from(DTYPES))
    packed = draw(st.booleans())
    reverse = draw(st.booleans())
    batch = draw(st.one_of(st.integers(1 if packed else 0, 4), st.just(7)))
    features, state = draw(sizes([9])), draw(sizes([13, 129]))
    batch_sizes = None
    if packed:
        # Sorted lengths of at least 1, as a PackedSequence holds them.
        lengths = sorted(draw(st.lists(st.integers(1, 5), min_size=batch, max_size=batch)))[::-1]
        batch_sizes = torch.tensor(
            [sum(n > t for n in lengths) for t in range(lengths[0])], dtype=torch.int64
        )
        input_shape: tuple[int, ...] = (int(batch_sizes.sum()), features)
    else:
        input_shape = (draw(st.integers(0, 5)), batch, features)
    fan_in = max(1, state + features) ** 0.5
    args = [
        draw(arguments(input_shape, dtype)),
        draw(arguments((3 * state, state + features), dtype, 1 / fan_in)),
        draw(arguments((3 * state,), dtype)),
        draw(arguments((batch, state), dtype)),
        draw(arguments((batch, state), dtype)),
    ]
    wants = draw(st.lists(st.booleans(), min_size=5, max_size=5))
    kinds = [draw(upstream(dtype)) for _ in range(3)]
    entry = draw(st.sampled_from(sorted(SEQUENCE_ENTRIES)))
    return dtype, args, batch_sizes, reverse, wants, kinds, entry, draw(st.integers(0, 2**31))


@settings(_settings(SEQUENCE_CALLS))
@given(sequence_calls())
def test_sequence_matches_float64_reference(call):
    dtype, args, batch_sizes, reverse, wants, kinds, entry, seed = call
    fn = SEQUENCE_ENTRIES[entry]
    actual = run(lambda *a: fn(*a, batch_sizes, reverse), args, wants, dtype, kinds, seed)

    def oracle(*a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return sequence_oracle(*a, batch_sizes, reverse)

    expected = run(oracle, args, wants, torch.float64, kinds, seed)
    # The state is kept in the dtype between steps (as a loop of cells keeps
    # it), so every step rounds the cell: an output is off by up to the
    # rounding of the largest cell the recurrence ran through, however small
    # the output itself.
    cells = [args[4].base]
    sequence_oracle(*[a.view(a.base) for a in args], batch_sizes, reverse, cells=cells)
    largest_cell = max((c.abs().max().item() for c in cells if c.numel()), default=0.0)
    limit = torch.finfo(dtype).max / 16
    assume(all(t.abs().max() < limit for t in expected if t is not None and t.numel()))
    names = ("output", "h_n", "c_n", "grad_input", "grad_weights", "grad_bias", "grad_old_h",
             "grad_old_cell")  # fmt: skip
    mode = "packed" if batch_sizes is not None else "padded"
    case = _describe(entry, args, wants, kinds, mode=mode, reverse=reverse)
    check(
        dtype, names, actual, expected, case, lambda: run(oracle, args, wants, dtype, kinds, seed),
        [largest_cell, largest_cell, 0.0, *gradient_scales(oracle, args, wants, kinds, seed)],
    )  # fmt: skip


def test_profiles_hold_enough_calls():
    # The long profile is the one CI runs: at least 10,000 calls.
    assert sum(PROFILES["ci"]) >= 10_000
    assert math.prod(PROFILES["quick"]) > 0
