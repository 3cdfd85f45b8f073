"""The fused CUDA kernels (lltm-cuda<major>) on a GPU.

Every test here is skipped, with the reason, unless a CUDA device is present
and lltm's CUDA kernels are loaded (``python -m lltm info`` says why not).
The oracle is lltm.reference in float64; sizes are chosen to reach every code
path of the kernels: the 16-byte vector path and the scalar one, grids larger
than one wave (both grid-stride loops), misaligned and strided arguments.
float32 and 16-bit results are held to the same accuracy check as on the CPU
(conftest.assert_as_accurate_as_reference, bounds in units of each dtype's
epsilon against the reference run in that dtype on the GPU), which
test_parity.py shows to reject kernels that are subtly wrong.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import (
    ARG_NAMES,
    GRAD_NAMES,
    OUTPUT_NAMES,
    assert_all_close,
    assert_as_accurate_as_reference,
    assert_worst_case_as_reference,
    make_backward_args,
    make_grad_outputs,
    make_inputs,
    rms,
    run_cell,
)
from test_errors import BACKWARD_CASES, FORWARD_CASES, _assert_lltm_error
from test_sequence import (
    OP_CASES,
    _op_args,
    assert_tight,
    loop_of_cells,
    make_sequence_inputs,
    run_sequence,
)
from test_sequence import OUTPUT_NAMES as SEQUENCE_OUTPUTS
from test_sequence import SHAPES as SEQUENCE_SHAPES
from test_sequence import (
    _backward_args as _sequence_backward_args,
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


# Elementwise bound on |lltm - oracle| below float64, in units of the dtype's
# epsilon: atol relative to max(1, rms(oracle)), as gradients grow with the
# sizes. Loose (a systematic error of a few eps passes it): it catches a few
# wrong elements, which the RMS check below averages away, at sizes too small
# for that statistic. The kernels compute 16-bit types in float32.
ELEMENTWISE_EPS = dict(atol=32, rtol=8)
LOW_PRECISION = [torch.float32, torch.float16, torch.bfloat16]


def _assert_close_to_oracle(actual, inputs):
    """``actual`` = lltm's ([new_h, new_cell], grads) for ``inputs``, against
    the reference run in float64 on the CPU."""
    dtype, device = inputs[0].dtype, inputs[0].device
    expected = run_cell(reference.lltm_cell, [t.detach().cpu().double() for t in inputs])
    eps = torch.finfo(dtype).eps
    for name, t, e in zip(NAMES, actual[0] + actual[1], expected[0] + expected[1], strict=True):
        assert (t.dtype, t.device) == (dtype, device), name
        tol = {}
        if dtype != torch.float64:
            scale = max(1.0, rms(e))
            tol = dict(
                atol=ELEMENTWISE_EPS["atol"] * eps * scale, rtol=ELEMENTWISE_EPS["rtol"] * eps
            )
        torch.testing.assert_close(t.cpu().double(), e, msg=lambda m, n=name: f"{n}: {m}", **tol)


def _assert_as_accurate_as_reference(inputs, cell=lltm.lltm_cell):
    """lltm on ``inputs`` (16-bit or float32, on the GPU) against the
    reference in the same dtype on the same GPU, both held to float64."""
    dtype = inputs[0].dtype
    out, grads = run_cell(cell, inputs)
    ref_out, ref_grads = run_cell(reference.lltm_cell, inputs)
    exact_out, exact_grads = run_cell(reference.lltm_cell, [t.double() for t in inputs])
    assert all(t.is_cuda for t in out + grads)
    assert_as_accurate_as_reference(
        NAMES, out + grads, ref_out + ref_grads, exact_out + exact_grads, dtype
    )


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


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (5, 3, 8)], ids=_ids)
def test_low_precision_small_sizes_close_to_float64_oracle(shape, dtype):
    inputs = make_inputs(*shape, dtype=dtype, device="cuda")
    _assert_close_to_oracle(run_cell(lltm.lltm_cell, inputs), inputs)


# Vector (state a multiple of 8) and scalar paths, a row wider than a block.
ACCURACY_SHAPES = [(16, 32, 128), (17, 33, 129), (4, 8, 1032), (8, 4, 1030)]


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("shape", ACCURACY_SHAPES, ids=_ids)
@pytest.mark.parametrize("seed", range(2))
def test_low_precision_as_accurate_as_reference(shape, dtype, seed):
    _assert_as_accurate_as_reference(make_inputs(*shape, dtype=dtype, device="cuda", seed=seed))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_forward_worst_case_as_reference(dtype):
    assert_worst_case_as_reference(dtype, device="cuda")


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
    _assert_as_accurate_as_reference(make_inputs(*shape, dtype=torch.float32, device="cuda"))


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


# --- Bad arguments: the CPU's messages, as ValueError / TypeError ----------------


def _on_cuda(args):
    """CUDA copies of a case's tensors; meta tensors stay where they are."""
    return [t.cuda() if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t for t in args]


