"""Memory layouts: strided, expanded and offset inputs behave like contiguous ones.

The kernels read raw data pointers, so each layout below is one that a
pointer-arithmetic mistake would get wrong. Results are compared with the same
values laid out contiguously, and with the reference.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    ALL_GRADS,
    ARG_NAMES,
    GRAD_NAMES,
    OUTPUT_NAMES,
    assert_all_close,
    make_grad_outputs,
    make_inputs,
)

import lltm
from lltm import _composite, reference

B, F, S = 5, 6, 7


def _randn(*shape, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


# Each builds one argument (by name) with an unusual layout.
def _input_transposed():
    return _randn(F, B, seed=10).t()


def _input_strided():
    return _randn(2 * B, 3 * F, seed=11)[::2, ::3]


def _input_channels_of_bigger():
    return _randn(B, F + 5, seed=12)[:, 2 : 2 + F]


def _weights_transposed():
    # Column-major: what `linear.weight.t()` of a (F + S, 3S) matrix gives.
    return _randn(S + F, 3 * S, seed=13).t()


def _weights_strided():
    return _randn(3 * S, 2 * (S + F), seed=14)[:, 1::2]


def _bias_expanded():
    return _randn(1, seed=15).expand(3 * S)


def _bias_strided():
    return _randn(6 * S, seed=16)[::2]


def _old_h_expanded():
    # One initial state shared by the whole batch: batch stride 0.
    return _randn(1, S, seed=17).expand(B, S)


def _old_h_transposed():
    return _randn(S, B, seed=18).t()


def _old_cell_channels_of_bigger():
    return _randn(B, 2 * S, seed=19)[:, S:]


def _old_cell_offset_rows():
    return _randn(B + 3, S, seed=20)[3:]


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
}


def _with_layout(name):
    """Contiguous inputs with one argument swapped for an unusual layout."""
    arg, build = LAYOUTS[name]
    inputs = make_inputs(B, F, S)
    inputs[ARG_NAMES.index(arg)] = build()
    return inputs


def _all_unusual():
    return [
        _input_strided(),
        _weights_transposed(),
        _bias_expanded(),
        _old_h_expanded(),
        _old_cell_channels_of_bigger(),
    ]


def _step(cell, inputs):
    """Forward + backward on the tensors exactly as laid out (no copies)."""
    leaves = [t.detach().requires_grad_() for t in inputs]  # detach keeps strides
    outputs = cell(*leaves)
    grads = torch.autograd.grad(outputs, leaves, make_grad_outputs(*outputs))
    return [t.detach() for t in outputs], list(grads)


def _check_against_contiguous(inputs):
    assert any(not t.is_contiguous() or t.storage_offset() for t in inputs)
    out, grads = _step(lltm.lltm_cell, inputs)
    dense_out, dense_grads = _step(lltm.lltm_cell, [t.contiguous() for t in inputs])
    ref_out, ref_grads = _step(reference.lltm_cell, inputs)
    names = OUTPUT_NAMES + GRAD_NAMES
    assert_all_close(out + grads, dense_out + dense_grads, names)
    assert_all_close(out + grads, ref_out + ref_grads, names)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_unusual_argument(layout):
    _check_against_contiguous(_with_layout(layout))


def test_every_argument_unusual():
    _check_against_contiguous(_all_unusual())


def test_expanded_upstream_gradients():
    # `new_h.sum().backward()` sends an expanded (stride 0) gradient.
    inputs = [t.requires_grad_() for t in make_inputs(B, F, S)]
    new_h, new_cell = lltm.lltm_cell(*inputs)
    grads = torch.autograd.grad(new_h.sum() + new_cell.sum(), inputs)
    ref_h, ref_cell = reference.lltm_cell(*inputs)
    ref_grads = torch.autograd.grad(ref_h.sum() + ref_cell.sum(), inputs)
    assert_all_close(grads, ref_grads, GRAD_NAMES)


def _backward_args(contiguous: bool):
    inputs = make_inputs(B, F, S)
    _, new_cell, gates = torch.ops.lltm.forward(*inputs)
    input, weights, _, old_h, _ = inputs
    args = [_randn(B, S, seed=30), _randn(B, S, seed=31), new_cell, gates, input, old_h, weights]
    if not contiguous:
        # Same values, transposed storage for every argument.
        args = [t.t().contiguous().t() for t in args]
        assert not any(t.is_contiguous() for t in args)
    return [*args, ALL_GRADS]


def test_backward_op_with_transposed_arguments():
    args = _backward_args(contiguous=False)
    expected = torch.ops.lltm.backward(*_backward_args(contiguous=True))
    assert_all_close(torch.ops.lltm.backward(*args), expected, GRAD_NAMES)
    assert_all_close(_composite.backward(*args), expected, GRAD_NAMES)


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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_inputs_are_never_modified(dtype):
    inputs = [t.to(dtype) for t in _all_unusual()]
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
