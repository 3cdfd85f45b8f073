"""``lltm::forward`` / ``lltm::backward`` written with ordinary torch ops.

This is the portable kernel registered for every device without a native
lltm kernel (a CUDA tensor when the CUDA plugin is missing or unusable, MPS,
XPU, ...). It computes exactly what the fused kernels compute, in the same
layout, so autograd and torch.compile behave identically on top of it; it is
just not fused. Tests hold it to the native kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_backward_args, check_forward_args, check_output_mask


def forward(
    input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    check_forward_args(input, weights, bias, old_h, old_cell)
    pre = torch.addmm(bias, torch.cat([old_h, input], dim=1), weights.t())
    pre_i, pre_o, pre_g = pre.chunk(3, dim=1)
    i, o, g = torch.sigmoid(pre_i), torch.sigmoid(pre_o), F.elu(pre_g)
    new_cell = old_cell + g * i
    new_h = torch.tanh(new_cell) * o
    return new_h, new_cell, torch.cat([i, o, g], dim=1)


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
    state = check_backward_args(grad_h, grad_cell, new_cell, gates, input, old_h, weights)[2]
    want_input, want_weights, want_bias, want_old_h, want_old_cell = check_output_mask(output_mask)
    i, o, g = gates.chunk(3, dim=1)
    t = torch.tanh(new_cell)
    d_cell = grad_h * o * (1 - t * t) + grad_cell
    d_gates = torch.cat(
        [
            d_cell * g * i * (1 - i),
            grad_h * t * o * (1 - o),
            d_cell * i * torch.where(g > 0, torch.ones_like(g), g + 1),
        ],
        dim=1,
    )
    return (
        d_gates @ weights[:, state:] if want_input else None,
        d_gates.t() @ torch.cat([old_h, input], dim=1) if want_weights else None,
        d_gates.sum(dim=0) if want_bias else None,
        d_gates @ weights[:, :state] if want_old_h else None,
        d_cell if want_old_cell else None,
    )
