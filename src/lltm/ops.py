"""The ``lltm::forward`` / ``lltm::backward`` operators seen from Python.

Importing this module loads the compiled library (``lltm._C``), whose static
initialisers declare the op schemas and register the CPU kernels. Here the
public ``torch.library`` API adds what is not a kernel:

* the autograd formula (``register_autograd``): backward is its own op;
* fake kernels (``register_fake``) so torch.compile and meta tensors can trace
  the op without running it, with the same argument checks as the C++ side.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _C  # noqa: F401  (registers the operators)

forward = torch.ops.lltm.forward.default
backward = torch.ops.lltm.backward.default

_FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _shape(t: Tensor) -> str:
    return str(tuple(t.shape))


def _fail(message: str) -> None:
    raise ValueError(f"lltm: {message}")


def _check_same(first: Tensor, first_name: str, t: Tensor, name: str) -> None:
    if t.dtype != first.dtype:
        _fail(
            f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; "
            "all arguments must share one floating dtype"
        )
    if t.device != first.device:
        _fail(f"{name} is on another device than {first_name}; all arguments must be on one device")


def _check_matrix(t: Tensor, name: str, rows: Any, cols: Any, expected: str) -> None:
    if t.dim() != 2 or t.shape[0] != rows or t.shape[1] != cols:
        _fail(f"{name} must have shape {expected} = ({rows}, {cols}), got {_shape(t)}")


def check_forward_args(
    input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor
) -> tuple[Any, Any, Any]:
    """Validates forward's arguments like the C++ kernels do; returns (B, F, S)."""
    for name, t in (("input", input), ("weights", weights), ("bias", bias), ("old_h", old_h), ("old_cell", old_cell)):
        if not isinstance(t, Tensor):
            raise TypeError(f"lltm: {name} must be a Tensor, got {type(t).__name__}")
    if input.dtype not in _FLOATING:
        _fail(
            f"input has dtype {input.dtype}; expected torch.float32, torch.float64, "
            "torch.float16 or torch.bfloat16"
        )
    for name, t in (("weights", weights), ("bias", bias), ("old_h", old_h), ("old_cell", old_cell)):
        _check_same(input, "input", t, name)
    if input.dim() != 2:
        _fail(f"input must be 2-D (batch, input_features), got shape {_shape(input)}")
    if old_h.dim() != 2:
        _fail(f"old_h must be 2-D (batch, state_size), got shape {_shape(old_h)}")
    batch, features, state = input.shape[0], input.shape[1], old_h.shape[1]
    _check_matrix(old_h, "old_h", batch, state, "(batch, state_size)")
    _check_matrix(old_cell, "old_cell", batch, state, "(batch, state_size)")
    _check_matrix(
        weights, "weights", 3 * state, state + features, "(3 * state_size, state_size + input_features)"
    )
    if bias.dim() != 1 or bias.shape[0] != 3 * state:
        _fail(f"bias must have shape (3 * state_size,) = ({3 * state},), got {_shape(bias)}")
    return batch, features, state


@torch.library.register_fake("lltm::forward")
def _forward_fake(
    input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    batch, _, state = check_forward_args(input, weights, bias, old_h, old_cell)
    return (
        input.new_empty((batch, state)),
        input.new_empty((batch, state)),
        input.new_empty((batch, 3 * state)),
    )


@torch.library.register_fake("lltm::backward")
def _backward_fake(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    input: Tensor,
    old_h: Tensor,
    weights: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    batch, features, state = input.shape[0], input.shape[1], old_h.shape[1]
    for name, t in (("grad_h", grad_h), ("grad_cell", grad_cell), ("new_cell", new_cell)):
        _check_same(input, "input", t, name)
        _check_matrix(t, name, batch, state, "(batch, state_size)")
    _check_matrix(gates, "gates", batch, 3 * state, "(batch, 3 * state_size)")
    return (
        input.new_empty((batch, features)),
        weights.new_empty((3 * state, state + features)),
        weights.new_empty((3 * state,)),
        input.new_empty((batch, state)),
        input.new_empty((batch, state)),
    )


def _setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
    input, weights, _bias, old_h, _old_cell = inputs
    _new_h, new_cell, gates = output
    # `gates` only feeds backward: gradients flowing into it are not defined.
    ctx.mark_non_differentiable(gates)
    ctx.save_for_backward(input, weights, old_h, new_cell, gates)


def _backward(
    ctx: Any, grad_h: Tensor, grad_cell: Tensor, _grad_gates: Tensor | None
) -> tuple[Tensor | None, ...]:
    input, weights, old_h, new_cell, gates = ctx.saved_tensors
    grads = backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights)
    return tuple(g if needed else None for g, needed in zip(grads, ctx.needs_input_grad))


torch.library.register_autograd("lltm::forward", _backward, setup_context=_setup_context)
