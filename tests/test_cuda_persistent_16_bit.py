"""The persistent sequence kernels in float16 and bfloat16
(csrc/cuda/lltm_cuda_persistent*.cuh) on the host build's emulated GPU, as
tests/test_cuda_persistent.py holds the float32 and float64 ones.

* Against the float64 oracle at odd sizes (state 1 to 33, batch 0 to 7, 0 to
  7 steps), padded and packed, in both directions, with every form of output
  gradient, in both launch modes, on GPUs of 132, 12 and 1 multiprocessors,
  in every schedule order. Bounds in units of the dtype's epsilon, relative
  to each tensor's RMS: a wrong element or step is off by O(1).
* The accuracy bound: lltm's 16-bit error no larger than nn.LSTM's own
  16-bit error at the same sizes, both measured here (tests/lstm_bound.py
  says how the two are normalised), under ``torch.autocast`` as users train.
* The rule for 16-bit sizes: W_h in 16 bits on chip lets sizes fit that do
  not in float32, and changes the mode at others.
* Both launch modes compute the same bits; dropping a barrier makes them wrong.

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import itertools

import cuda_host
import lstm_bound
import pytest
import torch
from conftest import rms
from test_cuda_persistent import (
    GPUS,
    GRAD_OUTPUTS,
    MODES,
    ORDERS,
    SIZES,
    USED,
    _gathers,
    emulated,
    forward_args,
    on,
    oracle,
    path,
    run_ops,
)

import lltm

pytestmark = cuda_host.ONLY

DTYPES = (torch.bfloat16, torch.float16)
# Bounds on lltm - float64 oracle, in units of the dtype's epsilon: the RMS
# of the error relative to the RMS of the oracle's tensor, and the worst
# element's error relative to its own size plus that RMS (so that the large
# elements of a heavy-tailed gradient are held to their own rounding). The
# kernels reach 0.9 and 4.0 in these tests, 0.9 only for tensors of a few
# elements (their results are rounded once, from float32 arithmetic on
# inputs rounded to the dtype); a wrong element or step is off by 1/eps.
RMS_EPS, WORST_EPS = 1.5, 8.0


def _errors(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(RMS error, worst error) of `got` against `want`, in eps of `dtype`."""
    eps = torch.finfo(dtype).eps
    scale = max(rms(want), 1e-30)
    error = (got.detach().cpu().double() - want).abs()
    worst = (error / (want.abs() + scale)).max().item()
    return rms(error) / scale / eps, worst / eps


def assert_matches_oracle_16_bit(
    args: list,
    grad_how: str,
    final_grads: str,
    mask,
    looser: float = 1.0,
    device: str | torch.device = "cpu",
) -> None:
    """lltm's ops in the dtype of `args` on `device` against the float64
    oracle on the CPU, within the bounds above (`looser` times them)."""
    dtype = args[0].dtype
    outputs, grads, gate_grads, upstream = run_ops(on(device, args), grad_how, final_grads, mask)
    expected_outputs, expected_grads = oracle(
        args, *(None if t is None else t.cpu() for t in upstream)
    )
    d_gates, grad_h, grad_c = gate_grads
    grad_names = [f"grad_{name}" for name in ("input", "weights", "bias", "old_h", "old_cell")]
    output_names = ["output", "h_n", "c_n", "cells"]
    pairs = {
        name: pair for name, *pair in zip(output_names, outputs, expected_outputs, strict=True)
    }
    for name, wanted, got, want in zip(grad_names, mask, grads, expected_grads, strict=True):
        assert wanted or got is None, name
        if wanted:
            pairs[name] = (got, want)
    pairs["gate_grads grad_h"] = (grad_h, expected_grads[3])
    pairs["gate_grads grad_c"] = (grad_c, expected_grads[4])
    for name, (got, want) in pairs.items():
        assert got.dtype == dtype and got.shape == want.shape, (name, got.dtype, got.shape)
        if not want.numel():
            continue
        rms_error, worst_error = _errors(got, want, dtype)
        assert rms_error <= looser * RMS_EPS and worst_error <= looser * WORST_EPS, (
            f"{name}: RMS error {rms_error:.2f} eps, worst {worst_error:.2f} eps"
        )
    # d_gates summed over every row is grad_bias (each row rounded: looser).
    rows = d_gates.double().reshape(-1, d_gates.shape[-1])
    if rows.numel():
        rms_error, worst_error = _errors(rows.sum(0), expected_grads[2], dtype)
        bound = 4 * looser
        assert rms_error <= bound * RMS_EPS and worst_error <= bound * WORST_EPS, (
            rms_error,
            worst_error,
        )


