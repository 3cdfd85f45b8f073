"""The exception a failing kernel call raises: the type lltm documents, under every torch.

The kernels throw ``std::invalid_argument`` for a bad argument and
``std::runtime_error`` for a failure inside torch (csrc/lltm_checks.h,
csrc/lltm_errors.h), each with a message that starts with ``lltm:``. No
exception type crosses torch's stable ABI, only the text: until torch 2.14
pybind11 happened to turn ``std::invalid_argument`` into ``ValueError``; from
2.15 torch's operator bindings turn every exception that is not one of c10's
own into ``RuntimeError``. So the Python layer decides the type, where the
documented one is known, and only once something has failed (a ``try`` costs
nothing until it catches):

* a bad argument: the checks of lltm/_checks.py, which mirror the C++ checks
  message for message (the fake kernels run them), run again on the failing
  call's arguments; the kernel's message is raised with the type they give,
  ``ValueError`` (or ``TypeError``);
* ``LLTM_CPU_ISA`` naming no instruction set: ``ValueError``, as
  ``lltm._C.cpu_isa()`` raises it;
* a CUDA out-of-memory: ``torch.OutOfMemoryError``, which tools that shrink a
  batch on memory pressure catch;
* anything else: as it came.

Every Python entry to the kernels goes through :func:`typed`: the fast eager
path (eager.py) and the Autograd kernels (autograd.py), which every call of
``torch.ops.lltm.*`` passes outside ``torch.inference_mode()``. Inside
inference mode a direct ``torch.ops.lltm.*`` call reaches the kernel with no
Python in between, and its type is torch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import _C
from .._checks import (
    check_backward_args,
    check_forward_args,
    check_output_mask,
    check_sequence_args,
    check_sequence_backward_args,
    sequence_batch_sizes,
)
from .library import backward, forward, sequence_backward, sequence_forward, sequence_gate_grads


def _forward_checks(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> None:
    check_forward_args(input, weights, bias, old_h, old_cell)


def _backward_checks(*args: Any) -> None:
    *tensors, output_mask = args
    check_backward_args(*tensors)
    check_output_mask(output_mask)


def _sequence_checks(*args: Any) -> None:
    input, weights, bias, old_h, old_cell, batch_sizes, _reverse = args
    n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes)
    sequence_batch_sizes(batch_sizes, n)


def _sequence_backward_checks(*args: Any) -> None:
    tensors, output_mask = args[:10], args[11:]
    sequence_batch_sizes(tensors[-1], check_sequence_backward_args(*tensors))
    if output_mask:  # sequence_gate_grads has none
        check_output_mask(output_mask[0])


# Each operator's argument checks, called with the operator's arguments.
_ARGUMENT_CHECKS: dict[Any, Callable[..., None]] = {
    forward: _forward_checks,
    backward: _backward_checks,
    sequence_forward: _sequence_checks,
    sequence_backward: _sequence_backward_checks,
    sequence_gate_grads: _sequence_backward_checks,
}


def _argument_error(op: Any, args: tuple[Any, ...]) -> ValueError | TypeError | None:
    """The error the Python checks find in ``op``'s arguments, if any."""
    try:
        _ARGUMENT_CHECKS[op](*args)
        if any(isinstance(a, Tensor) and a.device.type == "cpu" for a in args):
            _C.cpu_isa()
    except (ValueError, TypeError) as error:
        return error
    except Exception:  # noqa: BLE001  (arguments the checks cannot read: keep the kernel's error)
        return None
    return None


def typed(error: RuntimeError, op: Any, args: tuple[Any, ...]) -> Exception:
    """The exception to raise for ``error``, which calling ``op`` on ``args`` raised.

    See the module's docstring.
    """
    if isinstance(error, torch.OutOfMemoryError):
        return error
    message = str(error)
    if "out of memory" in message:
        converted = torch.OutOfMemoryError(message)
        converted.__cause__ = error
        return converted
    if message.startswith("lltm: "):
        found = _argument_error(op, args)
        if found is not None:
            return type(found)(message)
    return error
