"""Non-finite and extreme values: lltm computes what torch computes.

The activations are exact at the extremes (sigmoid(-inf) = 0, sigmoid(+inf)
= 1, tanh(+-inf) = +-1, elu(-inf) = -1, NaN in gives NaN out), and every
output and gradient has NaN and +-inf exactly where the reference
(lltm.reference.lltm_cell, differentiated by autograd) has them: a table of
extreme values through forward and backward, for the cell and the sequence
operator, the native kernels (every instruction-set variant) and the
composite ones, in every dtype.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import ARG_NAMES, GRAD_NAMES
from oracle import CELL_ENTRY_POINTS, CompositeSequence, nonfinite_pattern, sequence_oracle
from torch import Tensor

import lltm
from lltm import reference
from lltm.ops.cell_ops import composite as cell_composite

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

INF, NAN = math.inf, math.nan
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
# Finite values compared to the same-dtype reference, relative to the
# tensor's largest finite magnitude: the kernels compute 16-bit types in
# float32, the reference in the type itself.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


# --- The activations at the extremes ---------------------------------------------------

POINTS = [-INF, -1e4, -800.0, -100.0, -88.5, -87.0, -20.0, -1.0, -1e-30, 0.0, 1e-30, 1.0,
          20.0, 88.5, 100.0, 800.0, 1e4, INF, NAN]  # fmt: skip
EXACT = {-INF, INF}  # and NaN


def _activations(forward: Callable[..., tuple[Tensor, ...]], x: Tensor) -> tuple[Tensor, ...]:
    """sigmoid(x), elu(x) and tanh(x) as computed by one cell step.

    Zero weights leave the gates at the bias: bias = x gives sigmoid(x) in the
    input gate. For elu, the input gate open (bias +inf) and old_cell = 0:
    new_cell = elu(x). For tanh, old_cell = x with the input gate shut (bias
    -inf) and the output gate open (+inf): new_cell = x, new_h = tanh(x).
    """
    n = x.numel()
    zeros = dict(dtype=x.dtype)
    weights = torch.zeros(3 * n, n + 1, **zeros)
    _, _, gates = forward(
        torch.zeros(1, 1, **zeros), weights, torch.cat([x, x, x]),
        torch.zeros(1, n, **zeros), torch.zeros(1, n, **zeros),
    )  # fmt: skip
    sigmoid = gates[0, :n]
    open_candidate = torch.cat([torch.full_like(x, INF), torch.zeros_like(x), x])
    _, elu, _ = forward(
        torch.zeros(1, 1, **zeros), weights, open_candidate,
        torch.zeros(1, n, **zeros), torch.zeros(1, n, **zeros),
    )  # fmt: skip
    elu = elu[0]
    shut_open = torch.cat([torch.full_like(x, -INF), torch.full_like(x, INF), torch.zeros_like(x)])
    new_h, new_cell, _ = forward(
        torch.zeros(1, 1, **zeros), weights, shut_open, torch.zeros(1, n, **zeros), x[None]
    )
    torch.testing.assert_close(new_cell[0], x, rtol=0, atol=0, equal_nan=True)
    return sigmoid, elu, new_h[0]


KERNELS = {"native": torch.ops.lltm.forward, "composite": cell_composite.forward}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_activations_match_torch_and_are_exact_at_the_extremes(kernel, dtype):
    x = torch.tensor(POINTS, dtype=torch.float64).to(dtype)
    actual = _activations(KERNELS[kernel], x)
    # torch's own functions, computed in float32 for 16-bit types as the
    # kernels do (and as torch's 16-bit CPU kernels do internally).
    wide = x.float() if dtype in (torch.float16, torch.bfloat16) else x
    expected = [f(wide).to(dtype) for f in (torch.sigmoid, F.elu, torch.tanh)]
    extreme = torch.tensor([p in EXACT or math.isnan(p) for p in POINTS])
    for name, a, e in zip(("sigmoid", "elu", "tanh"), actual, expected, strict=True):
        torch.testing.assert_close(
            a[extreme], e[extreme], rtol=0, atol=0, equal_nan=True, msg=f"{name} at +-inf, NaN"
        )
        torch.testing.assert_close(
            a, e, rtol=TOLERANCE[dtype], atol=torch.finfo(dtype).tiny, equal_nan=True, msg=name
        )
    sigmoid, elu, tanh = actual
    assert sigmoid[0] == 0 and sigmoid[-2] == 1 and elu[0] == -1 and elu[-2] == INF
    assert tanh[0] == -1 and tanh[-2] == 1
    assert all(t[-1].isnan() for t in actual)


@pytest.mark.parametrize(
    "dtype, low, high", [(torch.float32, -120.0, -80.0), (torch.float64, -760.0, -700.0)], ids=str
)
def test_sigmoid_never_returns_a_subnormal(dtype, low, high):
    # Where 1 / (1 + exp(-x)) drops below the smallest normal number the
    # kernels return 0: a subnormal gate slows every GEMM that reads it.
    x = torch.linspace(low, high, 4001, dtype=dtype)
    sigmoid = _activations(torch.ops.lltm.forward, x)[0]
    tiny = torch.finfo(dtype).tiny
    assert bool(((sigmoid == 0) | (sigmoid >= tiny)).all())
    torch.testing.assert_close(sigmoid, torch.sigmoid(x), rtol=1e-6, atol=tiny)
    assert bool((sigmoid[x < low + 10] == 0).all()) and bool((sigmoid[x > high - 5] > 0).all())


# --- NaN and inf through forward and backward: the cell ----------------------------------

B, FEATURES, S = 3, 4, 5
ARG_INDEX = {name: i for i, name in enumerate(ARG_NAMES)}


def _cell_cases() -> dict[str, list[tuple[str, tuple[int, ...], float]]]:
    """Case name -> [(argument, index, value)], written into seeded inputs."""
    cases = {"old_h inf, old_cell -inf": [("old_h", (1, 2), INF), ("old_cell", (1, 3), -INF)]}
    spots = {
        "input": (1, 2),
        "old_h": (1, 1),
        "old_cell": (1, 4),
        "weights[i]": (2, 3),  # a row of the input gate, an old_h column
        "weights[g]": (2 * S + 1, S + 1),  # a row of the candidate, an input column
        "bias[i]": (1,),
        "bias[o]": (S + 1,),
        "bias[g]": (2 * S + 1,),
    }
    for label, index in spots.items():
        arg = label.split("[")[0]
        for value in (INF, -INF, NAN):
            cases[f"{label}={value}"] = [(arg, index, value)]
    for value in (1e4, -1e4, 100.0, -100.0):  # saturating, finite
        cases[f"input={value:g}"] = [("input", (1, 2), value)]
        cases[f"bias[g]={value:g}"] = [("bias", (2 * S + 1,), value)]
    return cases


CELL_CASES = _cell_cases()


def _cell_inputs(case: str, dtype: torch.dtype) -> list[Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(B, FEATURES), (3 * S, S + FEATURES), (3 * S,), (B, S), (B, S)]
    inputs = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
    for arg, index, value in CELL_CASES[case]:
        inputs[ARG_INDEX[arg]][index] = value
    return [t.to(dtype) for t in inputs]


CELLS = CELL_ENTRY_POINTS


def _run(fn: Callable[..., Any], inputs: list[Tensor], upstream: list[Tensor]) -> list[Tensor]:
    """Outputs, then the gradients of all inputs."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outputs = [o for o in fn(*leaves)]
    grads = torch.autograd.grad(outputs, leaves, upstream, allow_unused=True)
    return [t.detach() for t in outputs] + list(grads)