def _cases() -> list:
    """Each size in both modes and both directions; dtype, GPU, schedule
    order, output gradient, final states' gradients and mask rotate through
    the cases, so that every value of each meets many of the others."""
    cases = []
    settings = itertools.cycle(
        itertools.product(
            DTYPES,
            GPUS,
            ORDERS,
            GRAD_OUTPUTS,
            ("both", "none", "c only"),
            ((True,) * 5, (True, True, True, False, True), (False, True, False, True, True)),
        )
    )
    for (steps, batch, state, packed), mode, reverse in itertools.product(
        SIZES, MODES, (False, True)
    ):
        dtype, gpu, order, grad_how, final_grads, mask = next(settings)
        for _ in range(11):  # a coprime stride through the settings
            next(settings)
        cases.append(
            pytest.param(
                dtype, gpu, steps, batch, state, packed, mode, reverse, order, grad_how,
                final_grads, mask,
                id=f"{str(dtype)[6:]}-{gpu.replace(' ', '')}-t{steps}-b{batch}-s{state}"
                f"-{'packed' if packed else 'padded'}-{mode}{'-reverse' if reverse else ''}"
                f"-{order}-{grad_how}-{final_grads.replace(' ', '')}"
                f"-{''.join('1' if m else '0' for m in mask)}",
            )
        )  # fmt: skip
    return cases


