"""lltm's operators seen from Python.

The compiled library declares five operators (csrc/lltm_ops.cpp) and
registers their CPU kernels; the CUDA plugin adds CUDA kernels. This package
registers everything else with the ``torch.library`` API, from one table
(operators.py), one concern per module:

================  ================================================================
library.py        handles on ``torch.ops.lltm.*``, with their contracts
operators.py      the table: one entry per operator, naming what follows
registration.py   registers an entry with torch
fake.py           fake kernels: shapes for torch.compile, torch.export, meta tensors
autograd.py       reverse and forward mode, higher orders (the Autograd key)
tangents.py       the forward-mode formulas
vmap.py           batching rules for ``torch.vmap`` and per-sample gradients
autocast.py       the autocast policy of torch's recurrent ops
flops.py          FLOP formulas, for ``torch.utils.flop_counter.FlopCounterMode``
decompositions    the forward operators as core ATen, for ONNX, ExecuTorch, run_decompositions
eager.py          :func:`cell` and :func:`sequence`, the Python entry points
================  ================================================================

The composite kernels (plain torch) are lltm/_composite.py, the argument
checks lltm/_checks.py. ``forward``/``backward`` are the cell's operators,
``sequence_forward``/``sequence_backward``/``sequence_gate_grads`` the
sequence's (``torch.ops.lltm.<name>.default``).
"""

from __future__ import annotations

from .eager import cell, sequence
from .library import (
    backward,
    forward,
    sequence_backward,
    sequence_forward,
    sequence_gate_grads,
)
from .operators import OPERATORS
from .registration import register

for _operator in OPERATORS:
    register(_operator)

__all__ = [
    "backward",
    "cell",
    "forward",
    "sequence",
    "sequence_backward",
    "sequence_forward",
    "sequence_gate_grads",
]
