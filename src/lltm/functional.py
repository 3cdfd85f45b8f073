"""Functional form of the LLTM cell, in the style of ``torch.nn.functional``."""

from __future__ import annotations

from torch import Tensor

from . import ops


def lltm_cell(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor]:
    """One step of the LLTM cell.

    Float32, float64, float16 or bfloat16 (16-bit types compute in float32),
    all arguments of one dtype and on one device; any batch size, including 0;
    non-contiguous tensors as they are.

    Args:
        input: ``(batch, input_features)``.
        weights: ``(3 * state_size, state_size + input_features)``; columns
            ``[0, state_size)`` multiply ``old_h``, the rest ``input``.
        bias: ``(3 * state_size,)``, or None for none (as in ``F.linear``).
        old_h: the hidden state, ``(batch, state_size)``.
        old_cell: the cell, ``(batch, state_size)``.

    Returns:
        ``(new_h, new_cell)``, each ``(batch, state_size)``. Differentiable with
        respect to every argument (gradients computed only for those that need
        them); works under ``torch.compile``, ``torch.func`` and autocast.

    Raises:
        TypeError: an argument is not a tensor (``bias``: nor None).
        ValueError: a shape that does not fit, an integer dtype, mixed dtypes
            or devices; the message starts with ``lltm:`` and names the
            argument and what was expected.
    """
    return ops.cell(input, weights, bias, old_h, old_cell)


def lltm_sequence(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """The LLTM cell over a whole sequence, in one operator call.

    Step ``t`` is :func:`lltm_cell` on ``input[t]`` and the state the step
    before left; the recurrence and its backward run in C++ (or CUDA).

    Args:
        input: ``(seq_len, batch, input_features)``.
        weights: as for :func:`lltm_cell`.
        bias: as for :func:`lltm_cell`.
        old_h: the initial hidden state, ``(batch, state_size)``.
        old_cell: the initial cell, ``(batch, state_size)``.

    Returns:
        ``(output, (h_n, c_n))``: ``output`` ``(seq_len, batch, state_size)``
        holds every step's ``new_h``; ``h_n``, ``c_n`` are the last step's
        state. Differentiable with respect to every argument; works under
        ``torch.compile``. :class:`lltm.LLTMSequence` adds layers, directions,
        ``batch_first`` and packed sequences.

    Raises:
        TypeError: as for :func:`lltm_cell`.
        ValueError: as for :func:`lltm_cell`.
    """
    output, h_n, c_n = ops.sequence(input, weights, bias, old_h, old_cell)
    return output, (h_n, c_n)
