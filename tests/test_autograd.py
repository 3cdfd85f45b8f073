"""Autograd and torch.compile integration of lltm::forward / lltm::backward."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import (
    ARG_NAMES,
    GRAD_NAMES,
    INDUCTOR,
    OUTPUT_NAMES,
    assert_all_close,
    make_backward_args,
    make_inputs,
    run_cell,
)
from torch.utils._python_dispatch import TorchDispatchMode

import lltm
from lltm import reference

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

GRADCHECK_SHAPES = [(1, 1, 1), (2, 3, 4), (3, 5, 7), (0, 2, 3)]


@pytest.mark.parametrize("shape", GRADCHECK_SHAPES, ids=str)
def test_gradcheck_functional(shape):
    inputs = make_inputs(*shape, requires_grad=True)
    assert torch.autograd.gradcheck(lltm.lltm_cell, inputs)


@pytest.mark.parametrize("shape", GRADCHECK_SHAPES, ids=str)
def test_gradcheck_op(shape):
    # The op's third output (gates) is non-differentiable: gradcheck must
    # accept it and skip it.
    inputs = make_inputs(*shape, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.lltm.forward, inputs)


@pytest.mark.parametrize("needs_grad", [(0,), (1, 2), (3, 4), (0, 3, 4)], ids=str)
def test_gradcheck_some_inputs(needs_grad):
    # e.g. a module: only weights and bias are leaves that want gradients.
    inputs = make_inputs(2, 3, 4)
    for i in needs_grad:
        inputs[i].requires_grad_()
    assert torch.autograd.gradcheck(lltm.lltm_cell, inputs)


def test_gates_output_is_not_differentiable():
    # The saved activations only feed backward (a torch.compile'd backward
    # would otherwise be traced for their gradients too).
    _, _, gates = torch.ops.lltm.forward(*make_inputs(2, 3, 4, requires_grad=True))
    assert not gates.requires_grad


def test_no_grad_for_inputs_that_do_not_require_it():
    input, weights, bias, old_h, old_cell = make_inputs(2, 3, 4)
    weights.requires_grad_()
    new_h, new_cell = lltm.lltm_cell(input, weights, bias, old_h, old_cell)
    (new_h.sum() + new_cell.sum()).backward()
    assert weights.grad is not None
    assert all(t.grad is None for t in (input, bias, old_h, old_cell))


@pytest.mark.parametrize("used", ["new_h", "new_cell"])
def test_only_one_output_used(used):
    # The other output receives no gradient (None): the kernel must treat it
    # as zero, not read garbage.
    inputs = make_inputs(3, 5, 7, requires_grad=True)

    def pick(cell):
        new_h, new_cell = cell(*inputs)
        out = new_h if used == "new_h" else new_cell
        return torch.autograd.grad(
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), inputs
        )

    assert_all_close(pick(lltm.lltm_cell), pick(reference.lltm_cell), GRAD_NAMES)


def test_gradgradcheck():
    # create_graph=True must give gradients that are themselves correct
    # (gradient penalties, Hessian-vector products), not constants.
    inputs = make_inputs(2, 3, 4, requires_grad=True)
    assert torch.autograd.gradgradcheck(lltm.lltm_cell, inputs)


def test_create_graph_matches_reference():
    inputs = make_inputs(3, 4, 5, requires_grad=True)

    def penalty(cell):
        new_h, new_cell = cell(*inputs)
        grads = torch.autograd.grad(new_h.sum() + new_cell.pow(2).sum(), inputs, create_graph=True)
        first = [g.detach() for g in grads]
        second = torch.autograd.grad(sum(g.pow(2).sum() for g in grads), inputs)
        return first + list(second)

    names = [f"d{n}" for n in GRAD_NAMES] + [f"d2{n}" for n in GRAD_NAMES]
    assert_all_close(penalty(lltm.lltm_cell), penalty(reference.lltm_cell), names)


# --- create_graph=True against the native backward ---------------------------------
# With create_graph=True the gradients must be differentiable: backward then
# recomputes the step in plain torch (the families' composite.py, lltm/ops) instead of calling
# lltm::backward. The tests above compare the second derivatives with the
# reference's. Here the first-order gradients of that path are held to the
# native kernel, for every subset of inputs that require grad and both entry
# points (lltm_cell and torch.ops.lltm.forward).


class _RecordOps(TorchDispatchMode):
    """The lltm ops that run, by name."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "lltm":
            self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


SUBSETS = [s for s in itertools.product([False, True], repeat=5) if any(s)]


