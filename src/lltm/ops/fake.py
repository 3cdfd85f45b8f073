"""Fake kernels: output shapes and dtypes without running anything.

torch.compile, torch.export and meta tensors trace the ops through these
(registered from the table of operators.py). They make the same argument
checks as the C++ kernels (lltm/_checks.py mirrors csrc/lltm_checks.h), so
eager, compiled and fallback calls fail alike.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .._checks import (
    SequenceBackwardArgs,
    SequenceSizes,
    check_backward_args,
    check_forward_args,
    check_output_mask,
    check_sequence_args,
    check_sequence_backward_args,
)


def forward(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """lltm::forward's outputs: new_h, new_cell and gates."""
    batch, _, state = check_forward_args(input, weights, bias, old_h, old_cell)
    return (
        input.new_empty((batch, state)),
        input.new_empty((batch, state)),
        input.new_empty((batch, 3 * state)),
    )


def backward(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    input: Tensor,
    old_h: Tensor,
    weights: Tensor,
    output_mask: list[bool],
) -> tuple[Tensor | None, ...]:
    """lltm::backward's outputs: the gradients ``output_mask`` asks for."""
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


def sequence_forward(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """lltm::sequence_forward's outputs: output, h_n, c_n, gates and cells."""
    n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes)
    return (
        _sequence_layout(input, n, n.state),
        old_h.new_empty((n.batch, n.state)),
        old_h.new_empty((n.batch, n.state)),
        _sequence_layout(input, n, 3 * n.state),
        _sequence_layout(input, n, n.state),
    )


def sequence_backward(*args: Any) -> tuple[Tensor | None, ...]:
    """lltm::sequence_backward's outputs: the gradients ``output_mask`` asks for."""
    named = SequenceBackwardArgs(*args[:11])
    n = check_sequence_backward_args(named)
    wanted = check_output_mask(args[11])
    input, weights, old_h = named.input, named.weights, named.old_h
    grads = (
        _sequence_layout(input, n, n.features),
        weights.new_empty((3 * n.state, n.state + n.features)),
        weights.new_empty((3 * n.state,)),
        old_h.new_empty((n.batch, n.state)),
        old_h.new_empty((n.batch, n.state)),
    )
    return tuple(g if want else None for g, want in zip(grads, wanted, strict=True))


def sequence_gate_grads(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    """lltm::sequence_gate_grads's outputs: every step's gate gradients, those of the state."""
    named = SequenceBackwardArgs(*args)
    n = check_sequence_backward_args(named)
    return (
        _sequence_layout(named.input, n, 3 * n.state),
        named.old_h.new_empty((n.batch, n.state)),
        named.old_h.new_empty((n.batch, n.state)),
    )
