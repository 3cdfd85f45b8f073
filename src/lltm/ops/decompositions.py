"""Decompositions: lltm's forward operators as core ATen, for whoever asks for them.

A program exported with ``torch.export.export`` keeps lltm's operators, so that
AOTInductor, ``torch.compile`` and the exported module itself call the fused
kernels. Runtimes outside PyTorch have no lltm kernel: the ONNX exporter,
ExecuTorch's ``to_edge`` and ``ExportedProgram.run_decompositions()`` lower a
program to core ATen with a decomposition table built from
``torch.export.default_decompositions()``, and that table holds lltm's forward
operators. Lowered, they become:

* ``lltm::forward``: the cell's formula in plain torch (``_composite.forward``).
* ``lltm::sequence_forward``: the input projection of every step as one
  product ahead of the recurrence, then the recurrence alone as torch's
  ``scan`` over the steps: per step one ``addmm`` and the pointwise math. A
  scan holds the length as data, not as a count of unrolled steps, so one
  program (one ONNX Scan, one ExecuTorch loop) serves every length. A fixed
  length with a dynamic batch size is unrolled instead, as torch lowers
  nn.LSTM: ExecuTorch's loops cannot carry a state whose size changes (a
  dynamic length and batch together are an error there, not a program that
  answers with the wrong shape). ``gates`` and ``cells``, which only backward
  reads, are rebuilt after the recurrence from its outputs (one product and
  a cumulative sum: the LLTM's cell only accumulates), so a program that
  does not use them drops them.

16-bit inputs keep the kernels' arithmetic: products and pointwise math in
float32, pre-activations rounded once to the input's type, the state carried
in it. Packed sequences cannot be lowered (each step's batch size is data
that a static graph cannot follow): that is an error naming what to do.

How the table reaches the operators. ``default_decompositions()`` takes in
every operator with a CompositeImplicitAutograd kernel, custom ones too, and
its entry for such an operator is that kernel. Each forward operator
therefore gets a Python CompositeImplicitAutograd kernel, ``_in_table``: it
puts the operator in the table and declines wherever it is called (returns
NotImplemented), so that Inductor's table, which copies these entries, and
fake-tensor propagation keep the operator and its fake kernel.
``run_decompositions`` applies a table's entry for such an operator by
installing it as the operator's Python CompositeImplicitAutograd kernel
while it retraces the program through the Python dispatcher, with the
original kernel at the backend keys. A dispatcher only reaches a
CompositeImplicitAutograd kernel on devices with no kernel of their own, and
lltm's operators have kernels on every device; so lltm's Autograd kernels,
as the Python dispatcher sees them, look for that installation and apply the
entry: the decomposition below for ``_in_table``, the entry itself for a
table that brings its own, nothing for a table that leaves the operator out
(its entry, ``_special_op_to_preserve_cia``, declines). Outside a lowering
they run the operator's Autograd kernel as the dispatcher would.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._C import DispatchKey

from .. import _composite
from .._checks import check_sequence_args

try:  # torch's scan, a prototype in torch 2.10-2.15; its operator takes closures explicitly.
    from torch._higher_order_ops.scan import scan_op
except ImportError:  # pragma: no cover - every torch lltm supports has it
    scan_op = None  # type: ignore[assignment]


def _cell(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    return _composite.forward(input, weights, bias, old_h, old_cell)


def _sequence(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    if batch_sizes is not None:
        raise ValueError(
            "lltm: a packed sequence (lltm::sequence_forward with batch_sizes) cannot be "
            "lowered to core ATen, for ONNX, ExecuTorch or run_decompositions(): how many "
            "sequences each step updates is data, which the lowered graph cannot follow. "
            "Export the model on the padded batch instead (torch.nn.utils.rnn.pad_packed_sequence)"
        )
    n = check_sequence_args(input, weights, bias, old_h, old_cell, None)
    dtype, math = input.dtype, _composite.math_type(input)
    state = n.state
    w_x, w_h_t = weights[:, state:], weights[:, :state].t()
    if math != dtype:
        input, w_x, w_h_t = input.to(math), w_x.to(math), w_h_t.to(math)
        bias = None if bias is None else bias.to(math)
    # Every step's input projection in one product, ahead of the recurrence.
    projected = F.linear(input, w_x, bias)  # (T, B, 3S), in the math type
    # A scan: one loop over the steps, for any length. ExecuTorch's loops
    # cannot carry a state whose batch size changes, so a fixed length with
    # a dynamic batch size is unrolled instead, as torch lowers nn.LSTM.
    fixed_length = isinstance(n.steps, int)
    if fixed_length and (n.steps == 0 or not isinstance(n.batch, int)):
        output, h_n, c_n = _unrolled(projected, old_h, old_cell, w_h_t, reverse, dtype)
    else:
        output, h_n, c_n = _scanned(projected, old_h, old_cell, w_h_t, reverse, dtype)
    gates, cells = _gates_and_cells(projected, output, old_h, old_cell, w_h_t, reverse, dtype)
    return output, h_n, c_n, gates, cells


def _step(
    h: Tensor, c: Tensor, x_t: Tensor, w_h_t: Tensor, dtype: torch.dtype, split: bool
) -> tuple[Tensor, Tensor]:
    """One step from its input projection ``x_t``: (new_h, new_cell).

    The gates come apart by a split (one node in ONNX, where slices are
    three) when ``split``, else by slices (see _composite.gate_slices).
    """
    math = x_t.dtype
    pre = _rounded(torch.addmm(x_t, h.to(math), w_h_t), dtype)
    pre_i, pre_o, pre_g = pre.chunk(3, dim=-1) if split else _composite.gate_slices(pre)
    new_h, new_c, _, _ = _composite.step_forward(pre_i, pre_o, pre_g, c, math)
    return new_h.to(dtype), new_c.to(dtype)


def _unrolled(
    projected: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
    w_h_t: Tensor,
    reverse: bool,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """The steps one after the other, for a length fixed at export."""
    steps = projected.shape[0]
    h, c = old_h, old_cell
    outputs: list[Tensor] = [old_h] * steps
    for t in range(steps - 1, -1, -1) if reverse else range(steps):
        h, c = _step(h, c, projected[t], w_h_t, dtype, split=False)
        outputs[t] = h
    if steps == 0:
        return old_h.new_empty((0, *old_h.shape)), old_h.clone(), old_cell.clone()
    return torch.stack(outputs), h, c


def _scanned(
    projected: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
    w_h_t: Tensor,
    reverse: bool,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """The steps as one scan: any number of steps (an ONNX Scan, an ExecuTorch loop)."""
    if scan_op is None:  # pragma: no cover - every torch lltm supports has it
        raise RuntimeError("lltm: this torch has no scan operator to lower a dynamic length with")
    if not isinstance(old_h.shape[0], int) and _lowering_for_executorch():
        raise ValueError(
            "lltm: ExecuTorch cannot run an LLTM sequence whose length and batch size are both "
            "dynamic: a dynamic length becomes a loop, and ExecuTorch's loops keep their state "
            "at one batch size (its results would have the largest batch). Export with a fixed "
            "batch size (the length may stay dynamic) or a fixed length (the batch size may "
            "stay dynamic)"
        )

    def step(h: Tensor, c: Tensor, x_t: Tensor, w_h_t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # ExecuTorch only runs scans with a fixed batch size, where a split is fine.
        new_h, new_c = _step(h, c, x_t, w_h_t, dtype, split=True)
        return new_h, new_c, new_h.clone()  # an output may not alias a carry

    steps = projected.flip(0) if reverse else projected
    h_n, c_n, output = scan_op(step, [old_h.clone(), old_cell.clone()], [steps], (w_h_t,))
    return (output.flip(0) if reverse else output), h_n, c_n


def _lowering_for_executorch() -> bool:
    """Whether ExecuTorch (to_edge) is lowering the program being traced."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("executorch."):
            return True
        frame = frame.f_back
    return False


