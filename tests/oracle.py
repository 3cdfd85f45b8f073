"""Oracles for the differential tests (test_extremes.py, test_fuzz.py).

* :func:`sequence_oracle`: the reference cell (lltm.reference.lltm_cell) step
  by step on a running state, for padded and packed sequences in either
  direction: what lltm::sequence_forward computes, written without any of its
  code, and differentiated by autograd.
* :class:`CompositeCell` / :class:`CompositeSequence`: the composite kernels
  (src/lltm/ops/*_ops/composite.py) behind the same autograd formula as the native
  ones, so that a test can hold the fallback path to the reference too.
* :data:`CELL_ENTRY_POINTS`: the ways a user reaches the cell (the Python API,
  the registered operator, the composite kernels), by name.
* :func:`nonfinite_pattern`: where a tensor holds NaN, +inf and -inf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

import lltm
from lltm import reference
from lltm.ops.cell_ops import composite as cell_composite
from lltm.ops.sequence_ops import composite as sequence_composite

ALL = [True] * 5


def sequence_oracle(
    input: Tensor,
    weights: Tensor,
    bias: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None = None,
    reverse: bool = False,
    cells: list[Tensor] | None = None,
    cell: Callable[..., tuple[Tensor, Tensor]] = reference.lltm_cell,
) -> tuple[Tensor, Tensor, Tensor]:
    """(output, h_n, c_n) of the reference cell (or ``cell``, of the same
    arguments) over a sequence; every step's new_cell is appended to
    ``cells`` where one is given.

    Padded: input (steps, batch, features), every step on the whole batch.
    Packed: input (rows, features) with a PackedSequence's batch_sizes; step t
    updates the first batch_sizes[t] rows of the state, the other rows keep
    theirs (finished sequences going forward, not yet started ones in reverse).
    """
    if batch_sizes is None:
        sizes = [input.shape[1]] * input.shape[0]
    else:
        sizes = [int(s) for s in batch_sizes.tolist()]
    starts = [sum(sizes[:t]) for t in range(len(sizes))]

    def step_input(t: int) -> Tensor:
        if batch_sizes is None:
            return input[t]
        return input[starts[t] : starts[t] + sizes[t]]

    h, c = old_h, old_cell
    outputs: list[Any] = [None] * len(sizes)
    order = range(len(sizes) - 1, -1, -1) if reverse else range(len(sizes))
    for t in order:
        n = sizes[t]
        new_h, new_cell = cell(step_input(t), weights, bias, h[:n], c[:n])
        outputs[t] = new_h
        if cells is not None:
            cells.append(new_cell.detach())
        h = torch.cat([new_h, h[n:]])
        c = torch.cat([new_cell, c[n:]])
    if not outputs:
        shape = (0, old_h.shape[0], old_h.shape[1]) if batch_sizes is None else (0, old_h.shape[1])
        # `+ 0`: outputs in the graph even without a step.
        return input.new_zeros(shape) + 0 * input.sum(), h + 0, c + 0
    output = torch.stack(outputs) if batch_sizes is None else torch.cat(outputs)
    return output, h, c


class CompositeCell(torch.autograd.Function):
    """lltm::forward/backward's composite kernels under autograd."""

    @staticmethod
    def forward(ctx: Any, *inputs: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        new_h, new_cell, gates = cell_composite.forward(*inputs)
        ctx.save_for_backward(*inputs, new_cell, gates)
        return new_h, new_cell

    @staticmethod
    def backward(ctx: Any, grad_h: Tensor, grad_cell: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        input, weights, _bias, old_h, _old_cell, new_cell, gates = ctx.saved_tensors
        return cell_composite.backward(
            grad_h, grad_cell, new_cell, gates, input, old_h, weights, list(ctx.needs_input_grad)
        )


class CompositeSequence(torch.autograd.Function):
    """lltm::sequence_forward/backward's composite kernels under autograd."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        input: Tensor,
        weights: Tensor,
        bias: Tensor,
        old_h: Tensor,
        old_cell: Tensor,
        batch_sizes: Tensor | None,
        reverse: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        output, h_n, c_n, gates, cells = sequence_composite.sequence_forward(
            input, weights, bias, old_h, old_cell, batch_sizes, reverse
        )
        ctx.save_for_backward(input, weights, old_h, batch_sizes, output, gates, cells)
        ctx.reverse = reverse
        return output, h_n, c_n

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_output: Tensor, grad_h_n: Tensor, grad_c_n: Tensor
    ) -> tuple[Tensor | None, ...]:
        input, weights, old_h, batch_sizes, output, gates, cells = ctx.saved_tensors
        grads = sequence_composite.sequence_backward(
            grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h,
            batch_sizes, ctx.reverse, list(ctx.needs_input_grad[:5]),
        )  # fmt: skip
        return (*grads, None, None)


def nonfinite_pattern(t: Tensor) -> Tensor:
    """0 where finite, 1 at +inf, -1 at -inf, 2 at NaN."""
    return torch.where(
        t.isnan(), 2, torch.where(t.isposinf(), 1, torch.where(t.isneginf(), -1, 0))
    ).to(torch.int8)


def _registered_op(*inputs: Tensor) -> tuple[Tensor, Tensor]:
    new_h, new_cell, _ = torch.ops.lltm.forward(*inputs)
    return new_h, new_cell


CELL_ENTRY_POINTS = {
    "lltm_cell": lltm.lltm_cell,
    "registered_op": _registered_op,
    "composite": CompositeCell.apply,
}


def module_oracle(
    module: lltm.LLTMSequence,
    params: dict[str, Tensor],
    input: Tensor,
    h_0: Tensor,
    c_0: Tensor,
    batch_sizes: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(output, h_n, c_n) of an LLTMSequence with parameters ``params``
    (layers, directions, bias or none; no dropout), from
    :func:`sequence_oracle` per layer and direction. ``input`` is
    (seq_len, batch, features), or packed data with ``batch_sizes`` (sorted
    sequences); the state is (layers * directions, batch, state)."""
    layer_input = input
    h_n, c_n = [], []
    for layer in range(module.num_layers):
        outputs = []
        for direction in range(module.directions):
            index = layer * module.directions + direction
            weights_name, bias_name = module._parameter_names[index]
            weights = params[weights_name]
            bias = params.get(bias_name)
            if bias is None:
                bias = weights.new_zeros(weights.shape[0])
            output, h, c = sequence_oracle(
                layer_input, weights, bias, h_0[index], c_0[index], batch_sizes, direction == 1
            )
            outputs.append(output)
            h_n.append(h)
            c_n.append(c)
        layer_input = torch.cat(outputs, dim=-1)
    return layer_input, torch.stack(h_n), torch.stack(c_n)
