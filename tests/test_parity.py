"""lltm against the pure-PyTorch oracle (lltm.reference): values and gradients.

float64 parity is tight: any slip in the math (a swapped gate, a missed bias,
a wrong derivative, an untouched tail element) shows up far above rounding.
Lower precisions are held to the float64 oracle with dtype-sized tolerances
and must not be materially less accurate than the reference computed in that
same precision.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    ALL_GRADS,
    GRAD_NAMES,
    OUTPUT_NAMES,
    assert_all_close,
    assert_as_accurate_as_reference,
    assert_worst_case_as_reference,
    make_inputs,
    rms,
    run_cell,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

import lltm
from lltm import reference
from lltm.ops.cell_ops import composite as cell_composite
from lltm.ops.sequence_ops import composite as sequence_composite

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

# (batch, input_features, state_size): unit sizes, odd sizes that leave a tail
# after any vector width, empty batch, no input features, no state.
SHAPES = [
    (1, 1, 1),
    (3, 5, 7),
    (0, 4, 6),
    (1, 32, 128),
    (16, 32, 128),
    (17, 33, 129),
    (4, 0, 6),
    (5, 3, 0),
    (0, 0, 0),
]
NAMES = OUTPUT_NAMES + GRAD_NAMES


def _ids(shape: tuple[int, int, int]) -> str:
    return "b{}-f{}-s{}".format(*shape)


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_float64_matches_reference(shape):
    inputs = make_inputs(*shape)
    out, grads = run_cell(lltm.lltm_cell, inputs)
    ref_out, ref_grads = run_cell(reference.lltm_cell, inputs)
    for t, r in zip(out + grads, ref_out + ref_grads, strict=True):
        assert t.shape == r.shape and t.dtype == torch.float64
    assert_all_close(out + grads, ref_out + ref_grads, NAMES)


@pytest.mark.parametrize("seed", range(3))
def test_float64_matches_reference_other_seeds(seed):
    inputs = make_inputs(6, 10, 12, seed=seed)
    out, grads = run_cell(lltm.lltm_cell, inputs, seed=seed + 100)
    ref_out, ref_grads = run_cell(reference.lltm_cell, inputs, seed=seed + 100)
    assert_all_close(out + grads, ref_out + ref_grads, NAMES)


def _saturating_inputs(scale, dtype=torch.float64):
    """Inputs whose pre-activations reach +-|scale| * 30 (15 terms of
    randn * scale squared), with old_cell of the same size."""
    inputs = [t * scale for t in make_inputs(4, 6, 9)]
    return [t.to(dtype) for t in inputs]


def _largest_pre_activation(inputs):
    input, weights, bias, old_h, _ = (t.double() for t in inputs)
    return F.linear(torch.cat([old_h, input], 1), weights, bias).abs().max().item()


# The exp of csrc/cpu/pointwise/scalar_math.h clamps its argument where 2^n would leave the
# normal numbers: to [-87, 88] in float (which 16-bit types compute in) and
# [-708, 709] in double. Beyond, sigmoid and tanh are saturated and elu is -1.
EXP_CLAMP = {torch.float64: 709.0, torch.float32: 88.0}


@pytest.mark.parametrize("scale", [8, 30], ids=["x8", "x30"])
def test_saturated_gates_match_reference(scale):
    # Large pre-activations drive sigmoid to 0/1 and elu to -1: the derivative
    # formulas written through the gate outputs must still hold there.
    inputs = _saturating_inputs(scale)
    if scale == 30:
        assert _largest_pre_activation(inputs) > EXP_CLAMP[torch.float64]
    out, grads = run_cell(lltm.lltm_cell, inputs)
    ref_out, ref_grads = run_cell(reference.lltm_cell, inputs)
    assert_all_close(out + grads, ref_out + ref_grads, NAMES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_saturated_gates_in_lower_precision(dtype):
    # Pre-activations far past float's exp clamp (and past float16's range for
    # exp itself): every gate saturates through the clamped path.
    inputs = _saturating_inputs(8, dtype)
    assert _largest_pre_activation(inputs) > 2 * EXP_CLAMP[torch.float32]
    out, grads = run_cell(lltm.lltm_cell, inputs)
    ref_out, ref_grads = run_cell(reference.lltm_cell, inputs)
    exact_out, exact_grads = _oracle(inputs)
    assert_as_accurate_as_reference(
        NAMES, out + grads, ref_out + ref_grads, exact_out + exact_grads, dtype
    )


# Shapes up to 40 x 300 cross the kernels' internal boundaries: a second and
# third 128-column span (kSpanColumns) of the backward, a second 16-row block
# of the grad_bias sums (kFoldRows), and 8192 elements, above which the
# forward is split between threads.
@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(0, 40),
    features=st.integers(0, 17),
    state=st.integers(0, 300),
    seed=st.integers(0, 2**16),
)
@example(batch=33, features=5, state=257, seed=0)
@example(batch=17, features=0, state=129, seed=1)
@example(batch=40, features=17, state=300, seed=2)
def test_property_float64_any_shape(batch, features, state, seed):
    inputs = make_inputs(batch, features, state, seed=seed)
    out, grads = run_cell(lltm.lltm_cell, inputs)
    ref_out, ref_grads = run_cell(reference.lltm_cell, inputs)
    assert_all_close(out + grads, ref_out + ref_grads, NAMES)


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 40),
    features=st.integers(1, 70),
    state=st.integers(1, 150),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_property_composite_equals_native(batch, features, state, dtype):
    _assert_composite_equals_native(make_inputs(batch, features, state, dtype=dtype))


# --- Lower precisions --------------------------------------------------------

# Bound on |lltm - oracle| (elementwise): atol is relative to the magnitude of
# the output, max(1, rms(oracle)), because gradients grow with the sizes.
ELEMENTWISE_TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=0.05, rtol=0.01),
    torch.bfloat16: dict(atol=0.25, rtol=0.05),
}
LOW_PRECISION = list(ELEMENTWISE_TOL)


def _oracle(inputs, seed=1):
    """The reference in float64 on the very same (rounded) input values."""
    return run_cell(reference.lltm_cell, [t.double() for t in inputs], seed=seed)


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize(
    "shape", [(1, 1, 1), (3, 5, 7), (0, 4, 6), (16, 32, 128), (17, 33, 129)], ids=_ids
)
def test_low_precision_close_to_oracle(shape, dtype):
    inputs = make_inputs(*shape, dtype=dtype)
    out, grads = run_cell(lltm.lltm_cell, inputs)
    exp_out, exp_grads = _oracle(inputs)
    tol = ELEMENTWISE_TOL[dtype]
    for name, t, e in zip(NAMES, out + grads, exp_out + exp_grads, strict=True):
        assert t.dtype == dtype, name
        scale = max(1.0, rms(e))
        torch.testing.assert_close(
            t.double(),
            e,
            atol=tol["atol"] * scale,
            rtol=tol["rtol"],
            msg=lambda m, n=name: f"{n}: {m}",
        )


ACCURACY_SHAPES = [(16, 32, 128), (17, 33, 129)]


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("shape", ACCURACY_SHAPES, ids=_ids)
@pytest.mark.parametrize("seed", range(2))
def test_low_precision_as_accurate_as_reference(shape, dtype, seed):
    # Computing in the inputs' dtype, plain PyTorch sets the bar; the same
    # check runs on CUDA (test_cuda.py).
    inputs = make_inputs(*shape, dtype=dtype, seed=seed)
    out, grads = run_cell(lltm.lltm_cell, inputs)
    ref_out, ref_grads = run_cell(reference.lltm_cell, inputs)
    exp_out, exp_grads = _oracle(inputs)
    assert_as_accurate_as_reference(
        NAMES, out + grads, ref_out + ref_grads, exp_out + exp_grads, dtype
    )


# --- The accuracy check itself --------------------------------------------------


def _float32_kernel(breakage=None):
    """The cell computed as lltm's kernels compute 16-bit and float32 inputs
    (the pre-activations rounded once to the inputs' dtype, the rest in
    float32, the results rounded), optionally broken the way a kernel can be
    subtly wrong: a gate scaled by 2 %, an output shifted by a constant."""

    def cell(input, weights, bias, old_h, old_cell):
        dtype = input.dtype
        x, w, b, h, c = (t.float() for t in (input, weights, bias, old_h, old_cell))
        pre = (torch.cat([h, x], 1) @ w.t()).to(dtype).float() + b
        i, o, g = pre.chunk(3, dim=1)
        i, o, g = torch.sigmoid(i), torch.sigmoid(o), F.elu(g)
        if breakage == "candidate_x1.02":
            g = g * 1.02
        new_cell = c + g * i
        new_h = torch.tanh(new_cell) * o
        if breakage is not None and breakage.startswith("new_h+"):
            new_h = new_h + float(breakage.removeprefix("new_h+"))
        return new_h.to(dtype), new_cell.to(dtype)

    return cell


def _accuracy_check(cell, dtype, shape=(16, 32, 128), seed=0):
    inputs = make_inputs(*shape, dtype=dtype, seed=seed)
    out, grads = run_cell(cell, inputs)
    ref_out, ref_grads = run_cell(reference.lltm_cell, inputs)
    exp_out, exp_grads = _oracle(inputs)
    assert_as_accurate_as_reference(
        NAMES, out + grads, ref_out + ref_grads, exp_out + exp_grads, dtype
    )


@pytest.mark.cpu_kernels_only(reason="it checks the accuracy check, on a kernel written in Python")
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("shape", ACCURACY_SHAPES, ids=_ids)
def test_accuracy_check_accepts_a_correct_float32_kernel(dtype, shape):
    _accuracy_check(_float32_kernel(), dtype, shape)


@pytest.mark.cpu_kernels_only(reason="it checks the accuracy check, on a kernel written in Python")
@pytest.mark.parametrize(
    ("dtype", "breakage"),
    [
        (torch.bfloat16, "candidate_x1.02"),
        (torch.bfloat16, "new_h+0.01"),
        (torch.float16, "candidate_x1.02"),
        (torch.float16, "new_h+0.01"),
        (torch.float32, "candidate_x1.02"),
        (torch.float32, "new_h+0.0001"),
    ],
    ids=str,
)
@pytest.mark.parametrize("shape", ACCURACY_SHAPES, ids=_ids)
def test_accuracy_check_rejects_broken_kernels(dtype, breakage, shape):
    # Errors that elementwise tolerances of a few percent (or 1e-3 in
    # float32) let through: the check used for every dtype on CPU and CUDA
    # must not.
    with pytest.raises(AssertionError, match="eps"):
        _accuracy_check(_float32_kernel(breakage), dtype, shape)


# --- The composite fallback kernel -------------------------------------------


def _assert_composite_equals_native(inputs):
    native = torch.ops.lltm.forward(*inputs)
    composite = cell_composite.forward(*inputs)
    # The gates layout is part of the contract: backward kernels of either
    # kind must accept gates saved by a forward of the other kind.
    assert_all_close(composite, native, ("new_h", "new_cell", "gates"))
    new_h, new_cell, gates = native
    grad_h, grad_cell = torch.randn_like(new_h), torch.randn_like(new_cell)
    input, weights, _, old_h, _ = inputs
    args = (grad_h, grad_cell, new_cell, gates, input, old_h, weights, ALL_GRADS)
    assert_all_close(cell_composite.backward(*args), torch.ops.lltm.backward(*args), GRAD_NAMES)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_composite_equals_native(shape, dtype):
    _assert_composite_equals_native(make_inputs(*shape, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_composite_low_precision_close_to_oracle(dtype):
    # The composite rounds every intermediate, the native kernel does not:
    # both are held to the oracle rather than to each other.
    inputs = make_inputs(5, 9, 13, dtype=dtype)
    new_h, new_cell, _ = cell_composite.forward(*inputs)
    exp_out, _ = _oracle(inputs)
    tol = ELEMENTWISE_TOL[dtype]
    assert_all_close([new_h.double(), new_cell.double()], exp_out, OUTPUT_NAMES, **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_forward_worst_case_as_reference(dtype):
    assert_worst_case_as_reference(dtype)


# --- 16-bit grad_bias: the sum of the gradients before they are rounded --------------------


def _cancelling_upstream(shape, dtype, seed=0):
    """Upstream gradients whose second half of rows is minus the first plus
    a little: every column of grad_bias sums large terms that cancel, so a
    sum of terms already rounded to 16 bits is off by many of its units."""
    generator = torch.Generator().manual_seed(seed)
    first = torch.randn(shape[0] // 2, *shape[1:], generator=generator, dtype=torch.float64)
    little = 0.01 * torch.randn(first.shape, generator=generator, dtype=torch.float64)
    return torch.cat([first, little - first]).to(dtype)


def _units_apart(actual, expected, dtype):
    """|actual - expected| in units in the last place of `dtype` at expected."""
    expected = expected.double()
    ulp = torch.finfo(dtype).eps * torch.exp2(torch.floor(torch.log2(expected.abs())))
    return ((actual.double() - expected).abs() / ulp.clamp_min(torch.finfo(dtype).tiny)).max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_grad_bias_sums_unrounded_gradients(dtype):
    # The composite sums the float32 gradients, then rounds once; so must the
    # kernels (within one unit: float32 sums in another order).
    batch, features, state = 512, 4, 8
    x, w, b, h, c = make_inputs(batch // 2, features, state, dtype=dtype)
    inputs = [torch.cat([t, t]) if t.dim() == 2 and t.shape[0] == batch // 2 else t
              for t in (x, w, b, h, c)]  # fmt: skip
    _, new_cell, gates = torch.ops.lltm.forward(*inputs)
    grad_h, grad_cell = (_cancelling_upstream((batch, state), dtype, seed) for seed in (1, 2))
    args = (
        grad_h,
        grad_cell,
        new_cell,
        gates,
        inputs[0],
        inputs[3],
        w,
        [False, False, True] + [False] * 2,
    )
    ours = torch.ops.lltm.backward(*args)[2]
    composite = cell_composite.backward(*args)[2]
    assert _units_apart(ours, composite, dtype) <= 1

    # A sequence of three steps, W_h = 0 and an output gradient at the first
    # step only, so that no step's gradient depends on how the gradients
    # carried between steps are rounded (the persistent kernels carry them
    # in float32, the per-step path and the composite in the dtype).
    w = w.clone()
    w[:, :state] = 0
    sequence = [inputs[0][None].expand(3, -1, -1).contiguous(), w, b, inputs[3], inputs[4]]
    output, _, _, gates, cells = torch.ops.lltm.sequence_forward(*sequence, None, False)
    grad_output = torch.stack([_cancelling_upstream((batch, state), dtype, 3), *2 * [grad_h * 0]])
    args = (grad_output, None, None, output, gates, cells, sequence[0], w, inputs[3], None, False,
            [False, False, True, False, False])  # fmt: skip
    ours = torch.ops.lltm.sequence_backward(*args)[2]
    composite = sequence_composite.sequence_backward(*args)[2]
    assert _units_apart(ours, composite, dtype) <= 1