@pytest.mark.parametrize("case", FORWARD_CASES)
@pytest.mark.parametrize("call", ["functional", "op"])
def test_forward_errors(case, call):
    args, pattern = FORWARD_CASES[case]
    fn = {"functional": lltm.lltm_cell, "op": torch.ops.lltm.forward}[call]
    with pytest.raises(ValueError) as info:
        fn(*_on_cuda(args))
    _assert_lltm_error(info.value, pattern)


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_errors(case):
    args, pattern = BACKWARD_CASES[case]
    with pytest.raises(ValueError) as info:
        torch.ops.lltm.backward(*_on_cuda(args))
    _assert_lltm_error(info.value, pattern)


@pytest.mark.parametrize("position", range(5))
def test_arguments_on_different_devices_are_rejected(position):
    inputs = make_inputs(2, 3, 4, device="cuda")
    inputs[position] = inputs[position].cpu()
    # Every argument is compared with input: with input on the CPU, weights
    # is the first that differs.
    name = "weights" if position == 0 else ARG_NAMES[position]
    for fn in (lltm.lltm_cell, torch.ops.lltm.forward):
        with pytest.raises(ValueError) as info:
            fn(*inputs)
        _assert_lltm_error(info.value, rf"{name} is on another device than input")


def test_non_tensor_argument():
    args = make_inputs(2, 3, 4, device="cuda")
    args[2] = args[2].tolist()
    # bias is optional: its message says None is allowed too.
    with pytest.raises(TypeError, match=r"^lltm: bias must be a Tensor or None, got list$"):
        lltm.lltm_cell(*args)


# --- Sequences ------------------------------------------------------------------------


def _cuda_sequence_inputs(shape, dtype=torch.float64):
    return [t.cuda() for t in make_sequence_inputs(*shape, dtype=dtype)]


def test_sequence_kernels_are_registered_not_the_fallback():
    for op in ("lltm::sequence_forward", "lltm::sequence_backward"):
        if not _backends.has_native_kernel("cuda", op):
            pytest.skip(
                f"{_backends.PLUGIN.module} registers no CUDA kernel for {op}: "
                "CUDA sequences run the composite implementation"
            )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the composite path would warn
        run_sequence(lltm.lltm_sequence, _cuda_sequence_inputs((3, 2, 3, 4)))


@pytest.mark.parametrize("shape", SEQUENCE_SHAPES, ids=lambda s: "T{}-b{}-f{}-s{}".format(*s))
def test_sequence_float64_matches_loop_of_reference_cells(shape):
    inputs = _cuda_sequence_inputs(shape)
    out, grads = run_sequence(lltm.lltm_sequence, inputs)
    ref_out, ref_grads = run_sequence(loop_of_cells, inputs)
    assert all(t.is_cuda for t in out + grads)
    assert_tight(out + grads, ref_out + ref_grads, SEQUENCE_OUTPUTS + GRAD_NAMES)


def _cuda_op_args(case, dtype=torch.float64):
    """test_sequence's op arguments on the GPU; batch_sizes stays on the CPU."""
    args = _op_args(case, dtype)
    return [t.cuda() if isinstance(t, torch.Tensor) and i < 5 else t for i, t in enumerate(args)]


@pytest.mark.parametrize("case", OP_CASES)
def test_sequence_ops_match_the_cpu_kernels(case):
    # Padded, packed (batch_sizes on the CPU, as PackedSequence keeps them),
    # reverse: the GPU's outputs and gradients are the CPU kernels'.
    cpu_args, cuda_args = _op_args(case), _cuda_op_args(case)
    cpu_out = torch.ops.lltm.sequence_forward(*cpu_args)
    cuda_out = torch.ops.lltm.sequence_forward(*cuda_args)
    names = ("output", "h_n", "c_n", "gates", "cells")
    assert all(t.is_cuda for t in cuda_out)
    assert_tight([t.cpu() for t in cuda_out], cpu_out, names)
    cpu_grads = torch.ops.lltm.sequence_backward(*_sequence_backward_args(cpu_args, cpu_out))
    cuda_grads = torch.ops.lltm.sequence_backward(*_sequence_backward_args(cuda_args, cuda_out))
    assert_tight([t.cpu() for t in cuda_grads], cpu_grads, GRAD_NAMES)


