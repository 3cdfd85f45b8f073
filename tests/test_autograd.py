"""Autograd and torch.compile integration of lltm::forward / lltm::backward."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    GRAD_NAMES,
    OUTPUT_NAMES,
    assert_all_close,
    make_backward_args,
    make_inputs,
    run_cell,
)

import lltm
from lltm import reference

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
def test_backward_op_outputs_never_require_grad(make_args):
    # lltm::backward has no derivative of its own (double backward recomputes
    # the step instead): differentiating through a direct call must fail
    # loudly, not treat the gradients as constants.
    grads = torch.ops.lltm.backward.default(*make_args())
    assert len(grads) == 5
    assert not any(g.requires_grad for g in grads)


# --- torch.compile --------------------------------------------------------------


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
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
