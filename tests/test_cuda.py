"""The fused CUDA kernels (lltm-cuda<major>) on a GPU.

Every test here is skipped, with the reason, unless a CUDA device is present
and lltm's CUDA kernels are loaded (``python -m lltm info`` says why not).
The oracle is lltm.reference in float64; sizes are chosen to reach every code
path of the kernels: the 16-byte vector path and the scalar one, grids larger
than one wave (both grid-stride loops), misaligned and strided arguments.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import (
    GRAD_NAMES,
    OUTPUT_NAMES,
    assert_all_close,
    make_backward_args,
    make_grad_outputs,
    make_inputs,
    run_cell,
)
from torch._dynamo.utils import counters

import lltm
from lltm import _backends, reference

CUDA_READY, CUDA_WHY = _backends.cuda_status()
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not CUDA_READY, reason=f"lltm's CUDA kernels are not usable: {CUDA_WHY}"),
]
NAMES = OUTPUT_NAMES + GRAD_NAMES

# (batch, input_features, state_size). State sizes that are multiples of 8
# take the vector path in every dtype; odd ones the scalar path.
SHAPES = [
    (1, 1, 1),
    (3, 5, 7),
    (16, 32, 128),
    (17, 33, 129),
    (8, 4, 1030),  # a row wider than a 1024-thread block
    (0, 4, 8),
    (4, 0, 8),
    (5, 3, 0),
]


def _ids(shape: tuple[int, int, int]) -> str:
    return "b{}-f{}-s{}".format(*shape)


# Bound on |lltm - oracle| below float64, atol relative to max(1, rms(oracle))
# as gradients grow with the sizes; the kernels compute 16-bit types in float32.
LOW_PRECISION_TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=0.05, rtol=0.01),
    torch.bfloat16: dict(atol=0.25, rtol=0.05),
}


def _assert_close_to_oracle(actual, inputs):
    """``actual`` = lltm's ([new_h, new_cell], grads) for ``inputs``, against
    the reference run in float64 on the CPU."""
    dtype, device = inputs[0].dtype, inputs[0].device
    expected = run_cell(reference.lltm_cell, [t.detach().cpu().double() for t in inputs])
    for name, t, e in zip(NAMES, actual[0] + actual[1], expected[0] + expected[1], strict=True):
        assert (t.dtype, t.device) == (dtype, device), name
        tol = {}
        if dtype != torch.float64:
            scale = max(1.0, e.pow(2).mean().sqrt().item() if e.numel() else 0.0)
            tol = dict(
                atol=LOW_PRECISION_TOL[dtype]["atol"] * scale, rtol=LOW_PRECISION_TOL[dtype]["rtol"]
            )
        torch.testing.assert_close(t.cpu().double(), e, msg=lambda m, n=name: f"{n}: {m}", **tol)


def test_cuda_kernels_are_registered_not_the_fallback():
    assert _backends.has_native_kernel("cuda")
    assert _backends.has_native_kernel("cuda", "lltm::backward")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the composite path would warn
        run_cell(lltm.lltm_cell, make_inputs(2, 3, 4, device="cuda"))


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_float64_forward_and_gradients_match_reference(shape):
    inputs = make_inputs(*shape, device="cuda")
    _assert_close_to_oracle(run_cell(lltm.lltm_cell, inputs), inputs)


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 4), (3, 5, 8), (0, 2, 3)], ids=_ids)
def test_gradcheck(shape):
    inputs = make_inputs(*shape, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lltm.lltm_cell, inputs)


def _backward_args(shape, dtype=torch.float64):
    return make_backward_args(make_inputs(*shape, dtype=dtype, device="cuda"))


@pytest.mark.parametrize(
    ("dtype", "requires_grad"),
    [(torch.float64, False), (torch.float64, True), (torch.float32, True), (torch.bfloat16, False)],
    ids=str,
)
def test_opcheck_forward(dtype, requires_grad):
    args = make_inputs(3, 5, 8, dtype=dtype, device="cuda", requires_grad=requires_grad)
    torch.library.opcheck(torch.ops.lltm.forward.default, tuple(args))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=str)
def test_opcheck_backward(dtype):
    torch.library.opcheck(torch.ops.lltm.backward.default, _backward_args((3, 5, 8), dtype))


@pytest.mark.parametrize("dtype", list(LOW_PRECISION_TOL), ids=str)
@pytest.mark.parametrize("shape", [(3, 5, 7), (16, 32, 128), (17, 33, 129), (4, 8, 1032)], ids=_ids)
def test_low_precision_close_to_float64_oracle(shape, dtype):
    inputs = make_inputs(*shape, dtype=dtype, device="cuda")
    _assert_close_to_oracle(run_cell(lltm.lltm_cell, inputs), inputs)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values, every other element of a buffer twice as wide."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values, contiguous but one element past a 16-byte boundary."""
    buffer = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buffer[1:].view(t.shape)
    view.copy_(t)
    return view