@pytest.mark.parametrize("case", OP_CASES)
def test_opcheck_sequence_forward(case):
    args = _cuda_op_args(case)
    for t in args[:5]:
        t.requires_grad_()
    torch.library.opcheck(torch.ops.lltm.sequence_forward.default, tuple(args))


@pytest.mark.parametrize("case", OP_CASES)
def test_opcheck_sequence_backward(case):
    args = _cuda_op_args(case)
    outputs = torch.ops.lltm.sequence_forward(*args)
    torch.library.opcheck(
        torch.ops.lltm.sequence_backward.default, tuple(_sequence_backward_args(args, outputs))
    )


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_sequence_lower_precision_as_accurate_as_a_loop_in_that_precision(dtype):
    # A loop of the reference cell in `dtype` on the GPU sets the bar.
    inputs = [t * 0.5 for t in _cuda_sequence_inputs((8, 16, 32, 64), dtype)]
    ours_out, ours_grads = run_sequence(lltm.lltm_sequence, inputs)
    loop_out, loop_grads = run_sequence(loop_of_cells, inputs)
    exact_out, exact_grads = run_sequence(loop_of_cells, [t.double() for t in inputs])
    assert_as_accurate_as_reference(
        SEQUENCE_OUTPUTS + GRAD_NAMES,
        ours_out + ours_grads,
        loop_out + loop_grads,
        exact_out + exact_grads,
        dtype,
    )


def test_sequence_module_on_the_gpu():
    torch.manual_seed(0)
    module = lltm.LLTMSequence(5, 6, num_layers=2, bidirectional=True).double()
    packed = torch.nn.utils.rnn.pack_sequence(
        [torch.randn(n, 5, dtype=torch.float64) for n in (4, 2, 3)], enforce_sorted=False
    )
    output, (h_n, c_n) = module(packed)
    output_gpu, (h_gpu, c_gpu) = module.cuda()(packed.to("cuda"))
    assert_tight(
        [output_gpu.data.cpu(), h_gpu.cpu(), c_gpu.cpu()], [output.data, h_n, c_n], SEQUENCE_OUTPUTS
    )


# --- The persistent sequence kernels (csrc/cuda/lltm_cuda_persistent.cuh) -----------------

# (batch, features, state) of the GPU benchmarks (benchmarks/gpu.sh).
GPU_SIZES = [(16, 32, 128), (8, 32, 256), (64, 256, 512)]


def _sequence_path(batch, state, dtype=torch.float32):
    return _backends.sequence_path(torch.cuda.current_device(), dtype, batch, state)


def test_the_gpu_sizes_take_the_persistent_kernels():
    # float32, on any GPU with cooperative launches and 100 KiB of shared
    # memory a block (Volta on); clusters from compute capability 9.0.
    paths = {size: _sequence_path(size[0], size[2]) for size in GPU_SIZES}
    for size, path in paths.items():
        assert path is not None, "the plugin predates the persistent kernels"
        assert all(path[p].startswith("persistent") for p in ("forward", "backward")), (size, path)
    if torch.cuda.get_device_capability() >= (9, 0):
        assert paths[16, 32, 128]["forward"].startswith("persistent, clusters"), paths


@pytest.mark.parametrize(
    ("steps", "batch", "state", "packed", "reverse", "grad_how"),
    [
        (7, 7, 33, False, False, "dense"),
        (7, 7, 33, True, True, "strided"),
        (50, 16, 128, False, True, "broadcast"),
        (9, 16, 128, True, False, "none"),
        (6, 8, 256, True, True, "dense"),
        (4, 64, 512, False, False, "broadcast"),
    ],
    ids=lambda v: str(v),
)
def test_persistent_kernels_match_the_float64_oracle(
    steps, batch, state, packed, reverse, grad_how
):
    import test_cuda_persistent as persistent

    args = persistent.forward_args(steps, batch, state, packed, reverse, features=8)
    persistent.assert_matches_oracle(
        args, grad_how, "both", [True] * 5, persistent.F64, device="cuda"
    )


