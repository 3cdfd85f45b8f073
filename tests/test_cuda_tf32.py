"""float32 on the TF32 tensor cores (allow_tf32), on the host build's emulated GPU.

* The instruction: mma.sync m16n8k8 .tf32 with fragments built in the probe
  from the PTX ISA's layout gives A B + C (tests/cuda_host/runtime/
  tensor_cores.h); the emulation's reading of an operand's low 13 bits
  (ignored); csrc/cuda's round_to_tf32 against a rounding written here.
* The block product of the persistent kernels in TF32
  (lltm_cuda_tensor_cores.cuh) at odd sizes: each input split in two TF32
  terms, three instructions a tile and step, as accurate as float32's
  product and far more than one term's; inf and NaN where float32's product
  has them.
* The sequence ops with allow_tf32 (and torch's setting "high", which the
  emulated cuBLAS follows as cuBLAS does: tests/cuda_host/runtime/
  cublas.cpp): every plan (LLTM_CUDA_PLAN), forward and backward, padded and
  packed, both directions, against the float64 oracle within the bound
  below; the tensor cores ran (the emulation counts their instructions);
  with allow_tf32=False the bits are those of a call that never heard of
  it; inf and NaN where exact float32 has them; below sm_80, and for other
  dtypes, nothing changes; the plan says "3xTF32 tensor cores".
* lltm.LLTMSequence under torch's float32 matmul setting: TF32 under "high"
  (its backward too, whatever the setting when it runs), exact under
  "highest".
* Against nn.LSTM under cuDNN's default TF32, simulated (tests/lstm_bound.py):
  at 50 steps lltm is no less accurate in any role; the simulation is
  nn.LSTM's and rounds.

The bound. Under TF32 every product but one takes its inputs in two TF32
terms (three instructions, or three of cuBLAS's TF32 GEMMs: csrc/cuda/
lltm_cuda_tf32_gemm.cuh), which reads each to about 22 significant bits: the
results are float32's, within twice exact float32's error against float64
(measured: 0.8 to 1.3 times). One term's error would be hundreds of times
that (2**-11 an input against float32's 2**-24), so the bound fails for a
product taken in one term. The one product left in one term is the weight
gradient (cuBLAS's TF32 GEMM, as nn.LSTM's own): its reference is the
float64 run with just that GEMM's inputs rounded to TF32 (_Tf32WeightGrad),
whose error it stays within 1.25 times of (the values rounded differ from
the simulation's by float32's roundings now and then; measured, within 2 %).

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator

import cuda_host
import lstm_bound
import pytest
import torch
from lstm_bound import tf32
from oracle import nonfinite_pattern, sequence_oracle
from test_cuda_persistent import emulated, forward_args

import lltm
from lltm.reference import lltm_cell as reference_cell

pytestmark = cuda_host.ONLY

MMA_TF32 = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"


@pytest.fixture
def emulation():
    """The emulated GPU, as it starts, for one test (and as it starts after)."""
    emulated = cuda_host.emulation()
    emulated.reset()
    yield emulated
    emulated.reset()


def _bits(t: torch.Tensor) -> list[int]:
    return [b & 0xFFFFFFFF for b in t.float().contiguous().view(torch.int32).flatten().tolist()]


def _float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


# --- round_to_tf32 and the instruction -------------------------------------------------------


def test_round_to_tf32_rounds_to_nearest_ties_away(emulation):
    one = 0x3F800000
    cases = {
        _float(one + 0x0FFF): 1.0,  # below half an ulp: down
        _float(one + 0x1000): _float(one + 0x2000),  # a tie: away from zero
        -_float(one + 0x1000): -_float(one + 0x2000),
        _float(one + 0x2000 + 0x1000): _float(one + 0x4000),  # a tie from an odd one: away
        _float(one + 0x1FFF): _float(one + 0x2000),
        _float(0x7F7FFFFF): math.inf,  # float32's largest rounds past TF32's
        _float(0x00000FFF): 0.0,  # subnormals round in the same bits
        _float(0x00001000): _float(0x00002000),
        -0.0: -0.0,
        math.inf: math.inf,
        -math.inf: -math.inf,
    }
    got = emulation.round_to_tf32(list(cases))
    for (x, want), value in zip(cases.items(), got, strict=True):
        assert value == want and math.copysign(1, value) == math.copysign(1, want), (x, value)
    assert math.isnan(emulation.round_to_tf32([math.nan])[0])
    # And the rounding the tests and nn.LSTM's simulation use (lstm_bound.tf32)
    # is the kernels'.
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 1e3
    assert torch.equal(torch.tensor(emulation.round_to_tf32(x.tolist())), tf32(x))


def _operands(seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    a = tf32(torch.randn(16, 8, generator=generator))
    b = tf32(torch.randn(8, 8, generator=generator))
    c = torch.randn(16, 8, generator=generator)
    return a, b, c


@pytest.mark.parametrize("threads", [32, 96], ids=lambda t: f"{t // 32}warps")
def test_mma_tf32_computes_a_b_plus_c_from_the_ptx_fragments(emulation, threads):
    for seed in range(3):
        a, b, c = _operands(seed)
        before = emulation.instructions().get(MMA_TF32, 0)
        got = torch.tensor(
            emulation.mma_tf32(_bits(a), _bits(b), c.flatten().tolist(), threads)
        ).reshape(16, 8)
        # Products of TF32 values are exact in float32; 8 of them and C
        # summed in float32.
        torch.testing.assert_close(got.double(), a.double() @ b.double() + c.double(), rtol=0,
                                   atol=1e-5)  # fmt: skip
        # One instruction a warp.
        assert emulation.instructions()[MMA_TF32] - before == threads // 32
    # Each element is placed: a transposed or shifted reading would differ.
    a, b, _ = _operands(7)
    got = torch.tensor(emulation.mma_tf32(_bits(a), _bits(b), [0.0] * 128, 32)).reshape(16, 8)
    assert not torch.allclose(got.double(), a.double() @ b.double().T, atol=1e-3)
    assert not torch.allclose(got.double()[:8], a.double()[8:] @ b.double(), atol=1e-3)


def test_mma_tf32_ignores_the_low_13_bits(emulation):
    # What the emulation assumes (tensor_cores.h): an operand's low 13 bits
    # do not count. The kernels never pass any (they round first).
    a, b, c = _operands(3)
    noise = torch.randint(0, 0x2000, (16, 8), generator=torch.Generator().manual_seed(1))
    noisy_a = [bits | n for bits, n in zip(_bits(a), noise.flatten().tolist(), strict=True)]
    clean = emulation.mma_tf32(_bits(a), _bits(b), c.flatten().tolist(), 32)
    assert emulation.mma_tf32(noisy_a, _bits(b), c.flatten().tolist(), 32) == clean


def test_mma_tf32_below_sm80_is_a_fault(emulation):
    emulation.set_capability(7, 5)
    a, b, c = _operands(0)
    with pytest.raises(RuntimeError, match=r"m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32 on a GPU of "
                       r"compute capability 7\.5: it needs 8\.0"):  # fmt: skip
        emulation.mma_tf32(_bits(a), _bits(b), c.flatten().tolist(), 32)


# (W rows, X rows, inner, split): a tile and less, odd edges on every side,
# more tiles than warps, the inner dimension split.
PRODUCT_SIZES = [(16, 8, 8, 1), (1, 1, 1, 1), (13, 5, 17, 1), (9, 17, 33, 2), (40, 33, 70, 4),
                 (96, 3, 128, 8), (17, 40, 5, 2)]  # fmt: skip


def _product(emulation, w: torch.Tensor, x: torch.Tensor, split: int, k_contiguous: bool):
    """lltm_cuda_tensor_cores.cuh's product W X^T in TF32 as the persistent
    kernels call it, its parts summed in float64, and the instructions it took."""
    (ms, inner), ns = w.shape, x.shape[0]
    w_layout = w if k_contiguous else w.T.contiguous()
    before = emulation.instructions().get(MMA_TF32, 0)
    parts = torch.tensor(
        emulation.tensor_core_product_tf32(
            w_layout.flatten().tolist(), x.flatten().tolist(), ms, ns, inner, split, k_contiguous,
            128,
        )
    ).reshape(split, ms, ns)  # fmt: skip
    return parts.double().sum(0), emulation.instructions().get(MMA_TF32, 0) - before


@pytest.mark.parametrize("k_contiguous", [True, False], ids=["w_by_rows", "w_by_columns"])
@pytest.mark.parametrize("size", PRODUCT_SIZES, ids=lambda s: "m{}-n{}-k{}-split{}".format(*s))
def test_the_kernels_tf32_product(emulation, size, k_contiguous):
    # W and X float32, each split in two TF32 terms as its fragments are
    # read, three instructions a 16 x 8 tile and step of 8.
    ms, ns, inner, split = size
    generator = torch.Generator().manual_seed(ms * 1000 + ns * 10 + inner)
    w = torch.randn(ms, inner, generator=generator)
    x = torch.randn(ns, inner, generator=generator)
    got, instructions = _product(emulation, w, x, split, k_contiguous)
    assert instructions == 3 * math.ceil(ms / 16) * math.ceil(ns / 8) * math.ceil(inner / 8)
    exact = w.double() @ x.double().T
    scale = w.double().abs() @ x.double().abs().T
    # float32's accuracy: its own product, summed in float32, is off by up
    # to about inner * 2**-24 of the scale.
    error = ((got - exact).abs() / scale).max().item()
    assert error < inner * 2**-23, error
    # One term (both operands rounded to TF32) is far off that.
    if inner >= 5:
        one_term = tf32(w).double() @ tf32(x).double().T
        assert ((one_term - exact).abs() / scale).max().item() > 30 * error


@pytest.mark.parametrize("where", ["w", "x", "both"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_the_kernels_tf32_product_keeps_non_finite_values(emulation, where, value):
    # An inf or NaN of W or X: the result is non-finite where, and as,
    # float32's product makes it (the high term alone carries the value; its
    # partner in the cross terms is zero there).
    generator = torch.Generator().manual_seed(11)
    w = torch.randn(13, 17, generator=generator)
    x = torch.randn(5, 17, generator=generator)
    if where in ("w", "both"):
        w[3, 4] = value
        w[7, 9] = 0.0
    if where in ("x", "both"):
        x[2, 9] = value
        x[1, 4] = 1.0 + 2**-20  # a low term that is not zero
    got, _ = _product(emulation, w, x, 1, True)
    exact = w.double() @ x.double().T
    assert torch.equal(nonfinite_pattern(got), nonfinite_pattern(exact))
    assert not torch.isfinite(got).all()
    finite = torch.isfinite(exact)
    torch.testing.assert_close(got[finite], exact[finite], rtol=1e-5, atol=1e-5)


# --- The sequence ops with allow_tf32 ----------------------------------------------------------


class _Tf32WeightGrad(torch.autograd.Function):
    """x @ w^T, exact in float64; in the backward the weight gradient as
    cuBLAS's one-term TF32 GEMM takes it (grad and x rounded to TF32), the
    gradient of x exact: the one product lltm leaves in one term under TF32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x @ w.T

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return grad @ w, tf32(grad).T @ tf32(x)


