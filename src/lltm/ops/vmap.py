"""Batching rules: lltm's operators under ``torch.vmap`` (registered from operators.py).

The kernels already take a batch of independent rows, so a vmapped call whose
parameters are shared (only inputs and state batched: per-sample gradients,
``vmap`` over examples) becomes one kernel call: the vmapped dimension is
folded into the kernel's batch and unfolded from its outputs. Folding puts
the vmapped index innermost (row ``r`` of sample ``b`` becomes row
``r * B + b``), which keeps a packed sequence packed: at every step the
active sequences of all samples are still a prefix of the batch, with
``B`` times the batch size.

Per-sample parameter gradients (a backward with shared weights asked for
weight or bias gradients, which must not be summed over the samples): the
gate gradients of all samples in one call (for a sequence,
``lltm::sequence_gate_grads``, backpropagation through time alone; for a
step, the pointwise math in plain torch), then one batched matrix product
for the weights, not a loop.

Batched parameters (ensembles) and batched ``batch_sizes``: one kernel call
per vmapped index.
"""

from __future__ import annotations

from typing import Any, overload

import torch
from torch import Tensor

from .. import _composite
from .._checks import SequenceBackwardArgs, check_sequence_backward_args
from . import library

InDims = tuple[int | None, ...]
# A rule's result: the outputs, and the vmapped dimension of each.
Batched = tuple[tuple[Tensor | None, ...], tuple[int | None, ...]]


@overload
def _fold(t: Tensor, dim: int | None, size: int) -> Tensor: ...
@overload
def _fold(t: None, dim: int | None, size: int) -> None: ...
@overload
def _fold(t: Tensor | None, dim: int | None, size: int) -> Tensor | None: ...
def _fold(t: Tensor | None, dim: int | None, size: int) -> Tensor | None:
    """(B at ``dim``, ..., rows, width) -> (..., rows * B, width).

    The vmapped index goes innermost; an unbatched tensor is broadcast over
    the B samples.
    """
    if t is None:
        return None
    t = t.movedim(dim, -2) if dim is not None else t.unsqueeze(-2).expand(*t.shape[:-1], size, -1)
    return t.reshape(*t.shape[:-3], t.shape[-3] * size, t.shape[-1])


def _unfold(t: Tensor | None, size: int) -> tuple[Tensor | None, int | None]:
    """The inverse of _fold, with the output's vmapped dimension."""
    if t is None:
        return None, None
    return t.reshape(*t.shape[:-2], t.shape[-2] // size, size, t.shape[-1]), t.dim() - 1


def _unfolded(outputs: tuple[Tensor | None, ...], size: int) -> Batched:
    pairs = [_unfold(t, size) for t in outputs]
    return tuple(t for t, _ in pairs), tuple(d for _, d in pairs)


def _per_index(op: Any, size: int, in_dims: InDims, args: tuple[Any, ...]) -> Batched:
    """One call per vmapped index, outputs stacked along dimension 0."""
    results = [
        op(
            *(
                a.select(d, k) if isinstance(d, int) else a
                for a, d in zip(args, in_dims, strict=True)
            )
        )
        for k in range(size)
    ]
    stacked = tuple(
        None if column[0] is None else torch.stack(column) for column in zip(*results, strict=True)
    )
    return stacked, tuple(None if t is None else 0 for t in stacked)


def _samples_are_matrices(args: tuple[Any, ...], in_dims: InDims) -> bool:
    """Whether every batched tensor's samples have rows and columns, as folding needs.

    Where one does not, one call per sample raises the operator's own error
    naming the argument.
    """
    return all(
        not isinstance(a, Tensor) or d is None or a.dim() >= 3
        for a, d in zip(args, in_dims, strict=True)
    )


def _to_front(t: Tensor, dim: int | None, size: int) -> Tensor:
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)


