"""An operator's entry in the table, and what registers it: one public torch.library call a concern.

Each family lists its operators' entries (``OPERATORS`` in
cell_ops/__init__.py and sequence_ops/__init__.py); lltm.ops registers
every entry once, at import, and nothing else registers anything. The
schemas come from the compiled library (csrc/lltm_ops.cpp) and the native
kernels from csrc/cpu and csrc/cuda. For ``torch.ops.lltm.<name>`` the
dispatcher then calls: the fake kernel on fake and meta tensors; the
composite kernel on every device without a native kernel (forward
operators warn once per device type first); the Autograd kernel
(dispatch.py); the Autocast kernels of the entries that ask for them
(autocast.py); the batching rule under ``torch.vmap``; ``FlopCounterMode``
reads the FLOP formula; and lowerings to core ATen apply the decomposition
(decompositions.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.flop_counter import register_flop_formula

# _backends loads the CUDA plugin, whose CUDA kernels then stand beside the
# Python registrations below.
from .. import _backends, _probes
from . import autocast, decompositions, dispatch


@dataclass(frozen=True)
class Operator:
    """What Python registers for ``torch.ops.lltm.<name>``: one entry of the table."""

    name: str
    """The operator's name in the ``lltm`` namespace."""
    fake: Callable[..., Any]
    """Its outputs' shapes, after the argument checks (the family's fake.py)."""
    composite: Callable[..., Any]
    """The operator in plain torch ops, differentiable (the family's composite.py)."""
    flops: Callable[..., int]
    """The FLOPs of its matrix products, from its raw arguments (the family's fake.py)."""
    vmap: Callable[..., Any]
    """Its batching rule (the family's vmap.py)."""
    function: type[Any] | None = None
    """The autograd Function a forward operator applies (the family's autograd.py);
    None where autograd differentiates the operator through its composite
    (the backward operators)."""
    differentiated_as: Operator | None = None
    """For an operator that keeps nothing for a backward (``sequence_inference``):
    the forward operator whose Function serves a call of it that autograd
    must differentiate; its first outputs are this one's."""
    autocast: bool = False
    """Whether autocast casts its floating arguments, as for torch's recurrent ops."""
    decomposition: Callable[..., Any] | None = None
    """A forward operator's lowering to core ATen, for ONNX, ExecuTorch and
    ``run_decompositions()`` (the family's lowering.py)."""
    handle: Any = field(init=False, repr=False, compare=False)
    """``torch.ops.lltm.<name>.default``."""
    kernels: Callable[..., Any] = field(init=False, repr=False, compare=False)
    """What calling the handle calls, without the Python frame of ``OpOverload.__call__``:
    below the autograd key, the kernels."""

    @property
    def is_forward(self) -> bool:
        """Whether it is a forward operator (a backward operator has neither entry)."""
        return self.function is not None or self.differentiated_as is not None

    def __post_init__(self) -> None:
        handle = getattr(torch.ops.lltm, self.name).default
        object.__setattr__(self, "handle", handle)
        object.__setattr__(self, "kernels", _probes.direct(handle))


_library = torch.library.Library("lltm", "IMPL")


def register(operator: Operator) -> None:
    """Registers everything ``operator``'s entry names."""
    name = operator.name
    qualified = f"lltm::{name}"
    torch.library.register_fake(qualified, operator.fake)
    # No device: the CompositeExplicitAutograd entry, every device's default.
    composite = operator.composite
    torch.library.register_kernel(
        qualified,
        None,
        _backends.warning_first(composite) if operator.is_forward else composite,
    )
    _library.impl(name, dispatch.autograd_kernel(operator), "Autograd", with_keyset=True)
    if operator.autocast:
        for device_type in autocast.DEVICE_TYPES:
            _library.impl(
                name,
                autocast.kernel(operator.handle, device_type),
                f"Autocast{device_type.upper()}",
            )
    torch.library.register_vmap(qualified, operator.vmap)
    register_flop_formula(getattr(torch.ops.lltm, name), get_raw=True)(operator.flops)
    if operator.decomposition is not None:
        decompositions.register(operator.handle, operator.decomposition)
