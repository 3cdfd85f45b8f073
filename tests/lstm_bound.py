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

The same bound for float32 on the TF32 tensor cores (test_cuda_tf32.py):
lltm with TF32 allowed (lltm_errors_tf32) against nn.LSTM under cuDNN's
default, which runs float32 RNNs on the TF32 tensor cores. The CPU cannot
run that, so there nn.LSTM's TF32 error is simulated (lstm_errors_tf32); on
a GPU, lstm_errors(size, torch.float32, "cuda") measures it.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator

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
    return _lltm_errors(size, dtype, device, seed, autocast=True)


def lltm_errors_tf32(
    size: tuple[int, int, int, int], device: str, seed: int = 0
) -> dict[str, float]:
    """lltm.lltm_sequence's relative errors in float32 with TF32 allowed, by
    NAMES: forward and backward under torch.set_float32_matmul_precision("high")
    (as users train with it set), torch's setting put back after."""
    with matmul_precision("high"):
        return _lltm_errors(size, torch.float32, device, seed, autocast=False)


def lltm_errors_exact_float32(
    size: tuple[int, int, int, int], device: str, seed: int = 0
) -> dict[str, float]:
    """lltm_errors_tf32's, under torch's "highest" (exact float32)."""
    with matmul_precision("highest"):
        return _lltm_errors(size, torch.float32, device, seed, autocast=False)


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """torch's float32 matmul setting (torch.set_float32_matmul_precision)
    for the duration; on a GPU cuBLAS follows it, and so does the host
    build's emulated one (tests/cuda_host/runtime/cublas.cpp)."""
    before = torch.backends.cuda.matmul.fp32_precision
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def _lltm_errors(
    size: tuple[int, int, int, int],
    dtype: torch.dtype,
    device: str,
    seed: int,
    autocast: bool,
) -> dict[str, float]:
    """lltm.lltm_sequence's relative errors, by NAMES, from float32 leaves
    exact in `dtype`; with ``autocast``, its forward inside
    ``torch.autocast(device, dtype)``."""
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

    got = run(lltm.lltm_sequence, leaves, cast=autocast)
    # lltm's documented behaviour: the region's dtype, as torch's own recurrent
    # ops return it.
    assert all(t.dtype == dtype for t in got[:3]), [t.dtype for t in got[:3]]
    exact = run(loop_of_cells, [t.cpu().double() for t in leaves], cast=False)
    return {n: relative_error(g, e) for n, g, e in zip(NAMES, got, exact, strict=True)}


def _lstm(size: tuple[int, int, int, int], dtype: torch.dtype, seed: int) -> tuple:
    """nn.LSTM's float32 module with parameters exact in `dtype`, its inputs
    (input, h0, c0) and upstream gradients, from the shared draws."""
    _, _, features, state = size
    draws = _draws(size, seed)
    torch.manual_seed(seed + 1)
    module = torch.nn.LSTM(features, state)  # uniform in +-1/sqrt(state)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(parameter.to(dtype))  # exact in `dtype`
    inputs = [draws["input"], draws["h0"][None], draws["c0"][None]]
    upstream = [draws["grad_output"], draws["grad_h_n"][None], draws["grad_c_n"][None]]
    return module, inputs, upstream


def _by_role(output, h_n, c_n, grads) -> list[torch.Tensor]:
    """nn.LSTM's results by NAMES; `grads`: those of input, h0, c0, then of
    its parameters in their order (W_ih, W_hh, b_ih, b_hh)."""
    grad_x, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_b_ih, _ = grads
    weights = torch.cat([grad_w_ih.flatten(), grad_w_hh.flatten()])
    return [output, h_n[0], c_n[0], grad_x, weights, grad_b_ih, grad_h0[0], grad_c0[0]]


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
    module, inputs, upstream = _lstm(size, dtype, seed)

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
        return _by_role(output, h_n, c_n, grads), output.dtype

    computed_in = dtype
    if autocast:
        got, computed_in = run(torch.float32, device, cast=True)
    if not autocast or computed_in != dtype:
        got, computed_in = run(dtype, device, cast=False)
    exact, _ = run(torch.float64, "cpu", cast=False)
    errors = {n: relative_error(g, e) for n, g, e in zip(NAMES, got, exact, strict=True)}
    return errors, computed_in


# --- nn.LSTM on the TF32 tensor cores, simulated -------------------------------------------


def tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 values of `t` rounded to TF32 (10 bits of significand, to
    nearest, ties away from zero: cvt.rna.tf32.f32), in `t`'s dtype;
    infinities and NaN kept."""
    bits = t.float().contiguous().view(torch.int32)
    rounded = ((bits + 0x1000) & -0x2000).view(torch.float32)
    finite = torch.isfinite(t.float())
    return torch.where(finite, rounded, t.float()).to(t.dtype)


class _Tf32MatMul(torch.autograd.Function):
    """a @ b on the TF32 tensor cores: both operands rounded to TF32, the
    products (exact in float32: 11 by 11 significant bits) summed in float32.
    Its backward is the two GEMMs of cuDNN's backward, each the same way:
    grad a = grad @ b^T (backward data), grad b = a^T @ grad (backward
    weights), with grad, a and b rounded to TF32."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = tf32(a), tf32(b)
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        grad = tf32(grad)
        return grad @ b.T, a.T @ grad


def simulated_lstm(
    input: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor],
    parameters: list[torch.Tensor],
    tensor_cores: bool = True,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """nn.LSTM (one layer, one direction) as cuDNN computes it in float32,
    step by step in nn.LSTM's gate order (input, forget, cell, output);
    ``(output, (h_n, c_n))``, h and c of shape (1, batch, state).

    Modelled: every matrix product cuDNN runs on the TF32 tensor cores with
    TF32 operands and float32 sums (_Tf32MatMul): the input projection of
    all steps as one GEMM, the recurrent h W_hh^T each step, and through
    autograd their backward data and backward weights GEMMs (the recurrent
    weight gradient summed over the steps in float32, where cuDNN runs one
    GEMM over all of them: the same sums in another order). Everything else
    in float32, as cuDNN does. Not modelled: cuDNN's order of summation
    within a product and its fused pointwise arithmetic, float32-sized
    differences, 2**13 times smaller than TF32's rounding. TF32's rounding
    is modelled to nearest, the more accurate choice where a kernel might
    truncate, so nn.LSTM's simulated error is, if anything, the smaller.
    ``tensor_cores=False``: the same computation in exact float32.
    """
    matmul = _Tf32MatMul.apply if tensor_cores else torch.matmul
    w_ih, w_hh, b_ih, b_hh = parameters
    steps, batch, features = input.shape
    projected = matmul(input.reshape(steps * batch, features), w_ih.T) + b_ih
    projected = projected.reshape(steps, batch, -1)
    h, c = state[0][0], state[1][0]
    outputs = []
    for t in range(steps):
        gates = projected[t] + matmul(h, w_hh.T) + b_hh
        input_gate, forget_gate, cell_gate, output_gate = gates.chunk(4, dim=1)
        c = torch.sigmoid(forget_gate) * c + torch.sigmoid(input_gate) * torch.tanh(cell_gate)
        h = torch.sigmoid(output_gate) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs), (h[None], c[None])


def lstm_errors_tf32(
    size: tuple[int, int, int, int], seed: int = 0, tensor_cores: bool = True
) -> dict[str, float]:
    """nn.LSTM's relative errors in float32 on the TF32 tensor cores, cuDNN's
    default, by NAMES: simulated_lstm with nn.LSTM's parameters, inputs and
    upstream gradients (those of lstm_errors in float32), against nn.LSTM in
    float64. ``tensor_cores=False``: simulated_lstm's in exact float32."""
    module, inputs, upstream = _lstm(size, torch.float32, seed)

    def run(dtype: torch.dtype, simulate: bool) -> list[torch.Tensor]:
        model = copy.deepcopy(module).to(dtype)
        parameters = list(model.parameters())
        leaves = [t.to(dtype).requires_grad_() for t in inputs]
        if simulate:
            output, (h_n, c_n) = simulated_lstm(
                leaves[0], (leaves[1], leaves[2]), parameters, tensor_cores
            )
        else:
            output, (h_n, c_n) = model(leaves[0], (leaves[1], leaves[2]))
        grads = torch.autograd.grad(
            [output, h_n, c_n], [*leaves, *parameters], [g.to(dtype) for g in upstream]
        )
        return _by_role(output, h_n, c_n, grads)

    got = run(torch.float32, simulate=True)
    exact = run(torch.float64, simulate=False)
    return {n: relative_error(g, e) for n, g, e in zip(NAMES, got, exact, strict=True)}


def assert_no_less_accurate(ours: dict[str, float], theirs: dict[str, float]) -> None:
    """Each of lltm's errors at most nn.LSTM's error of the same role."""
    worse = {n: (ours[n], theirs[n]) for n in NAMES if not ours[n] <= theirs[n]}
    table = ", ".join(f"{n} {ours[n]:.2e} (nn.LSTM {theirs[n]:.2e})" for n in NAMES)
    assert not worse, f"less accurate than nn.LSTM in {sorted(worse)}: {table}"
