"""The sequence's derivatives: ``SequenceFunction``, reverse and forward mode.

As the cell's (cell_ops/autograd.py): the Function ``lltm::sequence_forward``
applies when a call is differentiated. Its ``backward`` calls
``lltm::sequence_backward`` (backpropagation through time, told by
``output_mask`` which gradients autograd needs); its ``jvp`` is the cell's
step in the order the steps run, with the running state's tangents carried
from step to step; the parts of every step's ``d_pre`` that do not depend on
the running state are one product for all steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ... import _probes
from .. import dispatch
from ..cell_ops.autograd import (
    Tangents,
    input_side_tangent,
    plus_state_tangent,
    step_tangents,
)
from ..cell_ops.composite import math_type
from . import composite
from .composite import as_rows, in_layout, in_step_order, state_and_input_rows, step_schedule
from .contract import check_sequence_args, sequence_backward, sequence_forward

_sequence_forward_kernels = _probes.direct(sequence_forward)


class SequenceFunction(_probes.FunctionBase):
    """lltm::sequence_forward with its derivatives.

    Outputs (output, h_n, c_n, gates, cells).
    """

    @staticmethod
    def forward(
        input: Tensor,
        weights: Tensor,
        bias: Tensor | None,
        old_h: Tensor,
        old_cell: Tensor,
        batch_sizes: Tensor | None,
        reverse: bool,
        allow_tf32: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Runs the kernels, below the autograd key."""
        with _probes.below_autograd():
            return _sequence_forward_kernels(
                input, weights, bias, old_h, old_cell, batch_sizes, reverse, allow_tf32
            )

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        """Saves the inputs and activations for backward and jvp."""
        tensors = inputs[:6]  # input, weights, bias, old_h, old_cell, batch_sizes
        reverse = inputs[6]
        out, _h_n, _c_n, gates, cells = output
        ctx.mark_non_differentiable(gates, cells)
        ctx.save_for_backward(*tensors, out, gates, cells)
        if dispatch.tangents_possible():
            ctx.save_for_forward(*tensors, out, gates, cells)
        ctx.reverse = reverse
        # The backward's products in the forward's precision.
        ctx.allow_tf32 = bool(inputs[7]) if len(inputs) > 7 else False
        ctx.set_materialize_grads(False)

    @staticmethod
    def _activations(ctx: Any) -> tuple[tuple[Any, ...], tuple[Tensor, ...], bool]:
        """The activations: (inputs with batch_sizes, (output, gates, cells), recomputed?).

        As the cell's (cell_ops/autograd.py).
        """
        input, weights, bias, old_h, old_cell, batch_sizes, output, gates, cells = ctx.saved_tensors
        inputs = (input, weights, bias, old_h, old_cell, batch_sizes)
        if not dispatch.differentiated_again(inputs[:5]):
            return inputs, (output, gates, cells), False
        output, _h_n, _c_n, gates, cells = composite.sequence_forward(
            input, weights, bias, old_h, old_cell, batch_sizes, ctx.reverse
        )
        return inputs, (output, gates, cells), True

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        """The gradients autograd asks for, from the backward operator."""
        inputs, saved, recomputed = SequenceFunction._activations(ctx)
        input, weights, _bias, old_h, _old_cell, batch_sizes = inputs
        grad_output, grad_h_n, grad_c_n, _grad_gates, _grad_cells = grads
        args = (
            grad_output, grad_h_n, grad_c_n, *saved, input, weights, old_h, batch_sizes,
            ctx.reverse, list(ctx.needs_input_grad[:5]), ctx.allow_tf32,
        )  # fmt: skip
        if recomputed:
            return (*composite.sequence_backward(*args), None, None, None)
        return (*dispatch.call_backward(sequence_backward, *args), None, None, None)

    @staticmethod
    def jvp(ctx: Any, *input_tangents: Tensor | None) -> tuple[Tensor | None, ...]:
        """The tangents of ``output``, ``h_n`` and ``c_n`` (:func:`output_tangents`)."""
        inputs, (output, gates, cells), _ = SequenceFunction._activations(ctx)
        d_output, d_h_n, d_c_n = output_tangents(
            inputs, ctx.reverse, input_tangents[:5], output, gates, cells
        )
        return d_output, d_h_n, d_c_n, None, None


# --- Forward mode ---------------------------------------------------------------------


def output_tangents(
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
    schedule = step_schedule(n, batch_sizes, reverse)
    math = math_type(input)
    gate_rows = as_rows(gates, n)
    cell_rows = as_rows(cells, n)
    h_x = None
    if d_weights is not None:
        h_x = state_and_input_rows(output, input, old_h, n, batch_sizes, reverse)
    d_x_rows = None if d_input is None else as_rows(d_input, n)
    input_side = input_side_tangent(h_x, d_x_rows, weights, d_weights, d_bias, n.rows, math)

    # The running state's tangents, carried through the steps.
    d_h = d_old_h.to(math) if d_old_h is not None else None
    d_c = d_old_cell.to(math) if d_old_cell is not None else None
    d_outputs: dict[int, Tensor] = {}
    for size, rows in schedule:
        d_pre = None if input_side is None else input_side[rows]
        d_pre = plus_state_tangent(d_pre, None if d_h is None else d_h[:size], weights, math)
        step_d_h, step_d_c = step_tangents(
            gate_rows[rows], cell_rows[rows], d_pre, None if d_c is None else d_c[:size], math
        )
        d_outputs[rows.start] = step_d_h
        d_h, d_c = _carry(step_d_h, d_h, n.batch), _carry(step_d_c, d_c, n.batch)

    dtype = input.dtype
    d_output = in_layout(in_step_order(d_outputs, n, n.state, input), n)
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
