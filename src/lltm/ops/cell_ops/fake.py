"""What a cell call makes and costs, from its arguments' shapes alone.

Fake kernels: the outputs' shapes and dtypes without running anything;
torch.compile, torch.export and meta tensors trace the operators through
them. They make the C++ kernels' argument checks first (contract.py), so
eager, compiled and fallback calls fail alike.

FLOP formulas: what ``torch.utils.flop_counter.FlopCounterMode`` counts,
given the operator's raw arguments (registered with ``get_raw=True``: a
packed sequence's batch sizes are values). torch counts the floating-point
operations of matrix products (2 per multiply-add), as it does for
nn.LSTMCell's and nn.LSTM's, and not the pointwise work; so do these. Each
count is the products the kernels run for the arguments given, so a
model's FLOP and MFU reports (Lightning's, torchtitan's, a user's own)
include lltm's cells:

* ``forward``: ``[old_h, input] @ W^T``, ``2 B (S + F) 3S``;
* ``backward``: ``d_gates^T @ [old_h, input]`` when the weights' gradient is
  asked for, and ``d_gates @ W`` restricted to the columns of the inputs
  whose gradient is asked for (``output_mask``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from ..checks import check_output_mask
from .contract import check_backward_args, check_forward_args

# --- Fake kernels ------------------------------------------------------------------


def forward(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """lltm::forward's outputs: new_h, new_cell and gates."""
    batch, _, state = check_forward_args(input, weights, bias, old_h, old_cell)
    return (
        input.new_empty((batch, state)),
        input.new_empty((batch, state)),
        input.new_empty((batch, 3 * state)),
    )


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
    """lltm::backward's outputs: the gradients ``output_mask`` asks for."""
    batch, features, state = check_backward_args(
        grad_h, grad_cell, new_cell, gates, input, old_h, weights
    )
    wanted = check_output_mask(output_mask)
    shapes = (
        (input, (batch, features)),
        (weights, (3 * state, state + features)),
        (weights, (3 * state,)),
        (input, (batch, state)),
        (input, (batch, state)),
    )
    return tuple(
        like.new_empty(shape) if want else None
        for (like, shape), want in zip(shapes, wanted, strict=True)
    )


# --- FLOP formulas -------------------------------------------------------------------


def product_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) x (k, n) matrix product, as torch counts them."""
    return 2 * m * k * n


def sizes(input: Tensor, old_h: Tensor) -> tuple[int, int, int]:
    """(rows, features, state): rows of input (all steps' for a sequence)."""
    rows = input.shape[0] * input.shape[1] if input.dim() == 3 else input.shape[0]
    return int(rows), int(input.shape[-1]), int(old_h.shape[1])


def gradient_flops(rows: int, f: int, s: int, output_mask: Sequence[bool]) -> int:
    """The products of the weights' and the inputs' gradients, given ``d_gates`` of ``rows`` rows.

    ``output_mask`` asks for (input, weights, bias, old_h, old_cell). ``old_h``
    counts only for the cell: a sequence's is carried by its recurrence.
    """
    want_input, want_weights, _bias, want_old_h, _cell = (bool(w) for w in output_mask)
    flops = product_flops(3 * s, rows, s + f) if want_weights else 0
    columns = (s if want_old_h else 0) + (f if want_input else 0)
    return flops + product_flops(rows, 3 * s, columns)


def forward_flops(
    input: Tensor, weights: Tensor, bias: Any, old_h: Tensor, old_cell: Tensor, **_: Any
) -> int:
    """lltm::forward's FLOPs."""
    rows, f, s = sizes(input, old_h)
    return product_flops(rows, s + f, 3 * s)


def backward_flops(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    input: Tensor,
    old_h: Tensor,
    weights: Tensor,
    output_mask: Sequence[bool],
    **_: Any,
) -> int:
    """lltm::backward's FLOPs."""
    rows, f, s = sizes(input, old_h)
    return gradient_flops(rows, f, s, output_mask)