LAYOUTS = {
    "strided": _strided,
    "column_major": lambda t: t.t().contiguous().t() if t.dim() == 2 else t,
    "misaligned": _misaligned,
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS)
def test_non_contiguous_and_misaligned_arguments(layout, dtype):
    inputs = make_inputs(6, 10, 16, dtype=dtype, device="cuda")
    # Autograd flows through the re-arranging views back to the leaves.
    leaves = [t.clone().requires_grad_() for t in inputs]
    arranged = [layout(t) for t in leaves]
    assert any(not t.is_contiguous() or t.data_ptr() % 16 for t in arranged)
    outputs = lltm.lltm_cell(*arranged)
    grads = torch.autograd.grad(outputs, leaves, make_grad_outputs(*outputs))
    _assert_close_to_oracle(([t.detach() for t in outputs], list(grads)), inputs)


def test_backward_accepts_misaligned_saved_tensors():
    grad_h, grad_cell, new_cell, gates, input, old_h, weights, mask = _backward_args((5, 3, 16))
    expected = torch.ops.lltm.backward(
        grad_h, grad_cell, new_cell, gates, input, old_h, weights, mask
    )
    args = [_misaligned(t) for t in (grad_h, grad_cell, new_cell, gates)]
    actual = torch.ops.lltm.backward(*args, input, old_h, weights, mask)
    assert_all_close(actual, expected, GRAD_NAMES)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device")
def test_second_device_while_first_is_current():
    torch.cuda.set_device(0)
    inputs = make_inputs(7, 9, 24, device="cuda:1")
    _assert_close_to_oracle(run_cell(lltm.lltm_cell, inputs), inputs)
    assert torch.cuda.current_device() == 0


# Past one wave of blocks, so both grid-stride loops run: many short rows
# (vector path), and more rows and columns than the grid covers (scalar path).
LARGE_SHAPES = [(600_000, 2, 8), (5_000, 3, 2_051)]


@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=_ids)
def test_large_batch_and_state(shape):
    inputs = make_inputs(*shape, dtype=torch.float32, device="cuda")
    out, grads = run_cell(lltm.lltm_cell, inputs)
    ref_out, ref_grads = run_cell(reference.lltm_cell, [t.double() for t in inputs])
    assert_all_close(
        [t.double() for t in out + grads], ref_out + ref_grads, NAMES, atol=1e-3, rtol=1e-3
    )


# --- Streams ------------------------------------------------------------------


def test_runs_on_the_current_stream_not_the_default_one():
    # The side stream first sleeps, then writes old_cell. A kernel that
    # ignored the current stream would not wait and read stale memory.
    inputs = make_inputs(64, 32, 256, device="cuda")
    expected = torch.ops.lltm.forward(*inputs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
        old_cell = inputs[4] * 1.0
        actual = torch.ops.lltm.forward(*inputs[:4], old_cell)
    torch.cuda.current_stream().wait_stream(stream)
    assert_all_close(actual, expected, ("new_h", "new_cell", "gates"))


def test_cuda_graph_capture_and_replay():
    # Capture fails if a kernel is launched on any stream but the capturing
    # one; replays with new inputs prove the kernels are in the graph.
    static = make_inputs(8, 16, 32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch advises
        torch.ops.lltm.forward(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.ops.lltm.forward(*static)
    for seed in (1, 2):
        fresh = make_inputs(8, 16, 32, device="cuda", seed=seed)
        for s, f in zip(static, fresh, strict=True):
            s.copy_(f)
        graph.replay()
        assert_all_close(static_out, torch.ops.lltm.forward(*fresh), ("new_h", "new_cell", "gates"))


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_reduce_overhead_training_step():
    # mode="reduce-overhead" records forward and backward into CUDA graphs
    # on a side stream; each call below replays them on new inputs.
    torch.manual_seed(0)
    model = lltm.LLTM(16, 32).cuda().double()

    def loss(x, h, c):
        new_h, new_cell = model(x, (h, c))
        return (new_h * torch.arange(32, device=x.device)).sum() + new_cell.pow(2).sum()

    counters.clear()
    compiled = torch.compile(loss, mode="reduce-overhead")
    for seed in range(4):
        x, _, _, h, c = make_inputs(8, 16, 32, device="cuda", seed=seed)
        model.zero_grad()
        compiled(x, h, c).backward()
        actual = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        loss(x, h, c).backward()
        assert_all_close(
            actual, [p.grad for p in model.parameters()], ("grad_weights", "grad_bias")
        )
    assert not counters["inductor"]["cudagraph_skips"], "CUDA graphs were not used"


def test_arguments_on_different_devices_are_rejected():
    inputs = make_inputs(2, 3, 4, device="cuda")
    inputs[3] = inputs[3].cpu()
    with pytest.raises((ValueError, RuntimeError), match="another device"):
        torch.ops.lltm.forward(*inputs)
