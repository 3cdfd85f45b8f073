"""lltm's operators seen from Python: the cell (``lltm::forward`` /
``lltm::backward``) and the sequence (``lltm::sequence_forward`` /
``lltm::sequence_backward``).

Importing this module loads the compiled library (``lltm._C``), whose static
initialisers declare the op schemas and register the CPU kernels. Here the
public ``torch.library`` API adds what is not a kernel:

* the autograd formula (``register_autograd``): backward is its own op, told
  by ``output_mask`` which gradients autograd needs;
* fake kernels (``register_fake``) so torch.compile and meta tensors can trace
  the op without running it, with the same argument checks as the C++ side
  (lltm/_checks.py mirrors csrc/lltm_checks.h).

The same formulas also back :func:`cell` and :func:`sequence`, the eager
entry points of ``lltm.lltm_cell`` and ``lltm.lltm_sequence``: plain
``torch.autograd.Function`` classes that call the kernels below the autograd
dispatch key. It computes exactly what the registered
formula computes (the same two functions below), minus the cost of
``register_autograd``'s generic wrapper (argument re-binding, a second trip
through the dispatcher), which at the tutorial's size is a third of the cell's
forward time. torch.compile, torch.func and direct calls of
``torch.ops.lltm.forward`` use the registered formula.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

# Importing _C registers the operators.
from . import _C, _backends, _composite, reference  # noqa: F401
from ._checks import (
    SequenceSizes,
    check_backward_args,
    check_forward_args,
    check_output_mask,
    check_sequence_args,
    check_sequence_backward_args,
)

forward = torch.ops.lltm.forward.default
backward = torch.ops.lltm.backward.default

# Runs the backend kernel directly, skipping the autograd key (what
# register_autograd's own wrapper does); private to torch, so degrade to a
# plain (slower, equally correct) call should it ever go away.
_below_autograd = getattr(torch._C, "_AutoDispatchBelowAutograd", contextlib.nullcontext)


def _typed(error: RuntimeError) -> RuntimeError:
    """The error to raise for a kernel's RuntimeError: a CUDA out-of-memory
    as torch.OutOfMemoryError, which tools that shrink a batch on memory
    pressure catch (no exception type crosses the stable ABI, torch's text
    does: csrc/lltm_errors.h); anything else as it is."""
    if "out of memory" in str(error) and not isinstance(error, torch.OutOfMemoryError):
        typed = torch.OutOfMemoryError(str(error))
        typed.__cause__ = error
        return typed
    return error


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


# --- The autograd formula: one definition, two entry points ----------------------


def _save(ctx: Any, inputs: tuple[Tensor, ...], new_cell: Tensor, gates: Tensor) -> None:
    # All five inputs: double backward recomputes the step from them.
    ctx.save_for_backward(*inputs, new_cell, gates)
    # Autograd would otherwise allocate and zero a gradient for every output
    # that does not reach the loss; _backward handles the None itself.
    ctx.set_materialize_grads(False)


def _setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
    _new_h, new_cell, gates = output
    # `gates` only feeds backward: gradients flowing into it are not defined.
    ctx.mark_non_differentiable(gates)
    _save(ctx, inputs, new_cell, gates)


def _backward(
    ctx: Any, grad_h: Tensor | None, grad_cell: Tensor | None, *_grad_gates: Tensor | None
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
    # Only the gradients autograd asks for are computed; the rest are None.
    try:
        return backward(
            grad_h, grad_cell, new_cell, gates, input, old_h, weights, list(ctx.needs_input_grad)
        )
    except RuntimeError as error:
        raise _typed(error) from None


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


def _needs_graph(
    input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor
) -> bool:
    """Whether autograd must record the call: grad mode on and some argument
    requiring grad (else the bare kernel runs)."""
    return torch.is_grad_enabled() and (
        input.requires_grad
        or weights.requires_grad
        or bias.requires_grad
        or old_h.requires_grad
        or old_cell.requires_grad
    )


class _Cell(torch.autograd.Function):
    """lltm::forward with the formula above, for eager calls (see the module
    docstring). `gates` is saved, not returned: it is no output here."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor
    ) -> tuple[Tensor, Tensor]:
        with _below_autograd():
            new_h, new_cell, gates = forward(input, weights, bias, old_h, old_cell)
        _save(ctx, (input, weights, bias, old_h, old_cell), new_cell, gates)
        return new_h, new_cell

    backward = staticmethod(_backward)  # type: ignore[assignment]


def cell(
    input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor]:
    """One differentiable LLTM step: ``(new_h, new_cell)``.

    Under torch.compile and torch.func transforms this is the registered op,
    which they trace; in eager mode, the faster autograd.Function above, or
    the bare kernel when nothing needs a gradient.
    """
    if input.is_cuda and not _backends.fused_kernels_run_on(input.get_device()):
        # A GPU the CUDA plugin has no code for: plain torch ops, differentiated
        # by autograd (one warning, from _backends).
        new_h, new_cell, _gates = _composite.forward(input, weights, bias, old_h, old_cell)
        return new_h, new_cell
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        new_h, new_cell, _gates = forward(input, weights, bias, old_h, old_cell)
        return new_h, new_cell
    try:
        if _needs_graph(input, weights, bias, old_h, old_cell):
            return _Cell.apply(input, weights, bias, old_h, old_cell)
        with _below_autograd():
            new_h, new_cell, _gates = forward(input, weights, bias, old_h, old_cell)
        return new_h, new_cell
    except RuntimeError as error:
        raise _typed(error) from None


