"""Registers an entry of operators.py's table with torch: one public torch.library call a concern.

The dispatcher then calls, for ``torch.ops.lltm.<name>``: the fake kernel
on fake and meta tensors; the composite kernel on every device without a
native kernel (forward operators warn once per device type first); the
Autograd kernel, which applies the entry's Function or differentiates the
composite; the Autocast kernels of the forward operators; the batching
rule under ``torch.vmap``; ``FlopCounterMode`` reads the FLOP formula; and
lowerings to core ATen apply the decomposition.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula

from .. import _backends
from . import autocast, autograd, decompositions
from .operators import Operator

_library = torch.library.Library("lltm", "IMPL")


def register(operator: Operator) -> None:
    """Registers everything ``operator``'s entry names."""
    name = operator.name
    qualified = f"lltm::{name}"
    handle = getattr(torch.ops.lltm, name).default
    torch.library.register_fake(qualified, operator.fake)
    # No device: the CompositeExplicitAutograd entry, every device's default.
    composite = operator.composite
    torch.library.register_kernel(
        qualified, None, _backends.warning_first(composite) if operator.function else composite
    )
    kernel = (
        autograd.forward_kernel(handle, operator.function, composite)
        if operator.function is not None
        else autograd.backward_kernel(handle, composite)
    )
    _library.impl(name, kernel, "Autograd", with_keyset=True)
    if operator.autocast:
        for device_type in autocast.DEVICE_TYPES:
            _library.impl(
                name, autocast.kernel(handle, device_type), f"Autocast{device_type.upper()}"
            )
    torch.library.register_vmap(qualified, operator.vmap)
    register_flop_formula(getattr(torch.ops.lltm, name), get_raw=True)(operator.flops)
    if operator.decomposition is not None:
        decompositions.register(handle, operator.decomposition)
