"""The sequence's operators under ``torch.vmap``: batching rules (ops/batching.py folds).

Where the weights and ``batch_sizes`` are shared, one call: the vmapped
dimension folded into the batch (a packed sequence stays packed, its batch
sizes multiplied). Per-sample parameter gradients (a backward with shared
weights asked for weight or bias gradients): the gate gradients of all
samples in one call of ``lltm::sequence_gate_grads``, backpropagation
through time alone, then one batched matrix product for the weights, not a
loop. Batched parameters (ensembles) and batched ``batch_sizes``: one call
per vmapped index.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..batching import Batched, InDims, fold, per_index, samples_are_matrices, unfold, unfolded
from ..cell_ops.composite import math_type
from .composite import as_rows, in_layout, state_and_input_rows
from .contract import SequenceBackwardArgs, check_sequence_backward_args
from .contract import sequence_backward as sequence_backward_op
from .contract import sequence_forward as sequence_forward_op
from .contract import sequence_gate_grads as sequence_gate_grads_op
from .contract import sequence_inference as sequence_inference_op


def sequence_forward(info: Any, in_dims: InDims, *args: Any) -> Batched:
    """lltm::sequence_forward under vmap: one call, the vmapped dimension in the batch."""
    return _forward_rule(sequence_forward_op, info, in_dims, args)


def sequence_inference(info: Any, in_dims: InDims, *args: Any) -> Batched:
    """lltm::sequence_inference under vmap: as lltm::sequence_forward."""
    return _forward_rule(sequence_inference_op, info, in_dims, args)


def _forward_rule(op: Any, info: Any, in_dims: InDims, args: tuple[Any, ...]) -> Batched:
    """The forward operators' rule: one call of ``op``, the vmapped dimension in the batch."""
    input_dim, weights_dim, bias_dim, old_h_dim, old_cell_dim, sizes_dim = in_dims[:6]
    if (
        weights_dim is not None
        or bias_dim is not None
        or sizes_dim is not None
        or not samples_are_matrices(args, in_dims)
    ):
        return per_index(op, info.batch_size, in_dims, args)
    input, weights, bias, old_h, old_cell, batch_sizes, reverse, *precision = args
    size = info.batch_size
    outputs = op(
        fold(input, input_dim, size),
        weights,
        bias,
        fold(old_h, old_h_dim, size),
        fold(old_cell, old_cell_dim, size),
        None if batch_sizes is None else batch_sizes * size,
        reverse,
        *precision,
    )
    return unfolded(outputs, size)


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
        fold(grad_output, in_dims[0], size),
        fold(grad_h_n, in_dims[1], size),
        fold(grad_c_n, in_dims[2], size),
        fold(output, in_dims[3], size),
        fold(gates, in_dims[4], size),
        fold(cells, in_dims[5], size),
        fold(input, in_dims[6], size),
        weights,
        fold(old_h, in_dims[8], size),
    )
    return folded, weights, None if batch_sizes is None else batch_sizes * size


def _one_call_serves(args: tuple[Any, ...], in_dims: InDims) -> bool:
    """Weights and batch_sizes shared, samples of matrices: the vmapped index can be folded."""
    weights_dim, sizes_dim = in_dims[7], in_dims[9]
    return weights_dim is None and sizes_dim is None and samples_are_matrices(args, in_dims)


def sequence_gate_grads(info: Any, in_dims: InDims, *args: Any) -> Batched:
    """lltm::sequence_gate_grads under vmap: one call where the weights are shared."""
    size = info.batch_size
    if not _one_call_serves(args, in_dims):
        return per_index(sequence_gate_grads_op, size, in_dims, args)
    folded, _, batch_sizes = _fold_sequence_backward_args(size, in_dims, args)
    return unfolded(sequence_gate_grads_op(*folded, batch_sizes, *args[10:]), size)


def sequence_backward(info: Any, in_dims: InDims, *args: Any) -> Batched:
    """lltm::sequence_backward under vmap: one call, or batched products for per-sample weights."""
    size = info.batch_size
    if not _one_call_serves(args, in_dims):
        return per_index(sequence_backward_op, size, in_dims, args)
    reverse, output_mask, precision = args[10], args[11], args[12:]
    folded, weights, batch_sizes = _fold_sequence_backward_args(size, in_dims, args)
    _, want_weights, want_bias, _, _ = output_mask
    if not want_weights and not want_bias:
        grads = sequence_backward_op(*folded, batch_sizes, reverse, output_mask, *precision)
        return unfolded(grads, size)
    return _per_sample_parameter_grads(
        size, folded, weights, batch_sizes, reverse, output_mask, *precision
    )


def _per_sample_parameter_grads(
    size: int,
    folded: SequenceBackwardTensors,
    weights: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
    output_mask: list[bool],
    allow_tf32: bool = False,
) -> Batched:
    """sequence_backward's gradients for each of ``size`` samples folded into one batch.

    The gate gradients in one call, then every sample's weight gradient
    d_gates^T [h_prev, input] over its own rows as one batched product (and its
    bias gradient as one sum over its rows).
    """
    want_input, want_weights, want_bias, want_old_h, want_old_cell = output_mask
    d_gates, grad_old_h, grad_old_cell = sequence_gate_grads_op(
        *folded, batch_sizes, reverse, allow_tf32
    )
    output, input, old_h = folded[3], folded[6], folded[8]
    n = check_sequence_backward_args(SequenceBackwardArgs(*folded, batch_sizes, reverse))
    d_rows = as_rows(d_gates, n)  # (rows * size, 3S), the sample innermost
    grads: list[Tensor | None] = [None] * 5
    if want_input:
        grads[0] = in_layout(d_rows @ weights[:, n.state :], n)
    per_sample = d_rows.reshape(-1, size, d_rows.shape[-1]).transpose(0, 1)  # (size, rows, 3S)
    if want_weights:
        h_x = state_and_input_rows(output, input, old_h, n, batch_sizes, reverse)
        h_x = h_x.reshape(-1, size, h_x.shape[-1]).transpose(0, 1)  # (size, rows, S + F)
        grads[1] = per_sample.mT @ h_x
    if want_bias:
        # Summed in the math type, from gate gradients in the input's type.
        math = math_type(input)
        grads[2] = per_sample.to(math).sum(dim=1).to(input.dtype)
    grads[3] = grad_old_h if want_old_h else None
    grads[4] = grad_old_cell if want_old_cell else None
    pairs = [unfold(g, size) if i in (0, 3, 4) else (g, 0) for i, g in enumerate(grads)]
    return (
        tuple(g for g, _ in pairs),
        tuple(None if g is None else d for g, d in pairs),
    )
