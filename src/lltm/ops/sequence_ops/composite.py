"""The sequence's operators in plain torch ops: the composite kernel.

As the cell's (cell_ops/composite.py): the kernel of every device without a
native one, differentiable to any order, held to the native kernels by the
tests. A sequence is the cell's step in a loop, one step at a time; the
native kernels fuse the steps.

The steps run in order (reversed for ``reverse``); step t updates the first
``batch_sizes[t]`` rows of a running (batch, state) state, the other rows
keep theirs. With non-increasing batch sizes that is exactly a
PackedSequence: going forward, finished sequences drop out at the end of the
batch; going in reverse, a sequence joins when its last element comes up,
from old_h. The layout helpers here (a sequence's tensors as rows, the steps'
schedule) serve the family's autograd and batching rules too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..cell_ops.composite import forward as cell_forward
from ..cell_ops.composite import math_type, step_backward
from ..checks import check_output_mask
from .contract import (
    SequenceBackwardArgs,
    check_sequence_args,
    check_sequence_backward_args,
    sequence_batch_sizes,
)


def step_schedule(n: Any, batch_sizes: Tensor | None, reverse: bool) -> list[tuple[int, slice]]:
    """(active batch, rows of the step) in the order the steps run."""
    sizes = sequence_batch_sizes(batch_sizes, n)
    starts = [sum(sizes[:t]) for t in range(len(sizes))]
    order = range(len(sizes) - 1, -1, -1) if reverse else range(len(sizes))
    return [(sizes[t], slice(starts[t], starts[t] + sizes[t])) for t in order]


def as_rows(t: Tensor, n: Any) -> Tensor:
    """A tensor of the input's layout as (rows, width)."""
    return t if n.packed else t.reshape(n.rows, t.shape[-1])


def in_layout(rows: Tensor, n: Any) -> Tensor:
    """Rows laid out as the input is: (steps, batch, width), or as they are when packed."""
    return rows if n.packed else rows.reshape(n.steps, n.batch, rows.shape[-1])


def in_step_order(pieces: dict[int, Tensor], n: Any, width: int, like: Tensor) -> Tensor:
    """Rows of every step, stacked by row index (pieces keyed by first row)."""
    if not pieces:
        return like.new_empty((n.rows, width))
    return torch.cat([pieces[start] for start in sorted(pieces)], dim=0)


def state_and_input_rows(
    output: Tensor,
    input: Tensor,
    old_h: Tensor,
    n: Any,
    batch_sizes: Tensor | None,
    reverse: bool,
) -> Tensor:
    """[h_prev, x] for every row, (rows, S + F).

    What each step multiplied by the weights: the right-hand side of the weight
    gradient.
    """
    if n.packed:
        steps = step_schedule(n, batch_sizes, reverse)
        h_rows = in_step_order(previous_states(output, old_h, steps), n, n.state, input)
        return torch.cat([h_rows, input], dim=1)
    # Padded: every step reads the whole batch, so the states read are the
    # outputs shifted by one step, with old_h at the end the sequence starts
    # from (and no state at all for a sequence of no steps).
    first = old_h.unsqueeze(0)
    h_steps = torch.cat([output[1:], first]) if reverse else torch.cat([first, output[:-1]])
    h_steps = h_steps[: n.steps]
    return torch.cat([h_steps, input], dim=2).reshape(n.rows, n.state + n.features)


def previous_states(
    out_rows: Tensor, old_h: Tensor, steps: list[tuple[int, slice]]
) -> dict[int, Tensor]:
    """The state each step read, keyed by the step's first row.

    Rebuilt from the output rows as the forward built it.
    """
    h_prev: dict[int, Tensor] = {}
    h = old_h
    for size, rows in steps:
        h_prev[rows.start] = h[:size]
        h = torch.cat([out_rows[rows], h[size:]])
    return h_prev


def sequence_forward(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
    allow_tf32: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """lltm::sequence_forward: (output, h_n, c_n, gates, cells), a step at a time."""
    n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes)
    x_rows = as_rows(input, n)
    h, c = old_h, old_cell
    outputs: dict[int, Tensor] = {}
    cells: dict[int, Tensor] = {}
    gates: dict[int, Tensor] = {}
    for size, rows in step_schedule(n, batch_sizes, reverse):
        new_h, new_cell, step_gates = cell_forward(x_rows[rows], weights, bias, h[:size], c[:size])
        outputs[rows.start], cells[rows.start], gates[rows.start] = new_h, new_cell, step_gates
        h = torch.cat([new_h, h[size:]])
        c = torch.cat([new_cell, c[size:]])
    return (
        in_layout(in_step_order(outputs, n, n.state, input), n),
        h.clone() if h is old_h else h,
        c.clone() if c is old_cell else c,
        in_layout(in_step_order(gates, n, 3 * n.state, input), n),
        in_layout(in_step_order(cells, n, n.state, input), n),
    )


