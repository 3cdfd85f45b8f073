"""The cell's operators under ``torch.vmap``: batching rules (ops/batching.py folds).

``forward``: one call, the vmapped dimension folded into the batch, unless
the parameters are batched (one call per index). ``backward``: one call
likewise; per-sample parameter gradients (a backward with shared weights
asked for weight or bias gradients, which must not be summed over the
samples) are the pointwise math in plain torch (composite.py) and one
batched matrix product for the weights, not a loop.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..batching import (
    Batched,
    InDims,
    fold,
    per_index,
    samples_are_matrices,
    to_front,
    unfolded,
)
from .composite import backward_math
from .contract import backward as backward_op
from .contract import forward as forward_op


def forward(info: Any, in_dims: InDims, *args: Tensor) -> Batched:
    """lltm::forward under vmap: one call, the vmapped dimension folded into the batch."""
    input_dim, weights_dim, bias_dim, old_h_dim, old_cell_dim = in_dims
    if weights_dim is not None or bias_dim is not None or not samples_are_matrices(args, in_dims):
        return per_index(forward_op, info.batch_size, in_dims, args)
    input, weights, bias, old_h, old_cell = args
    size = info.batch_size
    outputs = forward_op(
        fold(input, input_dim, size),
        weights,
        bias,
        fold(old_h, old_h_dim, size),
        fold(old_cell, old_cell_dim, size),
    )
    return unfolded(outputs, size)


def backward(info: Any, in_dims: InDims, *args: Any) -> Batched:
    """lltm::backward under vmap: one call, or batched products for per-sample weights."""
    *tensors, output_mask = args
    *row_dims, weights_dim, _ = in_dims
    size = info.batch_size
    if not samples_are_matrices(args, in_dims):
        return per_index(backward_op, size, in_dims, args)
    _, want_weights, want_bias, _, _ = output_mask
    if weights_dim is None and not want_weights and not want_bias:
        grad_h, grad_cell, new_cell, gates, input, old_h = (
            fold(t, d, size) for t, d in zip(tensors[:-1], row_dims, strict=True)
        )
        outputs = backward_op(
            grad_h, grad_cell, new_cell, gates, input, old_h, tensors[-1], output_mask
        )
        return unfolded(outputs, size)
    # Per-sample (or per-member) parameter gradients: batched products.
    batched = [to_front(t, d, size) for t, d in zip(tensors, (*row_dims, weights_dim), strict=True)]
    if weights_dim is None:
        batched[-1] = tensors[-1]  # broadcast by the products, not copied
    grad_h, grad_cell, new_cell, gates, input, old_h, weights = batched
    grads = backward_math(grad_h, grad_cell, new_cell, gates, input, old_h, weights, output_mask)
    return grads, tuple(None if g is None else 0 for g in grads)
