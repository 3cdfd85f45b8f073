"""The cell's derivatives: ``CellFunction``, reverse and forward mode.

The Function ``lltm::forward`` applies when a call is differentiated (the
one decision, ops/dispatch.py, says when). Its ``backward`` calls
``lltm::backward``, told by ``output_mask`` which gradients autograd needs;
its ``jvp`` pushes the inputs' tangents through the activations the forward
saved (:func:`output_tangents`). Where what they compute will itself be
differentiated, they recompute the activations from the inputs in plain
torch and apply the plain-torch formulas (composite.py; ops/dispatch.py says
more on higher orders).

The tangents, with ``d`` the tangent of a value (``gates`` and ``cells``,
the saved activations, are not differentiable outputs and get none):

    d_pre   = [d_old_h, d_input] W^T + [old_h, input] dW^T + d_bias
    d_i     = i (1 - i) d_pre_i          d_o = o (1 - o) d_pre_o
    d_g     = elu'(x) d_pre_g            (elu'(x) = 1 for x > 0, exp(x) otherwise)
    d_cell  = d_old_cell + d_g i + g d_i
    d_h     = (1 - tanh^2(cell)) o d_cell + tanh(cell) d_o

16-bit inputs are computed in float32, as the kernels compute them. Inputs
without a tangent are ``None`` and cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import _probes
from ..._errors import reraise
from .. import dispatch
from . import composite
from .contract import backward, forward

_forward_kernels = _probes.direct(forward)
_backward_kernels = _probes.direct(backward)

Tangents = Sequence[Tensor | None]


class CellFunction(_probes.FunctionBase):
    """lltm::forward with its derivatives; outputs (new_h, new_cell, gates)."""

    @staticmethod
    def forward(
        input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Runs the kernels, below the autograd key."""
        with _probes.below_autograd():
            return _forward_kernels(input, weights, bias, old_h, old_cell)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
        """Saves the inputs and activations for backward and jvp."""
        _new_h, new_cell, gates = output
        ctx.mark_non_differentiable(gates)
        ctx.save_for_backward(*inputs, new_cell, gates)
        if dispatch.tangents_possible():
            ctx.save_for_forward(*inputs, new_cell, gates)
        # An output that does not reach the loss has None for a gradient
        # (no zeros allocated and multiplied); backward handles it.
        ctx.set_materialize_grads(False)

    @staticmethod
    def _activations(ctx: Any) -> tuple[tuple[Tensor, ...], Tensor, Tensor, bool]:
        """The activations the forward saved: (inputs, new_cell, gates, recomputed?).

        Recomputed in plain torch from the inputs when what is computed from
        them will be differentiated again.
        """
        *inputs, new_cell, gates = ctx.saved_tensors
        if not dispatch.differentiated_again(inputs):
            return tuple(inputs), new_cell, gates, False
        _new_h, new_cell, gates = composite.forward(*inputs)
        return tuple(inputs), new_cell, gates, True

    @staticmethod
    def backward(
        ctx: Any, grad_h: Tensor | None, grad_cell: Tensor | None, _grad_gates: None
    ) -> tuple[Tensor | None, ...]:
        """The gradients autograd asks for, from the backward operator."""
        if not torch.is_grad_enabled():
            # A plain backward (autograd runs it with grad mode off): nothing
            # it computes is differentiated again, and no torch.func transform
            # runs it (they run backward with grad mode on). Straight to the
            # kernel, the common case spelled out.
            input, weights, _bias, old_h, _old_cell, new_cell, gates = ctx.saved_tensors
            if grad_h is None:
                grad_h = torch.zeros_like(new_cell)
            if grad_cell is None:
                grad_cell = torch.zeros_like(new_cell)
            try:
                with _probes.below_autograd():
                    return _backward_kernels(
                        grad_h, grad_cell, new_cell, gates, input, old_h, weights,
                        ctx.needs_input_grad,
                    )  # fmt: skip
            except (RuntimeError, ValueError) as error:
                reraise(error)
        inputs, new_cell, gates, recomputed = CellFunction._activations(ctx)
        input, weights, _bias, old_h, _old_cell = inputs
        grad_h = torch.zeros_like(new_cell) if grad_h is None else grad_h
        grad_cell = torch.zeros_like(new_cell) if grad_cell is None else grad_cell
        args = (grad_h, grad_cell, new_cell, gates, input, old_h, weights)
        if recomputed:
            return composite.backward_math(*args, ctx.needs_input_grad)
        return dispatch.call_backward(backward, *args, list(ctx.needs_input_grad))

    @staticmethod
    def jvp(ctx: Any, *input_tangents: Tensor | None) -> tuple[Tensor | None, ...]:
        """The tangents of ``new_h`` and ``new_cell`` (:func:`output_tangents`)."""
        inputs, new_cell, gates, _ = CellFunction._activations(ctx)
        d_h, d_cell = output_tangents(inputs, input_tangents, new_cell, gates)
        return d_h, d_cell, None


