"""The CUDA kernels at their edges: memory safety, alignment, devices and
streams, CUDA graphs, sizes past 32-bit offsets, out-of-memory.

Skipped, with the reason, unless a CUDA device is present and lltm's CUDA
kernels are loaded. The oracle is lltm.reference in float64 on the CPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import TORCH, make_inputs, run_cell

import lltm
from lltm import _backends, reference
from lltm.ops.cell_ops import composite as cell_composite

CUDA_READY, CUDA_WHY = _backends.cuda_status()
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not CUDA_READY, reason=f"lltm's CUDA kernels are not usable: {CUDA_WHY}"),
]
ROOT = Path(__file__).resolve().parents[1]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
# |lltm - float64 oracle| <= TOL * max(1, rms(oracle)), per dtype's epsilon.
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _close(actual, expected, dtype, name=""):
    scale = max(1.0, expected.double().pow(2).mean().sqrt().item() if expected.numel() else 0.0)
    torch.testing.assert_close(
        actual.double().cpu(), expected.double().cpu(), rtol=TOL[dtype], atol=TOL[dtype] * scale,
        msg=lambda m: f"{name}: {m}",
    )  # fmt: skip


def _oracle(inputs, seed=1):
    return run_cell(reference.lltm_cell, [t.detach().cpu().double() for t in inputs], seed=seed)


# --- Memory safety --------------------------------------------------------------------

SANITIZER_SHAPES = [(1, 1, 1), (3, 5, 7), (4, 3, 2), (16, 32, 4), (5, 3, 12), (17, 33, 129),
                    (8, 4, 1030), (0, 4, 8), (4, 0, 8), (5, 3, 0)]  # fmt: skip

_SWEEP = textwrap.dedent(
    """
    import sys, torch
    sys.path[:0] = {paths!r}
    import lltm
    from conftest import TORCH, make_inputs, run_cell
    from lltm import reference
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        for shape in {shapes!r}:
            inputs = make_inputs(*shape, dtype=dtype, device="cuda")
            out, grads = run_cell(lltm.lltm_cell, inputs)
            seq = [t.clone().requires_grad_() for t in inputs]
            output, (h, c) = lltm.lltm_sequence(seq[0][None].expand(3, -1, -1), *seq[1:])
            (output.sum() + h.sum() + c.sum()).backward()
    torch.cuda.synchronize()
    print("swept")
    """
)


@pytest.mark.slow
def test_compute_sanitizer_memcheck_parity_sweep():
    sanitizer = shutil.which("compute-sanitizer") or str(
        Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer"
    )
    if not Path(sanitizer).exists():
        pytest.skip("compute-sanitizer (CUDA toolkit) not found")
    script = _SWEEP.format(paths=[str(Path(__file__).parent), *sys.path], shapes=SANITIZER_SHAPES)
    result = subprocess.run(
        [sanitizer, "--tool", "memcheck", "--error-exitcode", "97", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "swept" in result.stdout and "ERROR SUMMARY: 0 errors" in result.stdout


# --- Alignment and layouts -------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast_gradients_column_major_weights_transposed_input(dtype):
    inputs = make_inputs(7, 9, 24, dtype=dtype, device="cuda")
    x, w, b, h, c = inputs
    arranged = [x.t().contiguous().t(), w.t().contiguous().t(), b, h, c]
    leaves = [t.detach().requires_grad_() for t in arranged]
    new_h, new_cell = lltm.lltm_cell(*leaves)
    # .sum() hands backward stride-0 gradients.
    grads = torch.autograd.grad(new_h.sum() + new_cell.sum(), leaves)
    ref = [t.detach().cpu().double().requires_grad_() for t in inputs]
    ref_h, ref_cell = reference.lltm_cell(*ref)
    expected = torch.autograd.grad(ref_h.sum() + ref_cell.sum(), ref)
    if dtype.is_floating_point and torch.finfo(dtype).bits == 16:
        # The weights' gradient sums batch rows of 16-bit factors: a few of its
        # entries land past TOL in the tutorial's own computation too. The
        # bound is then the error that computation makes, in the same dtype
        # on the same device, with the same layouts.
        same = [t.detach().requires_grad_() for t in arranged]
        same_h, same_cell = reference.lltm_cell(*same)
        same_grads = torch.autograd.grad(same_h.sum() + same_cell.sum(), same)
        _no_worse_than_reference(new_h, same_h, ref_h, dtype, "new_h")
        for i, (g, r, e) in enumerate(zip(grads, same_grads, expected, strict=True)):
            _no_worse_than_reference(g, r, e, dtype, f"grad {i}")
        return
    _close(new_h, ref_h.detach(), dtype, "new_h")
    for i, (g, e) in enumerate(zip(grads, expected, strict=True)):
        _close(g, e, dtype, f"grad {i}")


def _no_worse_than_reference(actual, same_dtype_reference, oracle, dtype, name):
    """|actual - oracle| within TOL or twice the same-dtype reference's own error."""
    oracle = oracle.detach().double().cpu()
    error = (actual.detach().double().cpu() - oracle).abs().max().item()
    reference_error = (same_dtype_reference.detach().double().cpu() - oracle).abs().max().item()
    scale = max(1.0, oracle.pow(2).mean().sqrt().item() if oracle.numel() else 0.0)
    bound = max(TOL[dtype] * scale, 2 * reference_error)
    assert error <= bound, (
        f"{name}: lltm is off by {error:.3g}, the reference in {dtype} by {reference_error:.3g}"
    )


