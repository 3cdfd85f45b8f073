"""The entry points behind ``lltm.lltm_cell``, ``lltm.lltm_sequence`` and the modules.

Each call takes the fastest path that computes the same thing:

* Plain eager mode (the common case), decided once per call by
  :func:`plain_eager`: the Functions of autograd.py made for it
  (``EagerCellFunction``, ``EagerSequenceFunction``) applied directly, or the
  bare kernel when nothing needs a gradient. This skips a trip through the
  dispatcher's Autograd key, which at the tutorial's size costs about a third
  of the cell's forward time, and everything that only transforms need.
* Anything else in play (torch.compile, a torch.func transform,
  ``torch.jit.trace``, forward-mode AD, autocast): the registered operator,
  whose dispatch keys serve each of them; jit.trace records it as an lltm op.
* A GPU that the CUDA plugin has no code for: the composite kernel in plain
  torch ops, differentiated by autograd (one warning, from _backends).
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from .. import _backends, _composite
from .._checks import check_forward_args
from . import autocast
from .autograd import EagerCellFunction, EagerSequenceFunction
from .errors import typed
from .library import below_autograd, direct, forward, sequence_forward

_forward_kernel_call = direct(forward)
_sequence_forward_kernel_call = direct(sequence_forward)


def plain_eager() -> bool:
    """Whether only ordinary autograd is in play.

    That is: no torch.compile or torch.export tracing, torch.func transform,
    ``torch.jit.trace``, forward-mode AD level or autocast region (of any
    device). torch.compile reads the first check and goes no further; the
    others are one read of torch's state each.
    """
    return not (
        torch.compiler.is_compiling()
        or torch._C._are_functorch_transforms_active()
        or torch._C._is_tracing()
        or fwAD._current_level >= 0
        or torch._C._is_any_autocast_enabled()
    )


def _fused_on_gpu(input: Tensor) -> bool:
    """Whether the CUDA plugin has code for ``input``'s GPU (else the composite kernel runs)."""
    return _backends.fused_kernels_run_on(input.get_device())


def _fused(input: Tensor) -> bool:
    """Whether lltm's fused kernels serve ``input``'s device."""
    return not input.is_cuda or _fused_on_gpu(input)


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


def cell(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor]:
    """One differentiable LLTM step: ``(new_h, new_cell)``."""
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
        check_forward_args(input, weights, bias, old_h, old_cell)  # a TypeError naming it
    if plain_eager() and (not input.is_cuda or _fused_on_gpu(input)):
        try:
            if torch.is_grad_enabled() and _any_requires_grad(
                input, weights, bias, old_h, old_cell
            ):
                return EagerCellFunction.apply(input, weights, bias, old_h, old_cell)
            with below_autograd():
                new_h, new_cell, _gates = _forward_kernel_call(
                    input, weights, bias, old_h, old_cell
                )
            return new_h, new_cell
        except RuntimeError as error:
            raise typed(error, forward, (input, weights, bias, old_h, old_cell)) from None
    args = (input, weights, bias, old_h, old_cell)
    device_type = input.device.type
    if not _fused(input):
        if autocast.enabled(device_type):
            args = autocast.cast_arguments(device_type, args)
        new_h, new_cell, _gates = _composite.forward(*args)
        return new_h, new_cell
    new_h, new_cell, _gates = forward(*args)
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
    if plain_eager() and (not input.is_cuda or _fused_on_gpu(input)):
        try:
            if torch.is_grad_enabled() and _any_requires_grad(
                input, weights, bias, old_h, old_cell
            ):
                return EagerSequenceFunction.apply(*args)
            with below_autograd():
                return _sequence_forward_kernel_call(*args)[:3]
        except RuntimeError as error:
            raise typed(error, sequence_forward, args) from None
    device_type = input.device.type
    if not _fused(input):
        if autocast.enabled(device_type):
            args = autocast.cast_arguments(device_type, args)
        return _composite.sequence_forward(*args)[:3]
    return sequence_forward(*args)[:3]
