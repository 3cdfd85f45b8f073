"""What a sequence call makes and costs, from its arguments' shapes alone.

As the cell's (cell_ops/fake.py): fake kernels, after the C++ kernels'
argument checks (contract.py), and the FLOP formulas ``FlopCounterMode``
reads, of matrix products only:

* ``sequence_forward``: every step's ``[h_prev, x_t] @ W^T`` (the input
  projection of all steps and the recurrence), ``2 R (S + F) 3S`` for ``R``
  rows (``T B``, or ``sum(batch_sizes)`` packed);
* ``sequence_backward``: the recurrence ``d_gates_t @ W_h`` of every step
  but the first one run when ``old_h`` needs no gradient, then the weights'
  and the input's gradients as for the cell, over all rows;
* ``sequence_gate_grads``: the recurrence of every step.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..cell_ops.fake import gradient_flops, product_flops, sizes
from ..checks import check_output_mask
from .contract import (
    SequenceBackwardArgs,
    SequenceSizes,
    check_sequence_args,
    check_sequence_backward_args,
)

# --- Fake kernels ------------------------------------------------------------------


def _sequence_layout(like: Tensor, n: SequenceSizes, width: Any) -> Tensor:
    shape = (n.rows, width) if n.packed else (n.steps, n.batch, width)
    return like.new_empty(shape)


def sequence_forward(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
    allow_tf32: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """lltm::sequence_forward's outputs: output, h_n, c_n, gates and cells."""
    n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes)
    return (
        _sequence_layout(input, n, n.state),
        old_h.new_empty((n.batch, n.state)),
        old_h.new_empty((n.batch, n.state)),
        _sequence_layout(input, n, 3 * n.state),
        _sequence_layout(input, n, n.state),
    )


def sequence_inference(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    """lltm::sequence_inference's outputs: output, h_n and c_n."""
    output, h_n, c_n, _gates, _cells = sequence_forward(*args)
    return output, h_n, c_n


def sequence_backward(*args: Any) -> tuple[Tensor | None, ...]:
    """lltm::sequence_backward's outputs: the gradients ``output_mask`` asks for."""
    named = SequenceBackwardArgs(*args[:11])
    n = check_sequence_backward_args(named)
    wanted = check_output_mask(args[11])
    input, weights, old_h = named.input, named.weights, named.old_h
    grads = (
        _sequence_layout(input, n, n.features),
        weights.new_empty((3 * n.state, n.state + n.features)),
        weights.new_empty((3 * n.state,)),
        old_h.new_empty((n.batch, n.state)),
        old_h.new_empty((n.batch, n.state)),
    )
    return tuple(g if want else None for g, want in zip(grads, wanted, strict=True))


def sequence_gate_grads(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    """lltm::sequence_gate_grads's outputs: every step's gate gradients, those of the state."""
    named = SequenceBackwardArgs(*args[:11])
    n = check_sequence_backward_args(named)
    return (
        _sequence_layout(named.input, n, 3 * n.state),
        named.old_h.new_empty((n.batch, n.state)),
        named.old_h.new_empty((n.batch, n.state)),
    )


# --- FLOP formulas -------------------------------------------------------------------


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
    return product_flops(rows, 3 * s, s)


def sequence_forward_flops(
    input: Tensor, weights: Tensor, bias: Any, old_h: Tensor, old_cell: Tensor, *_: Any, **__: Any
) -> int:
    """lltm::sequence_forward's FLOPs."""
    rows, f, s = sizes(input, old_h)
    return product_flops(rows, s + f, 3 * s)


# The same products, whatever is kept of them.
sequence_inference_flops = sequence_forward_flops


def sequence_backward_flops(*args: Any, **_: Any) -> int:
    """lltm::sequence_backward's FLOPs."""
    named = SequenceBackwardArgs(*args[:11])
    rows, f, s = sizes(named.input, named.old_h)
    want_input, want_weights, want_bias, want_old_h, want_old_cell = args[11]
    first = _first_step_rows(named.old_h, named.batch_sizes, named.reverse)
    carried = rows if want_old_h else rows - first
    gradients = gradient_flops(
        rows, f, s, (want_input, want_weights, want_bias, False, want_old_cell)
    )
    return _step_products(carried, s) + gradients


def sequence_gate_grads_flops(*args: Any, **_: Any) -> int:
    """lltm::sequence_gate_grads's FLOPs."""
    named = SequenceBackwardArgs(*args[:11])
    rows, _f, s = sizes(named.input, named.old_h)
    return _step_products(rows, s)
