"""16-bit rounding: lltm rounds where the reference rounds, not more often.

The reference computes gates = F.linear([old_h, input], W, b), which rounds
X W^T + b to 16 bits once, and differentiates ELU from its input. Kernels
that round X W^T before adding the bias overflow float16 where the bias would
have brought the value back; kernels that differentiate ELU through a 16-bit
elu(x) + 1 lose exp(x) (4 % at x = -3, 30 % at -5, all of it below -6).
Each test runs the cell and the sequence op, on the CPU and (where lltm's
CUDA kernels are active) on the GPU, and the composite kernel.
"""

from __future__ import annotations

import pytest
import torch

import lltm
from lltm import _backends, reference
from lltm.ops.cell_ops import composite as cell_composite

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

DEVICES = ["cpu"] + (["cuda"] if _backends.cuda_status()[0] else [])


def _one_unit_step(candidate_weight: float, candidate_bias: float, dtype, device):
    """A cell of one unit, input [h, x] = [1, 1], whose input and output gates
    see 0 and whose candidate sees 2 * candidate_weight + candidate_bias."""
    weights = torch.zeros(3, 2, dtype=torch.float64)
    weights[2] = candidate_weight
    bias = torch.tensor([0.0, 0.0, candidate_bias], dtype=torch.float64)
    ones = torch.ones(1, 1, dtype=torch.float64)
    args = [ones, weights, bias, ones, torch.zeros(1, 1, dtype=torch.float64)]
    return [t.to(device=device, dtype=dtype) for t in args]


def _cell(input, weights, bias, old_h, old_cell):
    return lltm.lltm_cell(input, weights, bias, old_h, old_cell)


def _sequence(input, weights, bias, old_h, old_cell):
    output, (_, c_n) = lltm.lltm_sequence(input[None], weights, bias, old_h, old_cell)
    return output[0], c_n


def _composite_cell(input, weights, bias, old_h, old_cell):
    return cell_composite.forward(input, weights, bias, old_h, old_cell)[:2]


IMPLEMENTATIONS = {"cell": _cell, "sequence": _sequence, "composite": _composite_cell}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_float16_pre_activation_rounded_once_with_the_bias(impl, device):
    # X W^T = 70000 overflows float16 (max 65504); X W^T + b = 60000 does not.
    args = _one_unit_step(35000.0, -10000.0, torch.float16, device)
    new_h, new_cell = IMPLEMENTATIONS[impl](*args)
    expected_h, expected_cell = reference.lltm_cell(*args)
    assert torch.isfinite(expected_cell).all()
    assert torch.isfinite(new_cell).all() and torch.isfinite(new_h).all()
    torch.testing.assert_close(new_cell, expected_cell)
    torch.testing.assert_close(new_h, expected_h)


def _candidate_gradients(impl, x: float, dtype, device):
    """Gradients of new_cell with respect to the candidate's bias and weights,
    with the candidate's pre-activation at x (exactly representable)."""
    args = [t.requires_grad_() for t in _one_unit_step(0.0, x, dtype, device)]
    _, new_cell = IMPLEMENTATIONS[impl](*args)
    grad_weights, grad_bias = torch.autograd.grad(new_cell.sum(), args[1:3])
    return grad_bias[2].double().item(), grad_weights[2].double().cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", ["cell", "sequence"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("x", [-3.0, -5.0, -8.0])
def test_elu_derivative_from_the_pre_activation(impl, dtype, x, device):
    # d new_cell / d b_candidate = i * elu'(x) = 0.5 * exp(x), to 16-bit
    # rounding of the result itself (the reference differentiates ELU from x).
    exact = 0.5 * torch.tensor(x, dtype=torch.float64).exp().item()
    grad_bias, grad_weights = _candidate_gradients(impl, x, dtype, device)
    eps = torch.finfo(dtype).eps
    assert abs(grad_bias - exact) <= 2 * eps * exact, (grad_bias, exact)
    torch.testing.assert_close(
        grad_weights, torch.full((2,), exact, dtype=torch.float64), rtol=2 * eps, atol=0
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_composite_elu_derivative_from_the_pre_activation(dtype):
    args = _one_unit_step(0.0, -5.0, dtype, "cpu")
    new_h, new_cell, gates = cell_composite.forward(*args)
    grads = cell_composite.backward(
        torch.zeros_like(new_h), torch.ones_like(new_cell), new_cell, gates,
        args[0], args[3], args[1], [False, False, True, False, False],
    )  # fmt: skip
    exact = 0.5 * torch.tensor(-5.0, dtype=torch.float64).exp().item()
    assert abs(grads[2][2].double().item() - exact) <= 2 * torch.finfo(dtype).eps * exact
