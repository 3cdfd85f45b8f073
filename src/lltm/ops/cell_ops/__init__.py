"""The cell: one LLTM step, ``lltm::forward`` and its backward ``lltm::backward``.

Everything Python says about the two operators, a file a concern (their
native kernels are in csrc/cpu/ and csrc/cuda/; docs/design.md names the
files):

=============  ===================================================================
contract.py    handles on the operators, their contracts, the argument checks
composite.py   the operators in plain torch: the kernel of devices without a native one
fake.py        fake kernels and FLOP formulas: what a call makes and costs, from shapes
vmap.py        batching rules for ``torch.vmap``
autograd.py    ``CellFunction``: backward and forward mode (its tangent formulas)
lowering.py    ``lltm::forward`` as core ATen, for ONNX, ExecuTorch, run_decompositions
=============  ===================================================================

Here: each operator's entry in the table, naming the pieces registration.py
registers (its autocast policy among them), and the entry point :func:`cell`.
"""

from __future__ import annotations

from torch import Tensor

from .. import dispatch
from ..registration import Operator
from . import composite, fake, lowering, vmap
from .autograd import CellFunction
from .contract import backward, forward

FORWARD = Operator(
    "forward",
    fake=fake.forward,
    composite=composite.forward,
    flops=fake.forward_flops,
    vmap=vmap.forward,
    function=CellFunction,
    autocast=True,
    decomposition=lowering.forward,
)
BACKWARD = Operator(
    "backward",
    fake=fake.backward,
    composite=composite.backward,
    flops=fake.backward_flops,
    vmap=vmap.backward,
)
OPERATORS = (FORWARD, BACKWARD)


def cell(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor]:
    """One differentiable LLTM step: ``(new_h, new_cell)``.

    What ``lltm::forward`` computes, through the one decision of
    ops/dispatch.py (in plain eager mode without the dispatcher's trip).
    """
    new_h, new_cell, _gates = dispatch.call(FORWARD, (input, weights, bias, old_h, old_cell))
    return new_h, new_cell


__all__ = ["BACKWARD", "FORWARD", "OPERATORS", "CellFunction", "backward", "cell", "forward"]
