"""FLOP formulas: what ``torch.utils.flop_counter.FlopCounterMode`` counts for lltm's operators.

Registered from the table of operators.py, each with the operator's raw
arguments (``get_raw=True``: a packed sequence's batch sizes are values).

torch counts the floating-point operations of matrix products (2 per
multiply-add), as it does for nn.LSTMCell's and nn.LSTM's, and not the
pointwise work; so do these. Each operator's count is the products its
kernels run for the arguments given, so a model's FLOP and MFU reports
(Lightning's, torchtitan's, a user's own) include lltm's cells:

* ``forward``: ``[old_h, input] @ W^T``, ``2 B (S + F) 3S``;
* ``backward``: ``d_gates^T @ [old_h, input]`` when the weights' gradient is
  asked for, and ``d_gates @ W`` restricted to the columns of the inputs
  whose gradient is asked for (``output_mask``);
* ``sequence_forward``: every step's ``[h_prev, x_t] @ W^T`` (the input
  projection of all steps and the recurrence), ``2 R (S + F) 3S`` for ``R``
  rows (``T B``, or ``sum(batch_sizes)`` packed);
* ``sequence_backward``: the recurrence ``d_gates_t @ W_h`` of every step
  but the first one run when ``old_h`` needs no gradient, then the weights'
  and the input's gradients as for the cell, over all rows;
* ``sequence_gate_grads``: the recurrence of every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from .._checks import SequenceBackwardArgs


def _product(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) x (k, n) matrix product, as torch counts them."""
    return 2 * m * k * n


def _sizes(input: Tensor, old_h: Tensor) -> tuple[int, int, int]:
    """(rows, features, state): rows of input (all steps' for a sequence)."""
    rows = input.shape[0] * input.shape[1] if input.dim() == 3 else input.shape[0]
    return int(rows), int(input.shape[-1]), int(old_h.shape[1])


def _gradient_products(rows: int, f: int, s: int, output_mask: Sequence[bool]) -> int:
    """The products of the weights' and the inputs' gradients, given ``d_gates`` of ``rows`` rows.

    ``output_mask`` asks for (input, weights, bias, old_h, old_cell). ``old_h``
    counts only for the cell: a sequence's is carried by its recurrence.
    """
    want_input, want_weights, _bias, want_old_h, _cell = (bool(w) for w in output_mask)
    flops = _product(3 * s, rows, s + f) if want_weights else 0
    columns = (s if want_old_h else 0) + (f if want_input else 0)
    return flops + _product(rows, 3 * s, columns)


def _first_step_rows(old_h: Tensor, batch_sizes: Tensor | None, reverse: bool) -> int:
    """The rows of the first step a sequence's kernels run: its last step when reversed.

    The batch, but for a packed sequence run in reverse: its last size, or
    the batch where those values cannot be read (a fake batch_sizes).
    """
    if batch_sizes is None or not reverse:
        return int(old_h.shape[0])
    try:
        return int(batch_sizes[-1])
    except (RuntimeError, NotImplementedError):
        return int(old_h.shape[0])


def _step_products(rows: int, s: int) -> int:
    """The recurrence of ``rows`` rows in all: ``d_gates_t @ W_h``, (rows, 3S) x (3S, S)."""
    return _product(rows, 3 * s, s)


def forward(
    input: Tensor, weights: Tensor, bias: Any, old_h: Tensor, old_cell: Tensor, **_: Any
) -> int:
    """lltm::forward's FLOPs."""
    rows, f, s = _sizes(input, old_h)
    return _product(rows, s + f, 3 * s)


def backward(
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
    rows, f, s = _sizes(input, old_h)
    return _gradient_products(rows, f, s, output_mask)


def sequence_forward(
    input: Tensor, weights: Tensor, bias: Any, old_h: Tensor, old_cell: Tensor, *_: Any, **__: Any
) -> int:
    """lltm::sequence_forward's FLOPs."""
    rows, f, s = _sizes(input, old_h)
    return _product(rows, s + f, 3 * s)


def sequence_backward(*args: Any, **_: Any) -> int:
    """lltm::sequence_backward's FLOPs."""
    named = SequenceBackwardArgs(*args[:11])
    rows, f, s = _sizes(named.input, named.old_h)
    want_input, want_weights, want_bias, want_old_h, want_old_cell = args[11]
    first = _first_step_rows(named.old_h, named.batch_sizes, named.reverse)
    carried = rows if want_old_h else rows - first
    gradients = _gradient_products(
        rows, f, s, (want_input, want_weights, want_bias, False, want_old_cell)
    )
    return _step_products(carried, s) + gradients


def sequence_gate_grads(*args: Any, **_: Any) -> int:
    """lltm::sequence_gate_grads's FLOPs."""
    named = SequenceBackwardArgs(*args)
    rows, _f, s = _sizes(named.input, named.old_h)
    return _step_products(rows, s)
