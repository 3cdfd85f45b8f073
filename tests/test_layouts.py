"""Memory layouts: strided, expanded and offset inputs behave like contiguous ones.

The kernels read raw data pointers, so each layout below is one that a
pointer-arithmetic mistake would get wrong. Results are compared with the same
values laid out contiguously, and with the reference. Each layout is built in
the dtype under test (a strided view converted with .to(dtype) would be a
contiguous copy): 16-bit rows take their own path, staged through float32
buffers, and float32 rows are read in place.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import (
    ALL_GRADS,
    ARG_NAMES,
    GRAD_NAMES,
    OUTPUT_NAMES,
    assert_all_close,
    make_backward_args,
    make_grad_outputs,
    make_inputs,
    rms,
)

import lltm
from lltm import _backends, reference
from lltm.ops.cell_ops import composite as cell_composite

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

B, F, S = 5, 6, 7


DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def _randn(*shape, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


# Each builds one argument (by name) with an unusual layout.
def _input_transposed(dtype=torch.float64):
    return _randn(F, B, seed=10, dtype=dtype).t()


def _input_strided(dtype=torch.float64):
    return _randn(2 * B, 3 * F, seed=11, dtype=dtype)[::2, ::3]


def _input_channels_of_bigger(dtype=torch.float64):
    return _randn(B, F + 5, seed=12, dtype=dtype)[:, 2 : 2 + F]


def _weights_transposed(dtype=torch.float64):
    # Column-major: what `linear.weight.t()` of a (F + S, 3S) matrix gives.
    return _randn(S + F, 3 * S, seed=13, dtype=dtype).t()


def _weights_strided(dtype=torch.float64):
    return _randn(3 * S, 2 * (S + F), seed=14, dtype=dtype)[:, 1::2]


def _bias_expanded(dtype=torch.float64):
    return _randn(1, seed=15, dtype=dtype).expand(3 * S)


def _bias_strided(dtype=torch.float64):
    return _randn(6 * S, seed=16, dtype=dtype)[::2]


def _old_h_expanded(dtype=torch.float64):
    # One initial state shared by the whole batch: batch stride 0.
    return _randn(1, S, seed=17, dtype=dtype).expand(B, S)


def _old_h_transposed(dtype=torch.float64):
    return _randn(S, B, seed=18, dtype=dtype).t()


def _old_cell_channels_of_bigger(dtype=torch.float64):
    return _randn(B, 2 * S, seed=19, dtype=dtype)[:, S:]


def _old_cell_offset_rows(dtype=torch.float64):
    return _randn(B + 3, S, seed=20, dtype=dtype)[3:]


def _old_cell_transposed(dtype=torch.float64):
    return _randn(S, B, seed=21, dtype=dtype).t()


def _old_cell_every_other_column(dtype=torch.float64):
    return _randn(B, 2 * S, seed=22, dtype=dtype)[:, ::2]


LAYOUTS = {
    "input_transposed": ("input", _input_transposed),
    "input_strided": ("input", _input_strided),
    "input_channels": ("input", _input_channels_of_bigger),
    "weights_transposed": ("weights", _weights_transposed),
    "weights_strided": ("weights", _weights_strided),
    "bias_expanded": ("bias", _bias_expanded),
    "bias_strided": ("bias", _bias_strided),
    "old_h_expanded": ("old_h", _old_h_expanded),
    "old_h_transposed": ("old_h", _old_h_transposed),
    "old_cell_channels": ("old_cell", _old_cell_channels_of_bigger),
    "old_cell_offset_rows": ("old_cell", _old_cell_offset_rows),
    "old_cell_transposed": ("old_cell", _old_cell_transposed),
    "old_cell_strided": ("old_cell", _old_cell_every_other_column),
}


def _with_layout(name, dtype=torch.float64):
    """Contiguous inputs with one argument swapped for an unusual layout."""
    arg, build = LAYOUTS[name]
    inputs = make_inputs(B, F, S, dtype=dtype)
    inputs[ARG_NAMES.index(arg)] = build(dtype)
    return inputs


def _all_unusual(dtype=torch.float64):
    return [
        _input_strided(dtype),
        _weights_transposed(dtype),
        _bias_expanded(dtype),
        _old_h_expanded(dtype),
        _old_cell_every_other_column(dtype),
    ]


def _step(cell, inputs):
    """Forward + backward on the tensors exactly as laid out (no copies)."""
    leaves = [t.detach().requires_grad_() for t in inputs]  # detach keeps strides
    outputs = cell(*leaves)
    grads = torch.autograd.grad(outputs, leaves, make_grad_outputs(*outputs))
    return [t.detach() for t in outputs], list(grads)


def _check_against_contiguous(inputs):
    dtype = inputs[0].dtype
    assert all(t.dtype == dtype for t in inputs)
    assert any(not t.is_contiguous() or t.storage_offset() for t in inputs)
    out, grads = _step(lltm.lltm_cell, inputs)
    dense_out, dense_grads = _step(lltm.lltm_cell, [t.contiguous() for t in inputs])
    names = OUTPUT_NAMES + GRAD_NAMES
    if dtype == torch.float64:
        ref_out, ref_grads = _step(reference.lltm_cell, inputs)
        assert_all_close(out + grads, dense_out + dense_grads, names)
        assert_all_close(out + grads, ref_out + ref_grads, names)
        return
    # The same values, read through other strides: the pointwise passes give
    # the same bits; torch's GEMMs may sum their K products in another order
    # for transposed operands, which moves a result by up to about K units of
    # the dtype's epsilon (relative to each tensor's size; K is at most 3S
    # here). A misread element is off by the values' own size.
    eps = torch.finfo(dtype).eps
    k = inputs[1].shape[0]
    for name, t, d in zip(names, out + grads, dense_out + dense_grads, strict=True):
        assert t.dtype == dtype, name
        scale = max(1.0, rms(d))
        torch.testing.assert_close(
            t, d, rtol=4 * eps, atol=k * eps * scale, msg=lambda m, name=name: f"{name}: {m}"
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_unusual_argument(layout, dtype):
    _check_against_contiguous(_with_layout(layout, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_argument_unusual(dtype):
    _check_against_contiguous(_all_unusual(dtype))


def test_expanded_upstream_gradients():
    # `new_h.sum().backward()` sends an expanded (stride 0) gradient.
    inputs = [t.requires_grad_() for t in make_inputs(B, F, S)]
    new_h, new_cell = lltm.lltm_cell(*inputs)
    grads = torch.autograd.grad(new_h.sum() + new_cell.sum(), inputs)
    ref_h, ref_cell = reference.lltm_cell(*inputs)
    ref_grads = torch.autograd.grad(ref_h.sum() + ref_cell.sum(), inputs)
    assert_all_close(grads, ref_grads, GRAD_NAMES)


def _backward_args(contiguous: bool, dtype=torch.float64):
    inputs = make_inputs(B, F, S, dtype=dtype)
    _, new_cell, gates = torch.ops.lltm.forward(*inputs)
    input, weights, _, old_h, _ = inputs
    args = [
        _randn(B, S, seed=30, dtype=dtype),
        _randn(B, S, seed=31, dtype=dtype),
        *(new_cell, gates, input, old_h, weights),
    ]
    if not contiguous:
        # Same values, transposed storage for every argument.
        args = [t.t().contiguous().t() for t in args]
        assert not any(t.is_contiguous() for t in args)
    return [*args, ALL_GRADS]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_op_with_transposed_arguments(dtype):
    args = _backward_args(contiguous=False, dtype=dtype)
    assert all(t.dtype == dtype for t in args[:-1])
    expected = torch.ops.lltm.backward(*_backward_args(contiguous=True, dtype=dtype))
    if dtype == torch.float64:
        assert_all_close(torch.ops.lltm.backward(*args), expected, GRAD_NAMES)
        assert_all_close(cell_composite.backward(*args), expected, GRAD_NAMES)
        return
    eps = torch.finfo(dtype).eps
    for name, t, e in zip(GRAD_NAMES, torch.ops.lltm.backward(*args), expected, strict=True):
        scale = max(1.0, rms(e))
        torch.testing.assert_close(
            t, e, rtol=4 * eps, atol=4 * eps * scale, msg=lambda m, name=name: f"{name}: {m}"
        )


def _offset_copy(t: torch.Tensor, offset: int) -> torch.Tensor:
    """t's values at a storage offset of `offset` elements (misaligned for the
    16-byte loads unless offset is a multiple of the vector width)."""
    buffer = torch.empty(t.numel() + offset + 8, dtype=t.dtype, device=t.device)
    view = buffer[offset : offset + t.numel()].view(t.shape)
    view.copy_(t)
    return view


DEVICES = ["cpu"] + (["cuda"] if _backends.cuda_status()[0] else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_arguments_give_the_results_of_aligned_ones(dtype, device, kernels):
    if device == "cuda" and kernels != "cpu":
        pytest.skip("on a GPU the CUDA kernels run themselves")
    inputs = make_inputs(6, 10, 16, dtype=dtype, device=device)
    vec = 16 // inputs[0].element_size()
    names = OUTPUT_NAMES + GRAD_NAMES

    def run(offset):
        # The kernels get the offset copies themselves (a copy made on the
        # way, as run_cell's leaves are, would be aligned again); autograd
        # takes the gradients back through them to aligned leaves.
        leaves = [t.clone().requires_grad_() for t in inputs]
        x, weights, bias, old_h, old_cell = leaves
        arranged = [_offset_copy(x, offset), weights, _offset_copy(bias, offset),
                    _offset_copy(old_h, offset), _offset_copy(old_cell, offset)]  # fmt: skip
        assert offset % vec == 0 or all(t.data_ptr() % 16 for t in arranged[2:])
        outputs = lltm.lltm_cell(*arranged)
        grads = torch.autograd.grad(outputs, leaves, make_grad_outputs(*outputs))
        return [t.detach() for t in outputs] + list(grads)

    expected = run(0)
    # Misaligned rows take the pointwise kernels' one-element path, which
    # computes what the 16-byte one does: bit for bit. grad_weights is the
    # exception: its GEMMs read old_h and input where they are (the forward
    # copies both into one aligned matrix; copying them in backward too
    # would cost every call a copy, to make a test bit-exact), and BLAS
    # libraries (cuBLAS, MKL) choose their kernels, and with them the order
    # of the batch's sum, by alignment: it is within that sum's rounding.
    # On a GPU the forward's GEMM (torch's addmm) adds the bias too, read
    # where it is: cuBLAS's choice by alignment reaches the pre-activations,
    # and every output is within that GEMM's rounding (H200, float64: a few ulps).
    eps = torch.finfo(dtype).eps
    for offset in (1, vec - 1, vec):
        for name, a, e in zip(names, run(offset), expected, strict=True):
            if name == "grad_weights":
                tol = dict(rtol=4 * eps, atol=inputs[0].shape[0] * eps * max(1.0, rms(e)))
            elif device == "cuda":
                terms = inputs[1].shape[1] + 1  # [old_h, input] @ W^T + b
                tol = dict(rtol=4 * eps, atol=terms * eps * max(1.0, rms(e)))
            else:
                tol = dict(rtol=0, atol=0)
            torch.testing.assert_close(
                a, e, **tol, msg=lambda m, n=name, o=offset: f"{n}, offset {o}: {m}"
            )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_op_accepts_misaligned_saved_tensors(dtype, device, kernels):
    if device == "cuda" and kernels != "cpu":
        pytest.skip("on a GPU the CUDA kernels run themselves")
    args = make_backward_args(make_inputs(5, 3, 16, dtype=dtype, device=device))
    expected = torch.ops.lltm.backward(*args)
    vec = 16 // args[0].element_size()
    # Only the pointwise kernel reads grad_h, grad_cell, new_cell and gates,
    # each misaligned on its own here: bit for bit.
    for offset, k in itertools.product((1, vec - 1), range(4)):
        misaligned = list(args)
        misaligned[k] = _offset_copy(args[k], offset)
        assert misaligned[k].data_ptr() % 16
        actual = torch.ops.lltm.backward(*misaligned)
        assert_all_close(actual, expected, GRAD_NAMES, rtol=0, atol=0)


def _storages(tensors):
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


def test_outputs_are_fresh_and_contiguous():
    inputs = _all_unusual()
    outputs = torch.ops.lltm.forward(*inputs)
    assert all(t.is_contiguous() for t in outputs)
    assert not _storages(outputs) & _storages(inputs)
    assert len(_storages(outputs)) == len(outputs)

    args = _backward_args(contiguous=False)
    grads = torch.ops.lltm.backward(*args)
    expected_shapes = [(B, F), (3 * S, S + F), (3 * S,), (B, S), (B, S)]
    assert [tuple(g.shape) for g in grads] == expected_shapes
    assert all(g.is_contiguous() for g in grads)
    assert not _storages(grads) & _storages(args[:-1])
    assert len(_storages(grads)) == len(grads)


def test_calls_are_independent():
    # A second call must not overwrite the first call's outputs (no reused
    # buffers behind the user's back).
    inputs = make_inputs(B, F, S)
    first = torch.ops.lltm.forward(*inputs)
    kept = [t.clone() for t in first]
    torch.ops.lltm.forward(*make_inputs(B, F, S, seed=1))
    assert_all_close(first, kept, ("new_h", "new_cell", "gates"), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inputs_are_never_modified(dtype):
    inputs = _all_unusual(dtype)
    bases = [t._base if t._base is not None else t for t in inputs]
    snapshot = [b.clone() for b in bases]
    versions = [b._version for b in bases]
    leaves = [t.detach().requires_grad_() for t in inputs]
    new_h, new_cell = lltm.lltm_cell(*leaves)
    grad_h, grad_cell = make_grad_outputs(new_h, new_cell)
    grad_snapshot = [grad_h.clone(), grad_cell.clone()]
    torch.autograd.grad((new_h, new_cell), leaves, (grad_h, grad_cell))
    for base, before, version in zip(bases, snapshot, versions, strict=True):
        assert base._version == version
        torch.testing.assert_close(base, before, rtol=0, atol=0)
    torch.testing.assert_close([grad_h, grad_cell], grad_snapshot, rtol=0, atol=0)


def test_backward_op_does_not_modify_its_arguments():
    args = _backward_args(contiguous=True)
    snapshot = [t.clone() for t in args[:-1]]
    torch.ops.lltm.backward(*args)
    for name, t, before in zip(
        ("grad_h", "grad_cell", "new_cell", "gates", "input", "old_h", "weights"),
        args[:-1],
        snapshot,
        strict=True,
    ):
        torch.testing.assert_close(t, before, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
