"""What the host build's emulated GPU assumes of a real one, checked on a GPU.

tests/test_cuda_persistent*.py hold the persistent kernels to the float64
oracle on the emulated GPU (tests/cuda_host), whose mma.sync follows the PTX
ISA's fragments and computes with every 16-bit input as it is. Two things
only a device settles:

* fp16 subnormal inputs to mma.sync are not flushed to zero. The 16-bit
  kernels read the float32 running h as two fp16 terms, high + low
  (csrc/cuda/lltm_cuda_tensor_cores.cuh); the low term is subnormal for
  |h| < 0.125. A device that flushed it would read h rounded to fp16, and
  the probe below would be off by far more than its result's rounding.
* The device's tensor-core products give results within the bounds the
  emulated ones are held to (tests/test_cuda_persistent_16_bit.py), on the
  tensor cores and, forced, on the CUDA cores, in both launch modes.

And every plan LLTM_CUDA_PLAN can force is captured in a CUDA graph and
replays as it runs eagerly; float32 under TF32 ("high") is no less accurate
than nn.LSTM under cuDNN's TF32, measured on the device against cuDNN
itself (on the host cuDNN is simulated: tests/test_cuda_tf32.py).

The GPU tests are marked ``cuda`` and skipped, with the reason, unless a
CUDA device is present and lltm's CUDA kernels are loaded. The probe's own
design (that it tells a flushing product from one that does not flush) is
checked on the CPU everywhere, and the emulated GPU passes it in ``nox -s
cuda_host``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import cuda_host
import lstm_bound
import pytest
import torch
from conftest import rms
from test_cuda_persistent import MODES, emulated, forward_args, path
from test_cuda_persistent_16_bit import assert_matches_oracle_16_bit

import lltm
from lltm import _backends

CUDA_READY, CUDA_WHY = _backends.cuda_status()
# The tests that need a GPU: marked `cuda` and skipped, saying why, without one.
needs_gpu = pytest.mark.skipif(
    not CUDA_READY, reason=f"lltm's CUDA kernels are not usable: {CUDA_WHY}"
)


@contextlib.contextmanager
def forced(plan: str | None) -> Iterator[None]:
    """LLTM_CUDA_PLAN set to ``plan`` (None: unset) until the block ends; the
    plugin reads it at every call."""
    before = os.environ.get("LLTM_CUDA_PLAN")
    if plan is None:
        os.environ.pop("LLTM_CUDA_PLAN", None)
    else:
        os.environ["LLTM_CUDA_PLAN"] = plan
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LLTM_CUDA_PLAN", None)
        else:
            os.environ["LLTM_CUDA_PLAN"] = before


def plan_of(dtype: torch.dtype, batch: int, state: int) -> dict[str, str]:
    """The plugin's plan on cuda:0 for such a call, both passes, as it is set now."""
    paths = _backends.sequence_path(0, dtype, batch, state)
    assert paths is not None, "the CUDA plugin answers no sequence_path"
    return paths


# --- fp16 subnormals into mma.sync -------------------------------------------------------

# The probe: T = 2 steps in fp16, no input (x = 0: its products are exact),
# state PROBE_STATE in pairs of units (2m, 2m + 1) whose cells start one fp16
# step apart, so that step 1 leaves each pair's h a few float32 steps apart,
# in the same or adjacent fp16 intervals. Input gate ~1 and output gate
# sigmoid(-2.5) = 0.076 (biases alone), so |h| < 0.08: every low term is
# subnormal in fp16. h_0 = 0 makes step 1 exact (z_1 = 0, c_1 = c_0); step
# 2's candidate of unit j is +-PROBE_WEIGHT (h_2m+1 - h_2m), m = j // 2: a
# difference of nearly equal h, which a product reading h rounded to fp16
# gets wrong by about PROBE_WEIGHT * (low_2m+1 - low_2m), where reading the
# low terms leaves an error of about PROBE_WEIGHT * 2**-25 (their own
# rounding). c_n = c_1 + elu(z_2) * input gate carries it out.
PROBE_BATCH, PROBE_STATE, PROBE_WEIGHT = 16, 128, 512.0
# The flushing product's error in c_n is at least this many times c_n's own
# fp16 rounding (the probe's design; checked on the CPU below), and lltm's
# error is allowed PROBE_BOUND times that rounding: between the two.
PROBE_MARGIN, PROBE_BOUND = 10.0, 2.0


