"""Autograd for lltm's operators: reverse mode, forward mode, higher orders.

Each operator gets a kernel at the Autograd dispatch key, registered with the
public ``torch.library.Library.impl`` (the registration that
``torch.library.register_autograd`` makes). When nothing differentiates a
call it goes straight to the kernels; otherwise the forward operators apply
a Function whose ``backward`` calls the backward operator, told by
``output_mask`` which gradients autograd needs, and whose ``jvp`` pushes
tangents through the saved activations (tangents.py).

Higher orders. ``gates`` and ``cells``, the activations the forward saves for
backward, are not differentiable outputs (torch.compile would otherwise
trace a backward for gradients that never come), so derivatives of
derivatives come from the plain-torch formulas (lltm/_composite.py), which
autograd and every torch.func transform differentiate to any order:

* under torch.func, a call that a differentiating transform sees inside
  another (hessian, jacfwd of jacrev, grad of grad, grad of jvp, ...) runs
  the composite forward directly: each transform differentiates its own
  level once, so a call under only one of them (grad, vjp, jacrev, jacfwd,
  and vmap of any of them: per-sample gradients) keeps the kernels;
* outside torch.func, where the graph may be differentiated again
  (create_graph=True, reverse mode over dual tensors), backward and jvp
  recompute the activations from the inputs in plain torch and apply the
  plain-torch formulas, so that their results are expressions in the inputs.

The backward operators, called directly on tensors that need gradients,
differentiate the same way in their own arguments.

Why not ``register_autograd``: the Function it generates has no ``jvp``, so
dual tensors silently came out without tangents, and in torch <= 2.13 it
cannot run under torch.func transforms at all (torch issue #170834). The
Functions here are single-level Functions, as in torch's own fix for that: a
kernel at the Autograd key is already running inside the torch.func
transform that dispatched it, at that transform's level, so the Function
records its node there, and the transforms below see the kernels' calls
through their own dispatch keys (vmap through the rules of vmap.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from .. import _composite, _probes
from .._errors import reraise
from . import tangents
from .library import (
    backward,
    forward,
    sequence_backward,
    sequence_forward,
    sequence_gate_grads,
)

below_autograd = _probes.below_autograd


def differentiating(args: Sequence[Any]) -> bool:
    """Whether a call must go through autograd.

    It must when a torch.func transform is active, or grad mode is on and an
    argument requires grad, or an argument carries a forward-mode tangent.
    """
    if _probes.functorch_transforms_active():
        return True
    if torch.is_grad_enabled() and _probes.any_requires_grad(*args):
        return True
    return _probes.forward_ad_active() and any(
        isinstance(a, Tensor) and fwAD.unpack_dual(a).tangent is not None for a in args
    )


def _differentiated_again(inputs: Sequence[Tensor | None]) -> bool:
    """Whether what a backward or jvp computes now may itself be differentiated.

    Outside torch.func: create_graph=True, reverse mode over forward mode; that
    is, grad mode on, and an input requires grad.
    """
    # Grad mode first: autograd runs a plain backward with it off.
    if not torch.is_grad_enabled() or _probes.functorch_transforms_active():
        return False  # under torch.func, decided at the forward: see _forward_kernel
    return any(t is not None and t.requires_grad for t in inputs)


# Set while a Function's backward calls a backward operator under torch.func:
# the operator's Autograd kernel then goes straight to the kernels (see
# _backward_op).
_within_backward = threading.local()

_Result = TypeVar("_Result")


def _backward_op(op: Callable[..., _Result], *args: Any) -> _Result:
    """Calls a backward operator from a Function's backward: straight to the kernels.

    Only for results that are not differentiated again.

    Outside torch.func that is below the autograd key (its Python kernel
    would cost a dispatcher round trip for nothing). Under torch.func, the
    transform computing this backward runs it with grad mode on and its
    inputs requiring grad (so that enclosing transforms see the ops), and
    that transform's level does not honour the below-autograd guard; no
    transform encloses this one differentiating (that case never gets here:
    see _forward_kernel), so the operator's Autograd kernel is told to go to
    the kernels, and vmap still applies its rules on the way.
    """
    try:
        if not _probes.functorch_transforms_active():
            with below_autograd():
                result: _Result = _BACKWARD_KERNEL_CALLS[op](*args)
                return result
        previous = getattr(_within_backward, "active", False)
        _within_backward.active = True
        try:
            return op(*args)
        finally:
            _within_backward.active = previous
    except (RuntimeError, ValueError) as error:
        reraise(error)


_BACKWARD_KERNEL_CALLS: dict[Any, Callable[..., Any]] = {
    op: _probes.direct(op) for op in (backward, sequence_backward, sequence_gate_grads)
}


# --- The forward operators ---------------------------------------------------------


def _tangents_possible() -> bool:
    """Whether a Function applied now can be asked for its jvp (else nothing is saved for it).

    Only inside a forward-mode AD level or a torch.func transform can an
    input carry a tangent.
    """
    return _probes.forward_ad_active() or _probes.functorch_transforms_active()


_forward_kernel_call = _probes.direct(forward)
_sequence_forward_kernel_call = _probes.direct(sequence_forward)
_backward_kernel_call = _probes.direct(backward)


class CellFunction(_probes.FunctionBase):
    """lltm::forward with its derivatives; outputs (new_h, new_cell, gates)."""

    if TYPE_CHECKING:  # inherited from torch's C++ base class, which declares no types

        @staticmethod
        def apply(
            input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
        ) -> tuple[Tensor, Tensor, Tensor]:
            """Applies the Function: the forward operator's outputs."""

    @staticmethod
    def forward(
        input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Runs the kernels, below the autograd key."""
        with below_autograd():
            return _forward_kernel_call(input, weights, bias, old_h, old_cell)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
        """Saves the inputs and activations for backward and jvp."""
        _new_h, new_cell, gates = output
        ctx.mark_non_differentiable(gates)
        ctx.save_for_backward(*inputs, new_cell, gates)
        if _tangents_possible():
            ctx.save_for_forward(*inputs, new_cell, gates)
        # An output that does not reach the loss has None for a gradient
        # (no zeros allocated and multiplied); backward handles it.
        ctx.set_materialize_grads(False)

    @staticmethod
    def _activations(ctx: Any) -> tuple[tuple[Tensor, ...], Tensor, Tensor, bool]:
        """The activations the forward saved: (inputs, new_cell, gates, recomputed?).

        Recomputed in plain torch from the inputs when what is computed from
        them will be differentiated again.
        """
        *inputs, new_cell, gates = ctx.saved_tensors
        if not _differentiated_again(inputs):
            return tuple(inputs), new_cell, gates, False
        _new_h, new_cell, gates = _composite.forward(*inputs)
        return tuple(inputs), new_cell, gates, True

    @staticmethod
    def backward(
        ctx: Any, grad_h: Tensor | None, grad_cell: Tensor | None, _grad_gates: None
    ) -> tuple[Tensor | None, ...]:
        """The gradients autograd asks for, from the backward operator."""
        if not torch.is_grad_enabled():
            # A plain backward (autograd runs it with grad mode off): nothing
            # it computes is differentiated again, and no torch.func transform
            # runs it (they run backward with grad mode on). Straight to the
            # kernel, the common case spelled out.
            input, weights, _bias, old_h, _old_cell, new_cell, gates = ctx.saved_tensors
            if grad_h is None:
                grad_h = torch.zeros_like(new_cell)
            if grad_cell is None:
                grad_cell = torch.zeros_like(new_cell)
            try:
                with below_autograd():
                    return _backward_kernel_call(
                        grad_h, grad_cell, new_cell, gates, input, old_h, weights,
                        ctx.needs_input_grad,
                    )  # fmt: skip
            except (RuntimeError, ValueError) as error:
                reraise(error)
        inputs, new_cell, gates, recomputed = CellFunction._activations(ctx)
        input, weights, _bias, old_h, _old_cell = inputs
        grad_h = torch.zeros_like(new_cell) if grad_h is None else grad_h
        grad_cell = torch.zeros_like(new_cell) if grad_cell is None else grad_cell
        args = (grad_h, grad_cell, new_cell, gates, input, old_h, weights)
        if recomputed:
            return _composite.backward_math(*args, ctx.needs_input_grad)
        return _backward_op(backward, *args, list(ctx.needs_input_grad))

    @staticmethod
    def jvp(ctx: Any, *input_tangents: Tensor | None) -> tuple[Tensor | None, ...]:
        """The tangents of ``new_h`` and ``new_cell`` (tangents.py)."""
        inputs, new_cell, gates, _ = CellFunction._activations(ctx)
        d_h, d_cell = tangents.cell(inputs, input_tangents, new_cell, gates)
        return d_h, d_cell, None


class SequenceFunction(_probes.FunctionBase):
    """lltm::sequence_forward with its derivatives.

    Outputs (output, h_n, c_n, gates, cells).
    """

    if TYPE_CHECKING:  # inherited from torch's C++ base class, which declares no types

        @staticmethod
        def apply(
            input: Tensor,
            weights: Tensor,
            bias: Tensor | None,
            old_h: Tensor,
            old_cell: Tensor,
            batch_sizes: Tensor | None,
            reverse: bool,
        ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
            """Applies the Function: the forward operator's outputs."""

    @staticmethod
    def forward(
        input: Tensor,
        weights: Tensor,
        bias: Tensor | None,
        old_h: Tensor,
        old_cell: Tensor,
        batch_sizes: Tensor | None,
        reverse: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Runs the kernels, below the autograd key."""
        with below_autograd():
            return _sequence_forward_kernel_call(
                input, weights, bias, old_h, old_cell, batch_sizes, reverse
            )

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        """Saves the inputs and activations for backward and jvp."""
        *tensors, reverse = inputs  # input, weights, bias, old_h, old_cell, batch_sizes
        out, _h_n, _c_n, gates, cells = output
        ctx.mark_non_differentiable(gates, cells)
        ctx.save_for_backward(*tensors, out, gates, cells)
        if _tangents_possible():
            ctx.save_for_forward(*tensors, out, gates, cells)
        ctx.reverse = reverse
        ctx.set_materialize_grads(False)

    @staticmethod
    def _activations(ctx: Any) -> tuple[tuple[Any, ...], tuple[Tensor, ...], bool]:
        """The activations: (inputs with batch_sizes, (output, gates, cells), recomputed?).

        As CellFunction._activations.
        """
        input, weights, bias, old_h, old_cell, batch_sizes, output, gates, cells = ctx.saved_tensors
        inputs = (input, weights, bias, old_h, old_cell, batch_sizes)
        if not _differentiated_again(inputs[:5]):
            return inputs, (output, gates, cells), False
        output, _h_n, _c_n, gates, cells = _composite.sequence_forward(
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
            ctx.reverse, list(ctx.needs_input_grad[:5]),
        )  # fmt: skip
        if recomputed:
            return (*_composite.sequence_backward(*args), None, None)
        return (*_backward_op(sequence_backward, *args), None, None)

    @staticmethod
    def jvp(ctx: Any, *input_tangents: Tensor | None) -> tuple[Tensor | None, ...]:
        """The tangents of ``output``, ``h_n`` and ``c_n`` (tangents.py)."""
        inputs, (output, gates, cells), _ = SequenceFunction._activations(ctx)
        d_output, d_h_n, d_c_n = tangents.sequence(
            inputs, ctx.reverse, input_tangents[:5], output, gates, cells
        )
        return d_output, d_h_n, d_c_n, None, None


# --- The Autograd kernels -------------------------------------------------------------


def forward_kernel(
    op: Any,
    function: type[CellFunction] | type[SequenceFunction],
    composite: Callable[..., Any],
) -> Callable[..., Any]:
    """The Autograd kernel of a forward operator: ``function`` applied, or the kernels below."""

    def kernel(keyset: Any, *args: Any) -> Any:
        try:
            if _probes.functorch_transforms_active() and _probes.nested_differentiation():
                # Derivatives of derivatives under torch.func (see the
                # module's docstring): the plain-torch formulas.
                return composite(*args)
            if differentiating(args):
                with _probes.enable_single_level_function():
                    return function.apply(*args)
            return _probes.redispatch_below_autograd(op, keyset, *args)
        except (RuntimeError, ValueError) as error:
            reraise(error)

    return kernel


def backward_kernel(op: Any, math: Callable[..., Any]) -> Callable[..., Any]:
    """The Autograd kernel of a backward operator: differentiable ``math``, or the kernels below."""

    def kernel(keyset: Any, *args: Any) -> Any:
        if differentiating(args) and not getattr(_within_backward, "active", False):
            return math(*args)
        try:
            return _probes.redispatch_below_autograd(op, keyset, *args)
        except (RuntimeError, ValueError) as error:
            reraise(error)

    return kernel
