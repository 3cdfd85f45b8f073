"""Functional form of the LLTM cell, in the style of ``torch.nn.functional``."""

from __future__ import annotations

from torch import Tensor
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from . import lengths as _lengths
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
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    lengths: Tensor | None = None,
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
        lengths: for sequences of different lengths in a padded batch,
            ``(batch,)`` integers on the CPU or the input's device, in any
            order (ONNX's ``sequence_lens``): sequence ``b`` is its first
            ``lengths[b]`` steps, as for :class:`lltm.LLTMSequence`.

    Returns:
        ``(output, (h_n, c_n))``: ``output`` ``(seq_len, batch, state_size)``
        holds every step's ``new_h`` (zeros past a sequence's length);
        ``h_n``, ``c_n`` are each sequence's state after its last step. Differentiable with respect to every argument; works under
        ``torch.compile``. :class:`lltm.LLTMSequence` adds layers, directions,
        ``batch_first`` and packed sequences.

    Raises:
        TypeError: as for :func:`lltm_cell`; ``lengths`` neither a tensor nor None.
        ValueError: as for :func:`lltm_cell`; ``lengths`` of another shape
            than ``(batch,)``, not integers, on another device, or outside
            ``[1, seq_len]``.
    """
    if lengths is None:
        output, h_n, c_n = ops.sequence(input, weights, bias, old_h, old_cell)
        return output, (h_n, c_n)
    if not isinstance(input, Tensor) or input.dim() != 3:
        raise ValueError("lltm: lltm_sequence input must be 3-D (seq_len, batch, features)")
    steps, batch = input.shape[0], input.shape[1]
    lengths = _lengths.check(lengths, batch, steps, input, "lltm_sequence")
    if _lengths.traced():
        output, h_n, c_n = _lengths.traced_direction(
            input, weights, bias, old_h, old_cell, lengths, False
        )
        return output, (h_n, c_n)
    # The packed path: its results and gradients.
    packed = pack_padded_sequence(input, lengths, enforce_sorted=False)
    order, unsort = packed.sorted_indices, packed.unsorted_indices
    output, h_n, c_n = ops.sequence(
        packed.data, weights, bias, old_h[order], old_cell[order], packed.batch_sizes
    )
    padded, _ = pad_packed_sequence(
        PackedSequence(output, packed.batch_sizes, order, unsort), total_length=steps
    )
    return padded, (h_n[unsort], c_n[unsort])
