"""A second call with the same shapes asks the GPU nothing, and does a declared amount of work.

At small sizes a training step on a GPU is bound by its host time: every
runtime query (a device attribute, the occupancy calculator, a kernel
attribute set), launch and allocation costs microseconds of it. The CUDA
sources ask the GPU once per device, dtype and size and remember the answer
(csrc/cuda/lltm_cuda_device_cache.h); the host build's emulation counts every
query, launch and allocation (``emulation.calls()``), so that here the first
training step of ``lltm.LLTMSequence`` asks the occupancy calculator and the
second, of the same shapes, asks nothing and makes exactly the launches,
GEMMs, allocations and operator calls declared below (each said why), in float32 and under bfloat16 and float16
autocast (the 16-bit kernels).

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import contextlib

import cuda_host
import pytest
import torch
from test_cuda_persistent import path
from test_cuda_work import QUERIES, counted

import lltm

pytestmark = cuda_host.ONLY

# The tutorial's proportions, small: the persistent kernels in clusters on the
# emulated H100, one block a group.
STEPS, BATCH, FEATURES, STATE = 5, 5, 3, 6

# The work of a repeated training step, by name: launches, GEMMs,
# allocations (the shim's, and those of the dispatcher's operators) and
# dispatcher operators; views, which make no work, are not declared. On the
# persistent path, with the initial state given and the input not requiring
# grad, as the model trains here:
WORK_16_BIT_FORWARD = {
    # The recurrence of every step in one launch; no plain kernel.
    "cudaLaunchKernelEx": 1,
    # The input projection of every step, in float32 (float_projection).
    "aoti_torch_cuda_addmm_out": 1,
    # The five outputs (output, h_n, c_n; gates and cells for backward) and
    # one float32 workspace: the projection and x, W_x and the bias widened.
    "aoti_torch_empty_strided": 5 + 1,
    # The widening of x, W_x and the bias.
    "aten::copy_": 3,
}
FORWARD = {
    torch.float32: {
        "cudaLaunchKernelEx": 1,
        # The input projection and bias of every step.
        "aoti_torch_cuda_addmm_out": 1,
        # The five outputs.
        "aoti_torch_empty_strided": 5,
    },
    torch.bfloat16: WORK_16_BIT_FORWARD,
    torch.float16: WORK_16_BIT_FORWARD,
}
WORK_16_BIT_BACKWARD = {
    # Backpropagation through time in one launch; no plain kernel (the
    # weights' gradient of a padded sequence reads views of old_h and output).
    "cudaLaunchKernelEx": 1,
    # grad_weights: the W_h columns from old_h and from output[:-1], the
    # W_x columns from input.
    "aoti_torch_cuda_addmm_out": 3,
    # d_gates, the running gradients of h and c, the float32 bias sums the
    # kernel writes, grad_weights, and grad_bias rounded to 16 bits.
    "aoti_torch_empty_strided": 6,
    # grad_bias: the bias sums' column sums, in float32 ...
    "aten::sum.dim_IntList": 1,
    # ... rounded once.
    "aten::copy_": 1,
}
BACKWARD = {
    torch.float32: {
        "cudaLaunchKernelEx": 1,
        "aoti_torch_cuda_addmm_out": 3,
        # d_gates, the running gradients of h and c, grad_weights.
        "aoti_torch_empty_strided": 4,
        # grad_bias: the column sums of d_gates. (The gradients of h_n and
        # c_n, which the loss's .sum() broadcasts, the kernel reads through
        # their strides: no copy.)
        "aten::sum.dim_IntList": 1,
    },
    torch.bfloat16: WORK_16_BIT_BACKWARD,
    torch.float16: WORK_16_BIT_BACKWARD,
}
# What makes no work.
VIEWS = ("aoti_torch__reinterpret_tensor",)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def training_step(gpu, model, x, hx, autocast: torch.dtype | None):
    """(forward's calls, backward's calls) of one training step: float32, or
    the model and its loss under ``torch.autocast`` in that dtype."""
    outputs: list = []
    region = torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext()
    with region:
        forward = counted(gpu, lambda: outputs.append(model(x, hx)))
        output, (h_n, c_n) = outputs[0]
        loss = output.float().sum() + h_n.float().sum() + c_n.float().sum()
    backward = counted(gpu, loss.backward)
    return forward, backward


def queries(calls) -> dict[str, int]:
    return {name: calls[name] for name in QUERIES if calls[name]}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_repeated_step_asks_the_gpu_nothing(dtype):
    autocast = None if dtype == torch.float32 else dtype
    torch.manual_seed(0)
    model = lltm.LLTMSequence(FEATURES, STATE)
    x = torch.randn(STEPS, BATCH, FEATURES)
    hx = tuple(torch.randn(1, BATCH, STATE, requires_grad=True) for _ in range(2))
    with cuda_host.routed() as gpu:
        # The emulated GPU was just reset: the first step asks.
        first = training_step(gpu, model, x, hx, autocast)
        second = training_step(gpu, model, x, hx, autocast)
        assert path(2 if autocast else 4, BATCH, STATE).count("persistent, clusters") == 2
    for name, at_first, again in zip(("forward", "backward"), first, second, strict=True):
        assert queries(at_first), f"{name}: the first step asked nothing: {dict(at_first)}"
        assert queries(again) == {}, f"{name}, second step: {dict(again)}"
    for name, calls, declared in (
        ("forward", second[0], FORWARD[dtype]),
        ("backward", second[1], BACKWARD[dtype]),
    ):
        work = {k: n for k, n in calls.items() if k not in VIEWS}
        assert work == declared, f"{name}, second step"


def test_a_changed_gpu_is_asked_again():
    # What is remembered belongs to the GPU that answered: after a change
    # (here fewer multiprocessors) the next call asks again, and its plan
    # is that GPU's.
    torch.manual_seed(0)
    model = lltm.LLTMSequence(FEATURES, STATE)
    x = torch.randn(STEPS, BATCH, FEATURES)
    with cuda_host.routed() as gpu:
        training_step(gpu, model, x, None, None)
        assert queries(training_step(gpu, model, x, None, None)[0]) == {}
        before = path(4, BATCH, STATE)
        gpu.set_multiprocessors(2)
        forward, _ = training_step(gpu, model, x, None, None)
        assert queries(forward), dict(forward)
        after = path(4, BATCH, STATE)
    assert after != before, after
