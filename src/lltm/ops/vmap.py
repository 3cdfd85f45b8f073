"""Batching rules: lltm's operators under ``torch.vmap`` (torch.library.register_vmap).

The kernels already take a batch of independent rows, so a vmapped call whose
parameters are shared (only inputs and state batched: per-sample gradients,
``vmap`` over examples) becomes one kernel call: the vmapped dimension is
folded into the kernel's batch and unfolded from its outputs. Folding puts
the vmapped index innermost (row ``r`` of sample ``b`` becomes row
``r * B + b``), which keeps a packed sequence packed: at every step the
active sequences of all samples are still a prefix of the batch, with
``B`` times the batch size.

What one call cannot serve:

* per-sample parameter gradients of a step (the backward with shared weights
  asked for weight or bias gradients, which must not be summed over the
  samples): the step's backward math in plain torch with a leading batch
  dimension, batched matrix products instead of a loop;
* batched parameters (ensembles), batched ``batch_sizes``, and per-sample
  parameter gradients of a sequence: one kernel call per vmapped index.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import _composite
from .library import backward, forward, sequence_backward, sequence_forward

InDims = tuple[int | None, ...]


def _fold(t: Tensor | None, dim: int | None, size: int) -> Tensor | None:
    """(B at ``dim``, ..., rows, width) -> (..., rows * B, width), the vmapped
    index innermost; an unbatched tensor is broadcast over the B samples."""
    if t is None:
        return None
    t = t.movedim(dim, -2) if dim is not None else t.unsqueeze(-2).expand(*t.shape[:-1], size, -1)
    return t.reshape(*t.shape[:-3], t.shape[-3] * size, t.shape[-1])


def _unfold(t: Tensor | None, size: int) -> tuple[Tensor | None, int | None]:
    """The inverse of _fold, with the output's vmapped dimension."""
    if t is None:
        return None, None
    return t.reshape(*t.shape[:-2], t.shape[-2] // size, size, t.shape[-1]), t.dim() - 1


def _unfolded(outputs: tuple[Tensor | None, ...], size: int) -> tuple[tuple, tuple]:
    pairs = [_unfold(t, size) for t in outputs]
    return tuple(t for t, _ in pairs), tuple(d for _, d in pairs)


def _per_index(op: Any, size: int, in_dims: InDims, args: tuple[Any, ...]) -> tuple[tuple, tuple]:
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


def _to_front(t: Tensor, dim: int | None, size: int) -> Tensor:
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)


@torch.library.register_vmap("lltm::forward")
def _forward_rule(info: Any, in_dims: InDims, *args: Tensor) -> tuple[tuple, tuple]:
    input_dim, weights_dim, bias_dim, old_h_dim, old_cell_dim = in_dims
    if weights_dim is not None or bias_dim is not None:
        return _per_index(forward, info.batch_size, in_dims, args)
    input, weights, bias, old_h, old_cell = args
    size = info.batch_size
    outputs = forward(
        _fold(input, input_dim, size),
        weights,
        bias,
        _fold(old_h, old_h_dim, size),
        _fold(old_cell, old_cell_dim, size),
    )
    return _unfolded(outputs, size)


@torch.library.register_vmap("lltm::backward")
def _backward_rule(info: Any, in_dims: InDims, *args: Any) -> tuple[tuple, tuple]:
    *tensors, output_mask = args
    *row_dims, weights_dim, _ = in_dims
    size = info.batch_size
    _, want_weights, want_bias, _, _ = output_mask
    if weights_dim is None and not want_weights and not want_bias:
        rows = [_fold(t, d, size) for t, d in zip(tensors[:-1], row_dims, strict=True)]
        return _unfolded(backward(*rows, tensors[-1], output_mask), size)
    # Per-sample (or per-member) parameter gradients: batched products.
    batched = [
        _to_front(t, d, size) for t, d in zip(tensors, (*row_dims, weights_dim), strict=True)
    ]
    if weights_dim is None:
        batched[-1] = tensors[-1]  # broadcast by the products, not copied
    grads = _composite.backward_math(*batched, output_mask)
    return grads, tuple(None if g is None else 0 for g in grads)


@torch.library.register_vmap("lltm::sequence_forward")
def _sequence_forward_rule(info: Any, in_dims: InDims, *args: Any) -> tuple[tuple, tuple]:
    input_dim, weights_dim, bias_dim, old_h_dim, old_cell_dim, sizes_dim, _ = in_dims
    if weights_dim is not None or bias_dim is not None or sizes_dim is not None:
        return _per_index(sequence_forward, info.batch_size, in_dims, args)
    input, weights, bias, old_h, old_cell, batch_sizes, reverse = args
    size = info.batch_size
    outputs = sequence_forward(
        _fold(input, input_dim, size),
        weights,
        bias,
        _fold(old_h, old_h_dim, size),
        _fold(old_cell, old_cell_dim, size),
        None if batch_sizes is None else batch_sizes * size,
        reverse,
    )
    return _unfolded(outputs, size)


@torch.library.register_vmap("lltm::sequence_backward")
def _sequence_backward_rule(info: Any, in_dims: InDims, *args: Any) -> tuple[tuple, tuple]:
    *tensors, batch_sizes, reverse, output_mask = args
    *row_dims, weights_dim, old_h_dim, sizes_dim, _, _ = in_dims
    _, want_weights, want_bias, _, _ = output_mask
    size = info.batch_size
    if weights_dim is not None or sizes_dim is not None or want_weights or want_bias:
        return _per_index(sequence_backward, size, in_dims, args)
    # (grad_output, grad_h_n, grad_c_n, output, gates, cells, input), weights, old_h
    rows = [_fold(t, d, size) for t, d in zip(tensors[:-2], row_dims, strict=True)]
    grads = sequence_backward(
        *rows,
        tensors[-2],
        _fold(tensors[-1], old_h_dim, size),
        None if batch_sizes is None else batch_sizes * size,
        reverse,
        output_mask,
    )
    return _unfolded(grads, size)