def _tf32_cell(input, weights, bias, old_h, old_cell):
    """lltm.reference.lltm_cell with its weight gradient as lltm takes it
    under TF32."""
    pre = _Tf32WeightGrad.apply(torch.cat([old_h, input], dim=1), weights) + bias
    input_gate, output_gate, candidate = pre.chunk(3, dim=1)
    new_cell = old_cell + torch.nn.functional.elu(candidate) * torch.sigmoid(input_gate)
    return torch.tanh(new_cell) * torch.sigmoid(output_gate), new_cell


def _float64_run(args: list, upstream: list, cell) -> list[torch.Tensor]:
    """output, h_n, c_n and the five inputs' gradients of `cell` over the
    sequence, in float64."""
    x, w, b, h, c, batch_sizes, reverse = args
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b, h, c)]
    outputs = sequence_oracle(*leaves, batch_sizes, reverse, cell=cell)
    grads = torch.autograd.grad(
        outputs, leaves, [g.double() for g in upstream], allow_unused=True, materialize_grads=True
    )
    return [t.detach() for t in (*outputs, *grads)]


def _ops_run(args: list, allow_tf32: bool | None) -> list[torch.Tensor]:
    """sequence_forward, then sequence_backward of every input and
    sequence_gate_grads, as lltm's ops run them (allow_tf32 None: left out),
    under torch's setting "high" where allow_tf32, else "highest";
    output, h_n, c_n, the five gradients, the gate gradients, and the
    upstream gradients."""
    flag = [] if allow_tf32 is None else [allow_tf32]
    with lstm_bound.matmul_precision("high" if allow_tf32 else "highest"):
        output, h_n, c_n, gates, cells = torch.ops.lltm.sequence_forward(*args, *flag)
        generator = torch.Generator().manual_seed(5)
        upstream = [torch.randn(t.shape, generator=generator).to(t.dtype) for t in
                    (output, h_n, c_n)]  # fmt: skip
        x, w, _b, h, _c, batch_sizes, reverse = args
        saved = [output, gates, cells, x, w, h, batch_sizes, reverse]
        grads = torch.ops.lltm.sequence_backward(*upstream, *saved, [True] * 5, *flag)
        gate_grads = torch.ops.lltm.sequence_gate_grads(*upstream, *saved, *flag)
    return [output, h_n, c_n, *grads, *gate_grads, cells, *upstream]


