"""Measured plans (torch.backends.cudnn.benchmark; csrc/cuda/
lltm_cuda_persistent_measuring.h) on the host build's emulated GPU, whose
CUDA events read a clock that advances by the cost each test sets per kind of
launch and GEMM:

* The first call of a kind times every plan that fits and takes the fastest;
  its results match the float64 oracle and, bit for bit, a run of that plan
  forced by LLTM_CUDA_PLAN.
* A later call of the same kind measures nothing (no event recorded) and
  runs the remembered plan, also while a CUDA graph is being captured; a
  first call during capture measures nothing and runs the rule's plan.
* A candidate the GPU refuses to launch is skipped, and listed as refused.
* The choices are bounded, least recently used first out.
* Benchmark mode off, or a plan forced, the rule decides as before.
* lltm's Python side passes the flag to the plugin when it changes.

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from types import ModuleType

import cuda_host
import pytest
import torch
from test_cuda_persistent import F64, assert_matches_oracle, emulated, forward_args, run_ops

from lltm import _backends

pytestmark = cuda_host.ONLY

STEPS, BATCH, STATE = 4, 3, 5
# Microseconds a call takes on the emulated clock: a cooperative launch is the
# cheapest, a cluster launch (the rule's on an H100) dearer, each step of the
# per-step path dearer still.
COSTS = {
    "cudaLaunchKernelEx/cooperative": 10.0,
    "cudaLaunchKernelEx/cluster": 30.0,
    "LLTM_LAUNCH": 20.0,
    "aoti_torch_cuda_addmm_out": 20.0,
}
COOPERATIVE = "persistent, cooperative grid"
CLUSTERS = "persistent, clusters"
GLOBAL = "h read from global memory"


def _library():
    return cuda_host.modules()[0]


@contextlib.contextmanager
def measuring(mode: str = "clusters") -> Iterator[ModuleType]:
    """lltm's ops on the emulated GPU with benchmark mode on and COSTS on its clock."""
    with emulated(mode) as gpu:
        gpu.set_costs(COSTS)
        assert _library().set_measuring(True)
        try:
            yield gpu
        finally:
            _library().set_measuring(False)


def measured() -> list[_backends.MeasuredPlan]:
    return _backends.parse_measured_plans(_library().measured_plans())


def inference(args: list) -> list[torch.Tensor]:
    return list(torch.ops.lltm.sequence_inference(*args))


def counted(gpu: ModuleType, run) -> tuple[dict[str, int], float, object]:
    """(the calls `run` made, by name; the microseconds it took on the clock; its result)."""
    calls, clock = gpu.calls(), gpu.clock()
    result = run()
    after = gpu.calls()
    return {k: v - calls.get(k, 0) for k, v in after.items()}, gpu.clock() - clock, result


def test_the_fastest_plan_is_taken_and_matches_the_oracle_and_the_plan_forced(monkeypatch):
    args = forward_args(STEPS, BATCH, STATE, packed=True, reverse=True)
    with measuring():
        assert_matches_oracle(args, "dense", "both", [True] * 5, F64)
        plans = {p.pass_: p for p in measured()}
        outputs, grads, gate_grads, _ = run_ops(args, "dense", "both", [True] * 5)
    assert set(plans) == {"forward", "backward"}
    for plan in plans.values():
        assert plan.chosen.startswith(COOPERATIVE) and GLOBAL not in plan.chosen, plan
        assert "waves" not in plan.chosen
        assert (plan.dtype, plan.tf32, plan.batch, plan.state) == ("float64", False, 3, 5)
        assert plan.schedule == f"packed, {STEPS} steps, reverse"
        plans_timed = [p for p, _ in plan.candidates]
        assert plans_timed[0] == "per-step"
        assert any(p.startswith(CLUSTERS) for p in plans_timed)
        assert any("2 waves" in p for p in plans_timed)
        times = dict(plan.candidates)
        # The clock's costs: a cooperative launch and the input projection's GEMM.
        assert times[plan.chosen] == pytest.approx(0.030 if plan.pass_ == "forward" else 0.010)
        assert min(t for t in times.values() if t is not None) == times[plan.chosen]
    assert any(GLOBAL in p for p, _ in plans["forward"].candidates)
    assert not any(GLOBAL in p for p, _ in plans["backward"].candidates)
    with emulated():
        monkeypatch.setenv("LLTM_CUDA_PLAN", "cooperative")
        forced = run_ops(args, "dense", "both", [True] * 5)
    got_all, forced_all = [*outputs, *grads, *gate_grads], [*forced[0], *forced[1], *forced[2]]
    for got, want in zip(got_all, forced_all, strict=True):
        assert torch.equal(got, want)


