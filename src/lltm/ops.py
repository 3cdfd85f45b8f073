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

# Importing _C registers the operators.
from . import _C, reference  # noqa: F401

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


def _check_supported_dtype(input: Tensor) -> None:
    if input.dtype not in _FLOATING:
        _fail(
            f"input has dtype {input.dtype}; expected torch.float32, torch.float64, "
            "torch.float16 or torch.bfloat16"
        )


def check_forward_args(
    input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor
) -> tuple[Any, Any, Any]:
    """Validates forward's arguments like the C++ kernels do; returns (B, F, S)."""
    for name, t in (
        ("input", input),
        ("weights", weights),
        ("bias", bias),
        ("old_h", old_h),
        ("old_cell", old_cell),
    ):
        if not isinstance(t, Tensor):
            raise TypeError(f"lltm: {name} must be a Tensor, got {type(t).__name__}")
    _check_supported_dtype(input)
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
        weights,
        "weights",
        3 * state,
        state + features,
        "(3 * state_size, state_size + input_features)",
    )
    if bias.dim() != 1 or bias.shape[0] != 3 * state:
        _fail(f"bias must have shape (3 * state_size,) = ({3 * state},), got {_shape(bias)}")
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
    _check_supported_dtype(input)
    others = {
        "grad_h": grad_h,
        "grad_cell": grad_cell,
        "new_cell": new_cell,
        "gates": gates,
        "old_h": old_h,
        "weights": weights,
    }
    for name, t in others.items():
        _check_same(input, "input", t, name)
    if input.dim() != 2 or old_h.dim() != 2:
        _fail(f"input and old_h must be 2-D, got shapes {_shape(input)} and {_shape(old_h)}")
    batch, features, state = input.shape[0], input.shape[1], old_h.shape[1]
    for name in ("old_h", "grad_h", "grad_cell", "new_cell"):
        _check_matrix(others[name], name, batch, state, "(batch, state_size)")
    _check_matrix(gates, "gates", batch, 3 * state, "(batch, 3 * state_size)")
    _check_matrix(
        weights,
        "weights",
        3 * state,
        state + features,
        "(3 * state_size, state_size + input_features)",
    )
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
    batch, features, state = check_backward_args(
        grad_h, grad_cell, new_cell, gates, input, old_h, weights
    )
    return (
        input.new_empty((batch, features)),
        weights.new_empty((3 * state, state + features)),
        weights.new_empty((3 * state,)),
        input.new_empty((batch, state)),
        input.new_empty((batch, state)),
    )


def _setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
    _new_h, new_cell, gates = output
    # `gates` only feeds backward: gradients flowing into it are not defined.
    ctx.mark_non_differentiable(gates)
    # All five inputs: double backward recomputes the step from them.
    ctx.save_for_backward(*inputs, new_cell, gates)
    # Autograd would otherwise allocate and zero a (batch, 3 * state) tensor
    # for the gradient of `gates` on every backward; _backward ignores it.
    ctx.set_materialize_grads(False)


def _backward(
    ctx: Any, grad_h: Tensor | None, grad_cell: Tensor | None, _grad_gates: Tensor | None
) -> tuple[Tensor | None, ...]:
    input, weights, bias, old_h, old_cell, new_cell, gates = ctx.saved_tensors
    # Without materialized gradients, an output that does not reach the loss
    # has None for a gradient.
    if grad_h is None:
        grad_h = torch.zeros_like(new_cell)
    if grad_cell is None:
        grad_cell = torch.zeros_like(new_cell)
    if torch.is_grad_enabled():
        # create_graph=True. lltm::backward has no derivative of its own:
        # autograd would silently treat its result as a constant.
        return _recomputed_backward(ctx, (input, weights, bias, old_h, old_cell), grad_h, grad_cell)
    grads = backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights)
    needed = ctx.needs_input_grad
    if all(needed):  # the common case: skip building a new tuple
        return grads
    return tuple(g if need else None for g, need in zip(grads, needed, strict=True))


def _recomputed_backward(
    ctx: Any, inputs: tuple[Tensor, ...], grad_h: Tensor, grad_cell: Tensor
) -> tuple[Tensor | None, ...]:
    """Gradients that are themselves differentiable (double backward,
    Hessian-vector products, gradient penalties), through a plain-PyTorch
    recomputation of the step. Only used when create_graph=True."""
    wanted = [t for t, needed in zip(inputs, ctx.needs_input_grad, strict=True) if needed]
    new_h, new_cell = reference.lltm_cell(*inputs)
    grads = iter(
        torch.autograd.grad(
            (new_h, new_cell), wanted, (grad_h, grad_cell), create_graph=True, allow_unused=True
        )
    )
    return tuple(next(grads) if needed else None for needed in ctx.needs_input_grad)


torch.library.register_autograd("lltm::forward", _backward, setup_context=_setup_context)