NAMES = ("output", "h_n", "c_n", *(f"grad_{n}" for n in ("input", "weights", "bias", "old_h",
         "old_cell")))  # fmt: skip
# LLTM_CUDA_PLAN values (tests/test_cuda_persistent_forced.py): every plan.
PLANS = ("auto", "cooperative", "cooperative-global-h", "waves=2", "cuda-cores", "per-step")
# (steps, batch, state, packed): odd sizes, edges of the instruction's tiles
# on every side.
TF32_SIZES = [(6, 7, 17, True), (4, 3, 33, False)]


def _relative_rms(got: torch.Tensor, exact: torch.Tensor) -> float:
    got, exact = got.detach().double(), exact.detach().double()
    return ((got - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item()


def _errors(args: list, got: list, exact32: list) -> dict[str, tuple[float, float, float]]:
    """By NAMES: the relative RMS errors against float64 of lltm's ops with
    allow_tf32 (got), of exact float32 (exact32), and of the float64 run
    with the weight gradient's GEMM in one TF32 term (_tf32_cell)."""
    upstream = got[-3:]
    want = _float64_run(args, upstream, reference_cell)
    simulated = _float64_run(args, upstream, _tf32_cell)
    return {
        name: (_relative_rms(g, w), _relative_rms(e, w), _relative_rms(s, w))
        for name, g, e, w, s in zip(NAMES, got, exact32, want, simulated, strict=False)
    }


def _assert_within_the_bound(errors: dict[str, tuple[float, float, float]]) -> None:
    """The module docstring's bound: float32's accuracy in every role but
    the weight gradient, which is within its one-term TF32 reference and
    TF32 it is (hundreds of times float32's error: the emulated cuBLAS
    rounded it, so it rounds any other product left in one term too)."""
    table = ", ".join(f"{n} {g:.2e} (float32 {e:.2e}, one-term weight gradient {s:.2e})" for
                      n, (g, e, s) in errors.items())  # fmt: skip
    for name, (error, float32_error, simulated) in errors.items():
        if name == "grad_weights":
            assert error <= 1.25 * simulated, table
            assert error > 100 * float32_error, table
        else:
            assert error <= 2 * float32_error, f"{name}: {table}"


def test_the_tutorial_size_within_the_tf32_bound():
    # T = 50 at the tutorial's sizes (batch 16, features 32, state 128), the
    # rule's plan on the emulated H100.
    args = forward_args(50, 16, 128, packed=False, reverse=False, dtype=torch.float32,
                        features=32)  # fmt: skip
    with emulated() as gpu:
        before = gpu.instructions().get(MMA_TF32, 0)
        got = _ops_run(args, True)
        assert gpu.instructions().get(MMA_TF32, 0) > before
        exact32 = _ops_run(args, False)
    _assert_within_the_bound(_errors(args, got, exact32))


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("size", TF32_SIZES, ids=lambda s: "T{}-B{}-S{}-{}".format(*s))
@pytest.mark.parametrize("plan", PLANS)
def test_allow_tf32_within_the_tf32_bound_on_every_plan(monkeypatch, plan, size, reverse):
    steps, batch, state, packed = size
    args = forward_args(steps, batch, state, packed=packed, reverse=reverse, dtype=torch.float32)
    monkeypatch.setenv("LLTM_CUDA_PLAN", plan)
    with emulated(order="random", seed=1) as gpu:
        before = gpu.instructions().get(MMA_TF32, 0)
        got = _ops_run(args, True)
        instructions = gpu.instructions().get(MMA_TF32, 0) - before
        exact32 = _ops_run(args, False)
        default = _ops_run(args, None)
        with lstm_bound.matmul_precision("high"):
            inference = torch.ops.lltm.sequence_inference(*args, True)
    # The inference forward takes the same products.
    for a, b in zip(inference, got[:3], strict=True):
        assert torch.equal(a, b)
    # The tensor cores ran where the plan takes them, and nowhere else.
    tensor_cores = plan not in ("cuda-cores", "per-step")
    assert (instructions > 0) == tensor_cores, instructions
    # allow_tf32=False is the call as it was: the bits of a call without it.
    for a, b in zip(exact32, default, strict=True):
        assert torch.equal(a, b)
    _assert_within_the_bound(_errors(args, got, exact32))
    # The gate gradients are those of the backward.
    d_gates, grad_h, grad_c = got[8:11]
    torch.testing.assert_close(grad_h, got[6], rtol=0, atol=0)
    torch.testing.assert_close(grad_c, got[7], rtol=0, atol=0)
    assert d_gates.shape[-1] == 3 * state


# (steps, batch, state): the per-step path's products past lltm's own kernel
# (lltm_cuda_recurrent.cuh: inner dimension at most 384), so that cuBLAS takes
# them: the backward's (inner 3 * 129), and both passes' (inner 400 forward).
CUBLAS_SIZES = [(3, 17, 129), (3, 3, 400)]
GEMM = "aoti_torch_cuda_addmm_out"


@pytest.mark.parametrize("size", CUBLAS_SIZES, ids=lambda s: "T{}-B{}-S{}".format(*s))
def test_allow_tf32_on_the_per_step_paths_cublas_products(monkeypatch, size):
    # The per-step path's recurrent products that go to cuBLAS are three
    # TF32 GEMMs on the split operands (lltm_cuda_tf32_gemm.cuh), W_h split
    # once a call: within the bound, where one term each would not be.
    steps, batch, state = size
    args = forward_args(steps, batch, state, packed=False, reverse=False, dtype=torch.float32)
    monkeypatch.setenv("LLTM_CUDA_PLAN", "per-step")
    with emulated() as gpu:
        before = gpu.calls().get(GEMM, 0)
        got = _ops_run(args, True)
        tf32_gemms = gpu.calls().get(GEMM, 0) - before
        before = gpu.calls().get(GEMM, 0)
        exact32 = _ops_run(args, False)
        exact_gemms = gpu.calls().get(GEMM, 0) - before
    _assert_within_the_bound(_errors(args, got, exact32))
    # Each GEMM but the weight gradient's becomes three.
    forward_products = steps if state > 384 else 0
    backward_products = 2 * steps  # sequence_backward's, then sequence_gate_grads'
    split = 1 + forward_products + backward_products + 1  # projection, ..., grad_input
    assert tf32_gemms - exact_gemms == 2 * split, (tf32_gemms, exact_gemms)


def test_a_long_projection_is_split_in_chunks():
    # The split GEMMs split their left operand a bounded number of rows at a
    # time (lltm_cuda_tf32_gemm.cuh: 2**21 elements a term): 70 steps of
    # 1000 rows of 32 features are two chunks of the input projection, three
    # GEMMs each, and the forward is still float32's.
    args = forward_args(70, 1000, 2, packed=False, reverse=False, dtype=torch.float32,
                        features=32)  # fmt: skip
    with emulated() as gpu:
        before = gpu.calls().get(GEMM, 0)
        with lstm_bound.matmul_precision("high"):
            got = torch.ops.lltm.sequence_forward(*args, True)
        assert gpu.calls().get(GEMM, 0) - before == 2 * 3
        exact32 = torch.ops.lltm.sequence_forward(*args, False)
    x, w, b, h, c, batch_sizes, reverse = [a.double() if torch.is_tensor(a) else a for a in args]
    want = sequence_oracle(x, w, b, h, c, batch_sizes, reverse, cell=reference_cell)
    for g, e, exact in zip(got[:3], exact32[:3], want, strict=True):
        assert _relative_rms(g, exact) <= 2 * _relative_rms(e, exact)


def test_below_compute_capability_8_allow_tf32_changes_nothing():
    # No TF32 there: the persistent kernels and the per-step path stay
    # exact float32, as cuBLAS does on such a GPU.
    args = forward_args(5, 4, 9, packed=True, reverse=False, dtype=torch.float32)
    with emulated() as gpu:
        gpu.set_capability(7, 5)
        before = gpu.instructions().get(MMA_TF32, 0)
        got = _ops_run(args, True)
        assert gpu.instructions().get(MMA_TF32, 0) == before
        exact32 = _ops_run(args, False)
    for a, b in zip(got, exact32, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_allow_tf32_leaves_other_dtypes_alone(dtype):
    # float64 stays float64, and the 16-bit kernels' products are on the
    # tensor cores already, the same either way.
    args = forward_args(4, 3, 17, packed=False, reverse=True, dtype=dtype)
    with emulated():
        got = _ops_run(args, True)
        without = _ops_run(args, False)
    for a, b in zip(got, without, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("setting", "capability", "says"),
    [
        ("auto", (9, 0), "3xTF32 tensor cores"),
        ("cooperative-global-h", (9, 0), "3xTF32 tensor cores"),
        ("cuda-cores", (9, 0), None),
        ("auto", (8, 0), "3xTF32 tensor cores"),
        ("auto", (7, 5), None),
    ],
)  # fmt: skip
def test_the_plan_says_tf32_tensor_cores(monkeypatch, setting, capability, says):
    monkeypatch.setenv("LLTM_CUDA_PLAN", setting)
    with emulated() as gpu:
        gpu.set_capability(*capability)
        with_tf32 = gpu.plan(4, 7, 17, True).splitlines()
        without = gpu.plan(4, 7, 17, False).splitlines()
        double = gpu.plan(8, 7, 17, True).splitlines()
    for line in with_tf32:
        assert line.startswith(("forward: persistent", "backward: persistent")), line
        if says is None:
            assert "tensor cores" not in line, line
        else:
            assert says in line, line
    for line in without + double:
        assert "tensor cores" not in line, line


@pytest.mark.parametrize(("capability", "says"), [((9, 0), True), ((7, 5), False)])
def test_the_plugins_sequence_path_follows_the_tf32_setting(capability, says):
    # What `lltm info` and the bench show: the plugin's own answer, with the
    # call's allow_tf32 (lltm._backends passes torch's setting).
    with emulated() as gpu:
        gpu.set_capability(*capability)
        plugin = cuda_host.modules()[0]
        with_tf32 = plugin.sequence_path(-1, 4, 7, 17, True)
        without = plugin.sequence_path(-1, 4, 7, 17, False)
        default = plugin.sequence_path(-1, 4, 7, 17)
    assert default == without
    assert ("3xTF32 tensor cores" in with_tf32) == says, with_tf32
    assert "tensor cores" not in without, without


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("where", ["recurrent_weight", "h0", "input_weight", "input"])
def test_non_finite_values_as_on_the_cuda_cores(where, value):
    # No fallback in TF32: in the kernels' products a non-finite value's
    # high term alone carries it (lltm_cuda_tensor_cores.cuh), in the split
    # GEMMs its low term (lltm_cuda_tf32_gemm.cuh), so every result is
    # non-finite where, and as, exact float32 makes it: an inf or NaN of W_h
    # or h0 (the recurrent products), of W_x or the input (the projection
    # and the gradient of the input, through the split GEMMs).
    args = forward_args(4, 5, 17, packed=False, reverse=False, dtype=torch.float32)
    if where == "recurrent_weight":
        args[1][7, 3] = value  # W_h's row 7, column 3
    elif where == "input_weight":
        args[1][30, 17 + 1] = value  # W_x's row 30, column 1
    elif where == "input":
        args[0][2, 3, 1] = value
    else:
        args[3][2, 5] = value
    with emulated() as gpu:
        before = gpu.instructions().get(MMA_TF32, 0)
        got = _ops_run(args, True)
        assert gpu.instructions().get(MMA_TF32, 0) > before
        exact32 = _ops_run(args, False)
    for name, a, b in zip((*NAMES, "d_gates", "grad_h", "grad_c", "cells"), got, exact32,
                          strict=False):  # fmt: skip
        assert torch.equal(nonfinite_pattern(a), nonfinite_pattern(b)), name
    # And the case is one: some result is not finite.
    assert not all(torch.isfinite(t).all() for t in got[:8])


def test_an_infinite_input_meeting_an_infinite_weight_is_nan_in_the_split_gemms():
    # The one case the split GEMMs do not carry as float32 does, as
    # lltm_cuda_tf32_gemm.cuh and docs/cuda.md say: an infinite input and an
    # infinite weight of the input projection that meet in one product give
    # NaN where float32's product is infinite (each one's low term holds it,
    # and meets the other's high term, zero).
    args = forward_args(3, 2, 5, packed=False, reverse=False, dtype=torch.float32)
    args[0][1, 0, 2] = math.inf  # step 1, row 0, feature 2
    args[1][4, 5 + 2] = math.inf  # W_x's row 4 (the input gate's unit 4), feature 2
    with emulated():
        got = _ops_run(args, True)
        exact32 = _ops_run(args, False)
    # float32: the input gate's pre-activation is +inf, the gate 1, the
    # step's h finite; here the pre-activation, and so that unit's h, NaN.
    assert torch.isfinite(exact32[0][1, 0, 4])
    assert torch.isnan(got[0][1, 0, 4])


@pytest.fixture
def matmul_precision() -> Iterator[Callable[[str], None]]:
    """Sets torch's float32 matmul precision; puts back what it was."""
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        yield torch.set_float32_matmul_precision
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def test_the_module_follows_torchs_setting(matmul_precision):
    # From torch's setting to the kernels: lltm.LLTMSequence on the emulated
    # GPU runs TF32 under "high", its backward in its forward's precision
    # whatever the setting when it runs, and exact float32 under "highest".
    torch.manual_seed(0)
    model = lltm.LLTMSequence(8, 24)
    x = torch.randn(5, 6, 8)

    def step(forward: str, backward: str, gpu) -> tuple[list[torch.Tensor], int, int]:
        matmul_precision(forward)
        start = gpu.instructions().get(MMA_TF32, 0)
        output, _ = model(x)
        middle = gpu.instructions().get(MMA_TF32, 0)
        matmul_precision(backward)
        grads = torch.autograd.grad(output.sum(), [*model.parameters()])
        end = gpu.instructions().get(MMA_TF32, 0)
        return [output.detach(), *grads], middle - start, end - middle

    with emulated() as gpu:
        tf32, forward_mma, backward_mma = step("high", "highest", gpu)
        exact, exact_forward_mma, exact_backward_mma = step("highest", "high", gpu)
    assert forward_mma > 0 and backward_mma > 0
    assert exact_forward_mma == exact_backward_mma == 0
    assert all(not torch.equal(a, b) for a, b in zip(tf32, exact, strict=True))
    for a, b in zip(tf32, exact, strict=True):
        torch.testing.assert_close(a, b, rtol=5e-3, atol=5e-3)


# --- Against nn.LSTM under TF32 -----------------------------------------------------------

# (steps, batch, features, state): the tutorial's size and an odd one, at the
# T = 50 of the 16-bit bound (test_cuda_persistent_16_bit.py).
LSTM_BOUND_SIZES = [(50, 16, 32, 128), (50, 7, 13, 45)]


@pytest.mark.parametrize("size", LSTM_BOUND_SIZES, ids=lambda s: "t{}-b{}-f{}-s{}".format(*s))
def test_under_tf32_no_less_accurate_than_nn_lstm_at_50_steps(size):
    """lltm with TF32 allowed against nn.LSTM under cuDNN's default TF32,
    measured as the 16-bit bound is (tests/lstm_bound.py; nn.LSTM simulated):
    at 50 steps lltm's error is at most nn.LSTM's in every role.

    Why it takes three terms: with one TF32 term a product, as cuDNN runs
    nn.LSTM, lltm was 1.4 to 9.2 times less accurate than nn.LSTM here
    (grad_bias and grad_old_cell the most). The LLTM cell has no forget
    gate: its cell state adds every step's rounding and keeps it, and in the
    backward the cell's gradient reaches every earlier step undamped, where
    nn.LSTM's forget gate damps both. With the products that feed the
    recurrence in two terms (the input projection, the recurrent products,
    the gradient of the input), every other role is at float32's error,
    0.001 to 0.004 times nn.LSTM's; the weight gradient, in one term as
    nn.LSTM's, 0.35 to 0.39 times nn.LSTM's (measured).
    """
    theirs = lstm_bound.lstm_errors_tf32(size)
    precision = torch.backends.cuda.matmul.fp32_precision
    with emulated() as gpu:
        before = gpu.instructions().get(MMA_TF32, 0)
        ours = lstm_bound.lltm_errors_tf32(size, "cpu")
        assert gpu.instructions().get(MMA_TF32, 0) > before  # TF32 it was
    assert torch.backends.cuda.matmul.fp32_precision == precision
    lstm_bound.assert_no_less_accurate(ours, theirs)
    # The weight gradient is TF32's (one term, the emulated cuBLAS's): the
    # comparison is of TF32 with TF32.
    assert ours["grad_weights"] > 0.1 * theirs["grad_weights"], ours


def test_the_nn_lstm_simulation_is_nn_lstms_and_rounds():
    # Without its TF32 rounding the simulation is nn.LSTM to float32's
    # rounding (its gate order and arithmetic: a wrong one is off by O(1));
    # with it, each product's operands lose 13 bits, and its error is TF32's,
    # hundreds of times float32's (measured: 840 to 2600 times).
    size = LSTM_BOUND_SIZES[1]
    exact = lstm_bound.lstm_errors_tf32(size, tensor_cores=False)
    rounded = lstm_bound.lstm_errors_tf32(size)
    table = ", ".join(f"{n} {rounded[n]:.2e} (float32 {exact[n]:.2e})" for n in lstm_bound.NAMES)
    for name in lstm_bound.NAMES:
        assert exact[name] < 1e-6, f"{name}: {table}"
        assert rounded[name] > 100 * exact[name], f"{name}: {table}"