@pytest.mark.parametrize(
    ("dtype", "gpu", "steps", "batch", "state", "packed", "mode", "reverse", "order", "grad_how",
     "final_grads", "mask"),
    _cases(),
)  # fmt: skip
def test_16_bit_kernels_match_the_float64_oracle(
    dtype, gpu, steps, batch, state, packed, mode, reverse, order, grad_how, final_grads, mask
):
    args = forward_args(steps, batch, state, packed, reverse, dtype=dtype)
    with emulated(mode, gpu, order=order, seed=steps + batch + state) as emulation:
        rule = path(2, batch, state)
        launches = emulation.launches()
        assert_matches_oracle_16_bit(args, grad_how, final_grads, list(mask))
        launched = emulation.launches() - launches
    if batch == 0:
        assert "nothing to run" in rule
        return
    mode_text = "clusters" if mode == "clusters" else "cooperative grid"
    assert rule.count(f"persistent, {mode_text}") == 2, rule
    # One launch an op: sequence_forward, sequence_backward, sequence_gate_grads;
    # and the gather for the weights' gradient of a packed batch of several
    # lengths (tests/test_cuda_work.py).
    assert launched == 3 + _gathers(args, mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("state", [16, 17])
def test_both_modes_compute_the_same_bits(dtype, state):
    # The h the blocks exchange is float32 in both (16: whole 16-byte vectors
    # of h in the cooperative mode's reads; 17: the scalar ones), and each
    # element of the forward's product is summed the same way whatever the
    # split of the state (the tensor cores' parts follow the instructions'
    # steps): the forward's outputs are the same bits. The backward sums the
    # blocks' shares of the gradient of h, and the modes split the state
    # over different numbers of blocks here (6 and 4): its float32 sums may
    # round differently, at most one step of the dtype apart.
    args = forward_args(7, 5, state, packed=True, reverse=False, dtype=dtype)
    results = {}
    for mode in MODES:
        with emulated(mode, "12 SMs", order="random", seed=4):
            assert path(2, 5, state).count("persistent") == 2
            outputs, grads, gate_grads, _ = run_ops(args, "dense", "both", [True] * 5)
        results[mode] = (outputs, grads + gate_grads)
    (cluster_outputs, cluster_grads), (cooperative_outputs, cooperative_grads) = results.values()
    for cluster, cooperative in zip(cluster_outputs, cooperative_outputs, strict=True):
        assert torch.equal(cluster, cooperative)
    eps = torch.finfo(dtype).eps
    for cluster, cooperative in zip(cluster_grads, cooperative_grads, strict=True):
        step = eps * torch.maximum(cluster.double().abs(), cooperative.double().abs())
        assert ((cluster.double() - cooperative.double()).abs() <= step).all()


def test_the_16_bit_per_step_path_where_disabled(monkeypatch):
    # LLTM_CUDA_PERSISTENT=0: a GEMM and a kernel a step, the state rounded
    # to 16 bits every step (looser bounds).
    args = forward_args(6, 3, 5, packed=True, reverse=True, dtype=torch.bfloat16)
    monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
    with emulated() as emulation:
        assert path(2, 3, 5).count("per-step (LLTM_CUDA_PERSISTENT=0)") == 2
        launches = emulation.launches()
        assert_matches_oracle_16_bit(args, "dense", "both", [True] * 5, looser=2.0)
        assert emulation.launches() - launches > 12


def test_a_16_bit_launch_the_gpu_refuses_falls_back_to_the_per_step_path():
    # As in float32: the plan counts on the device's 132 multiprocessors,
    # other work holds all but 4, the GPU refuses the cooperative launch and
    # the op runs the per-step path (after the forward's float32 projection
    # was made for the persistent kernel), with no error.
    args = forward_args(6, 7, 33, packed=False, reverse=True, dtype=torch.float16)
    with emulated("cooperative") as emulation:
        emulation.set_free_multiprocessors(4)
        assert path(2, 7, 33).count("persistent, cooperative grid") == 2
        launches = emulation.launches()
        assert_matches_oracle_16_bit(args, "dense", "both", [True] * 5, looser=2.0)
        assert emulation.launches() - launches > 12


# --- The accuracy bound: nn.LSTM in the same dtype ------------------------------------------

# (steps, batch, features, state): the GPU benchmarks' sizes, at their T = 50
# where the emulation is quick enough, fewer steps at the two largest.
BOUND_SIZES = [(50, 16, 32, 128), (50, 8, 32, 256), (12, 64, 256, 512), (12, 256, 256, 256)]


@pytest.mark.parametrize("size", BOUND_SIZES, ids=lambda s: "t{}-b{}-f{}-s{}".format(*s))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_under_autocast_no_less_accurate_than_nn_lstm(dtype, size):
    # lltm inside torch.autocast, as users train: its sequence op receives
    # 16-bit tensors and takes the persistent kernels, one launch a pass.
    # nn.LSTM on the CPU in the same dtype against its own float64.
    _, batch, _, state = size
    theirs, computed_in = lstm_bound.lstm_errors(size, dtype, "cpu")
    assert computed_in == dtype
    with emulated() as emulation:
        assert path(2, batch, state).count("persistent") == 2
        launches = emulation.launches()
        ours = lstm_bound.lltm_errors(size, dtype, "cpu")
        assert emulation.launches() - launches == 2
    lstm_bound.assert_no_less_accurate(ours, theirs)


def test_the_bound_rejects_the_per_step_path(monkeypatch):
    # The bound is no formality: the per-step path, which rounds the running
    # state to 16 bits every step (and the pre-activations with it), falls
    # short of it at the tutorial's size.
    size = (50, 16, 32, 128)
    theirs, _ = lstm_bound.lstm_errors(size, torch.bfloat16, "cpu")
    monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
    with emulated() as emulation:
        launches = emulation.launches()
        ours = lstm_bound.lltm_errors(size, torch.bfloat16, "cpu")
        assert emulation.launches() - launches >= 2 * size[0]  # a kernel a step each way
    with pytest.raises(AssertionError, match=r"less accurate than nn\.LSTM"):
        lstm_bound.assert_no_less_accurate(ours, theirs)


def test_the_module_under_autocast_takes_the_persistent_kernels():
    # lltm.LLTMSequence in float32, inside torch.autocast: one launch for the
    # forward, one for the backward, and outputs in the region's dtype.
    torch.manual_seed(0)
    module = lltm.LLTMSequence(8, 33)
    x = torch.randn(7, 5, 8)
    with emulated("cooperative", "12 SMs", order="random", seed=2) as emulation:
        launches = emulation.launches()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output, (h_n, c_n) = module(x)
        assert emulation.launches() - launches == 1
        (output.float().sum() + h_n.float().sum() + c_n.float().sum()).backward()
        assert emulation.launches() - launches == 2
    assert output.dtype == h_n.dtype == c_n.dtype == torch.bfloat16
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in module.parameters())


# --- The rule -----------------------------------------------------------------------------


def test_the_gpu_sizes_on_an_h100_in_16_bits():
    with emulated():
        rules = {size: path(2, *size) for size in ((16, 128), (8, 256), (64, 512), (256, 256))}
    forward = {size: text.splitlines()[0] for size, text in rules.items()}
    # W_h in 16 bits: the same splits in less shared memory (9.0 KiB where
    # float32 takes 16.1), the products on the tensor cores.
    assert forward[16, 128] == (
        "forward: persistent, clusters: 8 groups x 16 blocks (8 state units, 2 batch rows a "
        "block), 128 threads, 9.0 KiB shared memory, tensor cores"
    )
    assert forward[8, 256].startswith(
        "forward: persistent, clusters: 8 groups x 16 blocks (16 state units, 1 batch row a"
    )
    # float32 needs the cooperative grid at (64, 512) (W_h alone 194 KiB a
    # block); in 16 bits clusters fit, with both h buffers.
    assert forward[64, 512] == (
        "forward: persistent, clusters: 8 groups x 16 blocks (32 state units, 8 batch rows a "
        "block), 512 threads, 138.0 KiB shared memory, tensor cores"
    )
    assert all(text.count("persistent") == 2 for text in rules.values()), rules
    assert all(text.count(", tensor cores") == 2 for text in rules.values()), rules


