"""Gradients only where needed: lltm::backward's output_mask, end to end.

Every subset of the five arguments may require grad. For each, autograd must
ask lltm::backward for exactly that subset (so frozen weights cost no
weight-gradient GEMM and inputs without grad no ``d_gates @ W``), and the
gradients must match the float64 reference. The op itself, its composite
and its fake kernel return None exactly where the mask says so.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import ARG_NAMES, GRAD_NAMES, make_backward_args, make_grad_outputs, make_inputs
from torch.utils._python_dispatch import TorchDispatchMode

import lltm
from lltm import reference
from lltm.ops.cell_ops import composite as cell_composite

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

SHAPE = (5, 3, 7)
MASKS = [list(mask) for mask in itertools.product([False, True], repeat=5)]


def _mask_id(mask):
    return "+".join(name for name, want in zip(ARG_NAMES, mask, strict=True) if want) or "none"


class _RecordBackwardMasks(TorchDispatchMode):
    """Records the output_mask of every lltm::backward call."""

    def __init__(self):
        super().__init__()
        self.masks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.lltm.backward.default:
            self.masks.append(list(args[7]))
        return func(*args, **(kwargs or {}))


def _grads(cell, inputs, mask):
    """new_h, new_cell and the gradients of the arguments that require grad."""
    leaves = [t.detach().clone().requires_grad_(want) for t, want in zip(inputs, mask, strict=True)]
    outputs = cell(*leaves)
    wanted = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad(outputs, wanted, make_grad_outputs(*outputs))
    return [t.detach() for t in outputs], list(grads)


@pytest.mark.parametrize("mask", MASKS[1:], ids=_mask_id)
def test_autograd_asks_for_exactly_the_needed_gradients(mask):
    inputs = make_inputs(*SHAPE)
    with _RecordBackwardMasks() as recorder:
        outputs, grads = _grads(lltm.lltm_cell, inputs, mask)
    assert recorder.masks == [mask]
    ref_outputs, ref_grads = _grads(reference.lltm_cell, inputs, mask)
    torch.testing.assert_close(outputs, ref_outputs, rtol=1e-12, atol=1e-12)
    names = [name for name, want in zip(GRAD_NAMES, mask, strict=True) if want]
    for name, grad, expected in zip(names, grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12, msg=name)


def test_no_grad_needed_records_no_graph():
    inputs = make_inputs(*SHAPE)
    new_h, new_cell = lltm.lltm_cell(*inputs)
    assert new_h.grad_fn is None and new_cell.grad_fn is None
    with torch.no_grad():
        leaves = [t.requires_grad_() for t in make_inputs(*SHAPE)]
        new_h, _ = lltm.lltm_cell(*leaves)
    assert new_h.grad_fn is None and not new_h.requires_grad


@pytest.mark.parametrize("mask", MASKS, ids=_mask_id)
@pytest.mark.parametrize("kernel", ["native", "composite"])
def test_backward_op_returns_only_the_masked_gradients(mask, kernel):
    *tensors, _ = make_backward_args(make_inputs(*SHAPE))
    backward = torch.ops.lltm.backward if kernel == "native" else cell_composite.backward
    full = torch.ops.lltm.backward(*tensors, [True] * 5)
    grads = backward(*tensors, mask)
    assert len(grads) == 5
    for name, want, grad, expected in zip(GRAD_NAMES, mask, grads, full, strict=True):
        if not want:
            assert grad is None, name
            continue
        # The native kernel computes each gradient the same way whatever else
        # is asked for, bit for bit; the composite to rounding.
        tol = {"rtol": 0, "atol": 0} if kernel == "native" else {}
        torch.testing.assert_close(grad, expected, msg=name, **tol)


@pytest.mark.parametrize(
    "mask", [MASKS[0], MASKS[-1], [False, True, True, False, False]], ids=_mask_id
)
def test_fake_backward_follows_the_mask(mask):
    *tensors, _ = make_backward_args(make_inputs(*SHAPE))
    grads = torch.ops.lltm.backward(*(t.to("meta") for t in tensors), mask)
    full = torch.ops.lltm.backward(*tensors, [True] * 5)
    for want, grad, expected in zip(mask, grads, full, strict=True):
        if want:
            assert grad.device.type == "meta" and grad.shape == expected.shape
        else:
            assert grad is None


@pytest.mark.parametrize("mask", [[True] * 5, [False] * 3 + [True] * 2], ids=str)
def test_output_mask_must_have_five_entries(mask):
    *tensors, _ = make_backward_args(make_inputs(*SHAPE))
    for backward in (torch.ops.lltm.backward, cell_composite.backward):
        with pytest.raises(ValueError, match=r"^lltm: output_mask must have 5 entries"):
            backward(*tensors, mask[:-1])


def _recording_backend(masks):
    """An aot_eager-like backend that records lltm::backward's output_mask in
    every backward graph it compiles."""
    from torch._dynamo.backends.common import aot_autograd

    def forward_compiler(gm, _example_inputs):
        return gm

    def backward_compiler(gm, _example_inputs):
        masks.extend(
            list(node.args[7])
            for node in gm.graph.nodes
            if node.target is torch.ops.lltm.backward.default
        )
        return gm

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize(
    "mask",
    [[False, True, True, False, False], [True, False, False, True, True], [True] * 5],
    ids=_mask_id,
)
def test_compiled_cell_asks_for_the_same_gradients(mask):
    masks = []
    compiled = torch.compile(lltm.lltm_cell, backend=_recording_backend(masks), fullgraph=True)
    inputs = make_inputs(*SHAPE)
    outputs, grads = _grads(compiled, inputs, mask)
    assert masks == [mask]
    expected_outputs, expected_grads = _grads(lltm.lltm_cell, inputs, mask)
    torch.testing.assert_close(outputs, expected_outputs)
    torch.testing.assert_close(grads, expected_grads)
