"""float32's matrix products: TF32 where torch allows it for its own, read at each call.

The sequence operators take ``allow_tf32`` (csrc/lltm_ops.cpp): the
compiled library cannot read torch's setting, so the entry points read it
here on every call and pass it, and the backward gets its forward's value
(sequence_ops/autograd.py). The value is torch's for its own float32
matrix products on CUDA: ``torch.backends.cuda.matmul.fp32_precision`` is
``"tf32"``, which ``torch.set_float32_matmul_precision("high")`` (or
``"medium"``) sets and ``"highest"``, the default, unsets (``"ieee"``).
Where that setting is ``"none"`` torch resolves it through
``torch.backends.cuda.fp32_precision`` and ``torch.backends.fp32_precision``,
and so does the answer. The legacy getter,
``torch.get_float32_matmul_precision()``, is not asked where the new setting
exists: the new API does not update it, and torch raises rather than answer
once the two disagree; torch's cuBLAS handles read the new one.

Traced calls. torch.compile reads the value while tracing and keeps it as a
constant of the graph (``assume_constant_result``): every graph it compiles
is guarded on this same setting (the ``allow_tf32`` of its global-state
guard), so a graph traced under one setting and called under another is
traced again, never run with a stale value. torch.export and
``torch.jit.trace`` record the value of the moment they trace: an exported
or traced program computes in the precision it was made under, whatever the
setting where it runs.

Only float32 inputs ask: the operators ignore the flag for other dtypes, and
their calls pass False. The device does not matter: the CPU kernels compute
exact float32 whatever they are passed, and a graph exported on the CPU keeps
the setting it was made under wherever it runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .. import _probes


def _torch_allows_tf32() -> bool:
    return _probes.cuda_matmul_allows_tf32()


# torch.compile calls it while tracing and keeps its answer (module docstring).
torch_allows_tf32: Callable[[], bool] = torch.compiler.assume_constant_result(_torch_allows_tf32)
"""Whether torch's float32 matrix products may run on TF32 tensor cores now."""


def allow_tf32(input: Tensor) -> bool:
    """The ``allow_tf32`` argument of a sequence operator's call on ``input``."""
    return input.dtype == torch.float32 and torch_allows_tf32()


def describe() -> str:
    """The float32 precision lltm's sequence operators compute in now, in words."""
    if torch_allows_tf32():
        return (
            "TF32 allowed on CUDA, exact float32 on the CPU "
            "(torch's float32 matmul precision: high)"
        )
    return "exact float32 (torch's float32 matmul precision: highest)"
