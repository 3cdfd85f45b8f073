"""The compiled library and handles on its four operators.

Importing ``lltm._C`` runs its static initialisers: they declare the op
schemas (csrc/lltm_ops.cpp) and register the CPU kernels. Everything else in
this package registers Python pieces on top of these handles.
"""

from __future__ import annotations

import contextlib

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

# Runs a kernel below the autograd key, as an autograd kernel's own forward
# must; private to torch, so degrade to a plain (slower, equally correct)
# call should it ever go away.
below_autograd = getattr(torch._C, "_AutoDispatchBelowAutograd", contextlib.nullcontext)


def typed(error: RuntimeError) -> RuntimeError:
    """The error to raise for a kernel's RuntimeError: a CUDA out-of-memory
    as torch.OutOfMemoryError, which tools that shrink a batch on memory
    pressure catch (no exception type crosses the stable ABI, torch's text
    does: csrc/lltm_errors.h); anything else as it is."""
    if "out of memory" in str(error) and not isinstance(error, torch.OutOfMemoryError):
        converted = torch.OutOfMemoryError(str(error))
        converted.__cause__ = error
        return converted
    return error
