"""The operations of a sequence's matrix products, and the large GEMM.

A run's GFLOP/s are compared with the large GEMM's rate, timed in the same run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .kinds import LARGE_GEMM, Kind, Size


def product_flops(size: Size, inputs_grad: bool = False) -> dict[str, int]:
    """Floating-point operations (2 per multiply-add) of a sequence's matrix products, per phase.

    Those the ``gemm`` case computes (its docstring lists them). The pointwise
    work is not counted.
    """
    t, b, f, s = size.seq_len or 0, size.batch, size.features, size.state
    projection, recurrent = 2 * t * b * f * 3 * s, 2 * b * s * 3 * s
    weight_grad = 2 * 3 * s * t * b * (s + f)
    forward = projection + t * recurrent
    backward = (t if inputs_grad else max(t - 1, 0)) * recurrent + weight_grad
    if inputs_grad:
        backward += projection
    return {"forward": forward, "backward": backward, "step": forward + backward}


def flops_of(kind: Kind, impl: str, size: Size, inputs_grad: bool) -> dict[str, int] | None:
    """product_flops for the LLTM implementations of a kind that counts them.

    None for nn.LSTM, whose products are those of four gates: not comparable.
    """
    if not kind.counts_flops or impl == kind.rival or impl.startswith("lstm"):
        return None
    return product_flops(size, inputs_grad)


def large_gemm(device: torch.device, dtype: torch.dtype) -> tuple[Callable[[], Tensor], int, int]:
    """(the product, its size n, its floating-point operations) of the large GEMM.

    An n x n by n x n torch.mm in the run's dtype on its device.
    """
    n = LARGE_GEMM.get(device.type, LARGE_GEMM["cpu"])
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=generator).to(device, dtype) for _ in range(2))
    return (lambda: torch.mm(a, b)), n, 2 * n**3