def sequence_inference(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    """lltm::sequence_inference: sequence_forward's (output, h_n, c_n).

    Plain torch that autograd differentiates: it keeps what autograd needs,
    which is what it is for only where there is no native kernel.
    """
    output, h_n, c_n, _gates, _cells = sequence_forward(*args)
    return output, h_n, c_n


def _through_time(
    grad_output: Tensor | None,
    grad_h_n: Tensor | None,
    grad_c_n: Tensor | None,
    gates: Tensor,
    cells: Tensor,
    input: Tensor,
    weights: Tensor,
    old_h: Tensor,
    steps: list[tuple[int, slice]],
    n: Any,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Backpropagation through time.

    Returns every step's d_gates as (rows, 3S), the gradients of old_h and
    old_cell, and grad_bias in the math type.
    """
    gate_rows, cell_rows = as_rows(gates, n), as_rows(cells, n)
    grad_rows = None if grad_output is None else as_rows(grad_output, n)
    w_h = weights[:, : n.state]
    # Through time, last step first: the running gradients of the state.
    dh = torch.zeros_like(old_h) if grad_h_n is None else grad_h_n
    dc = torch.zeros_like(old_h) if grad_c_n is None else grad_c_n
    d_gates: dict[int, Tensor] = {}
    # As in the cell: pointwise math in float32 for 16-bit types; the
    # running gradients and d_gates kept in the input's type between steps.
    math, dtype = math_type(input), input.dtype
    grad_bias = torch.zeros(3 * n.state, dtype=math, device=input.device)
    for size, rows in reversed(steps):
        grad_h = dh[:size].to(math)
        if grad_rows is not None:
            grad_h = grad_h + grad_rows[rows].to(math)
        step, d_cell = step_backward(grad_h, dc[:size], cell_rows[rows], gate_rows[rows], math)
        grad_bias = grad_bias + step.sum(dim=0)
        step = step.to(dtype)
        d_gates[rows.start] = step
        dh = torch.cat([step @ w_h, dh[size:]])
        dc = torch.cat([d_cell.to(dtype), dc[size:]])
    all_d_gates = in_step_order(d_gates, n, 3 * n.state, input)
    return (
        all_d_gates,
        dh.clone() if dh is grad_h_n else dh,
        dc.clone() if dc is grad_c_n else dc,
        grad_bias,
    )


def sequence_backward(*args: Any) -> tuple[Tensor | None, ...]:
    """lltm::sequence_backward in plain torch ops, differentiable to any order."""
    named = SequenceBackwardArgs(*args[:11])
    output_mask = args[11]
    n = check_sequence_backward_args(named)
    grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h = named[:9]
    batch_sizes, reverse = named.batch_sizes, named.reverse
    want_input, want_weights, want_bias, want_old_h, want_old_cell = check_output_mask(output_mask)
    steps = step_schedule(n, batch_sizes, reverse)
    d_gates, grad_old_h, grad_old_cell, grad_bias = _through_time(
        grad_output, grad_h_n, grad_c_n, gates, cells, input, weights, old_h, steps, n
    )
    if want_weights:
        h_x = state_and_input_rows(output, input, old_h, n, batch_sizes, reverse)
    return (
        in_layout(d_gates @ weights[:, n.state :], n) if want_input else None,
        d_gates.t() @ h_x if want_weights else None,
        grad_bias.to(input.dtype) if want_bias else None,
        grad_old_h if want_old_h else None,
        grad_old_cell if want_old_cell else None,
    )


def sequence_gate_grads(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    """lltm::sequence_gate_grads in plain torch ops.

    Returns every step's gate gradients, laid out like ``gates``, and the
    gradients of old_h and old_cell.
    """
    named = SequenceBackwardArgs(*args[:11])
    n = check_sequence_backward_args(named)
    grad_output, grad_h_n, grad_c_n, _output, gates, cells, input, weights, old_h = named[:9]
    batch_sizes, reverse = named.batch_sizes, named.reverse
    steps = step_schedule(n, batch_sizes, reverse)
    d_gates, grad_old_h, grad_old_cell, _ = _through_time(
        grad_output, grad_h_n, grad_c_n, gates, cells, input, weights, old_h, steps, n
    )
    return in_layout(d_gates, n), grad_old_h, grad_old_cell
