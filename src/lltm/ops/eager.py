"""The entry points behind ``lltm.lltm_cell``, ``lltm.lltm_sequence`` and the modules.

Each call takes the fastest path that computes the same thing:

* Plain eager mode (the common case): the Function of autograd.py applied
  directly, or the bare kernel when nothing needs a gradient. This skips a
  trip through the dispatcher's Autograd key, which at the tutorial's size
  costs about a third of the cell's forward time.
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
from . import autocast
from .autograd import CellFunction, SequenceFunction
from .errors import typed
from .library import below_autograd, forward, sequence_forward


def _plain_eager(device_type: str) -> bool:
    """Only ordinary autograd in play."""
    return not (
        torch._C._are_functorch_transforms_active()
        or torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or fwAD._current_level >= 0
        or autocast.enabled(device_type)
    )


def _needs_graph(*args: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args)


def _unfused_gpu(input: Tensor) -> bool:
    return input.is_cuda and not _backends.fused_kernels_run_on(input.get_device())


def cell(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor]:
    """One differentiable LLTM step: ``(new_h, new_cell)``."""
    args = (input, weights, bias, old_h, old_cell)
    device_type = input.device.type
    if _unfused_gpu(input):
        if autocast.enabled(device_type):
            args = autocast.cast_arguments(device_type, args)
        new_h, new_cell, _gates = _composite.forward(*args)
        return new_h, new_cell
    if not _plain_eager(device_type):
        new_h, new_cell, _gates = forward(*args)
        return new_h, new_cell
    try:
        if _needs_graph(*args):
            new_h, new_cell, _gates = CellFunction.apply(*args)
        else:
            with below_autograd():
                new_h, new_cell, _gates = forward(*args)
    except RuntimeError as error:
        raise typed(error, forward, args) from None
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
    device_type = input.device.type
    if _unfused_gpu(input):
        if autocast.enabled(device_type):
            args = autocast.cast_arguments(device_type, args)
        return _composite.sequence_forward(*args)[:3]
    if not _plain_eager(device_type):
        return sequence_forward(*args)[:3]
    try:
        if _needs_graph(input, weights, bias, old_h, old_cell):
            return SequenceFunction.apply(*args)[:3]
        with below_autograd():
            return sequence_forward(*args)[:3]
    except RuntimeError as error:
        raise typed(error, sequence_forward, args) from None
