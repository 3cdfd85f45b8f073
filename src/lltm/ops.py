"""The ``lltm::forward`` / ``lltm::backward`` operators seen from Python.

Importing this module loads the compiled library (``lltm._C``), whose static
initialisers declare the op schemas and register the CPU kernels. Here the
public ``torch.library`` API adds what is not a kernel:

* the autograd formula (``register_autograd``): backward is its own op;
* fake kernels (``register_fake``) so torch.compile and meta tensors can trace
  the op without running it, with the same argument checks as the C++ side
  (lltm/_checks.py mirrors csrc/lltm_checks.h).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# Importing _C registers the operators.
from . import _C, reference  # noqa: F401
from ._checks import check_backward_args, check_forward_args

forward = torch.ops.lltm.forward.default
backward = torch.ops.lltm.backward.default


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

# lltm::backward has no derivative of its own (double backward goes through
# _recomputed_backward above). Declaring its autograd kernel a fallthrough
# makes that explicit: its outputs never require grad, so differentiating
# through a direct call fails loudly instead of treating it as a constant.
_library = torch.library.Library("lltm", "IMPL")
_library.impl("backward", torch.library.fallthrough_kernel, "Autograd")
