"""lltm's Python side of measured plans (lltm/_backends.py): passing
``torch.backends.cudnn.benchmark`` to the CUDA plugin, and reading back what
it measured. Without a loaded plugin (this torch may have no CUDA), nothing
is passed and nothing is listed; the plugin's listing is parsed and rendered
as ``lltm info`` shows it. The plugin's side: tests/test_cuda_measured_plans.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from lltm import _backends, info
from lltm.bench import report

LISTING = (
    "plan\tforward\tfloat32\t0\t16\t128\tpacked, 50 steps, reverse\tpersistent, clusters: x\n"
    "candidate\t1.250000\tper-step\n"
    "candidate\t0.125000\tpersistent, clusters: x\n"
    "candidate\trefused\tpersistent, cooperative grid: y\n"
    "plan\tbackward\tbfloat16\t1\t8\t256\t50 steps\tper-step\n"
    "candidate\t0.500000\tper-step\n"
)


@pytest.fixture
def benchmark_restored():
    before = torch.backends.cudnn.benchmark
    yield
    torch.backends.cudnn.benchmark = before


@pytest.mark.skipif(_backends.PLUGIN.loaded, reason="a CUDA plugin is loaded here")
def test_without_a_plugin_nothing_is_passed_or_listed(benchmark_restored, monkeypatch):
    monkeypatch.setattr(_backends, "_measuring", False)
    for on in (True, False, True):
        torch.backends.cudnn.benchmark = on
        _backends.mirror_benchmark()
        # Not passed to anyone: the next plugin seen still gets the flag.
        assert _backends._measuring is False
    assert _backends.measured_plans() == []


def test_the_listing_is_parsed():
    forward, backward = _backends.parse_measured_plans(LISTING)
    assert forward == _backends.MeasuredPlan(
        "forward",
        "float32",
        False,
        16,
        128,
        "packed, 50 steps, reverse",
        "persistent, clusters: x",
        (
            ("per-step", 1.25),
            ("persistent, clusters: x", 0.125),
            ("persistent, cooperative grid: y", None),
        ),
    )
    assert (backward.pass_, backward.dtype, backward.tf32, backward.chosen) == (
        "backward",
        "bfloat16",
        True,
        "per-step",
    )
    assert _backends.parse_measured_plans("") == []


def test_a_plan_renders_its_candidates_times():
    forward, backward = _backends.parse_measured_plans(LISTING)
    lines = forward.render().splitlines()
    assert lines[0] == (
        "forward float32 batch 16 state 128 (packed, 50 steps, reverse): persistent, clusters: x"
    )
    assert lines[1].split() == ["1250.0", "us", "per-step"]
    assert lines[2].split()[:2] == ["125.0", "us"]
    assert "refused by the GPU" in lines[3]
    assert backward.render().startswith("backward bfloat16, tf32 batch 8")


def test_lltm_info_lists_the_measured_plans():
    plans = [dataclasses.asdict(p) for p in _backends.parse_measured_plans(LISTING)]
    collected = {**info.collect(), "cuda_measured_plans": plans}
    json.dumps(collected)  # --json prints it
    lines = info.render(collected).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("measured plan"))
    assert lines[at].split(None, 2)[2].startswith("forward float32 batch 16 state 128")
    assert "refused by the GPU" in lines[at + 3]
    assert sum(line.startswith("measured plan") for line in lines) == 2


def test_the_bench_says_where_a_plan_was_measured():
    path = {"forward": "measured: persistent, clusters: x", "backward": "per-step (why)"}
    assert report.short_path(path) == "fwd clusters measured, bwd per-step"
    path["backward"] = "measured: persistent, clusters: y"
    assert report.short_path(path) == "clusters measured"


def test_bench_cudnn_benchmark_sets_the_flag_for_its_run_only(benchmark_restored, capsys):
    from lltm import bench

    torch.backends.cudnn.benchmark = False
    fast = ["-b", "2", "-f", "3", "-s", "4", "-r", "2", "--block-seconds", "0.001"]
    argv = [*fast, "--device", "cpu", "--threads", "1", "--seq-len", "2", "--impl", "lltm-sequence"]
    assert bench.main([*argv, "--cudnn-benchmark", "--json", "-"]) == 0
    assert torch.backends.cudnn.benchmark is False
    assert json.loads(capsys.readouterr().out)["results"]