# --- Devices and streams ---------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device")
def test_tensors_on_the_second_device_while_the_first_is_current():
    torch.cuda.set_device(0)
    inputs = make_inputs(5, 6, 16, dtype=torch.float32, device="cuda:1")
    out, grads = run_cell(lltm.lltm_cell, inputs)
    assert torch.cuda.current_device() == 0
    assert all(t.device == torch.device("cuda:1") for t in out + grads)
    expected = _oracle(inputs)
    for a, e in zip(out + grads, expected[0] + expected[1], strict=True):
        _close(a, e, torch.float32)


def test_runs_on_the_current_stream():
    # On a side stream, the inputs are written after a long sleep; a kernel on
    # any other stream would read them before that.
    inputs = make_inputs(64, 32, 256, dtype=torch.float32, device="cuda")
    targets = [torch.zeros_like(t) for t in inputs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # about 20-50 ms of GPU clock
        for target, value in zip(targets, inputs, strict=True):
            target.copy_(value)
        new_h, new_cell = lltm.lltm_cell(*targets)
        output, (h_n, c_n) = lltm.lltm_sequence(targets[0][None], *targets[1:])
    torch.cuda.current_stream().wait_stream(side)
    expected_h, expected_cell = reference.lltm_cell(*[t.cpu().double() for t in inputs])
    _close(new_h, expected_h, torch.float32, "new_h")
    _close(new_cell, expected_cell, torch.float32, "new_cell")
    _close(output[0], expected_h, torch.float32, "output")
    _close(h_n, expected_h, torch.float32, "h_n")
    _close(c_n, expected_cell, torch.float32, "c_n")
    assert torch.cuda.current_device() == inputs[0].device.index


def test_cuda_graph_capture_and_replay():
    static = make_inputs(8, 12, 32, dtype=torch.float32, device="cuda")
    # Warm up outside the capture (allocator, cuBLAS handles, lltm's caches).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            lltm.lltm_cell(*static)
            lltm.lltm_sequence(static[0][None].expand(4, -1, -1), *static[1:])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        new_h, new_cell = lltm.lltm_cell(*static)
        output, (h_n, c_n) = lltm.lltm_sequence(static[0][None].expand(4, -1, -1), *static[1:])
    for seed in (1, 2):
        fresh = make_inputs(8, 12, 32, dtype=torch.float32, device="cuda", seed=seed)
        for target, value in zip(static, fresh, strict=True):
            target.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        expected_h, expected_cell = reference.lltm_cell(*[t.cpu().double() for t in fresh])
        _close(new_h, expected_h, torch.float32, "new_h")
        _close(new_cell, expected_cell, torch.float32, "new_cell")
        x, w, b, loop_h, loop_c = (t.cpu().double() for t in fresh)
        for _ in range(4):  # the captured sequence: 4 steps of the same input
            loop_h, loop_c = reference.lltm_cell(x, w, b, loop_h, loop_c)
        _close(output[-1], loop_h, torch.float32, "output")
        _close(h_n, loop_h, torch.float32, "h_n")
        _close(c_n, loop_c, torch.float32, "c_n")


def test_graphed_module_trains_like_eager():
    torch.manual_seed(0)
    module = lltm.LLTM(12, 32).cuda()
    eager = lltm.LLTM(12, 32).cuda()
    eager.load_state_dict(module.state_dict())
    x, h, c = (torch.randn(8, n, device="cuda", requires_grad=True) for n in (12, 32, 32))
    # One callable: its sample arguments are the call's own, (x, (h, c)).
    graphed = torch.cuda.make_graphed_callables(module, (x, (h, c)))
    for step in range(3):
        # Each step from no gradient, as torch's graphed training loops run:
        # the graphed backward returns its static buffers, which a .grad left
        # in place would alias at the next replay (any module's, not only lltm's).
        module.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        inputs = [torch.randn_like(t).requires_grad_() for t in (x, h, c)]
        outs = graphed(inputs[0], (inputs[1], inputs[2]))
        ref = eager(inputs[0], (inputs[1], inputs[2]))
        sum(o.sum() for o in outs).backward()
        sum(o.sum() for o in ref).backward()
        for (name, p), q in zip(module.named_parameters(), eager.parameters(), strict=True):
            _close(p.grad, q.grad, torch.float32, f"step {step} grad {name}")


@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_reduce_overhead_matches_eager():
    module = lltm.LLTMSequence(12, 32, num_layers=2).cuda()
    compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)
    for seed in range(3):
        x = torch.randn(
            6, 4, 12, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)
        )
        output, (h_n, c_n) = compiled(x)
        expected, (h_e, c_e) = module(x)
        _close(output, expected, torch.float32, "output")
        _close(h_n, h_e, torch.float32, "h_n")
        _close(c_n, c_e, torch.float32, "c_n")


