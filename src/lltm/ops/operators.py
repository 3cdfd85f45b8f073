"""lltm's operators, one entry each: everything Python registers for an operator.

csrc/lltm_ops.cpp declares each operator's schema, and each backend
(csrc/cpu, csrc/cuda) registers its kernel for it. Everything else comes
from the operator's entry here, registered by registration.py: its fake
kernel, its composite kernel (plain torch: every device without a native
kernel, and derivatives of derivatives), how autograd differentiates it,
its autocast policy, its batching rule, its FLOP formula and, for the
forward operators, its lowering to core ATen. Adding an operator is one
schema line, its kernels, and one entry here with the functions it names
(CONTRIBUTING.md, "Adding an operator").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _composite
from . import autograd, decompositions, fake, flops, lowered, vmap


@dataclass(frozen=True)
class Operator:
    """What Python registers for ``torch.ops.lltm.<name>``."""

    name: str
    """The operator's name in the ``lltm`` namespace."""
    fake: Callable[..., Any]
    """Its outputs' shapes, after the argument checks (fake.py)."""
    composite: Callable[..., Any]
    """The operator in plain torch ops, differentiable (lltm/_composite.py)."""
    flops: Callable[..., int]
    """The FLOPs of its matrix products, from its raw arguments (flops.py)."""
    vmap: Callable[..., Any]
    """Its batching rule (vmap.py)."""
    function: type[Any] | None = None
    """The autograd Function the operator applies (autograd.py: the forward
    operators'); None where autograd differentiates it through its composite
    (the backward operators, and any operator without a Function of its own)."""
    autocast: bool = False
    """Whether autocast casts its floating arguments, as for torch's recurrent ops."""
    decomposition: Callable[..., Any] | None = None
    """A forward operator's lowering to core ATen, for ONNX, ExecuTorch and
    ``run_decompositions()`` (decompositions.py)."""


OPERATORS: tuple[Operator, ...] = (
    Operator(
        "forward",
        fake=fake.forward,
        composite=_composite.forward,
        flops=flops.forward,
        vmap=vmap.forward,
        function=autograd.CellFunction,
        autocast=True,
        decomposition=lowered.cell,
    ),
    Operator(
        "backward",
        fake=fake.backward,
        composite=_composite.backward,
        flops=flops.backward,
        vmap=vmap.backward,
    ),
    Operator(
        "sequence_forward",
        fake=fake.sequence_forward,
        composite=_composite.sequence_forward,
        flops=flops.sequence_forward,
        vmap=vmap.sequence_forward,
        function=autograd.SequenceFunction,
        autocast=True,
        decomposition=decompositions.sequence,
    ),
    Operator(
        "sequence_backward",
        fake=fake.sequence_backward,
        composite=_composite.sequence_backward,
        flops=flops.sequence_backward,
        vmap=vmap.sequence_backward,
    ),
    Operator(
        "sequence_gate_grads",
        fake=fake.sequence_gate_grads,
        composite=_composite.sequence_gate_grads,
        flops=flops.sequence_gate_grads,
        vmap=vmap.sequence_gate_grads,
    ),
)
