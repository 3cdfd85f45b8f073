"""Test of the installed conda package: the operator runs in every flavour and
matches the pure-PyTorch reference (tools/check_ops.py, run before, checks
that each flavour's compiled kernels are registered)."""

from __future__ import annotations

import torch

import lltm
from lltm import reference


def _loop(input, weights, bias, old_h, old_cell):
    """The reference cell over the steps of `input`."""
    outputs = []
    for step in input:
        old_h, old_cell = reference.lltm_cell(step, weights, bias, old_h, old_cell)
        outputs.append(old_h)
    return torch.stack(outputs), old_h, old_cell


def _compare(out, expected, args) -> None:
    torch.testing.assert_close(out, expected)
    # Weighted sums: a swapped or misrouted gradient changes the result.
    weights = [torch.linspace(0.5, 1.5, t.numel(), device=t.device).view(t.shape) for t in out]
    grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(out, weights, strict=True)), args)
    expected_grads = torch.autograd.grad(
        sum((t * w).sum() for t, w in zip(expected, weights, strict=True)), args
    )
    torch.testing.assert_close(grads, expected_grads)


def check(device: str) -> None:
    args = reference.example_inputs(4, 8, 16, device=device, requires_grad=True)
    _compare(lltm.lltm_cell(*args), reference.lltm_cell(*args), args)
    sequence = torch.randn(5, 4, 8, dtype=torch.float64, device=device, requires_grad=True)
    seq_args = [sequence, *args[1:]]
    output, (h_n, c_n) = lltm.lltm_sequence(*seq_args)
    _compare((output, h_n, c_n), _loop(*seq_args), seq_args)
    print(f"lltm {lltm.__version__}: {device} cell and sequence match the reference")


check("cpu")
# The CUDA flavour (it alone installs with a CUDA build of pytorch), on a GPU.
if torch.version.cuda is not None and torch.cuda.is_available():
    check("cuda")
