"""The sequence's forward operator as core ATen: the graphs ONNX and ExecuTorch run.

The lowering of ``lltm::sequence_forward`` (ops/decompositions.py says how
it reaches the exporters), built from the cell's (cell_ops/lowering.py): it
computes what the kernels compute, every output in the input's type, the
state carried in it. Three forms, for what the program's consumer runs
best; which one follows from the program's sizes and from one public flag,
whether torch.onnx.export is running (``torch.onnx.is_in_onnx_export()``).
Every other lowering (run_decompositions(), ExecuTorch's to_edge and
to_edge_transform_and_lower, in any order) gets the same graphs, which
ExecuTorch runs correctly at every size the export allows:

* **Unrolled** (a length fixed at export, outside ONNX): the steps one after
  the other, each the cell's own product ``[h, x_t] @ weights.T + bias``, as
  torch lowers nn.LSTM. ExecuTorch's XNNPACK partitioner takes every product
  and activation (the product reads the weights as they are, which it
  needs), and every output of every step is at hand.
* **Scanned**: per gate, the input projection of every step as one product
  ahead of the recurrence, then the recurrence alone as torch's ``scan``
  over the steps (an ONNX Scan, an ExecuTorch loop), per step a product per
  gate and the pointwise math. A scan holds the length as data, so one
  program serves every length. torch.onnx.export always gets this form:
  onnxruntime runs its Scan faster than as many unrolled steps.
* **Scanned at the batch's bound** (a dynamic length and batch size, outside
  ONNX): ExecuTorch's loops keep their carried state, and their stacked
  outputs, at the size planned for them and cannot resize them; so the
  carried state has the batch size's upper bound as its rows, and each step
  reads and writes the first ``batch`` of them.

Packed sequences cannot be lowered (each step's batch size is data that a
static graph cannot follow): that is an error naming what to do.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import _probes
from ..cell_ops.composite import math_type
from ..cell_ops.lowering import elu, product, rounded, step, update
from .contract import check_sequence_args

Outputs = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


def sequence_forward(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
    allow_tf32: bool = False,
) -> Outputs:
    """``lltm::sequence_forward`` in core ATen: (output, h_n, c_n, gates, cells).

    Unrolled or scanned (see the module's docstring); a packed sequence is
    an error.
    """
    if batch_sizes is not None:
        raise ValueError(
            "lltm: a packed sequence (lltm::sequence_forward with batch_sizes) cannot be "
            "lowered to core ATen, for ONNX, ExecuTorch or run_decompositions(): how many "
            "sequences each step updates is data, which the lowered graph cannot follow. "
            "Export the model on the padded batch with its lengths instead "
            "(LLTMSequence(padded, state, lengths), lltm_sequence(..., lengths))"
        )
    for_onnx = _exporting_to_onnx()  # any shape scans
    n = check_sequence_args(input, weights, bias, old_h, old_cell, None)
    fixed_length = isinstance(n.steps, int)
    if n.steps == 0 or (fixed_length and not for_onnx) or _probes.scan_op is None:
        if not fixed_length:
            raise ValueError(
                "lltm: this torch has no scan operator (torch._higher_order_ops.scan), which "
                "lowering an LLTM sequence with a dynamic length needs; export it with a fixed "
                "length"
            )
        return _unrolled(input, weights, bias, old_h, old_cell, reverse)
    bound = None
    if not (for_onnx or isinstance(n.batch, int)):
        bound = _probes.upper_bound(n.batch)
        if bound is None:
            raise ValueError(
                "lltm: lowering an LLTM sequence whose length and batch size are both dynamic "
                "(run_decompositions(), ExecuTorch's to_edge) needs an upper bound for the batch "
                "size: ExecuTorch's loops keep their state at a size fixed when the program is "
                "planned, so the lowered loop keeps it at the bound. Export with "
                "torch.export.Dim('batch', max=...) (torch.onnx.export needs no bound)"
            )
    return _scanned(input, weights, bias, old_h, old_cell, reverse, bound)


def sequence_inference(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``lltm::sequence_inference`` in core ATen: sequence_forward's (output, h_n, c_n).

    A consumer that does not use the gates and cells drops their graph.
    """
    output, h_n, c_n, _gates, _cells = sequence_forward(*args)
    return output, h_n, c_n


def _exporting_to_onnx() -> bool:
    """Whether torch.onnx.export is running (torch.onnx is imported only when used)."""
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and bool(onnx.is_in_onnx_export())


def _unrolled(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    reverse: bool,
) -> Outputs:
    """The steps one after the other, for a length fixed at export."""
    steps, dtype, math = input.shape[0], input.dtype, math_type(input)
    if steps == 0:
        empty = old_h.new_empty((0, *old_h.shape))
        no_gates = old_h.new_empty((0, old_h.shape[0], 3 * old_h.shape[1]))
        return empty, old_h.clone(), old_cell.clone(), no_gates, empty.clone()
    if math != dtype:  # cast once, not at every step
        weights = weights.to(math)
        bias = None if bias is None else bias.to(math)
    h, c = old_h, old_cell
    outputs, cells, gates = [old_h] * steps, [old_cell] * steps, [old_h] * steps
    for t in range(steps - 1, -1, -1) if reverse else range(steps):
        pre = product(torch.cat([h, input[t]], dim=1), weights, bias, math, dtype)
        h, c, step_gates = step(pre, c, math, dtype)
        outputs[t], cells[t], gates[t] = h, c, step_gates
    return torch.stack(outputs), h, c, torch.stack(gates), torch.stack(cells)


def _scanned(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    reverse: bool,
    bound: int | None,
) -> Outputs:
    """The steps as one scan: any number of steps.

    ``bound``: the carried state's rows, the batch size's upper bound (None:
    the batch size).
    """
    dtype, math = input.dtype, math_type(input)
    batch, state = old_h.shape
    if math != dtype:
        input, weights = input.to(math), weights.to(math)
        bias = None if bias is None else bias.to(math)
    # Per gate, every step's input projection in one product ahead of the
    # recurrence, and the recurrent weights. Three products a step rather
    # than one and a split: onnxruntime fuses each with its activation, and
    # runs the step a twentieth faster.
    gate_rows = [slice(k * state, (k + 1) * state) for k in range(3)]
    projected = [
        F.linear(input, weights[rows, state:], None if bias is None else bias[rows])
        for rows in gate_rows
    ]
    # Copies, not views: a scan's inputs may not alias each other.
    recurrent = [weights[rows, :state].t().contiguous() for rows in gate_rows]
    # The cells are the carried state. Rounded to a 16-bit type at every
    # step, they come out of the loop; otherwise they are the running sum
    # of the increments, rebuilt after it (a program that does not use them
    # drops that). With a bound, ExecuTorch needs every output of the loop
    # at it: they come out of the loop too.
    cells_out = bound is not None or math != dtype
    # With a bound, the carried state has `bound` rows and the batch's are the
    # first `batch`: read and written through their indices, so that the loop
    # holds no arithmetic on sizes (which torch's scan cannot retrace).
    rows: tuple[Tensor, ...] = () if bound is None else (_row_indices(batch, state, old_h.device),)

    def scan_step(h: Tensor, c: Tensor, *xs_and_more: Tensor) -> tuple[Tensor, ...]:
        x_i, x_o, x_g, w_i, w_o, w_g, *index = xs_and_more
        carried_h, carried_c = h, c
        if index:
            h, c = h.gather(0, index[0]), c.gather(0, index[0])
        h = h.to(math)
        pre_i, pre_o, pre_g = (
            rounded(torch.mm(h, w) + x, dtype) for x, w in ((x_i, w_i), (x_o, w_o), (x_g, w_g))
        )
        new_h, new_cell, _, _ = update(pre_i, pre_o, pre_g, c, math)
        new_h, new_cell = new_h.to(dtype), new_cell.to(dtype)
        if index:
            new_h = carried_h.scatter(0, index[0], new_h)
            new_cell = carried_c.scatter(0, index[0], new_cell)
        # A scan's outputs may not alias its carried state: copies of it.
        return new_h, new_cell, new_h.clone(), *((new_cell.clone(),) if cells_out else ())

    if bound is None:
        h_0, c_0 = old_h.clone(), old_cell.clone()
    else:
        h_0, c_0 = _padded(old_h, bound, rows[0]), _padded(old_cell, bound, rows[0])
    xs = [x.flip(0) for x in projected] if reverse else projected
    h_n, c_n, output, *cells = _probes.scan_op(scan_step, [h_0, c_0], xs, (*recurrent, *rows))
    if bound is not None:
        # Selected rather than sliced: export would assume a slice's end is
        # not the bound (a view of less than the whole).
        batch_rows = torch.arange(batch, device=old_h.device)
        h_n, c_n = h_n.index_select(0, batch_rows), c_n.index_select(0, batch_rows)
        output, cells = output.index_select(1, batch_rows), [cells[0].index_select(1, batch_rows)]
    if reverse:
        output, cells = output.flip(0), [c.flip(0) for c in cells]
    gates, increments = _gates(projected, recurrent, output, old_h, reverse, dtype)
    if not cells:
        # The kernels' running sum, in their order: c_0 + inc_1, then + inc_2, ...
        ordered = increments.flip(0) if reverse else increments
        summed = torch.cat([old_cell.unsqueeze(0), ordered]).cumsum(0)[1:]
        cells = [summed.flip(0) if reverse else summed]
    return output, h_n, c_n, gates, cells[0]


def _row_indices(batch: int, state: int, device: torch.device) -> Tensor:
    """(batch, state) indices of the first ``batch`` rows, for gather and scatter."""
    rows = torch.arange(batch, device=device).unsqueeze(1)
    return rows.expand(batch, state).contiguous()  # ExecuTorch takes no zero strides


def _padded(rows: Tensor, bound: int, index: Tensor) -> Tensor:
    """``rows`` as the first rows of ``bound`` rows, zeros after them."""
    return rows.new_zeros((bound, rows.shape[1])).scatter(0, index, rows)


def _gates(
    projected: list[Tensor],
    recurrent: list[Tensor],
    output: Tensor,
    old_h: Tensor,
    reverse: bool,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """Every step's gates and cell increments, rebuilt after the recurrence.

    From its outputs: the state each step read is the output of the step
    before it. Only backward reads the gates: a program that does not use
    them drops this.
    """
    math = projected[0].dtype
    first = old_h.unsqueeze(0)
    h_prev = (torch.cat([output[1:], first]) if reverse else torch.cat([first, output[:-1]])).to(
        math
    )
    pre_i, pre_o, pre_g = (
        rounded(x + torch.matmul(h_prev, w), dtype)
        for x, w in zip(projected, recurrent, strict=True)
    )
    i, o = torch.sigmoid(pre_i), torch.sigmoid(pre_o)
    return torch.cat([i, o, pre_g], dim=-1).to(dtype), elu(pre_g) * i