@pytest.mark.parametrize(
    ("capability", "tensor_cores"), [((7, 5), False), ((8, 0), True), ((9, 0), True)], ids=str
)
def test_tensor_cores_from_compute_capability_8(capability, tensor_cores):
    # mma.sync m16n8k16 in bf16 and fp16 exists from sm_80 on: below, the
    # 16-bit products stay on the CUDA cores; either way they match the
    # oracle. float32 never takes them (exact float32, no TF32).
    for dtype in DTYPES:
        args = forward_args(5, 11, 37, packed=True, reverse=False, dtype=dtype)
        with emulated("cooperative") as gpu:
            gpu.set_capability(*capability)
            rule, float32_rule = path(2, 11, 37), path(4, 11, 37)
            assert_matches_oracle_16_bit(args, "dense", "both", [True] * 5)
        assert rule.count("persistent") == 2, rule
        assert rule.count(", tensor cores") == (2 if tensor_cores else 0), rule
        assert "tensor cores" not in float32_rule


@pytest.mark.parametrize("batch", [1, 4])
def test_a_state_that_fits_only_in_16_bits(batch):
    # W_h of 2048 units across 128 blocks is 385 KiB a block in float32 and
    # 193 KiB in 16 bits.
    with emulated():
        float32, half = path(4, batch, 2048), path(2, batch, 2048)
    assert float32.count("per-step (no split fits on chip") == 2, float32
    assert half.count("persistent, cooperative grid: 1 group x 128 blocks") == 2, half


def test_a_state_that_fits_only_in_16_bits_matches_the_oracle():
    # A smaller GPU, the same point: 4 multiprocessors of 48 KiB a block,
    # where W_h of 128 units takes 49.5 KiB a block in float32, 25.5 in 16
    # bits.
    args = forward_args(3, 2, 128, packed=False, reverse=True, dtype=torch.bfloat16)
    with emulated("cooperative") as gpu:
        gpu.set_multiprocessors(4)
        gpu.set_shared_memory(64 * 1024, 48 * 1024)
        float32, half = path(4, 2, 128), path(2, 2, 128)
        launches = gpu.launches()
        assert_matches_oracle_16_bit(args, "dense", "both", [True] * 5)
        launched = gpu.launches() - launches
    assert float32.count("per-step (no split fits on chip") == 2, float32
    assert half.count("persistent, cooperative grid") == 2, half
    assert launched == 3


# --- The barriers ---------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["forward", "random"])
@pytest.mark.parametrize(
    ("mode", "kind"), [(mode, kind) for mode in MODES for kind in ("block", "cluster", "grid")]
)
def test_every_barrier_is_needed_in_16_bits(mode, kind, order):
    # Dropping a kind the kernels use makes each pass wrong; dropping one
    # they do not use changes nothing.
    args = forward_args(4, 3, 17, packed=True, reverse=True, dtype=torch.bfloat16)
    x, w, _b, h, _c, batch_sizes, reverse = args
    with emulated(mode, order=order, seed=9):
        expected = torch.ops.lltm.sequence_forward(*args)
        saved = [expected[0], expected[3], expected[4], x, w, h, batch_sizes, reverse, [True] * 5]
        grad_output = torch.ones_like(expected[0])
        expected_grads = torch.ops.lltm.sequence_backward(grad_output, None, None, *saved)
    with emulated(mode, order=order, seed=9) as gpu:
        gpu.drop_barrier(kind)
        forward_ok = _gives(lambda: torch.ops.lltm.sequence_forward(*args), expected)
        backward_ok = _gives(
            lambda: torch.ops.lltm.sequence_backward(grad_output, None, None, *saved),
            expected_grads,
        )
    needed = kind in USED[mode]
    assert forward_ok != needed and backward_ok != needed, (forward_ok, backward_ok)


def _gives(run, expected) -> bool:
    """Whether run() gives `expected` bit for bit; False where the emulation
    faults (a barrier it can see will never complete)."""
    try:
        got = run()
    except RuntimeError as fault:
        assert "lltm host emulation" in str(fault)
        return False
    return all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
