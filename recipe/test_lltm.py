"""Test of the installed conda package: the operator runs in every flavour and
matches the pure-PyTorch reference (packaging/check_ops.py, run before, checks
that each flavour's compiled kernels are registered)."""

from __future__ import annotations

import torch

import lltm
from lltm import reference


def check(device: str) -> None:
    args = reference.example_inputs(4, 8, 16, device=device, requires_grad=True)
    out = lltm.lltm_cell(*args)
    expected = reference.lltm_cell(*args)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(sum(t.sum() for t in out), args)
    expected_grads = torch.autograd.grad(sum(t.sum() for t in expected), args)
    torch.testing.assert_close(grads, expected_grads)
    print(f"lltm {lltm.__version__}: {device} output and gradients match the reference")


check("cpu")
# The CUDA flavour (it alone installs with a CUDA build of pytorch), on a GPU.
if torch.version.cuda is not None and torch.cuda.is_available():
    check("cuda")
