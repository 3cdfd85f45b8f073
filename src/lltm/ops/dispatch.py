"""Which code serves a call of one of lltm's operators: the one decision, made here.

Two callers ask it, and both ask :func:`autograd_step`:

* the dispatcher, at each operator's Autograd key, through the kernel
  :func:`autograd_kernel` makes (registered from the table, registration.py);
* lltm's entry points (``lltm.lltm_cell``, ``lltm.lltm_sequence``, the
  modules: the families' ``cell`` and ``sequence``), through :func:`call`.
  In plain eager mode (:func:`plain_eager`) the dispatcher would go straight
  from the operator to that Autograd kernel; :func:`call` skips that trip,
  about a third of the cell's forward at the tutorial's size, and asks
  :func:`autograd_step` itself. In an autocast region on the input's device,
  and no other mode, it casts the arguments as the operator's Autocast
  kernel would and does the same, so that the operator is entered once (at
  its device kernel) rather than at the Autocast, Autograd and device keys.
  In every other mode it calls the operator, whose dispatch keys serve the
  mode.

:func:`autograd_step` decides what autograd needs of a call. Nothing to
differentiate: the kernels, below the autograd key. A forward operator to
differentiate: its Function (the family's autograd.py), whose ``backward``
calls the backward operator (:func:`call_backward`) and whose ``jvp``
pushes tangents through the saved activations. A backward operator to
differentiate: its composite kernel, plain torch that autograd
differentiates to any order.

Higher orders. ``gates`` and ``cells``, the activations the forward saves for
backward, are not differentiable outputs (torch.compile would otherwise
trace a backward for gradients that never come), so derivatives of
derivatives come from the plain-torch formulas (the families'
composite.py), which autograd and every torch.func transform differentiate
to any order:

* under torch.func, a call that a differentiating transform sees inside
  another (hessian, jacfwd of jacrev, grad of grad, grad of jvp, ...) runs
  the composite forward directly: each transform differentiates its own
  level once, so a call under only one of them (grad, vjp, jacrev, jacfwd,
  and vmap of any of them: per-sample gradients) keeps the kernels;
* outside torch.func, where the graph may be differentiated again
  (create_graph=True, reverse mode over dual tensors), a Function's backward
  and jvp recompute the activations from the inputs in plain torch and apply
  the plain-torch formulas (:func:`differentiated_again`), so that their
  results are expressions in the inputs.

Why not ``torch.library.register_autograd``: the Function it generates has no
``jvp``, so dual tensors silently came out without tangents, and in torch
<= 2.13 it cannot run under torch.func transforms at all (torch issue
#170834). lltm's Functions are single-level Functions, as in torch's own fix
for that: a kernel at the Autograd key is already running inside the
torch.func transform that dispatched it, at that transform's level, so the
Function records its node there, and the transforms below see the kernels'
calls through their own dispatch keys (vmap through the families' rules).

A GPU that the CUDA plugin has no code for runs the composite kernel in
plain torch ops instead (one warning, from lltm/_backends.py), in every mode:
:func:`call` sends it there, with autocast's casts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from .. import _backends, _probes
from .._errors import reraise
from . import autocast
from .checks import check_types

if TYPE_CHECKING:
    from .registration import Operator

_has_torch_function = torch.overrides.has_torch_function
_transforms_active = _probes.functorch_transforms_active
_forward_ad_active = _probes.forward_ad_active
_any_requires_grad = _probes.any_requires_grad
_below_autograd = _probes.below_autograd


# --- The entry points ------------------------------------------------------------------


def call(operator: Operator, args: tuple[Any, ...]) -> Any:
    """An entry point's call of forward ``operator``: what calling the operator computes.

    The same kernels, the same autograd Function, the same saved tensors,
    the same errors; ``args`` are the operator's arguments, the first five
    ``(input, weights, bias, old_h, old_cell)`` in both families.
    """
    input = args[0]
    # Spelled out, not looped: this runs on every step. (Checked up front,
    # not in an `except`: torch.compile reports errors raised inside an
    # exception handler as graph breaks.)
    if not (
        isinstance(input, Tensor)
        and isinstance(args[1], Tensor)
        and (args[2] is None or isinstance(args[2], Tensor))
        and isinstance(args[3], Tensor)
        and isinstance(args[4], Tensor)
    ):
        check_types(*args[:5])
    if _fused(input) and _eager_but_autocast(args):
        if not _probes.any_autocast_enabled():
            try:
                return autograd_step(operator, args)
            except (RuntimeError, ValueError) as error:
                reraise(error)
        device_type = input.device.type
        if operator.autocast and torch.is_autocast_enabled(device_type):
            # What the operator's Autocast kernel, then its Autograd kernel,
            # would do, without the two trips through the dispatcher.
            try:
                return autocast.call_in_region(
                    partial(_autograd_step_of, operator), device_type, args
                )
            except (RuntimeError, ValueError) as error:
                reraise(error)
    if torch.compiler.is_compiling():
        # No exception handler around: the fake kernels raise the documented
        # types themselves, and from torch 2.15 an exception that traced code
        # catches becomes an ``Unsupported`` error that no longer carries it.
        return _operator_or_composite(operator, args)
    try:
        return _operator_or_composite(operator, args)
    except (RuntimeError, ValueError) as error:
        # Every mode raises the documented type: inside inference mode no
        # Python of lltm's runs between the operator and its kernel.
        reraise(error)


def plain_eager(args: tuple[Any, ...]) -> bool:
    """Whether the dispatcher would take this call straight to the operator's Autograd kernel.

    It does in plain eager mode. Every mode that changes what a call
    computes, or who sees it, takes the operator: torch.compile and export
    tracing, ``torch.jit.trace``, a torch.func transform, a forward-mode AD
    level, an autocast region (of any device), inference mode (whatever the
    grad mode inside it), anomaly detection (whose messages name the
    autograd node), a TorchDispatchMode (FakeTensorMode, FlopCounterMode, a
    user's), and an argument with ``__torch_function__`` or an active
    TorchFunctionMode, which must see the operators as the dispatcher calls
    them. Saved-tensor hooks, checkpointing, ``no_grad`` and
    ``functional_call`` change nothing here: the Function applied is the same.
    One read of torch's state each; torch.compile reads the first and stops.
    """
    return not _probes.any_autocast_enabled() and _eager_but_autocast(args)


def _eager_but_autocast(args: tuple[Any, ...]) -> bool:
    """:func:`plain_eager` but for autocast regions, which an entry point can serve itself.

    An autocast region on the input's device only casts the arguments of
    lltm's forward operators (autocast.py): :func:`call` casts them and
    takes the plain eager route, as the operator's Autocast kernel would.
    """
    return not (
        torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
        or _transforms_active()
        or _forward_ad_active()
        or torch.is_inference_mode_enabled()
        or torch.is_anomaly_enabled()
        or _probes.dispatch_modes_active()
        or _probes.jit_tracing()
        or _has_torch_function(args)
    )


def _fused(input: Tensor) -> bool:
    """Whether lltm's fused kernels serve ``input``'s device (else the composite kernel runs).

    On a GPU, first passes ``torch.backends.cudnn.benchmark`` on to the CUDA
    plugin where it changed (not while torch.compile traces: its graphs keep
    the value last seen).
    """
    if not input.is_cuda:
        return True
    if not torch.compiler.is_compiling():
        _backends.mirror_benchmark()
    return _backends.fused_kernels_run_on(input.get_device())


def _operator_or_composite(operator: Operator, args: tuple[Any, ...]) -> Any:
    """Every mode but plain eager: the operator, or on a GPU its kernels cannot serve the composite.

    The composite kernel gets the arguments as autocast's kernel would cast
    them (autocast.py): the operator's own Autocast kernel is not on its way.
    """
    if _fused(args[0]):
        return operator.handle(*args)
    return autocast.call_cast(operator.composite, args)


# --- The decision ------------------------------------------------------------------------


def autograd_step(operator: Operator, args: tuple[Any, ...], keyset: Any = None) -> Any:
    """What autograd needs of a call of ``operator``: the one decision.

    A call autograd must see applies the forward operator's Function; under
    a torch.func transform nested in a differentiating one, the composite
    forward (see the module's docstring); a backward operator's, its
    composite kernel, unless a Function's own backward called it
    (:func:`call_backward`). Any other call runs the kernels below the
    autograd key: redispatched past ``keyset`` from the Autograd kernel, or
    called directly from an entry point (``keyset`` None).
    """
    transforms = _transforms_active()
    # Differentiated: under a torch.func transform, in grad mode with an
    # argument that requires grad, or with a forward-mode tangent.
    if (
        transforms
        or (torch.is_grad_enabled() and _any_requires_grad(*args))
        or (_forward_ad_active() and _carries_tangent(args))
    ):
        if operator.differentiated_as is not None:
            # An operator that keeps nothing for a backward, differentiated
            # after all: the forward operator that keeps it, whose outputs
            # but the last two (gates, cells) are the twin's.
            return autograd_step(operator.differentiated_as, args)[:-2]
        function = operator.function
        if function is None:
            if not getattr(_within_backward, "active", False):
                return operator.composite(*args)
        elif not transforms:
            return function.apply(*args)
        elif _probes.nested_differentiation():
            return operator.composite(*args)
        else:
            with _probes.enable_single_level_function():
                return function.apply(*args)
    if keyset is not None:
        return _probes.redispatch_below_autograd(operator.handle, keyset, *args)
    with _below_autograd():
        return operator.kernels(*args)


def may_differentiate(args: tuple[Any, ...]) -> bool:
    """Whether autograd may ask a call with ``args`` for derivatives.

    An entry point asks this to choose between a forward operator and its
    twin that keeps nothing for a backward (``sequence_inference``). The
    test is :func:`autograd_step`'s; under torch.compile (whose tracing
    would stop at torch's private probes) grad mode and ``requires_grad``
    alone, which is what a compiled graph specialises on. A wrong "no" costs
    nothing but memory: the twin, differentiated, runs the forward operator
    (:func:`autograd_step`).
    """
    if torch.compiler.is_compiling():
        return torch.is_grad_enabled() and any(
            isinstance(a, Tensor) and a.requires_grad for a in args
        )
    if _probes.jit_tracing():
        # A trace records one graph for every later call, whatever its grad
        # mode (and checks that tracing again records the same).
        return True
    return (
        _transforms_active()
        or (torch.is_grad_enabled() and _any_requires_grad(*args))
        or (_forward_ad_active() and _carries_tangent(args))
    )


def _autograd_step_of(operator: Operator, *args: Any) -> Any:
    """:func:`autograd_step` with the arguments spread, as a kernel takes them."""
    return autograd_step(operator, args)


def autograd_kernel(operator: Operator) -> Callable[..., Any]:
    """``operator``'s kernel at the Autograd dispatch key: :func:`autograd_step`."""

    def kernel(keyset: Any, *args: Any) -> Any:
        try:
            return autograd_step(operator, args, keyset)
        except (RuntimeError, ValueError) as error:
            reraise(error)

    return kernel


def _carries_tangent(args: Sequence[Any]) -> bool:
    """Whether an argument carries a forward-mode tangent (in a forward-mode AD level)."""
    return any(isinstance(a, Tensor) and fwAD.unpack_dual(a).tangent is not None for a in args)


# --- What the families' Functions ask ------------------------------------------------------


def differentiated_again(inputs: Sequence[Tensor | None]) -> bool:
    """Whether what a backward or jvp computes now may itself be differentiated.

    Outside torch.func: create_graph=True, reverse mode over forward mode; that
    is, grad mode on, and an input requires grad. (Under torch.func it was
    decided at the forward: see :func:`autograd_step`.)
    """
    # Grad mode first: autograd runs a plain backward with it off.
    if not torch.is_grad_enabled() or _transforms_active():
        return False
    return any(t is not None and t.requires_grad for t in inputs)


def tangents_possible() -> bool:
    """Whether a Function applied now can be asked for its jvp (else nothing is saved for it).

    Only inside a forward-mode AD level or a torch.func transform can an
    input carry a tangent.
    """
    return _forward_ad_active() or _transforms_active()


# Set while a Function's backward calls a backward operator under torch.func:
# the operator's Autograd kernel then goes straight to the kernels.
_within_backward = threading.local()

_Result = TypeVar("_Result")


def call_backward(op: Callable[..., _Result], *args: Any) -> _Result:
    """Calls backward operator ``op`` from a Function's backward: straight to the kernels.

    Only for results that are not differentiated again.

    Outside torch.func that is below the autograd key (its Python kernel
    would cost a dispatcher round trip for nothing). Under torch.func, the
    transform computing this backward runs it with grad mode on and its
    inputs requiring grad (so that enclosing transforms see the ops), and
    that transform's level does not honour the below-autograd guard; no
    transform encloses this one differentiating (that case never gets here:
    the forward ran the composite), so the operator's Autograd kernel is
    told to go to the kernels, and vmap still applies its rules on the way.
    """
    try:
        if not _transforms_active():
            with _below_autograd():
                return _probes.direct(op)(*args)  # type: ignore[arg-type]
        previous = getattr(_within_backward, "active", False)
        _within_backward.active = True
        try:
            return op(*args)
        finally:
            _within_backward.active = previous
    except (RuntimeError, ValueError) as error:
        reraise(error)