# --- Sizes -----------------------------------------------------------------------------


def test_many_rows_float16():
    # 600000 rows: more than the 65535 blocks a grid's y dimension holds.
    inputs = make_inputs(600_000, 2, 8, dtype=torch.float16, device="cuda")
    new_h, new_cell = lltm.lltm_cell(*inputs)
    rows = torch.tensor([0, 1, 65_535, 65_536, 299_999, 599_999])
    expected = reference.lltm_cell(*[t.cpu().double() for t in inputs])
    _close(new_h[rows.cuda()], expected[0][rows], torch.float16, "new_h")
    _close(new_cell[rows.cuda()], expected[1][rows], torch.float16, "new_cell")


def test_very_wide_state_backward():
    # (1, 3, 2**20 + 1): one row of three million gates, an odd width (the
    # scalar path). The weights would be terabytes, so only the gradient of
    # old_cell is asked for, which needs none of the products that read them.
    state = 2**20 + 1
    generator = torch.Generator().manual_seed(0)
    new_cell, grad_h, grad_cell = (torch.randn(1, state, generator=generator) for _ in range(3))
    gates = torch.rand(1, 3 * state, generator=generator)
    weights = torch.zeros(1, 1).expand(3 * state, state + 3)
    cuda = [t.cuda() for t in (grad_h, grad_cell, new_cell, gates)]
    args = (*cuda, torch.zeros(1, 3, device="cuda"), torch.zeros(1, state, device="cuda"))
    # Expanded on the GPU: .cuda() of the expanded CPU tensor would copy all
    # of its 3 * 2**40 elements.
    cuda_weights = torch.zeros(1, 1, device="cuda").expand(weights.shape)
    grads = torch.ops.lltm.backward(*args, cuda_weights, [False] * 4 + [True])
    expected = cell_composite.backward(
        grad_h, grad_cell, new_cell, gates, torch.zeros(1, 3), torch.zeros(1, state), weights,
        [False] * 4 + [True],
    )  # fmt: skip
    _close(grads[4], expected[4], torch.float32, "grad_old_cell")


