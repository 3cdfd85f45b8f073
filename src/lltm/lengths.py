"""Padded batches with a length per sequence: ``lengths``, ONNX's ``sequence_lens``.

A padded batch ``(seq_len, batch, features)`` and ``lengths`` ``(batch,)``
mean what ``pack_padded_sequence(input, lengths, enforce_sorted=False)``
means: sequence ``b`` is its first ``lengths[b]`` steps. Its outputs past its
length are zeros, and its ``h_n`` and ``c_n`` are its state after its own last
step (in the reverse direction, after its first: the reverse direction runs
each sequence from its own last step).

Two routes, one meaning:

* **Eager**: the packed path itself. The batch is packed, run as a
  ``PackedSequence`` and padded again, so that its results and gradients are
  the packed path's, and no step runs on padding.
* **Traced** (``torch.export`` and the exporters built on it, ``torch.compile``,
  ``torch.jit.trace``): a graph whose shapes do not depend on the lengths'
  values, which a packed batch's do. Each direction runs the sequence
  operator over every step of the padded batch; each sequence's steps are
  first brought to the front of its column (the reverse direction reads
  sequence ``b``'s step ``lengths[b] - 1 - t`` at step ``t``, a gather), so
  that its first ``lengths[b]`` steps are its own and what the padding does
  afterwards to its state is never read: the outputs past the length are
  masked to zeros, and ``h_n`` and ``c_n`` are read at the sequence's last
  step, from the operator's ``output`` and ``cells`` (whose gradient, which
  ``cells`` do not carry, a plain-torch sum of the steps' increments adds
  where one can be asked: ``_cell_gradient_path``). Each sequence's
  arithmetic is the same as on the packed path; the padding's steps cost
  time. The exported graph cannot raise on the lengths' values: it clamps
  them into ``[0, seq_len]``, and a sequence of length 0 keeps its initial
  state, with zero outputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .ops import precision, sequence_ops


def traced() -> bool:
    """Whether this call is being traced into a graph (the traced route)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def check(lengths: object, batch: int, steps: int, like: Tensor, caller: str) -> Tensor:
    """``lengths`` checked against a padded batch of ``steps`` x ``batch``; int64 on the CPU.

    Raises TypeError for a non-tensor, ValueError (naming ``lengths``) for
    the rest: the shape, a floating or boolean dtype, a device other than the
    CPU or ``like``'s, and (eager only) a length below 1 or past ``steps``,
    which the packed path refuses too.
    """
    if not isinstance(lengths, Tensor):
        raise TypeError(f"lltm: {caller} lengths must be a Tensor, got {type(lengths).__name__}")
    if lengths.dim() != 1 or lengths.shape[0] != batch:
        raise ValueError(
            f"lltm: {caller} lengths must have shape (batch,) = ({batch},), one length per "
            f"sequence, got {tuple(lengths.shape)}"
        )
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise ValueError(f"lltm: {caller} lengths must be an integer tensor, got {lengths.dtype}")
    if lengths.device.type != "cpu" and lengths.device != like.device:
        raise ValueError(
            f"lltm: {caller} lengths must be on the CPU or on the input's device "
            f"({like.device}), got {lengths.device}"
        )
    if traced():
        return lengths
    lengths = lengths.to("cpu", torch.int64)
    if batch and int(lengths.min()) < 1:
        raise ValueError(
            f"lltm: {caller} lengths must be at least 1, got {int(lengths.min())}: an empty "
            "sequence has no step to run (pack_padded_sequence refuses it too)"
        )
    if batch and int(lengths.max()) > steps:
        raise ValueError(
            f"lltm: {caller} lengths must be at most seq_len = {steps}, the padded batch's "
            f"length, got {int(lengths.max())}"
        )
    return lengths


def traced_direction(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    lengths: Tensor,
    reverse: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """One layer and direction on the traced route: ``(output, h_n, c_n)``.

    ``input`` ``(seq_len, batch, features)``; ``lengths`` ``(batch,)``, any
    integer type, on the CPU or the input's device.
    """
    steps = input.shape[0]
    lengths = lengths.to(device=input.device, dtype=torch.int64).clamp(0, steps)
    t = torch.arange(steps, device=input.device).unsqueeze(1)  # (steps, 1)
    valid = t < lengths  # (steps, batch)
    if reverse:
        # Sequence b's step lengths[b] - 1 - t at step t; past its length,
        # any step (the first).
        order = torch.where(valid, lengths - 1 - t, 0)
        input = input.gather(0, _rows(order, input.shape[2]))
    output, _h, _c, _gates, cells = sequence_ops.SEQUENCE_FORWARD.handle(
        input, weights, bias, old_h, old_cell, None, False, precision.allow_tf32(input)
    )
    last = _rows((lengths - 1).clamp(min=0).unsqueeze(0), old_h.shape[1])  # (1, batch, state)
    ran = (lengths > 0).unsqueeze(1)  # (batch, 1)
    h_n = torch.where(ran, output.gather(0, last).squeeze(0), old_h)
    c_n = cells.gather(0, last).squeeze(0)
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (input, weights, bias, old_h, old_cell)
    ):
        c_n = c_n + _cell_gradient_path(input, weights, bias, old_h, old_cell, output, valid)
    c_n = torch.where(ran, c_n, old_cell)
    if reverse:
        output = output.gather(0, _rows(order, output.shape[2]))
    output = torch.where(valid.unsqueeze(2), output, output.new_zeros(()))
    return output, h_n, c_n


def _cell_gradient_path(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    output: Tensor,
    valid: Tensor,
) -> Tensor:
    """Zeros whose gradient is that of each sequence's last cell.

    The operator's ``cells`` are not differentiable (only its backward reads
    them), so the last cell read from them carries no gradient. Its value is
    ``c_0`` plus the increments ``elu(g) * sigmoid(i)`` of the sequence's
    steps, each a function of the step's input and of the ``h`` before it,
    an output of the operator, which differentiates it through the whole
    recurrence: that sum, recomputed here in plain torch, has the last cell's
    gradient. It is added as ``sum - sum.detach()``, exactly zero, so that
    the value stays the kernels'. Only where a gradient can be asked.
    """
    math = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    state = old_h.shape[1]
    h_prev = torch.cat([old_h.unsqueeze(0), output])[: output.shape[0]].to(math)
    columns = [slice(0, state), slice(2 * state, 3 * state)]  # input gate, candidate
    pre_i, pre_g = (
        torch.nn.functional.linear(
            torch.cat([h_prev, input.to(math)], dim=2),
            weights[rows].to(math),
            None if bias is None else bias[rows].to(math),
        )
        for rows in columns
    )
    increments = torch.nn.functional.elu(pre_g) * torch.sigmoid(pre_i)
    summed = old_cell.to(math) + (increments * valid.unsqueeze(2)).sum(0)
    return (summed - summed.detach()).to(old_cell.dtype)


def _rows(index: Tensor, width: int) -> Tensor:
    """A (steps, batch) step index as a gather index over ``width`` features.

    Contiguous, not expanded: ExecuTorch takes no zero strides.
    """
    return index.unsqueeze(2).expand(*index.shape, width).contiguous()
