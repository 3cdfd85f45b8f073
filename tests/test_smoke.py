"""Smoke test of an installed lltm: what a wheel's test command runs.

Imports, reports, computes one step on the CPU: enough to catch a wheel that
misses its library, links against the wrong torch or registers no kernel.
Depends on nothing but torch, lltm and pytest.
"""

from __future__ import annotations

import subprocess
import sys

import torch

import lltm
from lltm import reference


def test_import_and_version():
    assert lltm.__version__
    assert torch.ops.lltm.forward.default is lltm.ops.forward


def test_info_command_runs():
    out = subprocess.run(
        [sys.executable, "-m", "lltm", "info"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert f"lltm {lltm.__version__}" in " ".join(out.split())
    assert "kernel [cpu]" in out and "native" in out


def _upstream(outputs, seed=1):
    """Random upstream gradients: with all-ones ones (a .sum()), gradients
    routed to the wrong output would still match."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in outputs]


def test_cpu_step_matches_reference():
    inputs = reference.example_inputs(requires_grad=True)
    outputs = lltm.lltm_cell(*inputs)
    expected = reference.lltm_cell(*inputs)
    torch.testing.assert_close(outputs, expected)
    upstream = _upstream(outputs)
    grads = torch.autograd.grad(outputs, inputs, upstream)
    expected_grads = torch.autograd.grad(expected, inputs, upstream)
    torch.testing.assert_close(grads, expected_grads)


def test_cpu_sequence_matches_a_loop_of_the_reference():
    inputs = reference.example_inputs(requires_grad=True)  # batch 4, features 3, state 5
    _, weights, bias, h_0, c_0 = inputs
    steps = torch.randn(3, 4, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    steps.requires_grad_()
    leaves = [steps, weights, bias, h_0, c_0]
    output, (h_n, c_n) = lltm.lltm_sequence(*leaves)
    h, c, hs = h_0, c_0, []
    for x in steps.unbind(0):
        h, c = reference.lltm_cell(x, weights, bias, h, c)
        hs.append(h)
    expected = [torch.stack(hs), h, c]
    torch.testing.assert_close([output, h_n, c_n], expected)
    upstream = _upstream(expected)
    grads = torch.autograd.grad([output, h_n, c_n], leaves, upstream)
    torch.testing.assert_close(grads, torch.autograd.grad(expected, leaves, upstream))
