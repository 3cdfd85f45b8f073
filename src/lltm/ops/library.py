"""The compiled library and handles on its five operators.

Importing ``lltm._C`` runs its static initialisers: they declare the op
schemas (csrc/lltm_ops.cpp) and register the CPU kernels. Everything else in
this package registers Python pieces on top of these handles.

Each handle is ``torch.ops.lltm.<name>.default``; its docstring below is the
operator's contract, which every backend (CPU, CUDA, the composite kernel)
implements. Their floating-point tensors are float32, float64, float16 or
bfloat16, all of one dtype and on one device (16-bit types compute in
float32); a bad argument raises a ``ValueError`` or ``TypeError`` that starts
with ``lltm:`` and names the argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

# Importing _C registers the operators; then (names import in order) _backends
# loads the CUDA plugin, which registers its CUDA kernels.
from .. import _C, _backends  # noqa: F401

if TYPE_CHECKING:
    from torch._ops import OpOverload

Grads = tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None, Tensor | None]
"""Gradients of ``(input, weights, bias, old_h, old_cell)``, None where not asked for."""

forward: OpOverload[
    [Tensor, Tensor, Tensor | None, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]
] = torch.ops.lltm.forward.default
"""One LLTM step: ``new_h, new_cell, gates = forward(input, weights, bias, old_h, old_cell)``.

The operator behind :func:`lltm.lltm_cell`, which returns ``(new_h,
new_cell)`` of it.

Args:
    input: ``(batch, input_features)``.
    weights: ``(3 * state_size, state_size + input_features)``; columns
        ``[0, state_size)`` multiply ``old_h``, the rest ``input``.
    bias: ``(3 * state_size,)``, or None for no bias (as ``F.linear`` takes it).
    old_h: ``(batch, state_size)``.
    old_cell: ``(batch, state_size)``.

Returns:
    ``(new_h, new_cell, gates)``. ``new_h`` and ``new_cell`` are ``(batch,
    state_size)``. ``gates``, ``(batch, 3 * state_size)``, holds
    ``[sigmoid(input gate) | sigmoid(output gate) | x]``, ``x`` being the
    candidate's pre-activation: everything :obj:`backward` needs besides the
    inputs, since the derivatives of sigmoid and tanh are functions of their
    outputs and ELU's is computed from ``x`` (a rounded ``elu(x)`` would lose
    ``exp(x)`` in 16-bit). The pre-activations are ``[old_h, input] @
    weights.T + bias``, rounded once, as ``F.linear`` rounds them. ``gates``
    is an implementation detail, and not differentiable.
"""

backward: OpOverload[
    [Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Sequence[bool]], Grads
] = torch.ops.lltm.backward.default
"""The gradients of one step, given the upstream gradients of ``new_h`` and ``new_cell``.

``backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights,
output_mask)``: ``new_cell`` and ``gates`` are what :obj:`forward`
returned, ``input``, ``old_h`` and ``weights`` what it was given.

Args:
    grad_h: ``(batch, state_size)``, the gradient of ``new_h``.
    grad_cell: ``(batch, state_size)``, the gradient of ``new_cell``.
    new_cell: :obj:`forward`'s ``new_cell``.
    gates: :obj:`forward`'s ``gates``.
    input: :obj:`forward`'s ``input``.
    old_h: :obj:`forward`'s ``old_h``.
    weights: :obj:`forward`'s ``weights``.
    output_mask: five booleans, as in ATen's own backward operators: which of
        the gradients of ``(input, weights, bias, old_h, old_cell)`` are
        wanted. The others are not computed. lltm's autograd passes
        ``ctx.needs_input_grad``, so frozen parameters cost no weight-gradient
        product, and inputs that need no gradient no ``d_gates @ weights``.

Returns:
    ``(grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell)``,
    shaped like the arguments they belong to; None where ``output_mask``
    says False.
"""

sequence_forward: OpOverload[
    [Tensor, Tensor, Tensor | None, Tensor, Tensor, Tensor | None, bool],
    tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
] = torch.ops.lltm.sequence_forward.default
"""The cell over a whole sequence, in one call.

``output, h_n, c_n, gates, cells = sequence_forward(input, weights, bias,
old_h, old_cell, batch_sizes, reverse)``. Step ``t`` is :obj:`forward` on
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

Returns:
    ``(output, h_n, c_n, gates, cells)``. ``output`` holds every step's
    ``new_h``, laid out like ``input`` with ``state_size`` features;
    ``h_n`` and ``c_n``, ``(batch, state_size)``, are each sequence's state
    after its last step. ``gates`` and ``cells`` (every step's activated
    gates, as :obj:`forward` lays them out, and ``new_cell``) are what
    :obj:`sequence_backward` needs; they are not differentiable.
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
    ],
    Grads,
] = torch.ops.lltm.sequence_backward.default
"""Backpropagation through time: the gradients of a :obj:`sequence_forward` call.

``sequence_backward(grad_output, grad_h_n, grad_c_n, output, gates, cells,
input, weights, old_h, batch_sizes, reverse, output_mask)``.

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
    ],
    tuple[Tensor, Tensor, Tensor],
] = torch.ops.lltm.sequence_gate_grads.default
"""Backpropagation through time alone: every step's gate gradients.

``sequence_gate_grads(grad_output, grad_h_n, grad_c_n, output, gates, cells,
input, weights, old_h, batch_sizes, reverse)`` takes the arguments of
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

Returns:
    ``(grad_gates, grad_old_h, grad_old_cell)``: the gradient of the loss
    with respect to every step's pre-activations, laid out like ``gates``,
    and the gradients of ``old_h`` and ``old_cell``.
"""