def forward(info: Any, in_dims: InDims, *args: Tensor) -> Batched:
    """lltm::forward under vmap: one call, the vmapped dimension folded into the batch."""
    input_dim, weights_dim, bias_dim, old_h_dim, old_cell_dim = in_dims
    if weights_dim is not None or bias_dim is not None or not _samples_are_matrices(args, in_dims):
        return _per_index(library.forward, info.batch_size, in_dims, args)
    input, weights, bias, old_h, old_cell = args
    size = info.batch_size
    outputs = library.forward(
        _fold(input, input_dim, size),
        weights,
        bias,
        _fold(old_h, old_h_dim, size),
        _fold(old_cell, old_cell_dim, size),
    )
    return _unfolded(outputs, size)


def backward(info: Any, in_dims: InDims, *args: Any) -> Batched:
    """lltm::backward under vmap: one call, or batched products for per-sample weights."""
    *tensors, output_mask = args
    *row_dims, weights_dim, _ = in_dims
    size = info.batch_size
    if not _samples_are_matrices(args, in_dims):
        return _per_index(library.backward, size, in_dims, args)
    _, want_weights, want_bias, _, _ = output_mask
    if weights_dim is None and not want_weights and not want_bias:
        grad_h, grad_cell, new_cell, gates, input, old_h = (
            _fold(t, d, size) for t, d in zip(tensors[:-1], row_dims, strict=True)
        )
        outputs = library.backward(
            grad_h, grad_cell, new_cell, gates, input, old_h, tensors[-1], output_mask
        )
        return _unfolded(outputs, size)
    # Per-sample (or per-member) parameter gradients: batched products.
    batched = [
        _to_front(t, d, size) for t, d in zip(tensors, (*row_dims, weights_dim), strict=True)
    ]
    if weights_dim is None:
        batched[-1] = tensors[-1]  # broadcast by the products, not copied
    grad_h, grad_cell, new_cell, gates, input, old_h, weights = batched
    grads = _composite.backward_math(
        grad_h, grad_cell, new_cell, gates, input, old_h, weights, output_mask
    )
    return grads, tuple(None if g is None else 0 for g in grads)


def sequence_forward(info: Any, in_dims: InDims, *args: Any) -> Batched:
    """lltm::sequence_forward under vmap: one call, the vmapped dimension in the batch."""
    input_dim, weights_dim, bias_dim, old_h_dim, old_cell_dim, sizes_dim, _ = in_dims
    if (
        weights_dim is not None
        or bias_dim is not None
        or sizes_dim is not None
        or not _samples_are_matrices(args, in_dims)
    ):
        return _per_index(library.sequence_forward, info.batch_size, in_dims, args)
    input, weights, bias, old_h, old_cell, batch_sizes, reverse = args
    size = info.batch_size
    outputs = library.sequence_forward(
        _fold(input, input_dim, size),
        weights,
        bias,
        _fold(old_h, old_h_dim, size),
        _fold(old_cell, old_cell_dim, size),
        None if batch_sizes is None else batch_sizes * size,
        reverse,
    )
    return _unfolded(outputs, size)


# The tensors of a sequence backward call: grad_output, grad_h_n, grad_c_n,
# output, gates, cells, input, weights, old_h.
SequenceBackwardTensors = tuple[
    Tensor | None, Tensor | None, Tensor | None, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor
]


def _fold_sequence_backward_args(
    size: int, in_dims: InDims, args: tuple[Any, ...]
) -> tuple[SequenceBackwardTensors, Tensor, Tensor | None]:
    """The tensors of a sequence backward call folded, weights, and batch_sizes for the folded batch."""
    grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h = args[:9]
    batch_sizes = args[9]
    folded = (
        _fold(grad_output, in_dims[0], size),
        _fold(grad_h_n, in_dims[1], size),
        _fold(grad_c_n, in_dims[2], size),
        _fold(output, in_dims[3], size),
        _fold(gates, in_dims[4], size),
        _fold(cells, in_dims[5], size),
        _fold(input, in_dims[6], size),
        weights,
        _fold(old_h, in_dims[8], size),
    )
    return folded, weights, None if batch_sizes is None else batch_sizes * size


