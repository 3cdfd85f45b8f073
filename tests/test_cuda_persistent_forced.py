"""Plans forced by LLTM_CUDA_PLAN (csrc/cuda/lltm_cuda_persistent_plan.h,
ForcedPlan) on the host build's emulated GPU:

* Each value takes its plan where it fits (the plan reported, the launches
  the emulation records), and the results match the float64 oracle (16 bits:
  within their bounds), forward and backward.
* A forced plan that does not fit gives way to the rule's and says why.
* An invalid value is an argument error naming the variable and the values;
  LLTM_CUDA_PERSISTENT=0 comes first.

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import cuda_host
import pytest
import torch
from test_cuda_persistent import (
    F64,
    _gathers,
    assert_matches_oracle,
    emulated,
    forward_args,
    path,
)
from test_cuda_persistent_16_bit import assert_matches_oracle_16_bit

pytestmark = cuda_host.ONLY

VARIABLE = "LLTM_CUDA_PLAN"
GLOBAL = "h read from global memory"
BATCH, STATE = 7, 17


def _check(args: list) -> None:
    if args[0].dtype == torch.float64:
        assert_matches_oracle(args, "dense", "both", [True] * 5, F64)
    else:
        assert_matches_oracle_16_bit(args, "dense", "both", [True] * 5)


# value -> (dtype, what the forward's line holds, the backward's, waves):
# on an emulated H100 of 12 multiprocessors, where the rule takes clusters
# (and, in 16 bits, the tensor cores) in one launch.
FORCED = {
    "clusters": (torch.float64, ["persistent, clusters"], ["persistent, clusters"], 1),
    "cooperative": (
        torch.float64, ["persistent, cooperative grid"], ["persistent, cooperative grid"], 1,
    ),
    "cooperative-global-h": (
        torch.float64, ["persistent, cooperative grid", GLOBAL], ["persistent, cooperative grid"], 1,
    ),
    "waves=2": (torch.float64, ["2 waves of 4 batch rows"], ["2 waves of 4 batch rows"], 2),
    "cooperative,waves=3": (
        torch.float64,
        ["persistent, cooperative grid", "3 waves of 3 batch rows"],
        ["persistent, cooperative grid", "3 waves of 3 batch rows"],
        3,
    ),
    "cuda-cores": (torch.bfloat16, ["persistent, clusters"], ["persistent, clusters"], 1),
    "cooperative-global-h,cuda-cores": (
        torch.bfloat16, ["persistent, cooperative grid", GLOBAL], ["persistent, cooperative"], 1,
    ),
}  # fmt: skip


@pytest.mark.parametrize("value", FORCED)
def test_each_forced_plan_is_taken_and_matches_the_float64_oracle(monkeypatch, value):
    dtype, forward_has, backward_has, waves = FORCED[value]
    element_size = torch.finfo(dtype).bits // 8
    args = forward_args(4, BATCH, STATE, packed=True, reverse=True, dtype=dtype)
    with emulated("clusters", "12 SMs", order="random", seed=3) as gpu:
        rule = path(element_size, BATCH, STATE)
        monkeypatch.setenv(VARIABLE, value)
        forward, backward = path(element_size, BATCH, STATE).splitlines()
        launches = gpu.launches()
        _check(args)
        launched = gpu.launches() - launches
    assert rule.count("persistent, clusters") == 2 and "waves" not in rule, rule
    for line, has in ((forward, forward_has), (backward, backward_has)):
        assert line.endswith(f"(forced by {VARIABLE}={value})"), line
        assert all(text in line for text in has), line
        assert "does not fit" not in line, line
        assert ("tensor cores" in line) == (element_size == 2 and "cuda-cores" not in value), line
    assert GLOBAL not in backward
    # A launch a wave for each of sequence_forward, sequence_backward and
    # sequence_gate_grads.
    assert launched == 3 * waves + _gathers(args, [True] * 5)


def test_forced_per_step(monkeypatch):
    args = forward_args(4, BATCH, STATE, packed=True, reverse=False)
    monkeypatch.setenv(VARIABLE, "per-step")
    with emulated() as gpu:
        rule = path(8, BATCH, STATE)
        launches = gpu.launches()
        _check(args)
        launched = gpu.launches() - launches
    assert rule.count(f"per-step ({VARIABLE}=per-step)") == 2, rule
    assert launched > 12  # a product and a pointwise kernel a step


# (value, GPU set-up, dtype, batch, state, why, the rule's plan): the forced
# plan does not fit, the rule's runs.
FALLBACKS = {
    "clusters-below-sm90": (
        "clusters", lambda gpu: gpu.set_capability(8, 0), torch.float64, BATCH, STATE,
        "the device has no cluster launches (they need compute capability 9.0, it has 8.0)",
        "persistent, cooperative grid",
    ),
    "cooperative-without-cooperative-launches": (
        "cooperative", lambda gpu: gpu.set_cooperative_launch(False), torch.float64, BATCH, STATE,
        "the device has no cooperative launches", "persistent, clusters",
    ),
    "16-bit-clusters-below-sm90": (
        "clusters,waves=2", lambda gpu: gpu.set_capability(8, 0), torch.bfloat16, BATCH, STATE,
        "the device has no cluster launches", "persistent, cooperative grid",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", FALLBACKS)
def test_a_forced_plan_that_does_not_fit_gives_way_to_the_rules(monkeypatch, case):
    value, set_up, dtype, batch, state, why, rule_plan = FALLBACKS[case]
    element_size = torch.finfo(dtype).bits // 8
    args = forward_args(4, batch, state, packed=False, reverse=True, dtype=dtype)
    with emulated("clusters", "12 SMs") as gpu:
        set_up(gpu)
        rule = path(element_size, batch, state)
        monkeypatch.setenv(VARIABLE, value)
        forced = path(element_size, batch, state)
        launches = gpu.launches()
        _check(args)
        launched = gpu.launches() - launches
    for line, rule_line in zip(forced.splitlines(), rule.splitlines(), strict=True):
        text = line.split(": ", 1)[1]
        assert text.startswith(f"{VARIABLE}={value} does not fit: {why}"), line
        # The rule's plan, word for word.
        assert text.endswith("; the rule's plan: " + rule_line.split(": ", 1)[1]), line
        assert rule_plan in text and "forced by" not in text, line
    assert launched == 3


def test_a_forced_mode_that_fits_in_no_split_says_so():
    # float32 (64, 512) on an H100: clusters fit only in 2 waves; with one
    # wave forced too, no split of clusters fits and the rule's cooperative
    # grid runs.
    with emulated(), pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv(VARIABLE, "clusters")
        waves = path(4, 64, 512).splitlines()[0]
        monkeypatch.setenv(VARIABLE, "clusters,waves=1")
        one = path(4, 64, 512).splitlines()[0]
    assert "persistent, clusters" in waves and "2 waves of 32 batch rows" in waves, waves
    assert one.startswith(
        f"forward: {VARIABLE}=clusters,waves=1 does not fit: no split fits on chip"
    ), one
    assert "; the rule's plan: persistent, cooperative grid: 8 groups x 16 blocks" in one, one


@pytest.mark.parametrize(
    "value",
    ["bogus", "clusters,cooperative", "waves=5", "waves=0", "per-step,waves=2", "clusters,"],
)
def test_an_invalid_value_is_an_argument_error(monkeypatch, value):
    args = forward_args(2, 3, 5, packed=False, reverse=False)
    message = (
        f"{VARIABLE}={value} is not a plan of lltm's persistent sequence kernels; use per-step"
    )
    with emulated():
        monkeypatch.setenv(VARIABLE, value)
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            torch.ops.lltm.sequence_forward(*args)
        with pytest.raises(RuntimeError, match="is not a plan of lltm's persistent"):
            path(8, 3, 5)
        # A valid value again: the next call takes it.
        monkeypatch.setenv(VARIABLE, "cooperative")
        assert path(8, 3, 5).count("persistent, cooperative grid") == 2
        assert_matches_oracle(args, "dense", "both", [True] * 5, F64)


@pytest.mark.parametrize("value", ["", "auto"])
def test_unset_empty_and_auto_are_the_rule(monkeypatch, value):
    with emulated("cooperative"):
        rule = path(8, BATCH, STATE)
        monkeypatch.setenv(VARIABLE, value)
        assert path(8, BATCH, STATE) == rule
    assert "forced" not in rule


def test_lltm_cuda_persistent_0_comes_first(monkeypatch):
    monkeypatch.setenv(VARIABLE, "clusters")
    monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
    with emulated():
        assert path(8, BATCH, STATE).count("per-step (LLTM_CUDA_PERSISTENT=0)") == 2
