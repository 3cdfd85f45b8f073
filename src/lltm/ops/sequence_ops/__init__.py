"""The sequence: the cell over whole sequences, ``lltm::sequence_forward`` and its backward.

Everything Python says about the four operators (``sequence_forward``;
``sequence_inference``, the same without what only a backward reads;
``sequence_backward``, backpropagation through time; ``sequence_gate_grads``,
that backpropagation alone), a file a concern, as for the cell (cell_ops/,
whose pieces these build on; their native kernels are in csrc/cpu/ and
csrc/cuda/, docs/design.md names the files):

=============  ===================================================================
contract.py    handles on the operators, their contracts, the argument checks
composite.py   the operators in plain torch: the kernel of devices without a native one
fake.py        fake kernels and FLOP formulas: what a call makes and costs, from shapes
vmap.py        batching rules for ``torch.vmap``
autograd.py    ``SequenceFunction``: backward and forward mode (its tangent formulas)
lowering.py    ``lltm::sequence_forward`` as core ATen, for ONNX, ExecuTorch, run_decompositions
=============  ===================================================================

Here: each operator's entry in the table, naming the pieces registration.py
registers (its autocast policy among them), and the entry point
:func:`sequence`.
"""

from __future__ import annotations

from torch import Tensor

from .. import dispatch, precision
from ..registration import Operator
from . import composite, fake, lowering, vmap
from .autograd import SequenceFunction
from .contract import (
    sequence_backward,
    sequence_forward,
    sequence_gate_grads,
    sequence_inference,
)

SEQUENCE_FORWARD = Operator(
    "sequence_forward",
    fake=fake.sequence_forward,
    composite=composite.sequence_forward,
    flops=fake.sequence_forward_flops,
    vmap=vmap.sequence_forward,
    function=SequenceFunction,
    autocast=True,
    decomposition=lowering.sequence_forward,
)
SEQUENCE_INFERENCE = Operator(
    "sequence_inference",
    fake=fake.sequence_inference,
    composite=composite.sequence_inference,
    flops=fake.sequence_inference_flops,
    vmap=vmap.sequence_inference,
    differentiated_as=SEQUENCE_FORWARD,
    autocast=True,
    decomposition=lowering.sequence_inference,
)
SEQUENCE_BACKWARD = Operator(
    "sequence_backward",
    fake=fake.sequence_backward,
    composite=composite.sequence_backward,
    flops=fake.sequence_backward_flops,
    vmap=vmap.sequence_backward,
)
SEQUENCE_GATE_GRADS = Operator(
    "sequence_gate_grads",
    fake=fake.sequence_gate_grads,
    composite=composite.sequence_gate_grads,
    flops=fake.sequence_gate_grads_flops,
    vmap=vmap.sequence_gate_grads,
)
OPERATORS = (SEQUENCE_FORWARD, SEQUENCE_INFERENCE, SEQUENCE_BACKWARD, SEQUENCE_GATE_GRADS)


def sequence(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None = None,
    reverse: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The cell over a whole sequence, differentiable: ``(output, h_n, c_n)``.

    What ``lltm::sequence_forward`` computes, through the one decision of
    ops/dispatch.py, as :func:`lltm.ops.cell`; where no gradient can be
    asked of the call, ``lltm::sequence_inference``, the same values without
    the activations only a backward reads. float32's matrix products in the
    precision torch allows its own now (ops/precision.py).
    """
    allow_tf32 = precision.allow_tf32(input) if isinstance(input, Tensor) else False
    args = (input, weights, bias, old_h, old_cell, batch_sizes, reverse, allow_tf32)
    if not dispatch.may_differentiate(args):
        output, h_n, c_n = dispatch.call(SEQUENCE_INFERENCE, args)
        return output, h_n, c_n
    output, h_n, c_n, _gates, _cells = dispatch.call(SEQUENCE_FORWARD, args)
    return output, h_n, c_n


__all__ = [
    "OPERATORS",
    "SEQUENCE_BACKWARD",
    "SEQUENCE_FORWARD",
    "SEQUENCE_GATE_GRADS",
    "SEQUENCE_INFERENCE",
    "SequenceFunction",
    "sequence",
    "sequence_backward",
    "sequence_forward",
    "sequence_gate_grads",
    "sequence_inference",
]
