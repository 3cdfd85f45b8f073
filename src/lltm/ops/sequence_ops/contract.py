"""The sequence's operators: handles, contracts, checks.

``lltm::sequence_forward`` runs the cell over a whole sequence,
``lltm::sequence_inference`` does so keeping nothing for a backward,
``lltm::sequence_backward`` is backpropagation through time, and
``lltm::sequence_gate_grads`` that backpropagation alone (the gate
gradients, for per-sample weight gradients under ``torch.vmap``). Each
handle is ``torch.ops.lltm.<name>.default``; its docstring below is the
operator's contract, which every backend implements, and which the API
reference shows (docs/api/operators.md). The schemas are declared in
csrc/lltm_ops.cpp, and nowhere else.

The checks make the C++ kernels' checks (csrc/lltm_sequence_checks.h) with
the same messages, from the pieces in ops/checks.py; the fake and composite
kernels run them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

# Importing _C declares the operators (csrc/lltm_ops.cpp): the handles below
# exist once it is loaded.
from ... import _C  # noqa: F401
from ..cell_ops.contract import Grads
from ..checks import (
    check_bias,
    check_matrix,
    check_same,
    check_supported_dtype,
    check_weights,
    fail,
    shape_str,
)

if TYPE_CHECKING:
    from torch._ops import OpOverload

sequence_forward: OpOverload[
    [Tensor, Tensor, Tensor | None, Tensor, Tensor, Tensor | None, bool, bool],
    tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
] = torch.ops.lltm.sequence_forward.default
"""The cell over a whole sequence, in one call.

``output, h_n, c_n, gates, cells = sequence_forward(input, weights, bias,
old_h, old_cell, batch_sizes, reverse, allow_tf32=False)``. Step ``t`` is :obj:`forward` on
step ``t``'s input and the state the step before left. The operator behind
:func:`lltm.lltm_sequence` and :class:`lltm.LLTMSequence`.