def test_a_later_call_runs_the_remembered_plan_without_measuring():
    args = forward_args(STEPS, BATCH, STATE, packed=False, reverse=False)
    with measuring() as gpu:
        first, _, _ = counted(gpu, lambda: inference(args))
        calls, took, second = counted(gpu, lambda: inference(args))
        [plan] = measured()
    assert first.get("cudaEventRecord", 0) > 0
    assert calls.get("cudaEventRecord", 0) == 0
    assert calls.get("cudaStreamIsCapturing", 0) == 0
    assert calls["cudaLaunchKernelEx"] == 1
    assert took == pytest.approx(30.0)  # the projection and one cooperative launch
    assert plan.pass_ == "inference" and plan.schedule == f"{STEPS} steps"
    with emulated():
        rule = inference(args)
    for got, want in zip(second, rule, strict=True):
        torch.testing.assert_close(got, want, **F64)


def test_no_measuring_while_a_graph_is_captured():
    args = forward_args(STEPS, BATCH, STATE, packed=False, reverse=False)
    with measuring() as gpu:
        gpu.set_capturing(True)
        calls, took, _ = counted(gpu, lambda: inference(args))
        # Nothing measured: the rule's plan, clusters on an H100.
        assert calls.get("cudaEventRecord", 0) == 0
        assert took == pytest.approx(50.0)
        assert measured() == []
        gpu.set_capturing(False)
        inference(args)  # measured now
        gpu.set_capturing(True)
        calls, took, _ = counted(gpu, lambda: inference(args))
        # The remembered plan applies during capture.
        assert calls.get("cudaEventRecord", 0) == 0
        assert took == pytest.approx(30.0)


def test_a_plan_the_gpu_refuses_is_skipped():
    # Other work holds all but one multiprocessor, which takes 8 blocks: a
    # cooperative grid of more cannot be had (the plans count on every
    # multiprocessor), so the cheapest launch, a cooperative grid for the
    # whole batch, is refused; one wave of a batch row at a time fits.
    args = forward_args(STEPS, BATCH, STATE, packed=False, reverse=False)
    with measuring() as gpu:
        gpu.set_multiprocessor_limits(2048, 8)
        gpu.set_free_multiprocessors(1)
        gpu.set_costs({**COSTS, "cudaLaunchKernelEx/cluster": 45.0})
        assert_matches_oracle(args, "dense", "both", [True] * 5, F64)
        plans = measured()
    assert {p.pass_ for p in plans} == {"forward", "backward"}
    for plan in plans:
        times = dict(plan.candidates)
        refused = [p for p, ms in plan.candidates if ms is None]
        assert refused and all(p.startswith(COOPERATIVE) for p in refused), plan
        assert plan.chosen.startswith(COOPERATIVE) and "3 waves" in plan.chosen, plan
        assert times[plan.chosen] is not None
        assert min(ms for ms in times.values() if ms is not None) == times[plan.chosen]


def test_the_choices_are_bounded_least_recently_used_first_out(monkeypatch):
    monkeypatch.setenv("LLTM_CUDA_MEASURED_PLANS", "2")
    runs = {
        steps: forward_args(steps, BATCH, STATE, packed=False, reverse=False) for steps in (1, 2, 3)
    }
    with measuring() as gpu:
        for steps in (1, 2):
            inference(runs[steps])
        inference(runs[1])  # used again: now the most recent
        inference(runs[3])  # the bound: 2 steps goes
        assert [p.schedule for p in measured()] == ["3 steps", "1 steps"]
        calls, _, _ = counted(gpu, lambda: inference(runs[2]))
        assert calls.get("cudaEventRecord", 0) > 0  # measured again
        assert [p.schedule for p in measured()] == ["2 steps", "3 steps"]


