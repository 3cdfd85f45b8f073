"""The entry points behind ``lltm.lltm_cell``, ``lltm.lltm_sequence`` and the modules.

A call computes exactly what calling the operator computes: the same
kernels, the same autograd Function, the same saved tensors, the same
errors. In plain eager mode (see :func:`fast_path`) it only skips the
dispatcher's trip to the operator's Autograd kernel, about a third of the
cell's forward at the tutorial's size, and does what that kernel would do
there: apply the operator's Function (autograd.py) when something is to be
differentiated, else call the kernel below the autograd key. In every other
mode it calls the operator, whose dispatch keys serve the mode. A GPU that
the CUDA plugin has no code for runs the composite kernel in plain torch ops
instead (one warning, from _backends), in every mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import _backends, _composite, _probes
from .._checks import check_forward_args
from .._errors import reraise
from . import autocast
from .autograd import CellFunction, SequenceFunction
from .library import forward, sequence_forward

_forward_kernel_call = _probes.direct(forward)
_sequence_forward_kernel_call = _probes.direct(sequence_forward)
_has_torch_function = torch.overrides.has_torch_function


def fast_path(args: tuple[Any, ...]) -> bool:
    """Whether going straight to the operator's Autograd kernel gives what the operator gives.

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
    return not (
        torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
        or _probes.functorch_transforms_active()
        or _probes.forward_ad_active()
        or _probes.any_autocast_enabled()
        or torch.is_inference_mode_enabled()
        or torch.is_anomaly_enabled()
        or _probes.dispatch_modes_active()
        or _probes.jit_tracing()
        or _has_torch_function(args)
    )


def _fused(input: Tensor) -> bool:
    """Whether lltm's fused kernels serve ``input``'s device (else the composite kernel runs)."""
    return not input.is_cuda or _backends.fused_kernels_run_on(input.get_device())


def _any_requires_grad(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> bool:
    # The weights first: in a model they require grad, and the answer is in.
    return (
        weights.requires_grad
        or input.requires_grad
        or old_h.requires_grad
        or old_cell.requires_grad
        or (bias is not None and bias.requires_grad)
    )


def _operator_call(op: Any, composite: Any, args: tuple[Any, ...]) -> Any:
    """Every mode but plain eager: the operator ``op``, or the ``composite`` kernel.

    The composite kernel, with autocast's casts, on a device the fused
    kernels cannot serve. Under torch.compile it is called with no exception handler around: the
    meta kernels raise the documented types themselves, and from torch 2.15
    an exception that traced code catches becomes an ``Unsupported`` error
    that no longer carries it.
    """
    if _fused(args[0]):
        return op(*args)
    device_type = args[0].device.type
    if autocast.enabled(device_type):
        args = autocast.cast_arguments(device_type, args)
    return composite(*args)


def cell(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor]:
    """One differentiable LLTM step: ``(new_h, new_cell)``."""
    args = (input, weights, bias, old_h, old_cell)
    if not (
        isinstance(input, Tensor)
        and isinstance(weights, Tensor)
        and (bias is None or isinstance(bias, Tensor))
        and isinstance(old_h, Tensor)
        and isinstance(old_cell, Tensor)
    ):
        # The dispatcher's own message is long and names no expected type.
        # (Checked up front, not in an `except`: torch.compile reports errors
        # raised inside an exception handler as graph breaks. Spelled out, not
        # looped: this runs on every step.)
        check_forward_args(*args)  # a TypeError naming it
    if _fused(input) and fast_path(args):
        # What the operator's Autograd kernel does in plain eager mode.
        try:
            if torch.is_grad_enabled() and _any_requires_grad(*args):
                new_h, new_cell, _gates = CellFunction.apply(*args)
            else:
                with _probes.below_autograd():
                    new_h, new_cell, _gates = _forward_kernel_call(*args)
        except (RuntimeError, ValueError) as error:
            reraise(error)
    elif torch.compiler.is_compiling():
        new_h, new_cell, _gates = _operator_call(forward, _composite.forward, args)
    else:
        try:
            new_h, new_cell, _gates = _operator_call(forward, _composite.forward, args)
        except (RuntimeError, ValueError) as error:
            # Every mode raises the documented type: inside inference mode no
            # Python of lltm's runs between the operator and its kernel.
            reraise(error)
    return new_h, new_cell


def sequence(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None = None,
    reverse: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The cell over a whole sequence, differentiable: ``(output, h_n, c_n)``.

    Dispatched like :func:`cell`.
    """
    args = (input, weights, bias, old_h, old_cell, batch_sizes, reverse)
    if _fused(input) and fast_path(args):
        try:
            if torch.is_grad_enabled() and _any_requires_grad(
                input, weights, bias, old_h, old_cell
            ):
                return SequenceFunction.apply(*args)[:3]
            with _probes.below_autograd():
                return _sequence_forward_kernel_call(*args)[:3]
        except (RuntimeError, ValueError) as error:
            reraise(error)
    if torch.compiler.is_compiling():
        return _operator_call(sequence_forward, _composite.sequence_forward, args)[:3]  # type: ignore[no-any-return]
    try:
        return _operator_call(sequence_forward, _composite.sequence_forward, args)[:3]  # type: ignore[no-any-return]
    except (RuntimeError, ValueError) as error:
        reraise(error)