Args:
    input: ``(seq_len, batch, input_features)``; or, packed,
        ``(sum(batch_sizes), input_features)``.
    weights: as for :obj:`forward`.
    bias: as for :obj:`forward`.
    old_h: the initial state, ``(batch, state_size)``.
    old_cell: the initial cell, ``(batch, state_size)``.
    batch_sizes: None, or for packed input the ``(seq_len,)`` int64 CPU
        tensor of a ``PackedSequence``: non-increasing sizes, the first equal
        to ``batch``. Step ``t`` then updates only the first
        ``batch_sizes[t]`` sequences.
    reverse: run the steps from last to first (the backward direction of a
        bidirectional layer).
    allow_tf32: float32's matrix products may run on TF32 tensor cores, as
        torch's own may under ``torch.set_float32_matmul_precision("high")``
        (CUDA: each input in two TF32 terms, float32's accuracy; the weight
        gradient cuBLAS's one term);
        :func:`lltm.lltm_sequence` and :class:`lltm.LLTMSequence` pass torch's
        setting at call time. Kernels without TF32 (the CPU's) compute exact
        float32 either way; other dtypes ignore it.

Returns:
    ``(output, h_n, c_n, gates, cells)``. ``output`` holds every step's
    ``new_h``, laid out like ``input`` with ``state_size`` features;
    ``h_n`` and ``c_n``, ``(batch, state_size)``, are each sequence's state
    after its last step. ``gates`` and ``cells`` (every step's activated
    gates, as :obj:`forward` lays them out, and ``new_cell``) are what
    :obj:`sequence_backward` needs; they are not differentiable.
"""

sequence_inference: OpOverload[
    [Tensor, Tensor, Tensor | None, Tensor, Tensor, Tensor | None, bool, bool],
    tuple[Tensor, Tensor, Tensor],
] = torch.ops.lltm.sequence_inference.default
"""The cell over a whole sequence when nothing will differentiate the call.

``output, h_n, c_n = sequence_inference(input, weights, bias, old_h,
old_cell, batch_sizes, reverse)``: :obj:`sequence_forward`'s arguments and
first three outputs, the same values bit for bit, computed without keeping
what only :obj:`sequence_backward` reads (``gates`` and ``cells``: together
four times the output's size). :func:`lltm.lltm_sequence` and
:class:`lltm.LLTMSequence` call it when no gradient can be asked of the call
(``torch.no_grad``, ``torch.inference_mode``, or no argument that requires
grad, and no forward-mode tangent or ``torch.func`` transform). Called where
autograd must differentiate it, it runs :obj:`sequence_forward` and its
derivatives instead: the gradients are right either way.

Args:
    input: as for :obj:`sequence_forward`.
    weights: as for :obj:`sequence_forward`.
    bias: as for :obj:`sequence_forward`.
    old_h: as for :obj:`sequence_forward`.
    old_cell: as for :obj:`sequence_forward`.
    batch_sizes: as for :obj:`sequence_forward`.
    reverse: as for :obj:`sequence_forward`.
    allow_tf32: as for :obj:`sequence_forward`.

Returns:
    ``(output, h_n, c_n)``, as :obj:`sequence_forward` returns them.
"""

sequence_backward: OpOverload[
    [
        Tensor | None,
        Tensor | None,
        Tensor | None,
        Tensor,
        Tensor,
        Tensor,
        Tensor,
        Tensor,
        Tensor,
        Tensor | None,
        bool,
        Sequence[bool],
        bool,
    ],
    Grads,
] = torch.ops.lltm.sequence_backward.default
"""Backpropagation through time: the gradients of a :obj:`sequence_forward` call.

``sequence_backward(grad_output, grad_h_n, grad_c_n, output, gates, cells,
input, weights, old_h, batch_sizes, reverse, output_mask, allow_tf32=False)``.

Args:
    grad_output: the gradient of ``output``, or None if it did not reach the loss.
    grad_h_n: the gradient of ``h_n``, or None.
    grad_c_n: the gradient of ``c_n``, or None.
    output: :obj:`sequence_forward`'s ``output``.
    gates: :obj:`sequence_forward`'s ``gates``.
    cells: :obj:`sequence_forward`'s ``cells``.
    input: :obj:`sequence_forward`'s ``input``.
    weights: :obj:`sequence_forward`'s ``weights``.
    old_h: :obj:`sequence_forward`'s ``old_h``.
    batch_sizes: :obj:`sequence_forward`'s ``batch_sizes``.
    reverse: :obj:`sequence_forward`'s ``reverse``.
    output_mask: which gradients are wanted, as for :obj:`backward`.
    allow_tf32: as for :obj:`sequence_forward`: the forward's, so that a
        backward computes in its forward's precision.

Returns:
    ``(grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell)``,
    None where ``output_mask`` says False.
"""

sequence_gate_grads: OpOverload[
    [
        Tensor | None,
        Tensor | None,
        Tensor | None,
        Tensor,
        Tensor,
        Tensor,
        Tensor,
        Tensor,
        Tensor,
        Tensor | None,
        bool,
        bool,
    ],
    tuple[Tensor, Tensor, Tensor],
] = torch.ops.lltm.sequence_gate_grads.default
"""Backpropagation through time alone: every step's gate gradients.

``sequence_gate_grads(grad_output, grad_h_n, grad_c_n, output, gates, cells,
input, weights, old_h, batch_sizes, reverse, allow_tf32=False)`` takes the arguments of
:obj:`sequence_backward` but ``output_mask``. :obj:`sequence_backward` is
this followed by the products with ``weights`` and ``[h_prev, input]``; this
operator serves what needs the gate gradients themselves: per-sample weight
gradients, one product per sample, under ``torch.vmap`` over a batch that
shares the weights.

Args:
    grad_output: as for :obj:`sequence_backward`.
    grad_h_n: as for :obj:`sequence_backward`.
    grad_c_n: as for :obj:`sequence_backward`.
    output: as for :obj:`sequence_backward`.
    gates: as for :obj:`sequence_backward`.
    cells: as for :obj:`sequence_backward`.
    input: as for :obj:`sequence_backward`.
    weights: as for :obj:`sequence_backward`.
    old_h: as for :obj:`sequence_backward`.
    batch_sizes: as for :obj:`sequence_backward`.
    reverse: as for :obj:`sequence_backward`.
    allow_tf32: as for :obj:`sequence_backward`.

Returns:
    ``(grad_gates, grad_old_h, grad_old_cell)``: the gradient of the loss
    with respect to every step's pre-activations, laid out like ``gates``,
    and the gradients of ``old_h`` and ``old_cell``.
"""


class SequenceBackwardArgs(NamedTuple):
    """The arguments of lltm::sequence_backward before ``output_mask``.

    All of lltm::sequence_gate_grads' but ``allow_tf32``. ``SequenceBackwardArgs(*args[:11])``
    names them: the one place that spells them out.
    """

    grad_output: Tensor | None
    grad_h_n: Tensor | None
    grad_c_n: Tensor | None
    output: Tensor
    gates: Tensor
    cells: Tensor
    input: Tensor
    weights: Tensor
    old_h: Tensor
    batch_sizes: Tensor | None
    reverse: bool


class SequenceSizes(NamedTuple):
    """The sizes of a sequence call.

    ``steps`` steps over ``batch`` sequences, ``rows`` rows of input in all
    (steps * batch unless packed).
    """

    steps: Any
    batch: Any
    rows: Any
    features: Any
    state: Any
    packed: bool


def _check_sequence_layout(t: Tensor, name: str, n: SequenceSizes, width: Any, what: str) -> None:
    if n.packed:
        if t.dim() != 2 or t.shape[0] != n.rows or t.shape[1] != width:
            fail(
                f"{name} must have shape (sum(batch_sizes), {what}) = ({n.rows}, {width}), "
                f"got {shape_str(t)}"
            )
    elif t.dim() != 3 or tuple(t.shape) != (n.steps, n.batch, width):
        fail(
            f"{name} must have shape (seq_len, batch, {what}) = ({n.steps}, {n.batch}, {width}), "
            f"got {shape_str(t)}"
        )


def _check_batch_sizes_tensor(batch_sizes: Tensor) -> None:
    if (
        batch_sizes.dim() != 1
        or batch_sizes.dtype != torch.int64
        or batch_sizes.device.type != "cpu"
    ):
        where = "" if batch_sizes.device.type == "cpu" else " on another device"
        fail(
            "batch_sizes must be a 1-D int64 tensor on the CPU, as a PackedSequence's; got shape "
            f"{shape_str(batch_sizes)} of {batch_sizes.dtype}{where}"
        )


def _sequence_sizes(input: Tensor, old_h: Tensor, batch_sizes: Tensor | None) -> SequenceSizes:
    if old_h.dim() != 2:
        fail(f"old_h must be 2-D (batch, state_size), got shape {shape_str(old_h)}")
    state = old_h.shape[1]
    if batch_sizes is not None:
        _check_batch_sizes_tensor(batch_sizes)
        if input.dim() != 2:
            fail(
                "input must be 2-D (sum(batch_sizes), input_features) when batch_sizes is "
                f"given, got shape {shape_str(input)}"
            )
        return SequenceSizes(
            batch_sizes.shape[0], old_h.shape[0], input.shape[0], input.shape[1], state, True
        )
    if input.dim() != 3:
        fail(f"input must be 3-D (seq_len, batch, input_features), got shape {shape_str(input)}")
    steps, batch, features = input.shape
    return SequenceSizes(steps, batch, steps * batch, features, state, False)


def check_sequence_args(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None,
) -> SequenceSizes:
    """Validates lltm::sequence_forward's arguments like the C++ kernels do."""
    check_supported_dtype(input)
    for name, t in (("weights", weights), ("bias", bias), ("old_h", old_h), ("old_cell", old_cell)):
        if t is not None:
            check_same(input, "input", t, name)
    n = _sequence_sizes(input, old_h, batch_sizes)
    check_matrix(old_h, "old_h", n.batch, n.state, "(batch, state_size)")
    check_matrix(old_cell, "old_cell", n.batch, n.state, "(batch, state_size)")
    check_weights(weights, n.state, n.features)
    check_bias(bias, n.state)
    return n


def check_sequence_backward_args(args: SequenceBackwardArgs) -> SequenceSizes:
    """Validates lltm::sequence_backward's arguments like the C++ kernels do."""
    grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h = args[:9]
    batch_sizes = args.batch_sizes
    check_supported_dtype(input)
    for name, t in (
        ("output", output),
        ("gates", gates),
        ("cells", cells),
        ("weights", weights),
        ("old_h", old_h),
        ("grad_output", grad_output),
        ("grad_h_n", grad_h_n),
        ("grad_c_n", grad_c_n),
    ):
        if t is not None:
            check_same(input, "input", t, name)
    n = _sequence_sizes(input, old_h, batch_sizes)
    check_matrix(old_h, "old_h", n.batch, n.state, "(batch, state_size)")
    _check_sequence_layout(input, "input", n, n.features, "input_features")
    _check_sequence_layout(output, "output", n, n.state, "state_size")
    _check_sequence_layout(cells, "cells", n, n.state, "state_size")
    _check_sequence_layout(gates, "gates", n, 3 * n.state, "3 * state_size")
    if grad_output is not None:
        _check_sequence_layout(grad_output, "grad_output", n, n.state, "state_size")
    for name, t in (("grad_h_n", grad_h_n), ("grad_c_n", grad_c_n)):
        if t is not None:
            check_matrix(t, name, n.batch, n.state, "(batch, state_size)")
    check_weights(weights, n.state, n.features)
    return n


def sequence_batch_sizes(batch_sizes: Tensor | None, n: SequenceSizes) -> list[int]:
    """Every step's active batch size, checked like the C++ kernels check it."""
    if batch_sizes is None:
        return [int(n.batch)] * int(n.steps)
    sizes = [int(v) for v in batch_sizes.tolist()]
    for step, size in enumerate(sizes):
        limit = n.batch if step == 0 else sizes[step - 1]
        if size < 1 or size > limit or (step == 0 and size != n.batch):
            fail(
                "batch_sizes must be positive and non-increasing, starting at the batch of old_h "
                f"({n.batch}); got {size} at step {step}"
            )
    if sum(sizes) != n.rows:
        fail(f"batch_sizes must sum to the rows of input ({n.rows}), got {sum(sizes)}")
    return sizes
