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
        [sys.executable, "-m", "lltm", "info"], capture_output=True, text=True, check=True
    ).stdout
    assert f"lltm {lltm.__version__}" in " ".join(out.split())
    assert "kernel [cpu]" in out and "native" in out


def test_cpu_step_matches_reference():
    inputs = reference.example_inputs(requires_grad=True)
    outputs = lltm.lltm_cell(*inputs)
    expected = reference.lltm_cell(*inputs)
    torch.testing.assert_close(outputs, expected)
    grads = torch.autograd.grad(sum(t.sum() for t in outputs), inputs)
    expected_grads = torch.autograd.grad(sum(t.sum() for t in expected), inputs)
    torch.testing.assert_close(grads, expected_grads)