def _subset_id(subset):
    return "+".join(n for n, want in zip(ARG_NAMES, subset, strict=True) if want)


def _cell_entry_points():
    def op(*args):
        new_h, new_cell, _ = torch.ops.lltm.forward(*args)
        return new_h, new_cell

    return {"lltm_cell": lltm.lltm_cell, "op": op}


def _gradients(fn, inputs, subset, create_graph, outputs_used=(True, True)):
    leaves = [t.detach().clone().requires_grad_(r) for t, r in zip(inputs, subset, strict=True)]
    wanted = [t for t in leaves if t.requires_grad]
    outputs = fn(*leaves)
    generator = torch.Generator().manual_seed(3)
    cotangents = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in outputs]
    pairs = [(o, g) for o, g, used in zip(outputs, cotangents, outputs_used, strict=True) if used]
    with _RecordOps() as recorder:
        grads = torch.autograd.grad(
            [o for o, _ in pairs], wanted, [g for _, g in pairs], create_graph=create_graph
        )
    return grads, recorder.ops


@pytest.mark.parametrize("entry", ["lltm_cell", "op"])
@pytest.mark.parametrize("subset", SUBSETS, ids=_subset_id)
def test_create_graph_gradients_equal_the_native_backward(subset, entry):
    fn = _cell_entry_points()[entry]
    inputs = make_inputs(3, 4, 5, seed=11)
    native, native_ops = _gradients(fn, inputs, subset, create_graph=False)
    recomputed, recomputed_ops = _gradients(fn, inputs, subset, create_graph=True)
    # The two paths are what they claim to be: the kernel, then the recomputation.
    assert native_ops == ["backward"]
    assert "backward" not in recomputed_ops
    assert all(g.requires_grad for g in recomputed)
    names = [n for n, want in zip(GRAD_NAMES, subset, strict=True) if want]
    assert_all_close([g.detach() for g in recomputed], native, names, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("used", [(True, False), (False, True)], ids=["new_h", "new_cell"])
def test_create_graph_with_one_output_unused(used):
    inputs = make_inputs(3, 4, 5, seed=12)
    subset = (True, False, True, True, False)
    native, _ = _gradients(lltm.lltm_cell, inputs, subset, False, used)
    recomputed, _ = _gradients(lltm.lltm_cell, inputs, subset, True, used)
    names = [n for n, want in zip(GRAD_NAMES, subset, strict=True) if want]
    assert_all_close([g.detach() for g in recomputed], native, names, rtol=1e-12, atol=1e-12)


def _sequence_entry_points(batch_sizes, reverse):
    def eager(*args):
        return lltm.ops.sequence(*args, batch_sizes, reverse)

    def op(*args):
        return torch.ops.lltm.sequence_forward(*args, batch_sizes, reverse)[:3]

    return {"sequence": eager, "op": op}


def _sequence_inputs(case):
    generator = torch.Generator().manual_seed(13)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale

    weights, bias = randn(15, 8, scale=0.4), randn(15, scale=0.4)
    h, c = randn(4, 5), randn(4, 5)
    if case.startswith("packed"):
        batch_sizes = torch.tensor([4, 3, 3, 1])
        return [randn(11, 3), weights, bias, h, c], batch_sizes, case.endswith("reverse")
    steps = 0 if case.startswith("no_steps") else 4
    return [randn(steps, 4, 3), weights, bias, h, c], None, case.endswith("reverse")


SEQUENCE_SUBSETS = [
    (True, True, True, True, True),
    (False, True, True, False, False),
    (True, False, False, True, False),
    (False, False, False, False, True),
]


@pytest.mark.parametrize("entry", ["sequence", "op"])
@pytest.mark.parametrize("subset", SEQUENCE_SUBSETS, ids=_subset_id)
@pytest.mark.parametrize(
    "case", ["padded", "padded_reverse", "packed", "packed_reverse", "no_steps", "no_steps_reverse"]
)
def test_sequence_create_graph_gradients_equal_the_native_backward(case, subset, entry):
    inputs, batch_sizes, reverse = _sequence_inputs(case)
    fn = _sequence_entry_points(batch_sizes, reverse)[entry]
    used = (True, True, True)
    native, native_ops = _gradients(fn, inputs, subset, False, used)
    recomputed, recomputed_ops = _gradients(fn, inputs, subset, True, used)
    assert native_ops == ["sequence_backward"]
    assert "sequence_backward" not in recomputed_ops
    if not case.startswith("no_steps"):
        # Without steps (h_n = old_h, c_n = old_cell) every gradient is a
        # constant, as in plain torch; otherwise each depends on the inputs.
        assert all(g.requires_grad for g in recomputed)
    names = [n for n, want in zip(GRAD_NAMES, subset, strict=True) if want]
    assert_all_close([g.detach() for g in recomputed], native, names, rtol=1e-12, atol=1e-12)


# --- torch.library.opcheck ----------------------------------------------------


def _forward_args(shape, dtype=torch.float64, requires_grad=False, seed=0):
    return tuple(make_inputs(*shape, dtype=dtype, requires_grad=requires_grad, seed=seed))


def _backward_args(shape, dtype=torch.float64, requires_grad=False):
    *tensors, mask = make_backward_args(make_inputs(*shape, dtype=dtype))
    return (*(t.clone().requires_grad_(requires_grad) for t in tensors), mask)


def _partly_requiring_grad():
    args = _forward_args((2, 3, 4))
    args[1].requires_grad_()
    args[2].requires_grad_()
    return args


FORWARD_OPCHECK_ARGS = {
    "plain": lambda: _forward_args((2, 3, 4)),
    "requires_grad": lambda: _forward_args((3, 5, 7), requires_grad=True),
    "partly_requires_grad": _partly_requiring_grad,
    "empty_batch": lambda: _forward_args((0, 3, 4), requires_grad=True),
    "float32": lambda: _forward_args((4, 6, 8), dtype=torch.float32, requires_grad=True),
    "bfloat16": lambda: _forward_args((2, 3, 4), dtype=torch.bfloat16),
}
BACKWARD_OPCHECK_ARGS = {
    "plain": lambda: _backward_args((2, 3, 4)),
    "requires_grad": lambda: _backward_args((3, 5, 7), requires_grad=True),
    "empty_batch": lambda: _backward_args((0, 3, 4)),
    "float32": lambda: _backward_args((4, 6, 8), dtype=torch.float32),
}


@pytest.mark.parametrize("make_args", FORWARD_OPCHECK_ARGS.values(), ids=FORWARD_OPCHECK_ARGS)
def test_opcheck_forward(make_args):
    torch.library.opcheck(torch.ops.lltm.forward.default, make_args())


@pytest.mark.parametrize("make_args", BACKWARD_OPCHECK_ARGS.values(), ids=BACKWARD_OPCHECK_ARGS)
def test_opcheck_backward(make_args):
    torch.library.opcheck(torch.ops.lltm.backward.default, make_args())


@pytest.mark.parametrize("make_args", BACKWARD_OPCHECK_ARGS.values(), ids=BACKWARD_OPCHECK_ARGS)
def test_backward_op_outputs_have_no_history_without_differentiation(make_args):
    # The kernels never create autograd history of their own: under no_grad
    # (as in a first-order backward) nothing requires grad.
    with torch.no_grad():
        grads = torch.ops.lltm.backward.default(*make_args())
    assert len(grads) == 5
    assert not any(g.requires_grad or g.grad_fn is not None for g in grads)


def test_backward_op_is_differentiable():
    # A gradient that is differentiated again (double backward, Hessians)
    # differentiates lltm::backward in all its tensor arguments.
    *tensors, mask = _backward_args((2, 3, 4), requires_grad=True)

    def call(*args):
        return tuple(g for g in torch.ops.lltm.backward(*args, mask) if g is not None)

    assert torch.autograd.gradcheck(call, tensors, check_forward_ad=True)


# The kernels for CPU tensors, reached in grad mode with autograd live: the
# dispatcher goes straight to the CPU key and nothing turns autograd off on
# the way, as through a fallthrough at the Autograd key.
_CPU_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("case", ["padded", "packed_reverse"])
def test_sequence_backward_kernels_record_no_history(case, layout):
    # Whatever lltm's Autograd kernels make of a call (they differentiate the
    # backward operators in their own arguments), the kernels must not record
    # autograd history themselves: on arguments that all require grad, their
    # outputs need none. A kernel that copies an upstream gradient through
    # torch's dispatcher (the running gradients start as grad_h_n and
    # grad_c_n) records the copy.
    inputs, batch_sizes, reverse = _sequence_inputs(case)
    output, h_n, c_n, gates, cells = torch.ops.lltm.sequence_forward(*inputs, batch_sizes, reverse)
    generator = torch.Generator().manual_seed(5)
    upstream = [
        torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in (output, h_n, c_n)
    ]
    if layout == "transposed":  # the kernels then make contiguous copies first
        upstream = [t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in upstream]
    saved = (output, gates, cells, inputs[0], inputs[1], inputs[3])
    args = [t.detach().requires_grad_() for t in (*upstream, *saved)]
    assert torch.is_grad_enabled()
    for op, mask in (
        (torch.ops.lltm.sequence_backward.default, [[True] * 5]),
        (torch.ops.lltm.sequence_gate_grads.default, []),
    ):
        grads = op.redispatch(_CPU_KERNEL, *args, batch_sizes, reverse, *mask)
        assert not any(g.requires_grad or g.grad_fn is not None for g in grads if g is not None)


# --- torch.compile --------------------------------------------------------------


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("backend", ["aot_eager", INDUCTOR])
def test_compile_functional_matches_eager(backend):
    compiled = torch.compile(lltm.lltm_cell, backend=backend, fullgraph=True)
    for shape in [(3, 5, 7), (16, 32, 128)]:
        inputs = make_inputs(*shape)
        out, grads = run_cell(compiled, inputs)
        ref_out, ref_grads = run_cell(lltm.lltm_cell, inputs)
        assert_all_close(out + grads, ref_out + ref_grads, OUTPUT_NAMES + GRAD_NAMES)


@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_has_no_graph_break():
    inputs = make_inputs(3, 5, 7, requires_grad=True)
    explanation = torch._dynamo.explain(lltm.lltm_cell)(*inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1

    rnn = lltm.LLTM(5, 7).double()
    x, _, _, h, c = inputs
    explanation = torch._dynamo.explain(rnn)(x, (h, c))
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_module_fullgraph_matches_eager():
    torch.manual_seed(0)
    rnn = lltm.LLTM(5, 7).double()
    compiled = torch.compile(rnn, backend="aot_eager", fullgraph=True)
    x, _, _, h, c = make_inputs(4, 5, 7)

    def step(module):
        module.zero_grad()
        new_h, new_c = module(x, (h, c))
        (new_h * 2 + new_c).sum().backward()
        return [new_h.detach(), new_c.detach(), rnn.weights.grad.clone(), rnn.bias.grad.clone()]

    names = ("new_h", "new_cell", "grad_weights", "grad_bias")
    assert_all_close(step(compiled), step(rnn), names)


@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_sequence_loop_fullgraph():
    # A whole unrolled sequence in one graph: the op composes with itself.
    _, weights, bias, h, c = make_inputs(2, 3, 4, requires_grad=True)
    steps = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def unroll(weights, bias, h, c):
        for t in range(steps.shape[0]):
            h, c = lltm.lltm_cell(steps[t], weights, bias, h, c)
        return h, c

    compiled = torch.compile(unroll, backend="aot_eager", fullgraph=True)
    inputs = [weights, bias, h, c]
    out, grads = run_cell(compiled, inputs)
    ref_out, ref_grads = run_cell(unroll, inputs)
    assert_all_close(out + grads, ref_out + ref_grads, ("h", "c", "dw", "db", "dh", "dc"))


@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_dynamic_shapes_no_recompile():
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lltm.lltm_cell, backend=counter, fullgraph=True, dynamic=True)
    for shape in [(3, 5, 7), (6, 5, 7), (9, 2, 11)]:
        inputs = make_inputs(*shape)
        out, grads = run_cell(compiled, inputs)
        ref_out, ref_grads = run_cell(lltm.lltm_cell, inputs)
        assert_all_close(out + grads, ref_out + ref_grads, OUTPUT_NAMES + GRAD_NAMES)
    # Symbolic batch, features and state: one graph serves them all.
    assert counter.frame_count == 1


def test_create_graph_through_steps_that_share_weights():
    # Three steps of one cell: with create_graph=True the gradients are the
    # same as without, and as the reference's (the earlier steps' paths to the
    # shared weights counted once, not again through each step's own inputs).
    _, weights, bias, h, c = make_inputs(2, 3, 5, requires_grad=True, seed=21)
    steps = torch.randn(3, 2, 3, generator=torch.Generator().manual_seed(22), dtype=torch.float64)

    def grads(cell, create_graph):
        new_h, new_c = h, c
        for x in steps:
            new_h, new_c = cell(x, weights, bias, new_h, new_c)
        loss = (new_h * new_c).sum()
        return torch.autograd.grad(loss, (weights, bias, h, c), create_graph=create_graph)

    names = ("grad_weights", "grad_bias", "grad_h", "grad_c")
    first_order = grads(lltm.lltm_cell, False)
    assert_all_close([g.detach() for g in grads(lltm.lltm_cell, True)], first_order, names)
    assert_all_close(first_order, grads(reference.lltm_cell, False), names)