def assert_same_values(actual: list[Tensor], expected: list[Tensor], names, dtype) -> None:
    """NaN and +-inf at the same places; finite values within the dtype's
    tolerance of the tensor's largest finite magnitude."""
    for name, a, e in zip(names, actual, expected, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype, name
        pattern_a, pattern_e = nonfinite_pattern(a), nonfinite_pattern(e)
        if not torch.equal(pattern_a, pattern_e):
            where = (pattern_a != pattern_e).nonzero().tolist()
            pytest.fail(
                f"{name}: NaN/inf pattern differs at {where[:6]}: lltm {pattern_a.tolist()}, "
                f"reference {pattern_e.tolist()} (0 finite, 1 +inf, -1 -inf, 2 NaN)"
            )
        finite = pattern_e == 0
        scale = max(1.0, e[finite].double().abs().max().item()) if finite.any() else 1.0
        torch.testing.assert_close(
            a[finite].double(), e[finite].double(), rtol=0, atol=TOLERANCE[dtype] * scale, msg=name
        )


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CELL_CASES)
def test_cell_nonfinite_pattern_matches_reference(case, dtype, cell):
    inputs = _cell_inputs(case, dtype)
    generator = torch.Generator().manual_seed(1)
    upstream = [torch.randn(B, S, generator=generator).to(dtype) for _ in range(2)]
    actual = _run(CELLS[cell], inputs, upstream)
    expected = _run(reference.lltm_cell, inputs, upstream)
    assert_same_values(actual, expected, ("new_h", "new_cell", *GRAD_NAMES), dtype)