def probe_args() -> list[torch.Tensor]:
    """[input, weights, bias, h_0, c_0] of the probe, fp16, on the CPU."""
    b, s = PROBE_BATCH, PROBE_STATE
    generator = torch.Generator().manual_seed(7)
    weights = torch.zeros(3 * s, s + 1, dtype=torch.float64)
    units = torch.arange(s)
    pair = 2 * (units // 2)
    sign = 1.0 - 2.0 * (units % 2).double()  # rows of a pair: +, -
    weights[2 * s + units, pair + 1] = sign * PROBE_WEIGHT
    weights[2 * s + units, pair] = -sign * PROBE_WEIGHT
    bias = torch.cat([torch.full((s,), 8.0), torch.full((s,), -2.5), torch.zeros(s)])
    first = (0.3 + 0.6 * torch.rand(b, s // 2, generator=generator)).half()
    # The next fp16 above each: the pair's cells one fp16 step apart.
    second = torch.nextafter(first, torch.full_like(first, 2.0))
    c_0 = torch.stack([first, second], dim=2).reshape(b, s)
    x = torch.zeros(2, b, 1)
    h_0 = torch.zeros(b, s)
    return [t.half() for t in (x, weights, bias, h_0)] + [c_0]


def run_probe(args: list[torch.Tensor]) -> torch.Tensor:
    """c_n of lltm's sequence_forward on the probe."""
    x, w, b, h, c = args
    return torch.ops.lltm.sequence_forward(x, w, b, h, c, None, False)[2]


def probe_oracle(args: list[torch.Tensor], flush: bool) -> torch.Tensor:
    """c_n of the probe in float64; ``flush``: each step's product reads h
    rounded to fp16 (its low term flushed), as a flushing device would."""
    x, w, b, h, c = (t.double() for t in args)
    for step in range(x.shape[0]):
        read = h.half().double() if flush else h
        gates = torch.cat([read, x[step]], dim=1) @ w.T + b
        input_gate, output_gate, candidate = gates.chunk(3, dim=1)
        c = c + torch.nn.functional.elu(candidate) * torch.sigmoid(input_gate)
        h = torch.tanh(c) * torch.sigmoid(output_gate)
    return c


def probe_errors(c_n: torch.Tensor, args: list[torch.Tensor]) -> tuple[float, float, float]:
    """(RMS of c_n - exact, of fp16(exact) - exact, of flushed - exact)."""
    exact = probe_oracle(args, flush=False)
    rounding = rms(exact.half().double() - exact)
    return rms(c_n.double().cpu() - exact), rounding, rms(probe_oracle(args, True) - exact)


def assert_probe_not_flushed(c_n: torch.Tensor, args: list[torch.Tensor]) -> None:
    error, rounding, flushed = probe_errors(c_n, args)
    assert error <= PROBE_BOUND * rounding, (
        f"c_n is {error:.3g} (RMS) from the float64 result, its fp16 rounding "
        f"{rounding:.3g}; a product that flushes fp16 subnormals would be {flushed:.3g} off"
    )


def test_the_probe_tells_a_flushing_product_from_an_exact_one():
    args = probe_args()
    exact = probe_oracle(args, flush=False)
    _, rounding, flushed = probe_errors(exact.half(), args)
    assert flushed >= PROBE_MARGIN * rounding, (flushed, rounding)
    # |h| stays where fp16's low terms are subnormal (below 2**-14 = the
    # smallest normal, for |h| < 0.125).
    x, w, b, h, c = (t.double() for t in args)
    gates = torch.cat([h, x[0]], dim=1) @ w.T + b
    h_1 = torch.tanh(c) * torch.sigmoid(gates.chunk(3, dim=1)[1])
    assert h_1.abs().max() < 0.125
    low = h_1 - h_1.half().double()
    assert (low.abs() < torch.finfo(torch.float16).smallest_normal).all()
    assert (low != 0).float().mean() > 0.9
    # The exact result rounded passes; the flushing product's, rounded, fails.
    assert_probe_not_flushed(exact.half(), args)
    with pytest.raises(AssertionError, match="flushes fp16 subnormals"):
        assert_probe_not_flushed(probe_oracle(args, flush=True).half(), args)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("plan", [None, "cooperative"], ids=["rule", "cooperative"])
def test_fp16_subnormals_into_the_tensor_cores_are_not_flushed(plan):
    args = probe_args()
    with forced(plan):
        forward = plan_of(torch.float16, PROBE_BATCH, PROBE_STATE)["forward"]
        assert "tensor cores" in forward and "does not fit" not in forward, forward
        c_n = run_probe([t.cuda() for t in args])
    assert_probe_not_flushed(c_n, args)


@pytest.mark.parametrize("mode", [pytest.param(mode, marks=cuda_host.ONLY) for mode in MODES])
def test_the_emulated_gpu_passes_the_probe(mode):
    # The emulation decodes every fp16 input as it is: it must pass, on the
    # tensor cores, in both launch modes.
    with emulated(mode):
        forward = path(2, PROBE_BATCH, PROBE_STATE).splitlines()[0]
        assert "tensor cores" in forward, forward
        c_n = run_probe(probe_args())
    assert_probe_not_flushed(c_n, probe_args())


# --- The device's tensor-core products within the emulation's bounds ------------------------

# (steps, batch, state): odd sizes, a partial tile of batch rows and of
# state, and one with several tiles each way.
DEVICE_SIZES = [(7, 3, 17), (5, 7, 33), (6, 20, 72)]


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("plan", ["clusters", "cooperative", "cooperative,cuda-cores"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("steps", "batch", "state"), DEVICE_SIZES)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_16_bit_kernels_on_the_device_within_the_emulations_bounds(
    plan, dtype, steps, batch, state, packed
):
    args = forward_args(steps, batch, state, packed, reverse=packed, dtype=dtype)
    with forced(plan):
        paths = plan_of(dtype, batch, state)
        if any("does not fit" in line for line in paths.values()):
            pytest.skip(f"this GPU runs no {plan} plan here: {paths['forward']}")
        assert all("forced by" in line for line in paths.values()), paths
        cores = "cuda-cores" not in plan
        assert ("tensor cores" in paths["forward"]) == cores, paths
        # The bounds the emulated GPU's products are held to (RMS_EPS, WORST_EPS).
        assert_matches_oracle_16_bit(args, "dense", "both", [True] * 5, device="cuda")


# --- Every forced plan captured in a CUDA graph ---------------------------------------------

# Each plan LLTM_CUDA_PLAN can force, the dtype it is for, and the sizes
# (batch, features, state) to try it at, the first where it fits.
CAPTURED_PLANS = [
    ("per-step", torch.float32),
    ("clusters", torch.float32),
    ("cooperative", torch.float32),
    ("cooperative-global-h", torch.float32),
    ("waves=2", torch.float32),
    ("clusters", torch.bfloat16),
    ("cooperative", torch.float16),
    ("cuda-cores", torch.bfloat16),
]
CAPTURE_SIZES = [(16, 32, 128), (8, 32, 256), (64, 256, 512), (256, 256, 256), (256, 512, 1024)]
CAPTURE_STEPS = 6


def _fitting_size(plan: str, dtype: torch.dtype) -> tuple[int, int, int] | None:
    for batch, features, state in CAPTURE_SIZES:
        with forced(plan):
            paths = plan_of(dtype, batch, state)
        if not any("does not fit" in line for line in paths.values()):
            return batch, features, state
    return None


def _train_step(module, x, h_0, c_0):
    output, (h_n, c_n) = module(x, (h_0, c_0))
    (output.float().square().mean() + h_n.float().sum() + c_n.float().sum()).backward()
    return output, h_n, c_n


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize(
    ("plan", "dtype"), CAPTURED_PLANS, ids=lambda v: str(v).replace("torch.", "")
)
def test_every_forced_plan_is_captured_and_replays_as_eager(plan, dtype):
    size = _fitting_size(plan, dtype)
    if size is None:
        pytest.skip(f"LLTM_CUDA_PLAN={plan} fits none of {CAPTURE_SIZES} on this GPU")
    batch, features, state = size
    torch.manual_seed(0)
    module = lltm.LLTMSequence(features, state).to("cuda", dtype)
    x = torch.randn(CAPTURE_STEPS, batch, features, device="cuda", dtype=dtype)
    h_0 = torch.randn(1, batch, state, device="cuda", dtype=dtype) * 0.5
    c_0 = torch.randn(1, batch, state, device="cuda", dtype=dtype) * 0.5
    params = list(module.parameters())
    with forced(plan):
        # Warm up outside the capture, on a side stream (as torch.cuda.graph's docs ask).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                module.zero_grad(set_to_none=True)
                _train_step(module, x, h_0, c_0)
        torch.cuda.current_stream().wait_stream(side)
        module.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _train_step(module, x, h_0, c_0)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        replayed = [t.detach().clone() for t in captured] + [p.grad.clone() for p in params]
        eager_module = lltm.LLTMSequence(features, state).to("cuda", dtype)
        eager_module.load_state_dict(module.state_dict())
        eager = list(_train_step(eager_module, x, h_0, c_0))
        eager += [p.grad for p in eager_module.parameters()]
    eps = torch.finfo(dtype).eps
    for got, want in zip(replayed, eager, strict=True):
        scale = max(rms(want.double()), 1e-30)
        # The same plan and kernels: a few roundings apart at most (cuBLAS may
        # pick another algorithm for the weights' gradient under capture); a
        # replay of stale inputs or of another stream's work is off by O(1).
        assert rms(got.double() - want.double()) <= 8 * eps * scale, (plan, got.shape)


# (steps, batch, features, state): tests/test_cuda_tf32.py's sizes against
# nn.LSTM under TF32, the tutorial's and an odd one.
TF32_LSTM_SIZES = [(50, 16, 32, 128), (50, 7, 13, 45)]


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("plan", [None, "cooperative", "cooperative-global-h", "per-step"],
                         ids=["rule", "cooperative", "global-h", "per-step"])  # fmt: skip
@pytest.mark.parametrize("size", TF32_LSTM_SIZES, ids=lambda s: "t{}-b{}-f{}-s{}".format(*s))
def test_tf32_on_the_device_no_less_accurate_than_nn_lstm(plan, size):
    """What tests/test_cuda_tf32.py holds on the emulated GPU against a
    simulated cuDNN, on the device against cuDNN itself: under torch's
    "high", lltm's float32 (3xTF32 tensor-core products, split cuBLAS GEMMs)
    is no less accurate than nn.LSTM under cuDNN's default TF32, in every
    role, at 50 steps (tests/lstm_bound.py's method)."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("no TF32 below compute capability 8.0")
    assert torch.backends.cudnn.allow_tf32  # torch's default: nn.LSTM in TF32
    theirs, _ = lstm_bound.lstm_errors(size, torch.float32, "cuda")
    with forced(plan):
        ours = lstm_bound.lltm_errors_tf32(size, "cuda")
        exact = lstm_bound.lltm_errors_exact_float32(size, "cuda")
    lstm_bound.assert_no_less_accurate(ours, theirs)
    # And the emulation's bound (tests/test_cuda_tf32.py): float32's accuracy
    # in every role but the weight gradient, which is cuBLAS's one TF32 term
    # (so TF32 ran). Three times float32's error here, where the emulation
    # holds twice: the device's float32 sums run in another order.
    table = ", ".join(f"{n} {ours[n]:.2e} (float32 {exact[n]:.2e})" for n in lstm_bound.NAMES)
    for name in lstm_bound.NAMES:
        if name == "grad_weights":
            assert ours[name] > 30 * exact[name], table
        else:
            assert ours[name] <= 3 * exact[name], f"{name}: {table}"
