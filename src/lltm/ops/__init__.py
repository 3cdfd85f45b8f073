"""lltm's operators seen from Python.

The compiled library declares five operators (csrc/lltm_ops.cpp) and
registers their CPU kernels; the CUDA plugin adds CUDA kernels. This package
registers everything else with the public ``torch.library`` API, one concern
per module:

==============  ==================================================================
library.py      loads the library; handles on ``torch.ops.lltm.*``, with their contracts
fake.py         fake kernels: shapes for torch.compile, torch.export, meta tensors
autograd.py     reverse and forward mode, higher orders (the Autograd key)
tangents.py     the forward-mode formulas
vmap.py         batching rules for ``torch.vmap`` and per-sample gradients
autocast.py     the autocast policy of torch's recurrent ops
decompositions  the forward operators as core ATen, for ONNX, ExecuTorch, run_decompositions
flops.py        FLOP formulas, for torch.utils.flop_counter.FlopCounterMode
eager.py        :func:`cell` and :func:`sequence`, the Python entry points
==============  ==================================================================

``forward``/``backward`` are the cell's operators, ``sequence_forward``/
``sequence_backward``/``sequence_gate_grads`` the sequence's
(``torch.ops.lltm.<name>.default``).
"""

from __future__ import annotations

from . import autocast, autograd, decompositions, fake, flops, vmap  # noqa: F401  (registrations)
from .eager import cell, sequence
from .library import (
    backward,
    forward,
    sequence_backward,
    sequence_forward,
    sequence_gate_grads,
)

__all__ = [
    "backward",
    "cell",
    "forward",
    "sequence",
    "sequence_backward",
    "sequence_forward",
    "sequence_gate_grads",
]