def test_the_reported_case_gives_nan_like_the_reference():
    # One inf in old_h and one -inf in old_cell: the gate that gets inf meets
    # an input gate of exactly 0 (sigmoid(-inf)), and inf * 0 is NaN.
    inputs = _cell_inputs("old_h inf, old_cell -inf", torch.float32)
    new_h, new_cell = lltm.lltm_cell(*inputs)
    ref_h, ref_cell = reference.lltm_cell(*inputs)
    assert new_cell.isnan().any() and torch.equal(new_cell.isnan(), ref_cell.isnan())
    assert torch.equal(new_h.isnan(), ref_h.isnan())


# --- NaN and inf through the sequence operator -----------------------------------------

T, SEQ_BATCH, SEQ_FEATURES, SEQ_STATE = 3, 2, 2, 3
SEQUENCE_SPOTS = {
    "input": (1, 1, 0),  # step 1, sequence 1; packed: row 3 (sequence 1 of step 1)
    "old_h": (1, 2),
    "old_cell": (0, 1),
    "weights": (2 * SEQ_STATE, 1),  # candidate row, an old_h column
    "bias": (0,),
}
SEQUENCE_CASES = {
    f"{arg}={value}": (arg, value) for arg in SEQUENCE_SPOTS for value in (INF, -INF, NAN)
} | {"input=1e4": ("input", 1e4), "input=-1e4": ("input", -1e4)}
LAYOUTS = {"padded": (None, False), "reverse": (None, True), "packed": ([3, 2], False),
           "packed_reverse": ([3, 2], True)}  # fmt: skip


def _sequence_args(case: str, layout: str, dtype: torch.dtype) -> list[Any]:
    arg, value = SEQUENCE_CASES[case]
    lengths, reverse = LAYOUTS[layout]
    generator = torch.Generator().manual_seed(0)
    shapes = [
        (T, SEQ_BATCH, SEQ_FEATURES),
        (3 * SEQ_STATE, SEQ_STATE + SEQ_FEATURES),
        (3 * SEQ_STATE,),
        (SEQ_BATCH, SEQ_STATE),
        (SEQ_BATCH, SEQ_STATE),
    ]
    inputs = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
    inputs[ARG_INDEX[arg]][SEQUENCE_SPOTS[arg]] = value
    batch_sizes = None
    if lengths is not None:
        # Packed: steps of batch sizes (2, 2, 1), rows step by step.
        batch_sizes = torch.tensor(
            [sum(n > t for n in lengths) for t in range(max(lengths))], dtype=torch.int64
        )
        x = inputs[0]
        inputs[0] = torch.cat([x[t, : int(size)] for t, size in enumerate(batch_sizes)])
    return [t.to(dtype) for t in inputs] + [batch_sizes, reverse]


SEQUENCES = {
    "lltm_sequence": lambda *args: lltm.ops.sequence(*args),
    "composite": CompositeSequence.apply,
}


def _sequence_params() -> list[Any]:
    # 16-bit GEMMs are slow on CPUs (tens of ms for these tiny sizes): those
    # dtypes go through two of the layouts, on the native kernels only.
    params = []
    for case in SEQUENCE_CASES:
        for layout in LAYOUTS:
            for dtype in DTYPES:
                for kernel in SEQUENCES:
                    if dtype.itemsize == 2 and (
                        kernel == "composite" or layout not in ("padded", "packed_reverse")
                    ):
                        continue
                    params.append(
                        pytest.param(
                            case, layout, dtype, kernel, id=f"{case}-{layout}-{dtype}-{kernel}"
                        )
                    )
    return params


@pytest.mark.parametrize("case, layout, dtype, kernel", _sequence_params())
def test_sequence_nonfinite_pattern_matches_reference(case, layout, dtype, kernel):
    args = _sequence_args(case, layout, dtype)
    inputs, extra = args[:5], args[5:]
    with torch.no_grad():
        shapes = [t.shape for t in sequence_oracle(*inputs, *extra)]
    generator = torch.Generator().manual_seed(1)
    upstream = [torch.randn(s, generator=generator).to(dtype) for s in shapes]
    actual = _run(lambda *leaves: SEQUENCES[kernel](*leaves, *extra), inputs, upstream)
    expected = _run(lambda *leaves: sequence_oracle(*leaves, *extra), inputs, upstream)
    assert_same_values(actual, expected, ("output", "h_n", "c_n", *GRAD_NAMES), dtype)


# --- Every instruction-set variant -----------------------------------------------------


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="the AVX2/AVX-512 variants exist on x86-64 only",
)
@pytest.mark.cpu_kernels_only(reason="it lowers the CPU kernels' instruction set")
@pytest.mark.parametrize("isa", ["baseline", "avx2"])
def test_every_isa_variant(isa: str) -> None:
    """This file again with LLTM_CPU_ISA lowering the kernels' instruction set
    (the default, run above, is the widest the CPU has)."""
    env = {**os.environ, "LLTM_CPU_ISA": isa}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "-k", "not every_isa_variant and not composite and not registered_op", str(Path(__file__))],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
