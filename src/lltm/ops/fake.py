"""Fake kernels: output shapes and dtypes without running anything.

torch.compile, torch.export and meta tensors trace the ops through these.
They make the same argument checks as the C++ kernels (lltm/_checks.py
mirrors csrc/lltm_checks.h), so eager, compiled and fallback calls fail alike.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .._checks import (
    SequenceSizes,
    check_backward_args,
    check_forward_args,
    check_output_mask,
    check_sequence_args,
    check_sequence_backward_args,
)
from .library import register_fake


@register_fake("lltm::forward")
def _forward_fake(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    batch, _, state = check_forward_args(input, weights, bias, old_h, old_cell)
    return (
        input.new_empty((batch, state)),
        input.new_empty((batch, state)),
        input.new_empty((batch, 3 * state)),
    )


@register_fake("lltm::backward")
def _backward_fake(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    input: Tensor,
    old_h: Tensor,
    weights: Tensor,
    output_mask: list[bool],
) -> tuple[Tensor | None, ...]:
    batch, features, state = check_backward_args(
        grad_h, grad_cell, new_cell, gates, input, old_h, weights
    )
    wanted = check_output_mask(output_mask)
    shapes = (
        (input, (batch, features)),
        (weights, (3 * state, state + features)),
        (weights, (3 * state,)),
        (input, (batch, state)),
        (input, (batch, state)),
    )
    return tuple(
        like.new_empty(shape) if want else None
        for (like, shape), want in zip(shapes, wanted, strict=True)
    )


def _sequence_layout(like: Tensor, n: SequenceSizes, width: Any) -> Tensor:
    shape = (n.rows, width) if n.packed else (n.steps, n.batch, width)
    return like.new_empty(shape)


@register_fake("lltm::sequence_forward")
def _sequence_forward_fake(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes)
    return (
        _sequence_layout(input, n, n.state),
        old_h.new_empty((n.batch, n.state)),
        old_h.new_empty((n.batch, n.state)),
        _sequence_layout(input, n, 3 * n.state),
        _sequence_layout(input, n, n.state),
    )


@register_fake("lltm::sequence_backward")
def _sequence_backward_fake(
    grad_output: Tensor | None,
    grad_h_n: Tensor | None,
    grad_c_n: Tensor | None,
    output: Tensor,
    gates: Tensor,
    cells: Tensor,
    input: Tensor,
    weights: Tensor,
    old_h: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
    output_mask: list[bool],
) -> tuple[Tensor | None, ...]:
    n = check_sequence_backward_args(
        grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h, batch_sizes
    )
    wanted = check_output_mask(output_mask)
    grads = (
        _sequence_layout(input, n, n.features),
        weights.new_empty((3 * n.state, n.state + n.features)),
        weights.new_empty((3 * n.state,)),
        old_h.new_empty((n.batch, n.state)),
        old_h.new_empty((n.batch, n.state)),
    )
    return tuple(g if want else None for g, want in zip(grads, wanted, strict=True))


@register_fake("lltm::sequence_gate_grads")
def _sequence_gate_grads_fake(
    grad_output: Tensor | None,
    grad_h_n: Tensor | None,
    grad_c_n: Tensor | None,
    output: Tensor,
    gates: Tensor,
    cells: Tensor,
    input: Tensor,
    weights: Tensor,
    old_h: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    n = check_sequence_backward_args(
        grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h, batch_sizes
    )
    return (
        _sequence_layout(input, n, 3 * n.state),
        old_h.new_empty((n.batch, n.state)),
        old_h.new_empty((n.batch, n.state)),
    )
