"""The cell's operators, ``lltm::forward`` and ``lltm::backward``: handles, contracts, checks.

Each handle is ``torch.ops.lltm.<name>.default``; its docstring below is the
operator's contract, which every backend (CPU, CUDA, the composite kernel)
implements, and which the API reference shows (docs/api/operators.md). The
schemas are declared in csrc/lltm_ops.cpp, and nowhere else.

The checks make the C++ kernels' checks (csrc/lltm_checks.h) with the same
messages, from the pieces in ops/checks.py: the fake and composite kernels
run them, so eager, compiled and fallback calls fail alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

# Importing _C declares the operators (csrc/lltm_ops.cpp): the handles below
# exist once it is loaded.
from ... import _C  # noqa: F401
from ..checks import (
    check_bias,
    check_matrix,
    check_same,
    check_supported_dtype,
    check_types,
    check_weights,
    fail,
    shape_str,
)

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


def check_forward_args(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Any, Any, Any]:
    """Validates forward's arguments like the C++ kernels do; returns (B, F, S)."""
    check_types(input, weights, bias, old_h, old_cell)
    check_supported_dtype(input)
    for name, t in (("weights", weights), ("bias", bias), ("old_h", old_h), ("old_cell", old_cell)):
        if t is not None:
            check_same(input, "input", t, name)
    if input.dim() != 2:
        fail(f"input must be 2-D (batch, input_features), got shape {shape_str(input)}")
    if old_h.dim() != 2:
        fail(f"old_h must be 2-D (batch, state_size), got shape {shape_str(old_h)}")
    batch, features, state = input.shape[0], input.shape[1], old_h.shape[1]
    check_matrix(old_h, "old_h", batch, state, "(batch, state_size)")
    check_matrix(old_cell, "old_cell", batch, state, "(batch, state_size)")
    check_weights(weights, state, features)
    check_bias(bias, state)
    return batch, features, state


def check_backward_args(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    input: Tensor,
    old_h: Tensor,
    weights: Tensor,
) -> tuple[Any, Any, Any]:
    """Validates backward's arguments like the C++ kernels do; returns (B, F, S)."""
    check_supported_dtype(input)
    others = {
        "grad_h": grad_h,
        "grad_cell": grad_cell,
        "new_cell": new_cell,
        "gates": gates,
        "old_h": old_h,
        "weights": weights,
    }
    for name, t in others.items():
        check_same(input, "input", t, name)
    if input.dim() != 2 or old_h.dim() != 2:
        fail(f"input and old_h must be 2-D, got shapes {shape_str(input)} and {shape_str(old_h)}")
    batch, features, state = input.shape[0], input.shape[1], old_h.shape[1]
    for name in ("old_h", "grad_h", "grad_cell", "new_cell"):
        check_matrix(others[name], name, batch, state, "(batch, state_size)")
    check_matrix(gates, "gates", batch, 3 * state, "(batch, 3 * state_size)")
    check_weights(weights, state, features)
    return batch, features, state