def _one_call_serves(args: tuple[Any, ...], in_dims: InDims) -> bool:
    """Weights and batch_sizes shared, samples of matrices: the vmapped index can be folded."""
    weights_dim, sizes_dim = in_dims[7], in_dims[9]
    return weights_dim is None and sizes_dim is None and _samples_are_matrices(args, in_dims)


def sequence_gate_grads(info: Any, in_dims: InDims, *args: Any) -> Batched:
    """lltm::sequence_gate_grads under vmap: one call where the weights are shared."""
    size = info.batch_size
    if not _one_call_serves(args, in_dims):
        return _per_index(library.sequence_gate_grads, size, in_dims, args)
    folded, _, batch_sizes = _fold_sequence_backward_args(size, in_dims, args)
    return _unfolded(library.sequence_gate_grads(*folded, batch_sizes, args[10]), size)


def sequence_backward(info: Any, in_dims: InDims, *args: Any) -> Batched:
    """lltm::sequence_backward under vmap: one call, or batched products for per-sample weights."""
    size = info.batch_size
    if not _one_call_serves(args, in_dims):
        return _per_index(library.sequence_backward, size, in_dims, args)
    reverse, output_mask = args[10], args[11]
    folded, weights, batch_sizes = _fold_sequence_backward_args(size, in_dims, args)
    _, want_weights, want_bias, _, _ = output_mask
    if not want_weights and not want_bias:
        return _unfolded(
            library.sequence_backward(*folded, batch_sizes, reverse, output_mask), size
        )
    return _per_sample_parameter_grads(size, folded, weights, batch_sizes, reverse, output_mask)


def _per_sample_parameter_grads(
    size: int,
    folded: SequenceBackwardTensors,
    weights: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
    output_mask: list[bool],
) -> Batched:
    """sequence_backward's gradients for each of ``size`` samples folded into one batch.

    The gate gradients in one call, then every sample's weight gradient
    d_gates^T [h_prev, input] over its own rows as one batched product (and its
    bias gradient as one sum over its rows).
    """
    want_input, want_weights, want_bias, want_old_h, want_old_cell = output_mask
    d_gates, grad_old_h, grad_old_cell = library.sequence_gate_grads(*folded, batch_sizes, reverse)
    output, input, old_h = folded[3], folded[6], folded[8]
    n = check_sequence_backward_args(SequenceBackwardArgs(*folded, batch_sizes, reverse))
    d_rows = _composite.as_rows(d_gates, n)  # (rows * size, 3S), the sample innermost
    grads: list[Tensor | None] = [None] * 5
    if want_input:
        grads[0] = _composite.in_layout(d_rows @ weights[:, n.state :], n)
    per_sample = d_rows.reshape(-1, size, d_rows.shape[-1]).transpose(0, 1)  # (size, rows, 3S)
    if want_weights:
        h_x = _composite.state_and_input_rows(output, input, old_h, n, batch_sizes, reverse)
        h_x = h_x.reshape(-1, size, h_x.shape[-1]).transpose(0, 1)  # (size, rows, S + F)
        grads[1] = per_sample.mT @ h_x
    if want_bias:
        # Summed in the math type, from gate gradients in the input's type.
        math = _composite.math_type(input)
        grads[2] = per_sample.to(math).sum(dim=1).to(input.dtype)
    grads[3] = grad_old_h if want_old_h else None
    grads[4] = grad_old_cell if want_old_cell else None
    unfolded = [_unfold(g, size) if i in (0, 3, 4) else (g, 0) for i, g in enumerate(grads)]
    return (
        tuple(g for g, _ in unfolded),
        tuple(None if g is None else d for g, d in unfolded),
    )
