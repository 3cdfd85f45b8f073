"""lltm's operators seen from Python.

The compiled library declares five operators (csrc/lltm_ops.cpp) and
registers their CPU kernels; the CUDA plugin adds CUDA kernels. This package
registers everything else with the ``torch.library`` API, from one table:
each operator's entry, in its family's package, names what Python registers
for it, and every entry is registered here, once (registration.py).

==================  ============================================================
cell_ops/           the cell's operators, ``forward`` and ``backward``: contracts,
                    composite kernel, fake kernels and FLOPs, batching rules, the
                    autograd Function, the lowering, the entry point :func:`cell`
sequence_ops/       the same for the sequence's: ``sequence_forward``,
                    ``sequence_backward``, ``sequence_gate_grads``; :func:`sequence`
registration.py     an entry of the table (``Operator``), and the torch.library calls
dispatch.py         the one decision: the Function, the composite or the kernels,
                    for the Autograd kernels and the entry points alike
checks.py           the argument checks both families are built from
autocast.py         autocast's policy for the forward operators
batching.py         the vmapped dimension folded into the kernels' batch
decompositions.py   how the lowerings reach torch.export's decomposition table
precision.py        the ``allow_tf32`` the sequence's calls pass: torch's float32
                    matmul setting, read at each call
==================  ============================================================

``forward``/``backward`` are the cell's operators,
``sequence_forward``/``sequence_backward``/``sequence_gate_grads`` the
sequence's (``torch.ops.lltm.<name>.default``); their docstrings are their
contracts. Their floating-point tensors are float32, float64, float16 or
bfloat16, all of one dtype and on one device (16-bit types compute in
float32); a bad argument raises a ``ValueError`` or ``TypeError`` that
starts with ``lltm:`` and names the argument.
"""

from __future__ import annotations

from . import cell_ops, sequence_ops
from .cell_ops import backward, cell, forward
from .registration import Operator, register
from .sequence_ops import sequence, sequence_backward, sequence_forward, sequence_gate_grads

OPERATORS: tuple[Operator, ...] = (*cell_ops.OPERATORS, *sequence_ops.OPERATORS)
"""Every operator's entry: what Python registers for it."""

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