@pytest.mark.parametrize("size", GPU_SIZES, ids=lambda s: "x".join(map(str, s)))
def test_persistent_float32_as_accurate_as_a_loop_in_float32(size):
    # T = 50, as the bench: a loop of the reference cell in float32 on the
    # GPU sets the bar (its products: cuBLAS, TF32 off by default for matmul).
    inputs = [t * 0.5 for t in _cuda_sequence_inputs((50, *size), torch.float32)]
    ours_out, ours_grads = run_sequence(lltm.lltm_sequence, inputs)
    loop_out, loop_grads = run_sequence(loop_of_cells, inputs)
    exact_out, exact_grads = run_sequence(loop_of_cells, [t.double() for t in inputs])
    assert_as_accurate_as_reference(
        SEQUENCE_OUTPUTS + GRAD_NAMES,
        ours_out + ours_grads,
        loop_out + loop_grads,
        exact_out + exact_grads,
        torch.float32,
    )


@pytest.mark.parametrize("size", [*GPU_SIZES, (256, 256, 256)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_persistent_16_bit_under_autocast_no_less_accurate_than_cudnn(dtype, size):
    # T = 50, as the bench: lltm inside torch.autocast, as users train, takes
    # the persistent kernels in `dtype`; nn.LSTM (cuDNN) under the same
    # autocast sets the bound, or in `dtype` itself where its autocast
    # computes in another (cuDNN's casts to float16 in a bfloat16 region).
    # tests/lstm_bound.py: how the two errors are normalised.
    import lstm_bound

    batch, _, state = size
    path = _sequence_path(batch, state, dtype)
    assert all(path[p].startswith("persistent") for p in ("forward", "backward")), path
    ours = lstm_bound.lltm_errors((50, *size), dtype, "cuda")
    theirs, computed_in = lstm_bound.lstm_errors((50, *size), dtype, "cuda", autocast=True)
    assert computed_in == dtype
    lstm_bound.assert_no_less_accurate(ours, theirs)


@pytest.mark.parametrize("case", OP_CASES)
def test_persistent_and_per_step_paths_agree(case, monkeypatch):
    args = _cuda_op_args(case)
    path = _sequence_path(args[3].shape[0], args[3].shape[1], torch.float64)
    assert path["forward"].startswith("persistent"), path
    outputs = torch.ops.lltm.sequence_forward(*args)
    grads = torch.ops.lltm.sequence_backward(*_sequence_backward_args(args, outputs))
    monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
    assert _sequence_path(args[3].shape[0], args[3].shape[1], torch.float64)["forward"] == (
        "per-step (LLTM_CUDA_PERSISTENT=0)"
    )
    per_step = torch.ops.lltm.sequence_forward(*args)
    per_step_grads = torch.ops.lltm.sequence_backward(*_sequence_backward_args(args, per_step))
    names = ("output", "h_n", "c_n", "gates", "cells")
    assert_tight([t.cpu() for t in outputs], [t.cpu() for t in per_step], names)
    assert_tight([t.cpu() for t in grads], [t.cpu() for t in per_step_grads], GRAD_NAMES)


def test_sequence_cuda_graph_capture_and_replay():
    # The persistent launches (cooperative or in clusters) captured in a CUDA
    # graph, forward and backward, replayed with new inputs.
    def inputs(seed):
        return [t.cuda() for t in make_sequence_inputs(6, 16, 32, 128, torch.float32, seed=seed)]

    static = inputs(0)

    def step():
        outputs = torch.ops.lltm.sequence_forward(*static, None, False)
        grad = torch.ones_like(outputs[0])
        return outputs, torch.ops.lltm.sequence_backward(
            grad, None, None, outputs[0], outputs[3], outputs[4], static[0], static[1],
            static[3], None, False, [True] * 5,
        )  # fmt: skip

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs, static_grads = step()
    for seed in (1, 2):
        for s, f in zip(static, inputs(seed), strict=True):
            s.copy_(f)
        graph.replay()
        eager_outputs, eager_grads = step()
        assert_all_close(static_outputs, eager_outputs, ("output", "h_n", "c_n", "gates", "cells"))
        assert_all_close(static_grads, eager_grads, GRAD_NAMES)