@pytest.mark.parametrize("op", ["sequence_forward", "sequence_inference"])
def test_opcheck_while_measuring(op):
    # Measuring runs the op many times: it must still mutate none of its
    # inputs and match its schema, fake kernel and autograd registration.
    args = forward_args(STEPS, BATCH, STATE, packed=True, reverse=True)
    for t in args[:5]:
        t.requires_grad_()
    with measuring():
        torch.library.opcheck(getattr(torch.ops.lltm, op).default, tuple(args))
        assert measured()


def test_each_schedule_is_a_kind_of_its_own():
    # A padded batch runs the same launches either way; a packed one's
    # schedule, direction included, is its own kind.
    padded = forward_args(STEPS, BATCH, STATE, packed=False, reverse=False)
    packed = forward_args(STEPS, BATCH, STATE, packed=True, reverse=False)
    with measuring():
        for args in (padded, packed):
            for reverse in (False, True):
                inference([*args[:6], reverse])
        schedules = [p.schedule for p in measured()]
    assert schedules == [
        f"packed, {STEPS} steps, reverse",
        f"packed, {STEPS} steps",
        f"{STEPS} steps",
    ]


def test_an_invalid_bound_is_an_argument_error(monkeypatch):
    monkeypatch.setenv("LLTM_CUDA_MEASURED_PLANS", "many")
    args = forward_args(STEPS, BATCH, STATE, packed=False, reverse=False)
    with measuring(), pytest.raises(ValueError, match="LLTM_CUDA_MEASURED_PLANS=many"):
        inference(args)


def test_benchmark_off_is_the_rule():
    args = forward_args(STEPS, BATCH, STATE, packed=False, reverse=False)
    with measuring() as gpu:
        _library().set_measuring(False)
        calls, took, _ = counted(gpu, lambda: inference(args))
        assert measured() == []
    assert calls.get("cudaEventRecord", 0) == 0
    assert took == pytest.approx(50.0)


def test_a_forced_plan_wins_over_measuring(monkeypatch):
    monkeypatch.setenv("LLTM_CUDA_PLAN", "clusters")
    args = forward_args(STEPS, BATCH, STATE, packed=False, reverse=False)
    with measuring() as gpu:
        calls, took, _ = counted(gpu, lambda: inference(args))
        assert measured() == []
    assert calls.get("cudaEventRecord", 0) == 0
    assert took == pytest.approx(50.0)


def test_16_bit_candidates_include_both_kinds_of_product():
    args = forward_args(STEPS, BATCH, 16, packed=False, reverse=False, dtype=torch.bfloat16)
    with measuring():
        inference(args)
        [plan] = measured()
    plans = [p for p, _ in plan.candidates]
    assert plan.dtype == "bfloat16"
    assert any("tensor cores" in p for p in plans)
    assert any(p.startswith("persistent") and "tensor cores" not in p for p in plans)


def test_python_passes_the_flag_to_the_plugin_when_it_changes(monkeypatch):
    # The host build's library in the place of a loaded plugin's _C.
    library = _library()
    calls: list[bool] = []

    def set_measuring(on: bool) -> bool:
        calls.append(on)
        return library.set_measuring(on)

    plugin = types.ModuleType("lltm_cuda_host_plugin._C")
    plugin.set_measuring = set_measuring  # type: ignore[attr-defined]
    plugin.measured_plans = library.measured_plans  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, plugin.__name__, plugin)
    monkeypatch.setattr(
        _backends, "PLUGIN", _backends.PluginStatus(True, "lltm_cuda_host_plugin", "test", None)
    )
    monkeypatch.setattr(_backends, "_measuring", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    args = forward_args(STEPS, BATCH, STATE, packed=False, reverse=False)
    with emulated() as gpu:
        gpu.set_costs(COSTS)
        try:
            _backends.mirror_benchmark()
            torch.backends.cudnn.benchmark = True
            _backends.mirror_benchmark()
            _backends.mirror_benchmark()
            inference(args)
            assert [p.pass_ for p in _backends.measured_plans()] == ["inference"]
            torch.backends.cudnn.benchmark = False
            _backends.mirror_benchmark()
        finally:
            library.set_measuring(False)
    assert calls == [True, False]
