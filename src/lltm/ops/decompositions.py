"""How the forward operators' lowerings to core ATen reach whoever asks for them.

A program exported with ``torch.export.export`` keeps lltm's operators, so that
AOTInductor, ``torch.compile`` and the exported module itself call the fused
kernels. Runtimes outside PyTorch have no lltm kernel: the ONNX exporter,
ExecuTorch's ``to_edge`` and ``ExportedProgram.run_decompositions()`` lower a
program to core ATen with a decomposition table built from
``torch.export.default_decompositions()``, and that table holds lltm's forward
operators. Lowered, they become the graphs of each family's lowering.py
(named by the ``decomposition`` of their table entries): the cell's
formula, and a sequence's steps unrolled (a length fixed at export) or in
one loop (torch's ``scan``: any length).

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
entry: the operator's lowering for ``_in_table``, the entry itself for a
table that brings its own, nothing for a table that leaves the operator out
(its entry, ``_special_op_to_preserve_cia``, declines). Outside a lowering
they run the operator's Autograd kernel as the dispatcher would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _probes

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
