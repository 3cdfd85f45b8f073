"""The cell's forward operator as core ATen: the graph ONNX and ExecuTorch run.

The lowering that ``ExportedProgram.run_decompositions()``, the ONNX
exporter and ExecuTorch's ``to_edge`` apply to ``lltm::forward``
(ops/decompositions.py says how it reaches them). It computes what the
kernels compute, every output in the input's type: the product and the
pointwise math in the math type (float32 for 16-bit inputs), the
pre-activations rounded once to the input's type. Its pieces serve the
sequence's lowering (sequence_ops/lowering.py) too.

Not to be confused with the other two LLTMs in plain PyTorch: the public
reference (lltm/reference.py, the oracle) and the composite kernel
(composite.py, which runs eagerly on devices without a native kernel); this
one is written for exporters: operators their runtimes take.

The ELU is written ``max(x, exp(min(x, 0)) - 1)``: ExecuTorch's XNNPACK
partitioner (1.5) takes each of those operators but not ``elu``, and
onnxruntime runs them in half the time of its ``Elu``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .composite import gate_slices, math_type
from .contract import check_forward_args


def forward(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``lltm::forward`` in core ATen: (new_h, new_cell, gates)."""
    check_forward_args(input, weights, bias, old_h, old_cell)
    dtype, math = input.dtype, math_type(input)
    pre = product(torch.cat([old_h, input], dim=1), weights, bias, math, dtype)
    new_h, new_cell, gates = step(pre, old_cell, math, dtype)
    return new_h, new_cell, gates


def product(
    rows: Tensor, weights: Tensor, bias: Tensor | None, math: torch.dtype, dtype: torch.dtype
) -> Tensor:
    """``rows @ weights.T + bias`` in the math type, rounded once to ``dtype``."""
    if math != dtype:
        rows, weights = rows.to(math), weights.to(math)
        bias = None if bias is None else bias.to(math)
    return rounded(F.linear(rows, weights, bias), dtype)


def rounded(pre: Tensor, dtype: torch.dtype) -> Tensor:
    """Pre-activations of a 16-bit input, rounded once to it as the kernels round them.

    They are computed in float32; pre-activations of other inputs are
    returned unchanged.
    """
    return pre if pre.dtype == dtype else pre.to(dtype).to(pre.dtype)


def elu(x: Tensor) -> Tensor:
    """ELU: ``x`` where positive, ``exp(x) - 1`` elsewhere (``exp(x) - 1 >= x`` always)."""
    return torch.maximum(x, torch.exp(torch.clamp(x, max=0.0)) - 1)


def update(
    pre_i: Tensor, pre_o: Tensor, pre_g: Tensor, old_cell: Tensor, math: torch.dtype
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The pointwise part of a step, in the math type: (new_h, new_cell, i, o).

    In the kernels' order (composite.step_forward): the cell's increment
    is elu(g) * i, and tanh reads the cell before its rounding.
    """
    i, o = torch.sigmoid(pre_i), torch.sigmoid(pre_o)
    new_cell = old_cell.to(math) + elu(pre_g) * i
    return torch.tanh(new_cell) * o, new_cell, i, o


def step(
    pre: Tensor, old_cell: Tensor, math: torch.dtype, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """A step from its pre-activations: (new_h, new_cell, gates), in ``dtype``.

    The gates come apart by slices: lowered for ExecuTorch (1.5), a split of a
    tensor whose batch size is dynamic fixes that size, and XNNPACK takes
    slices but not a split.
    """
    pre_i, pre_o, pre_g = gate_slices(pre)
    new_h, new_cell, i, o = update(pre_i, pre_o, pre_g, old_cell, math)
    # The layout of every kernel's `gates`: activated input and output gates,
    # the candidate's pre-activation.
    gates = torch.cat([i, o, pre_g], dim=-1).to(dtype)
    return new_h.to(dtype), new_cell.to(dtype), gates
