"""Forward-mode derivatives (JVPs) of the cell and the sequence.

Given tangents of the inputs, these push them through one step (or every
step) using what the forward saved: the activated gates, the candidate's
pre-activation and the new cells. With ``d`` the tangent of a value:

    d_pre   = [d_old_h, d_input] W^T + [old_h, input] dW^T + d_bias
    d_i     = i (1 - i) d_pre_i          d_o = o (1 - o) d_pre_o
    d_g     = elu'(x) d_pre_g            (elu'(x) = 1 for x > 0, exp(x) otherwise)
    d_cell  = d_old_cell + d_g i + g d_i
    d_h     = (1 - tanh^2(cell)) o d_cell + tanh(cell) d_o

(``gates`` and ``cells``, the saved activations, are not differentiable
outputs and get no tangent; see autograd.py for higher orders.)

A sequence is the same step in the order the steps run, with the running
state's tangents carried from step to step; the parts of every step's
``d_pre`` that do not depend on the running state are one product for all
steps. 16-bit inputs are computed in float32, as the kernels compute them.
Inputs without a tangent are ``None`` and cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _composite
from .._checks import check_sequence_args

Tangents = Sequence[Tensor | None]


def _step(
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


def _input_side(
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


def _plus_state(
    d_pre: Tensor | None, d_h: Tensor | None, weights: Tensor, math: torch.dtype
) -> Tensor | None:
    """d_pre + d_old_h W_h^T."""
    if d_h is None:
        return d_pre
    state = weights.shape[0] // 3
    recurrent = d_h.to(math) @ weights[:, :state].to(math).T
    return recurrent if d_pre is None else d_pre + recurrent


def cell(
    primals: Sequence[Tensor], tangents: Tangents, new_cell: Tensor, gates: Tensor
) -> tuple[Tensor, Tensor]:
    """Tangents of lltm::forward's (new_h, new_cell)."""
    input, weights, _bias, old_h, _old_cell = primals
    d_input, d_weights, d_bias, d_old_h, d_old_cell = tangents
    math = _composite.math_type(input)
    h_x = torch.cat([old_h, input], dim=1) if d_weights is not None else None
    d_pre = _input_side(h_x, d_input, weights, d_weights, d_bias, input.shape[0], math)
    d_pre = _plus_state(d_pre, d_old_h, weights, math)
    d_h, d_cell = _step(gates, new_cell, d_pre, d_old_cell, math)
    return d_h.to(input.dtype), d_cell.to(input.dtype)


def sequence(
    primals: Sequence[Tensor | None],
    reverse: bool,
    tangents: Tangents,
    output: Tensor,
    gates: Tensor,
    cells: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Tangents of lltm::sequence_forward's (output, h_n, c_n).

    ``primals`` are (input, weights, bias, old_h, old_cell, batch_sizes).
    """
    input, weights, bias, old_h, old_cell, batch_sizes = primals
    d_input, d_weights, d_bias, d_old_h, d_old_cell = tangents
    assert input is not None and weights is not None and old_h is not None and old_cell is not None
    n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes)
    schedule = _composite.step_schedule(n, batch_sizes, reverse)
    math = _composite.math_type(input)
    gate_rows = _composite.as_rows(gates, n)
    cell_rows = _composite.as_rows(cells, n)
    h_x = None
    if d_weights is not None:
        h_x = _composite.state_and_input_rows(output, input, old_h, n, batch_sizes, reverse)
    d_x_rows = None if d_input is None else _composite.as_rows(d_input, n)
    input_side = _input_side(h_x, d_x_rows, weights, d_weights, d_bias, n.rows, math)

    # The running state's tangents, carried through the steps.
    d_h = d_old_h.to(math) if d_old_h is not None else None
    d_c = d_old_cell.to(math) if d_old_cell is not None else None
    d_outputs: dict[int, Tensor] = {}
    for size, rows in schedule:
        d_pre = None if input_side is None else input_side[rows]
        d_pre = _plus_state(d_pre, None if d_h is None else d_h[:size], weights, math)
        step_d_h, step_d_c = _step(
            gate_rows[rows], cell_rows[rows], d_pre, None if d_c is None else d_c[:size], math
        )
        d_outputs[rows.start] = step_d_h
        d_h, d_c = _carry(step_d_h, d_h, n.batch), _carry(step_d_c, d_c, n.batch)

    dtype = input.dtype
    d_output = _composite.in_layout(_composite.in_step_order(d_outputs, n, n.state, input), n)
    zeros = old_h.new_zeros((n.batch, n.state))
    return (
        d_output.to(dtype),
        zeros if d_h is None else d_h.to(dtype),
        zeros if d_c is None else d_c.to(dtype),
    )


def _carry(step: Tensor, running: Tensor | None, batch: int) -> Tensor:
    """The running (batch, state) tangent after a step that updated its first rows.

    The step's rows, then the rows it did not touch (zero tangents if nothing
    was running yet).
    """
    if step.shape[0] == batch:
        return step
    if running is None:
        running = step.new_zeros((batch, step.shape[1]))
    return torch.cat([step, running[step.shape[0] :]])
