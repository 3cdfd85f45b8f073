"""The compiled library and handles on its five operators.

Importing ``lltm._C`` runs its static initialisers: they declare the op
schemas (csrc/lltm_ops.cpp) and register the CPU kernels. Everything else in
this package registers Python pieces on top of these handles.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

# Importing _C registers the operators; then (names import in order) _backends
# loads the CUDA plugin and registers the composite kernel for devices without
# a native one.
from .. import _C, _backends  # noqa: F401

forward = torch.ops.lltm.forward.default
backward = torch.ops.lltm.backward.default
sequence_forward = torch.ops.lltm.sequence_forward.default
sequence_backward = torch.ops.lltm.sequence_backward.default
sequence_gate_grads = torch.ops.lltm.sequence_gate_grads.default


def direct(op: torch._ops.OpOverload) -> Any:
    """What calling ``op`` calls: the same trip through the dispatcher,
    without the Python frame of ``OpOverload.__call__``, which the eager path
    would pay on every kernel call. ``_op`` is private to torch: should it go
    away, ``op`` itself."""
    return getattr(op, "_op", op)


# Runs a kernel below the autograd key, as an autograd kernel's own forward
# must; private to torch, so degrade to a plain (slower, equally correct)
# call should it ever go away.
below_autograd = getattr(torch._C, "_AutoDispatchBelowAutograd", contextlib.nullcontext)
