"""The LLTM cell in plain PyTorch: the oracle for tests and benchmarks.

This is the Python implementation from PyTorch's "Custom C++ and CUDA
Extensions" tutorial, kept deliberately naive: autograd differentiates it and
it saves every intermediate, which is exactly what the fused kernels avoid.
Tests hold every path of lltm to it, in float64.

lltm has two more LLTMs in plain PyTorch, neither of them public and neither
an oracle: each operator family's composite kernel (``composite.py`` in
``lltm/ops/cell_ops`` and ``lltm/ops/sequence_ops``: what a device without a
native kernel runs, computing what the fused kernels compute) and its lowering
(``lowering.py`` there: core ATen graphs for exporters such as ONNX and
ExecuTorch).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def lltm_cell(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor]:
    """One LLTM step; returns ``(new_h, new_cell)``."""
    X = torch.cat([old_h, input], dim=1)
    gate_weights = F.linear(X, weights, bias)
    gates = gate_weights.chunk(3, dim=1)
    input_gate = torch.sigmoid(gates[0])
    output_gate = torch.sigmoid(gates[1])
    candidate_cell = F.elu(gates[2])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    return new_h, new_cell


def example_inputs(
    batch: int = 4,
    features: int = 3,
    state: int = 5,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
    requires_grad: bool = False,
    seed: int = 0,
) -> list[Tensor]:
    """Random ``[input, weights, bias, old_h, old_cell]`` for one step, seeded.

    The arguments of :func:`lltm_cell` in order, from a generator seeded with
    ``seed``.
    """
    generator = torch.Generator().manual_seed(seed)
    shapes = [
        (batch, features),
        (3 * state, state + features),
        (3 * state,),
        (batch, state),
        (batch, state),
    ]
    return [
        torch.randn(shape, generator=generator, dtype=dtype)
        .to(device)
        .requires_grad_(requires_grad)
        for shape in shapes
    ]


class LLTM(torch.nn.Module):
    """The tutorial's pure-PyTorch module, parameter for parameter.

    :class:`lltm.LLTM` inherits its parameters and initialisation and replaces
    only ``forward`` with the fused operator. ``device`` and ``dtype`` say
    where and in which type the parameters are made, as for every torch
    module; the tutorial's two-argument call is unchanged.
    """

    def __init__(
        self,
        input_features: int,
        state_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        # 3 * state_size for input gate, output gate and candidate cell gate.
        # input_features + state_size because we will multiply with [input, h].
        self.weights = torch.nn.Parameter(
            torch.empty(3 * state_size, input_features + state_size, device=device, dtype=dtype)
        )
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The tutorial's initialisation: uniform in +-1/sqrt(state_size)."""
        stdv = 1.0 / math.sqrt(self.state_size)
        for weight in self.parameters():
            weight.data.uniform_(-stdv, +stdv)

    def forward(self, input: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """One step: ``(new_h, new_cell)`` from ``input`` and ``state = (old_h, old_cell)``."""
        old_h, old_cell = state
        return lltm_cell(input, self.weights, self.bias, old_h, old_cell)
