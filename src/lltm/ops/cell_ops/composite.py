"""The cell's operators in plain torch ops: the composite kernel.

The kernel registered for every device without a native lltm kernel (a CUDA
tensor when the CUDA plugin is missing or cannot run on its GPU, MPS, XPU,
...): it computes exactly what the fused kernels compute, in the same layout
and the same types, so autograd and torch.compile behave identically on top
of it; it is just not fused. Being plain torch, it is also what autograd
differentiates where a derivative is itself differentiated (autograd.py),
and what a batching rule falls back on for per-sample weight gradients
(vmap.py). Tests hold it to the native kernels.

Not to be confused with the other two LLTMs in plain PyTorch: the public
reference (lltm/reference.py, the tutorial's own code, the oracle tests hold
everything to) and the lowering (lowering.py: core ATen graphs for
exporters).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_output_mask
from .contract import check_backward_args, check_forward_args


def math_type(t: Tensor) -> torch.dtype:
    """The type the pointwise math runs in, as in the native kernels.

    float32 for 16-bit types (each op rounding to 16 bits would lose digits to
    every 1 - y and every sum), the type itself otherwise.
    """
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def forward(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """lltm::forward: (new_h, new_cell, gates)."""
    check_forward_args(input, weights, bias, old_h, old_cell)
    math = math_type(input)
    # One rounding of the pre-activations, with the bias or without one.
    pre = F.linear(torch.cat([old_h, input], dim=1), weights, bias).to(math)
    pre_i, pre_o, pre_g = gate_slices(pre)
    new_h, new_cell, i, o = step_forward(pre_i, pre_o, pre_g, old_cell, math)
    # The layout of every kernel's `gates`: activated input and output gates,
    # the candidate's pre-activation (its derivative needs x, not elu(x)).
    dtype = input.dtype
    return new_h.to(dtype), new_cell.to(dtype), torch.cat([i, o, pre_g], dim=1).to(dtype)


def gate_slices(pre: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The input, output and candidate columns of (..., 3S) pre-activations.

    Three slices rather than a split (chunk): lowered for ExecuTorch (1.5),
    a split of a tensor whose batch size is dynamic fixes that size (the
    program then fails on any other), or fails to_executorch ahead of a scan.
    """
    state = pre.shape[-1] // 3
    return pre[..., :state], pre[..., state : 2 * state], pre[..., 2 * state :]


def step_forward(
    pre_i: Tensor, pre_o: Tensor, pre_g: Tensor, old_cell: Tensor, math: torch.dtype
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The pointwise part of one step, in the math type.

    From its three pre-activations: (new_h, new_cell, input gate, output
    gate), the gates activated.
    """
    i, o, g = torch.sigmoid(pre_i), torch.sigmoid(pre_o), F.elu(pre_g)
    new_cell = old_cell.to(math) + g * i
    new_h = torch.tanh(new_cell) * o
    return new_h, new_cell, i, o


def step_backward(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    math: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """d_gates and the gradient of old_cell of one step, in the math type.

    Rows are the last-but-one dimension: any leading (batch) dimensions are
    carried along, as the vmap rules need.
    """
    i, o, x = gates.to(math).chunk(3, dim=-1)
    g = F.elu(x)
    t = torch.tanh(new_cell.to(math))
    d_cell = grad_h * o * (1 - t * t) + grad_cell.to(math)
    # Factors in the order of torch's own derivatives (sigmoid's is
    # grad * (1 - y) * y), so that NaN and inf come out where they do there.
    d_gates = torch.cat(
        [
            d_cell * g * (1 - i) * i,
            grad_h * t * (1 - o) * o,
            d_cell * i * torch.where(x > 0, torch.ones_like(x), torch.exp(x)),
        ],
        dim=-1,
    )
    return d_gates, d_cell


def backward(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    input: Tensor,
    old_h: Tensor,
    weights: Tensor,
    output_mask: list[bool],
) -> tuple[Tensor | None, ...]:
    """lltm::backward: the gradients ``output_mask`` asks for."""
    check_backward_args(grad_h, grad_cell, new_cell, gates, input, old_h, weights)
    return backward_math(
        grad_h, grad_cell, new_cell, gates, input, old_h, weights, check_output_mask(output_mask)
    )


def backward_math(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    input: Tensor,
    old_h: Tensor,
    weights: Tensor,
    output_mask: Sequence[bool],
) -> tuple[Tensor | None, ...]:
    """lltm::backward's math, unchecked, for any leading batch dimensions.

    Rows are dimension -2; ``weights`` may carry the batch dimensions too.
    Plain torch ops, so differentiable to any order: lltm's autograd runs it
    where a gradient will itself be differentiated, and the vmap rules where
    one kernel call cannot serve a batch of calls (per-sample weight
    gradients).
    """
    want_input, want_weights, want_bias, want_old_h, want_old_cell = output_mask
    state = old_h.shape[-1]
    math = math_type(input)
    d_gates, d_cell = step_backward(grad_h.to(math), grad_cell, new_cell, gates, math)
    # grad_bias is summed in the math type; the products take d_gates in the
    # input's type, as the native kernels' GEMMs do.
    grad_bias = d_gates.sum(dim=-2).to(input.dtype) if want_bias else None
    d_gates = d_gates.to(input.dtype)
    return (
        d_gates @ weights[..., state:] if want_input else None,
        d_gates.mT @ torch.cat([old_h, input], dim=-1) if want_weights else None,
        grad_bias,
        d_gates @ weights[..., :state] if want_old_h else None,
        d_cell.to(input.dtype) if want_old_cell else None,
    )