# --- Sequences ----------------------------------------------------------------------

sequence_forward = torch.ops.lltm.sequence_forward.default
sequence_backward = torch.ops.lltm.sequence_backward.default


def _sequence_layout(like: Tensor, n: SequenceSizes, width: Any) -> Tensor:
    shape = (n.rows, width) if n.packed else (n.steps, n.batch, width)
    return like.new_empty(shape)


@torch.library.register_fake("lltm::sequence_forward")
def _sequence_forward_fake(
    input: Tensor,
    weights: Tensor,
    bias: Tensor,
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


@torch.library.register_fake("lltm::sequence_backward")
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


def _save_sequence(
    ctx: Any, inputs: tuple[Any, ...], output: Tensor, gates: Tensor, cells: Tensor
) -> None:
    input, weights, bias, old_h, old_cell, batch_sizes, reverse = inputs
    # All five differentiable inputs: double backward recomputes the sequence.
    ctx.save_for_backward(input, weights, bias, old_h, old_cell, batch_sizes, output, gates, cells)
    ctx.reverse = reverse
    ctx.set_materialize_grads(False)


def _sequence_setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    out, _h_n, _c_n, gates, cells = output
    ctx.mark_non_differentiable(gates, cells)
    _save_sequence(ctx, inputs, out, gates, cells)


def _sequence_backward(
    ctx: Any,
    grad_output: Tensor | None,
    grad_h_n: Tensor | None,
    grad_c_n: Tensor | None,
    *_grad_saved: Tensor | None,
) -> tuple[Tensor | None, ...]:
    input, weights, bias, old_h, old_cell, batch_sizes, output, gates, cells = ctx.saved_tensors
    needed = list(ctx.needs_input_grad[:5])
    if torch.is_grad_enabled():
        # create_graph=True: differentiable gradients through a plain-PyTorch
        # recomputation of the sequence (see _recomputed_backward).
        inputs = (input, weights, bias, old_h, old_cell)
        wanted = [t for t, need in zip(inputs, needed, strict=True) if need]
        outputs = _composite.sequence_forward(*inputs, batch_sizes, ctx.reverse)[:3]
        pairs = [
            (out, grad)
            for out, grad in zip(outputs, (grad_output, grad_h_n, grad_c_n), strict=True)
            if grad is not None
        ]
        grads = iter(
            torch.autograd.grad(
                [out for out, _ in pairs],
                wanted,
                [grad for _, grad in pairs],
                create_graph=True,
                allow_unused=True,
            )
        )
        return (*(next(grads) if need else None for need in needed), None, None)
    try:
        grads = sequence_backward(
            grad_output,
            grad_h_n,
            grad_c_n,
            output,
            gates,
            cells,
            input,
            weights,
            old_h,
            batch_sizes,
            ctx.reverse,
            needed,
        )
    except RuntimeError as error:
        raise _typed(error) from None
    return (*grads, None, None)


torch.library.register_autograd(
    "lltm::sequence_forward", _sequence_backward, setup_context=_sequence_setup_context
)
_library.impl("sequence_backward", torch.library.fallthrough_kernel, "Autograd")


class _Sequence(torch.autograd.Function):
    """lltm::sequence_forward with the formula above, for eager calls; gates
    and cells are saved, not returned."""

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
        inputs = (input, weights, bias, old_h, old_cell, batch_sizes, reverse)
        with _below_autograd():
            output, h_n, c_n, gates, cells = sequence_forward(*inputs)
        _save_sequence(ctx, inputs, output, gates, cells)
        return output, h_n, c_n

    backward = staticmethod(_sequence_backward)  # type: ignore[assignment]


def sequence(
    input: Tensor,
    weights: Tensor,
    bias: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None = None,
    reverse: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The cell over a whole sequence, differentiable: ``(output, h_n, c_n)``.

    Dispatched like :func:`cell`: the registered op under torch.compile and
    torch.func, the autograd.Function in eager mode, the bare kernel when
    nothing needs a gradient.
    """
    args = (input, weights, bias, old_h, old_cell, batch_sizes, reverse)
    if input.is_cuda and not _backends.fused_kernels_run_on(input.get_device()):
        return _composite.sequence_forward(*args)[:3]  # as in cell()
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return sequence_forward(*args)[:3]
    try:
        if _needs_graph(input, weights, bias, old_h, old_cell):
            return _Sequence.apply(*args)
        with _below_autograd():
            return sequence_forward(*args)[:3]
    except RuntimeError as error:
        raise _typed(error) from None
