"""The persistent plans that use the whole GPU at the largest sizes
(csrc/cuda/lltm_cuda_persistent_plan.h) on the host build's emulated GPU:

* A forward that reads h in global memory (SequencePlan::h_from_global):
  the plan a cooperative grid takes where no block holds both its slice of
  W_h and a copy of its group's h.
* Waves: the batch in up to kMaxWaves launches one after another, where no
  plan fits it whole but one fits a part.

For each: the rule on an H100 at the map's sizes that take it; the float64
oracle on small emulated GPUs whose limits force it (several groups and
blocks, padded and packed in both directions: rows that become active in
reverse read h0), on the CUDA cores in every dtype and on the tensor cores
in 16 bits; for the first, its barriers; and, where both meet, lltm's
16-bit error held to nn.LSTM's.

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import re

import cuda_host
import lstm_bound
import pytest
import torch
from test_cuda_persistent import (
    F64,
    _gathers,
    _gives,
    assert_matches_oracle,
    emulated,
    forward_args,
    oracle,
    path,
)
from test_cuda_persistent_16_bit import assert_matches_oracle_16_bit

pytestmark = cuda_host.ONLY

GLOBAL = "h read from global memory"


def _assert_matches_oracle(args: list) -> None:
    """lltm's ops against the float64 oracle, within its dtype's bounds."""
    dtype = args[0].dtype
    if dtype in (torch.bfloat16, torch.float16):
        assert_matches_oracle_16_bit(args, "strided", "both", [True] * 5)
    else:
        tol = F64 if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
        assert_matches_oracle(args, "strided", "both", [True] * 5, tol)


# --- h read from global memory -------------------------------------------------------------


def test_the_large_gpu_sizes_on_an_h100():
    # W_h of 1024 units over 64 blocks beside the float32 h of 32 rows, or of
    # 512 units over 16 blocks beside that of 32 rows, is more than a block's
    # 227 KiB: the forward reads h at L2 (the backward never copies h).
    with emulated():
        rules = {
            (element_size, batch, state): path(element_size, batch, state).splitlines()
            for element_size, batch, state in ((4, 64, 1024), (2, 64, 1024), (4, 256, 512))
        }
    for size, (forward, backward) in rules.items():
        assert forward.startswith("forward: persistent, cooperative grid"), (size, forward)
        assert GLOBAL in forward, (size, forward)
        assert backward.startswith("backward: persistent") and GLOBAL not in backward, backward
    assert "tensor cores" in rules[2, 64, 1024][0]
    # Where h fits in shared memory, it stays there.
    with emulated():
        assert GLOBAL not in path(4, 64, 512) + path(2, 64, 512) + path(2, 256, 256)


# (dtype, batch, state, capability, KiB of shared memory a block) on 4
# multiprocessors: each forward plan is 2 groups x 2 blocks with h read from
# global memory (asserted). State 33: rows of h that are not whole 16-byte
# vectors; 32: rows that are.
CASES = [
    (torch.float64, 12, 17, (8, 0), 7),
    (torch.float32, 12, 33, (8, 0), 12),
    (torch.float32, 12, 32, (8, 0), 11),
    (torch.bfloat16, 12, 17, (8, 0), 4),
    (torch.float16, 12, 17, (8, 0), 4),
    (torch.bfloat16, 12, 33, (7, 5), 7),
]


def _small_gpu(gpu, capability: tuple[int, int], kib: int) -> None:
    gpu.set_capability(*capability)
    gpu.set_multiprocessors(4)
    gpu.set_shared_memory(kib * 1024, kib * 1024)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize(
    ("dtype", "batch", "state", "capability", "kib"),
    CASES,
    ids=[f"{str(c[0])[6:]}-s{c[2]}-sm{c[3][0]}{c[3][1]}" for c in CASES],
)
def test_matches_the_float64_oracle(dtype, batch, state, capability, kib, reverse):
    args = forward_args(5, batch, state, packed=True, reverse=reverse, dtype=dtype)
    element_size = torch.finfo(dtype).bits // 8
    with emulated("cooperative", order="random", seed=state) as gpu:
        _small_gpu(gpu, capability, kib)
        forward = path(element_size, batch, state).splitlines()[0]
        launches = gpu.launches()
        _assert_matches_oracle(args)
        launched = gpu.launches() - launches
    assert "2 groups x 2 blocks" in forward and GLOBAL in forward, forward
    assert ("tensor cores" in forward) == (element_size == 2 and capability >= (8, 0)), forward
    assert launched == 3 + _gathers(args, [True] * 5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kind", ["block", "grid"])
def test_every_barrier_is_needed(dtype, kind):
    # h0 in h_exchange and each step's h are other blocks' writes: without
    # the grid barrier a block reads them before they are there.
    case = next(c for c in CASES if c[0] == dtype)
    _, batch, state, capability, kib = case
    args = forward_args(4, batch, state, packed=True, reverse=True, dtype=dtype)
    expected = oracle(args, None, None, None)[0][0]
    with emulated("cooperative", order="random", seed=9) as gpu:
        _small_gpu(gpu, capability, kib)
        assert GLOBAL in path(torch.finfo(dtype).bits // 8, batch, state)
        gpu.drop_barrier(kind)
        if dtype == torch.float64:
            ok = _gives(lambda: [torch.ops.lltm.sequence_forward(*args)[0]], [expected])
        else:
            got = _forward_or_fault(args)
            ok = got is not None and torch.allclose(got.double(), expected, rtol=0.05, atol=0.05)
    assert not ok


def _forward_or_fault(args: list) -> torch.Tensor | None:
    try:
        return torch.ops.lltm.sequence_forward(*args)[0]
    except RuntimeError as fault:
        assert "lltm host emulation" in str(fault)
        return None


# --- Waves ---------------------------------------------------------------------------------


def test_the_largest_gpu_size_on_an_h100_runs_in_two_waves():
    # 256 x 1024 (row, unit) pairs over at most 132 blocks is more than the
    # 1,024 a block holds; 128 rows at a time fit, in both passes and widths.
    with emulated():
        rules = {element_size: path(element_size, 256, 1024) for element_size in (4, 2)}
    for rule in rules.values():
        assert rule.count("persistent, cooperative grid") == 2, rule
        assert rule.count("2 waves of 128 batch rows") == 2, rule
    # A size that fits whole is one launch; one that fits in no waves says so.
    with emulated():
        assert "waves" not in path(4, 64, 1024)
        assert path(4, 16, 4096).count("the batch whole or in up to 4 waves") == 2


def _waves(line: str) -> int:
    match = re.search(r"(\d+) waves of", line)
    return int(match.group(1)) if match else 1


# (dtype, batch, state, GPU set-up, waves forward, waves backward): the
# first three on 2 multiprocessors of a few KiB a block (capability 8.0:
# cooperative; 16 bits on the tensor cores), the last on an H100 of one
# multiprocessor (clusters of one block: 70 rows of 17 units are more pairs
# than a block holds).
def _kib(kib: int):
    def set_up(gpu) -> None:
        gpu.set_capability(8, 0)
        gpu.set_multiprocessors(2)
        gpu.set_shared_memory(kib * 1024, kib * 1024)

    return set_up


WAVE_CASES = {
    "float64": (torch.float64, 12, 9, _kib(4), 4, 2),
    "float32": (torch.float32, 16, 9, _kib(3), 2, 2),
    "bfloat16": (torch.bfloat16, 7, 9, _kib(2), 4, 4),
    "float32-clusters": (torch.float32, 70, 17, lambda gpu: gpu.set_multiprocessors(1), 2, 2),
}


@pytest.mark.parametrize(
    ("packed", "reverse"), [(False, False), (True, True), (True, False)],
    ids=["padded", "packed-reverse", "packed"],
)  # fmt: skip
@pytest.mark.parametrize("case", WAVE_CASES)
def test_waves_match_the_float64_oracle(case, packed, reverse):
    dtype, batch, state, set_up, forward_waves, backward_waves = WAVE_CASES[case]
    args = forward_args(4, batch, state, packed=packed, reverse=reverse, dtype=dtype)
    element_size = torch.finfo(dtype).bits // 8
    with emulated("clusters", order="random", seed=batch) as gpu:
        set_up(gpu)
        forward, backward = path(element_size, batch, state).splitlines()
        launches = gpu.launches()
        _assert_matches_oracle(args)
        launched = gpu.launches() - launches
    waves = (_waves(forward), _waves(backward))
    assert waves == (forward_waves, backward_waves), f"{forward}\n{backward}"
    # sequence_forward a launch a wave; sequence_backward and
    # sequence_gate_grads, the backward's waves each.
    assert launched == forward_waves + 2 * backward_waves + _gathers(args, [True] * 5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_under_autocast_no_less_accurate_than_nn_lstm(dtype):
    # tests/test_cuda_persistent_16_bit.py's accuracy bound where both plans
    # meet: on 2 multiprocessors of 8 KiB a block, (32, 32) runs in 4 waves
    # both ways, the forward reading h in global memory, on the tensor cores.
    size = (20, 32, 16, 32)
    theirs, _ = lstm_bound.lstm_errors(size, dtype, "cpu")
    with emulated("cooperative") as gpu:
        gpu.set_multiprocessors(2)
        gpu.set_shared_memory(8 * 1024, 8 * 1024)
        forward, backward = path(2, 32, 32).splitlines()
        launches = gpu.launches()
        ours = lstm_bound.lltm_errors(size, dtype, "cpu")
        launched = gpu.launches() - launches
    assert GLOBAL in forward and "tensor cores" in forward, forward
    assert "4 waves" in forward and "4 waves" in backward, (forward, backward)
    assert launched == 8
    lstm_bound.assert_no_less_accurate(ours, theirs)


# --- The whole map -------------------------------------------------------------------------


@pytest.mark.parametrize("element_size", [4, 2], ids=["float32", "16-bit"])
def test_no_size_of_the_map_takes_the_per_step_path_on_an_h100(element_size):
    # benchmarks/gpu.sh's map: batch 1 to 256 by state 64 to 1024 (an H200
    # has the H100's 132 multiprocessors and 227 KiB a block).
    with emulated():
        rules = {
            (batch, state): path(element_size, batch, state)
            for batch in (1, 4, 16, 64, 256)
            for state in (64, 128, 256, 512, 1024)
        }
    per_step = {size: rule for size, rule in rules.items() if "per-step" in rule}
    assert not per_step, per_step