@pytest.mark.slow
def test_more_than_two_to_the_31_gate_elements_bfloat16():
    # gates: 699051 x 3072 > 2**31 elements: every offset must be 64-bit.
    batch, state = 2**31 // (3 * 1024) + 1, 1024
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs about 16 GB of GPU memory")
    inputs = make_inputs(batch, 8, state, dtype=torch.bfloat16, device="cuda")
    new_h, new_cell = lltm.lltm_cell(*inputs)
    rows = torch.tensor([0, 1, batch // 2, batch - 2, batch - 1])
    x, w, b, h, c = (t.cpu().double() for t in inputs)
    expected = reference.lltm_cell(x[rows], w, b, h[rows], c[rows])
    _close(new_h[rows.cuda()], expected[0], torch.bfloat16, "new_h")
    _close(new_cell[rows.cuda()], expected[1], torch.bfloat16, "new_cell")


# --- opcheck, gradcheck, out of memory ---------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck_every_dtype(dtype):
    inputs = make_inputs(3, 5, 8, dtype=dtype, device="cuda", requires_grad=dtype.is_floating_point)
    torch.library.opcheck(torch.ops.lltm.forward.default, tuple(inputs))
    sequence_args = (inputs[0][None].expand(2, -1, -1).contiguous(), *inputs[1:], None, False)
    torch.library.opcheck(torch.ops.lltm.sequence_forward.default, sequence_args)


def test_gradcheck_float64_cell_and_sequence():
    inputs = make_inputs(3, 4, 5, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lltm.lltm_cell, inputs)

    def sequence(*args):
        output, (h_n, c_n) = lltm.lltm_sequence(*args)
        return output, h_n, c_n

    seq_inputs = [inputs[0][None].expand(3, -1, -1).detach().clone().requires_grad_(),
                  *inputs[1:]]  # fmt: skip
    assert torch.autograd.gradcheck(sequence, seq_inputs)


def test_out_of_memory_is_torch_out_of_memory_error(capfd):
    # Broadcast inputs cost nothing; the outputs would not fit on any GPU.
    batch = 2**36
    x = torch.zeros(1, 3, device="cuda").expand(batch, 3)
    h = torch.zeros(1, 4, device="cuda").expand(batch, 4)
    weights, bias = torch.zeros(12, 7, device="cuda"), torch.zeros(12, device="cuda")
    for call in (
        lambda: lltm.lltm_cell(x, weights, bias, h, h),
        lambda: lltm.lltm_sequence(x[None], weights, bias, h, h),
    ):
        if TORCH >= (2, 13):
            # torch_exception_get_what_without_backtrace (2.13) hands torch's
            # message over, and the Python layer gives it its type.
            with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
                call()
        else:
            # Before 2.13 the shim only prints it (tests/test_torch_errors.py).
            with pytest.raises(RuntimeError, match=r"printed the reason to stderr$"):
                call()
            assert "out of memory" in capfd.readouterr().err
    # The device is still usable afterwards.
    inputs = make_inputs(3, 5, 8, dtype=torch.float32, device="cuda")
    out, _ = run_cell(lltm.lltm_cell, inputs)
    _close(out[0], _oracle(inputs)[0][0], torch.float32)
