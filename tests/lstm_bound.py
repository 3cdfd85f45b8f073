"""The accuracy bound of lltm's 16-bit sequences: nn.LSTM's own error in the
same 16-bit dtype, at the same sizes, measured where it is used
(test_cuda_persistent_16_bit.py on the host build, test_cuda.py on a GPU).

How the errors are normalised, so that two different models compare fairly:

* Each error is the RMS of (result - float64 result) over the RMS of the
  float64 result, one number per tensor: scale-free, so that it does not
  depend on how large each model's values are.
* Both models start from the same draws: input, initial state and upstream
  gradients standard normal, from the same seed; weights and biases from the
  same distribution, uniform in +-1/sqrt(state), both modules' default
  initialisation (lltm.LLTM, nn.LSTM).
* Everything is rounded to the 16-bit dtype first, and the float64 run starts
  from those rounded values: the error is the computation's, not the
  rounding of its inputs.
* Tensors are paired by role: output, h_n, c_n, and the gradients of the
  input, of the weights (nn.LSTM's W_ih and W_hh together), of the bias
  (nn.LSTM's b_ih; b_hh's is the same), of the initial h and of the initial
  cell.
"""

from __future__ import annotations

import math

import torch
from test_sequence import loop_of_cells

import lltm

NAMES = (
    "output",
    "h_n",
    "c_n",
    "grad_input",
    "grad_weights",
    "grad_bias",
    "grad_old_h",
    "grad_old_cell",
)


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    """RMS of the error over the RMS of the float64 result."""
    got, exact = got.detach().cpu().double(), exact.detach().cpu().double()
    return ((got - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item()


def _draws(size: tuple[int, int, int, int], seed: int) -> dict[str, torch.Tensor]:
    """float32 draws of both models: input, h0, c0 and the upstream gradients."""
    steps, batch, features, state = size
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator)

    return {
        "input": normal(steps, batch, features),
        "h0": normal(batch, state),
        "c0": normal(batch, state),
        "grad_output": normal(steps, batch, state),
        "grad_h_n": normal(batch, state),
        "grad_c_n": normal(batch, state),
    }


def _uniform(generator: torch.Generator, bound: float, *shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=generator) * (2 * bound) - bound


def lltm_errors(
    size: tuple[int, int, int, int], dtype: torch.dtype, device: str, seed: int = 0
) -> dict[str, float]:
    """lltm.lltm_sequence's relative errors under ``torch.autocast(device,
    dtype)`` (float32 leaves, cast by autocast), by NAMES."""
    _, _, features, state = size
    draws = _draws(size, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    bound = 1 / math.sqrt(state)
    weights = _uniform(generator, bound, 3 * state, state + features)
    bias = _uniform(generator, bound, 3 * state)
    # float32 values that are exact in `dtype`: what autocast computes with.
    leaves = [
        t.to(dtype).float().to(device)
        for t in (draws["input"], weights, bias, draws["h0"], draws["c0"])
    ]
    upstream = [draws[n].to(dtype) for n in ("grad_output", "grad_h_n", "grad_c_n")]

    def run(fn, inputs: list[torch.Tensor], cast: bool):
        inputs = [t.detach().requires_grad_() for t in inputs]
        with torch.autocast(device, dtype=dtype, enabled=cast):
            output, (h_n, c_n) = fn(*inputs)
        grads = torch.autograd.grad([output, h_n, c_n], inputs, [g.to(output) for g in upstream])
        return [output, h_n, c_n, *grads]

    got = run(lltm.lltm_sequence, leaves, cast=True)
    # lltm's documented behaviour: the region's dtype, as torch's own recurrent
    # ops return it.
    assert all(t.dtype == dtype for t in got[:3]), [t.dtype for t in got[:3]]
    exact = run(loop_of_cells, [t.cpu().double() for t in leaves], cast=False)
    return {n: relative_error(g, e) for n, g, e in zip(NAMES, got, exact, strict=True)}


def lstm_errors(
    size: tuple[int, int, int, int],
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
    autocast: bool = False,
) -> tuple[dict[str, float], torch.dtype]:
    """nn.LSTM's relative errors in ``dtype`` (by NAMES) and the dtype it
    computed in. With ``autocast``, inside ``torch.autocast(device, dtype)``
    where the module computes in that dtype there; cuDNN's autocast casts to
    float16 whatever the region's dtype, and there the module runs in
    ``dtype`` itself (parameters and inputs), outside autocast."""
    _, _, features, state = size
    draws = _draws(size, seed)
    torch.manual_seed(seed + 1)
    module = torch.nn.LSTM(features, state)  # uniform in +-1/sqrt(state)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(parameter.to(dtype))  # exact in `dtype`
    inputs = [draws["input"], draws["h0"][None], draws["c0"][None]]
    upstream = [draws["grad_output"], draws["grad_h_n"][None], draws["grad_c_n"][None]]

    def run(in_dtype: torch.dtype, on: str, cast: bool):
        model = torch.nn.LSTM(features, state).to(on, in_dtype)
        model.load_state_dict(module.state_dict())
        model.flatten_parameters()  # cuDNN's layout (nothing to do elsewhere)
        leaves = [t.to(dtype).to(on, in_dtype).requires_grad_() for t in inputs]
        with torch.autocast(on, dtype=dtype, enabled=cast):
            output, (h_n, c_n) = model(leaves[0], (leaves[1], leaves[2]))
        grads = torch.autograd.grad(
            [output, h_n, c_n],
            [*leaves, *model.parameters()],
            [g.to(dtype).to(output) for g in upstream],
        )
        grad_x, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_b_ih, _ = grads
        weights = torch.cat([grad_w_ih.flatten(), grad_w_hh.flatten()])
        results = [output, h_n[0], c_n[0], grad_x, weights, grad_b_ih, grad_h0[0], grad_c0[0]]
        return results, output.dtype

    computed_in = dtype
    if autocast:
        got, computed_in = run(torch.float32, device, cast=True)
    if not autocast or computed_in != dtype:
        got, computed_in = run(dtype, device, cast=False)
    exact, _ = run(torch.float64, "cpu", cast=False)
    errors = {n: relative_error(g, e) for n, g, e in zip(NAMES, got, exact, strict=True)}
    return errors, computed_in


def assert_no_less_accurate(ours: dict[str, float], theirs: dict[str, float]) -> None:
    """Each of lltm's errors at most nn.LSTM's error of the same role."""
    worse = {n: (ours[n], theirs[n]) for n in NAMES if not ours[n] <= theirs[n]}
    table = ", ".join(f"{n} {ours[n]:.2e} (nn.LSTM {theirs[n]:.2e})" for n in NAMES)
    assert not worse, f"less accurate than nn.LSTM in {sorted(worse)}: {table}"