# --- Forward mode ---------------------------------------------------------------------


def output_tangents(
    primals: Sequence[Tensor], tangents: Tangents, new_cell: Tensor, gates: Tensor
) -> tuple[Tensor, Tensor]:
    """Tangents of lltm::forward's (new_h, new_cell)."""
    input, weights, _bias, old_h, _old_cell = primals
    d_input, d_weights, d_bias, d_old_h, d_old_cell = tangents
    math = composite.math_type(input)
    h_x = torch.cat([old_h, input], dim=1) if d_weights is not None else None
    d_pre = input_side_tangent(h_x, d_input, weights, d_weights, d_bias, input.shape[0], math)
    d_pre = plus_state_tangent(d_pre, d_old_h, weights, math)
    d_h, d_cell = step_tangents(gates, new_cell, d_pre, d_old_cell, math)
    return d_h.to(input.dtype), d_cell.to(input.dtype)


def step_tangents(
    gates: Tensor,
    new_cell: Tensor,
    d_pre: Tensor | None,
    d_old_cell: Tensor | None,
    math: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """(d_h, d_cell) of one step, in the math type."""
    i, o, x = gates.to(math).chunk(3, dim=-1)
    t = torch.tanh(new_cell.to(math))
    if d_pre is None:
        d_o = d_cell = torch.zeros_like(i)
    else:
        d_pre_i, d_pre_o, d_x = d_pre.chunk(3, dim=-1)
        d_i = i * (1 - i) * d_pre_i
        d_o = o * (1 - o) * d_pre_o
        d_g = torch.where(x > 0, torch.ones_like(x), torch.exp(x)) * d_x
        d_cell = d_g * i + F.elu(x) * d_i
    if d_old_cell is not None:
        d_cell = d_cell + d_old_cell.to(math)
    d_h = (1 - t * t) * o * d_cell + t * d_o
    return d_h, d_cell


def input_side_tangent(
    h_x: Tensor | None,
    d_input: Tensor | None,
    weights: Tensor,
    d_weights: Tensor | None,
    d_bias: Tensor | None,
    rows: int,
    math: torch.dtype,
) -> Tensor | None:
    """The part of d_pre that does not depend on the tangent of old_h, for ``rows`` rows.

    That is d_input W_x^T + [old_h, input] dW^T + d_bias (``h_x`` is [old_h,
    input], needed only for dW), or None when all three are None.
    """
    state = weights.shape[0] // 3
    terms = []
    if d_input is not None:
        terms.append(d_input.to(math) @ weights[:, state:].to(math).T)
    if d_weights is not None:
        assert h_x is not None
        terms.append(h_x.to(math) @ d_weights.to(math).T)
    if d_bias is not None:
        terms.append(d_bias.to(math))
    if not terms:
        return None
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total.expand(rows, -1)


def plus_state_tangent(
    d_pre: Tensor | None, d_h: Tensor | None, weights: Tensor, math: torch.dtype
) -> Tensor | None:
    """d_pre + d_old_h W_h^T."""
    if d_h is None:
        return d_pre
    state = weights.shape[0] // 3
    recurrent = d_h.to(math) @ weights[:, :state].to(math).T
    return recurrent if d_pre is None else d_pre + recurrent