def _rounded(pre: Tensor, dtype: torch.dtype) -> Tensor:
    """Pre-activations of a 16-bit input, rounded once to it as the kernels round them.

    They are computed in float32; pre-activations of other inputs are
    returned unchanged.
    """
    return pre if pre.dtype == dtype else pre.to(dtype).to(pre.dtype)


def _gates_and_cells(
    projected: Tensor,
    output: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
    w_h_t: Tensor,
    reverse: bool,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """What the sequence's backward reads (gates, cells), for all steps at once.

    From the outputs: the state each step read is the output of the step
    before it.
    """
    math = projected.dtype
    first = old_h.unsqueeze(0)
    h_prev = torch.cat([output[1:], first]) if reverse else torch.cat([first, output[:-1]])
    pre = _rounded(projected + torch.matmul(h_prev.to(math), w_h_t), dtype)
    pre_i, pre_o, pre_g = _composite.gate_slices(pre)
    i, o = torch.sigmoid(pre_i), torch.sigmoid(pre_o)
    # No forget gate: each step's cell is the first one plus every increment so far.
    increments = F.elu(pre_g) * i
    summed = increments.flip(0).cumsum(0).flip(0) if reverse else increments.cumsum(0)
    cells = old_cell.to(math) + summed
    return torch.cat([i, o, pre_g], dim=-1).to(dtype), cells.to(dtype)


# --- Registration ----------------------------------------------------------------------

_IMPLICIT = DispatchKey.CompositeImplicitAutograd


def _in_table(*args: Any) -> Any:
    """The Python CompositeImplicitAutograd kernel of lltm's forward operators.

    It puts them in torch.export's default decomposition table, and declines
    wherever it is called (see the module's docstring).
    """
    _leave_to_inductor()
    return NotImplemented


def _leave_to_inductor() -> None:
    """Takes lltm's operators out of Inductor's decomposition tables.

    Inductor copies torch.export's default table into its own when it is
    first imported, lltm's entries with them if lltm was imported before.
    The entries decline, so Inductor keeps the operator and calls it as a
    fallback kernel, but it refuses a fallback for an operator its table
    decomposes. Inductor's tracing calls an entry before it lowers the graph,
    so removing them here comes in time.
    """
    inductor = sys.modules.get("torch._inductor.decomposition")
    if inductor is None:
        return
    tables = [getattr(inductor, "decompositions", {})]
    fast_random = getattr(inductor, "fast_random_decomps", None)
    if fast_random is not None:
        tables.append(fast_random())
    for table in tables:
        for op in _LOWERED:
            table.pop(op, None)


def _installed_entry(op: Any) -> Callable[..., Any] | None:
    """The table entry run_decompositions installed for ``op``, or None.

    While it retraces a program, run_decompositions installs the entry as the
    CompositeImplicitAutograd kernel and the original one at each backend key,
    where lltm registers no Python kernel of its own; outside, None.
    """
    if DispatchKey.CPU not in op.py_kernels:
        return None
    entry: Callable[..., Any] | None = op.py_kernels.get(_IMPLICIT)
    return entry


def _autograd_kernel(op: Any, decomposition: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any) -> Any:
        entry = _installed_entry(op)
        if entry is not None:
            result = decomposition(*args) if entry is _in_table else entry(*args)
            if result is not NotImplemented:
                return result
        # The operator's Autograd kernel, as the dispatcher would call it.
        return op._op_dk(DispatchKey.Autograd, *args)

    return kernel


# The Python dispatcher resolves the Autograd key per backend: one entry each.
_AUTOGRAD_KEYS = [
    getattr(DispatchKey, f"Autograd{device}")
    for device in ("CPU", "CUDA", "Meta", "XPU", "MPS", "HPU", "PrivateUse1")
    if hasattr(DispatchKey, f"Autograd{device}")
]

# Every operator with a decomposition: what _leave_to_inductor takes out of
# Inductor's tables.
_LOWERED: dict[Any, Callable[..., Any]] = {}


def register(op: Any, decomposition: Callable[..., Any]) -> None:
    """Makes ``decomposition`` the core ATen lowering of forward operator ``op``.

    See the module's docstring.
    """
    _LOWERED[op] = decomposition
    op.py_impl(_IMPLICIT)(_in_table)
    for key in _AUTOGRAD_KEYS:
        op.py_impl(key)(_autograd_kernel(op, decomposition))


def cell(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """lltm::forward in core ATen: the cell's formula in plain torch."""
    return _cell(input, weights, bias, old_h, old_cell)


def sequence(*args: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """lltm::sequence_forward in core ATen: one input projection, then a loop over the steps."""
    return _sequence(*args)
