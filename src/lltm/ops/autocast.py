"""Autocast: inside ``torch.autocast`` lltm's forward operators run as ``nn.LSTM`` does.

torch's own recurrent ops are on autocast's lower-precision list: their
floating-point arguments are cast to the region's dtype
(``torch.get_autocast_dtype``: bfloat16 or float16, whichever the region
names) and they compute and return that dtype. Autograd then returns the
gradients of float32 parameters in float32, through the casts. lltm's
forward operators get the same policy (``autocast=True`` in their table
entries), from a kernel at each Autocast dispatch key: float64 arguments and
other devices' tensors are left alone, as torch's casts leave them.

``torch.library.register_autocast`` cannot express this: it casts to one
dtype fixed at registration. The backward operators have no autocast kernel,
like torch's: they receive what the forward saved, already in the region's
dtype, whether backward runs inside the region or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .. import _probes
from .._errors import reraise

# Devices whose autocast has a dispatch key in this torch.
DEVICE_TYPES = [
    device
    for device in ("cpu", "cuda", "xpu", "mps", "hpu")
    if _probes.has_dispatch_key(f"Autocast{device.upper()}")
]


def _cast(value: Any, device_type: str, dtype: torch.dtype) -> Any:
    if (
        isinstance(value, Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
        and value.device.type == device_type
    ):
        return value.to(dtype)
    return value


def cast_arguments(device_type: str, args: Sequence[Any]) -> tuple[Any, ...]:
    """``args`` as the autocast region on ``device_type`` casts them."""
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(_cast(a, device_type, dtype) for a in args)


def call_cast(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(*args)``, the arguments cast as an autocast region active on their device casts them.

    For a call that no Autocast kernel sees: the composite kernel, called
    directly on a GPU the fused kernels cannot serve (ops/dispatch.py). No
    device without autocast (meta) has a region.
    """
    device_type = args[0].device.type
    if device_type in DEVICE_TYPES and torch.is_autocast_enabled(device_type):
        args = cast_arguments(device_type, args)
    return fn(*args)


def call_in_region(fn: Callable[..., Any], device_type: str, args: Sequence[Any]) -> Any:
    """What a forward operator's Autocast kernel does: ``fn`` of the cast arguments, the region off.

    The kernel's ``fn`` is the operator (its next dispatch key); an entry
    point in an otherwise plain eager region (ops/dispatch.py) passes what
    that operator's Autograd kernel would run, entering the operator once
    rather than at the Autocast, Autograd and device keys in turn.
    """
    cast = cast_arguments(device_type, args)
    with torch.autocast(device_type, enabled=False):
        return fn(*cast)


def kernel(op: Any, device_type: str) -> Callable[..., Any]:
    """The kernel of forward operator ``op`` at ``device_type``'s Autocast key."""

    def cast_and_call(*args: Any) -> Any:
        try:
            return call_in_region(op, device_type, args)
        except (RuntimeError, ValueError) as error:
            # Inside inference mode no Autograd kernel runs after this one.
            reraise(error)

    return cast_and_call
