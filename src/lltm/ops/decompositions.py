"""Decompositions: lltm's forward operators as core ATen, for whoever asks for them.

A program exported with ``torch.export.export`` keeps lltm's operators, so that
AOTInductor, ``torch.compile`` and the exported module itself call the fused
kernels. Runtimes outside PyTorch have no lltm kernel: the ONNX exporter,
ExecuTorch's ``to_edge`` and ``ExportedProgram.run_decompositions()`` lower a
program to core ATen with a decomposition table built from
``torch.export.default_decompositions()``, and that table holds lltm's forward
operators. Lowered, they become the graphs of ``lowered.py``: the cell's
formula, and a sequence's steps unrolled (a length fixed at export) or in
one loop (torch's ``scan``: any length). Which graph follows from the
program's sizes and from one public flag: whether torch.onnx.export is
running (``torch.onnx.is_in_onnx_export()``), for which a loop serves every
shape best. Every other lowering (run_decompositions(), ExecuTorch's to_edge
and to_edge_transform_and_lower, in any order) gets the same graphs, which
ExecuTorch runs correctly at every size the export allows.
Packed sequences cannot be lowered (each step's batch size is data that a
static graph cannot follow): that is an error naming what to do.

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
from typing import Any

from torch import Tensor

from .. import _probes
from . import lowered


def sequence(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None,
    reverse: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """lltm::sequence_forward in core ATen: the input projection, then the steps (lowered.py)."""
    if batch_sizes is not None:
        raise ValueError(
            "lltm: a packed sequence (lltm::sequence_forward with batch_sizes) cannot be "
            "lowered to core ATen, for ONNX, ExecuTorch or run_decompositions(): how many "
            "sequences each step updates is data, which the lowered graph cannot follow. "
            "Export the model on the padded batch instead (torch.nn.utils.rnn.pad_packed_sequence)"
        )
    return lowered.sequence(
        input, weights, bias, old_h, old_cell, reverse, for_onnx=_exporting_to_onnx()
    )


def _exporting_to_onnx() -> bool:
    """Whether torch.onnx.export is running (torch.onnx is imported only when used)."""
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and bool(onnx.is_in_onnx_export())


# --- Registration ----------------------------------------------------------------------

_IMPLICIT = "CompositeImplicitAutograd"


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
    for table in _probes.inductor_decomposition_tables():
        for op in _LOWERED:
            table.pop(op, None)


def _installed_entry(op: Any) -> Callable[..., Any] | None:
    """The table entry run_decompositions installed for ``op``, or None.

    While it retraces a program, run_decompositions installs the entry as the
    CompositeImplicitAutograd kernel and the original one at each backend key,
    where lltm registers no Python kernel of its own; outside, None.
    """
    if _probes.python_kernel(op, "CPU") is None:
        return None
    return _probes.python_kernel(op, _IMPLICIT)


def _autograd_kernel(op: Any, decomposition: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any) -> Any:
        entry = _installed_entry(op)
        if entry is not None:
            result = decomposition(*args) if entry is _in_table else entry(*args)
            if result is not NotImplemented:
                return result
        # The operator's Autograd kernel, as the dispatcher would call it.
        return _probes.call_kernel(op, "Autograd", *args)

    return kernel


# The Python dispatcher resolves the Autograd key per backend: one entry each.
_AUTOGRAD_KEYS = _probes.dispatch_key_names(
    tuple(
        f"Autograd{device}"
        for device in ("CPU", "CUDA", "Meta", "XPU", "MPS", "HPU", "PrivateUse1")
    )
)

# Every operator with a decomposition: what _leave_to_inductor takes out of
# Inductor's tables.
_LOWERED: set[Any] = set()


def register(op: Any, decomposition: Callable[..., Any]) -> None:
    """Makes ``decomposition`` the core ATen lowering of forward operator ``op``.

    See the module's docstring. Without Python kernels (a torch that moved
    them: lltm/_probes.py), run_decompositions() keeps the operator.
    """
    _LOWERED.add(op)
    if not _probes.python_kernels():
        return
    _probes.add_python_kernel(op, _IMPLICIT, _in_table)
    for key in _AUTOGRAD_KEYS:
        _probes.add_python_kernel(op, key, _autograd_kernel(op, decomposition))
