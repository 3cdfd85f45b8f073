"""Functional form of the LLTM cell, in the style of ``torch.nn.functional``."""

from __future__ import annotations

from torch import Tensor

from . import ops
from ._checks import check_forward_args


def lltm_cell(
    input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor]:
    """One step of the LLTM cell.

    Args:
        input: ``(batch, input_features)``.
        weights: ``(3 * state_size, state_size + input_features)``; columns
            ``[0, state_size)`` multiply ``old_h``, the rest ``input``.
        bias: ``(3 * state_size,)``.
        old_h, old_cell: ``(batch, state_size)``.

    Returns:
        ``(new_h, new_cell)``, each ``(batch, state_size)``. Differentiable with
        respect to every argument; works under ``torch.compile``.
    """
    try:
        new_h, new_cell, _gates = ops.forward(input, weights, bias, old_h, old_cell)
    except (TypeError, RuntimeError):
        # The dispatcher's message for a non-Tensor argument is long and names
        # no expected type: this raises a TypeError naming the argument. (Checked
        # only on failure: the common path pays nothing for it.)
        check_forward_args(input, weights, bias, old_h, old_cell)
        raise
    return new_h, new_cell
