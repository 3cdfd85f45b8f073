"""``sequence_inference`` of the CUDA sources (csrc/cuda/lltm_cuda_sequence_forward.cu)
on the host build's emulated GPU: ``sequence_forward``'s path without what only
the backward reads.

* Its output, h_n and c_n are ``sequence_forward``'s bits, in float32, float64,
  float16 and bfloat16, padded and packed, in both directions, at odd sizes
  (no step, no batch row, no state, no input feature among them), on every
  plan: the persistent kernels in clusters and on a cooperative grid, on GPUs
  of 132, 12 and 1 multiprocessors, in 16 bits on the tensor cores and on the
  CUDA cores, with h read from global memory, in waves; the per-step path
  (LLTM_CUDA_PERSISTENT=0, a state too large for the persistent kernels, a
  launch the GPU refuses), with lltm's own recurrent product and cuBLAS's.
* It makes the same launches and GEMMs, and allocates what
  ``sequence_forward`` allocates but the cells, and in 16 bits the gates
  (the emulation records each allocation's sizes): where the per-step path
  runs in 16 bits, one step's gates in their place.
* Its arguments are checked as ``sequence_forward``'s, with the same messages.

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import collections
import itertools
from types import ModuleType

import cuda_host
import pytest
import torch
from test_cuda_persistent import GPUS, MODES, ORDERS, SIZES, emulated, forward_args, path
from test_cuda_persistent_whole_gpu import CASES as GLOBAL_CASES
from test_cuda_persistent_whole_gpu import GLOBAL, WAVE_CASES, _small_gpu, _waves
from test_cuda_work import QUERIES

pytestmark = cuda_host.ONLY

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
SIXTEEN_BITS = (torch.float16, torch.bfloat16)
# What the emulation counts that is work on the GPU: launches and GEMMs.
LAUNCHES_AND_GEMMS = ("LLTM_LAUNCH", "cudaLaunchKernelEx", "aoti_torch_cuda_addmm_out")


def _element_size(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


def _dtype_code(dtype: torch.dtype) -> int:
    """The dtype as the emulation records it (the shim's code: torch's ScalarType)."""
    return {torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}[dtype]


def _run(gpu: ModuleType, op, args: list):
    """(results, counted work, allocations) of one call of `op`."""
    gpu.allocations()  # drops what earlier calls left
    before = gpu.calls()
    results = op(*args)
    after = gpu.calls()
    work = collections.Counter(
        {
            name: n - before.get(name, 0)
            for name, n in after.items()
            if n != before.get(name, 0) and name not in QUERIES
        }
    )
    allocations = collections.Counter((sizes, dtype) for sizes, dtype in gpu.allocations())
    return results, work, allocations


def assert_inference_is_forward(gpu: ModuleType, args: list) -> bool:
    """sequence_inference against sequence_forward on the emulated GPU as it
    is set up: the same bits of output, h_n and c_n, the same launches and
    GEMMs, no more copies, and the allocations but those only the backward
    reads. Whether the persistent kernels ran."""
    ops = torch.ops.lltm_cuda_host
    # The training call first: the queries of the GPU and the plan are made
    # there, so both calls below are the same repeated work.
    ops.sequence_forward(*args)
    forward, forward_work, forward_allocations = _run(gpu, ops.sequence_forward, args)
    inference, inference_work, inference_allocations = _run(gpu, ops.sequence_inference, args)
    assert len(inference) == 3
    for name, want, got in zip(("output", "h_n", "c_n"), forward[:3], inference, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), f"{name}: not the training path's bits"
    for name in LAUNCHES_AND_GEMMS:
        assert inference_work[name] == forward_work[name], (name, inference_work, forward_work)
    assert inference_work["aten::copy_"] <= forward_work["aten::copy_"], (
        inference_work,
        forward_work,
    )
    persistent = forward_work["cudaLaunchKernelEx"] > 0
    # The training call's tensors but the cells (the output's shape) and in
    # 16 bits the gates; where 16 bits take the per-step path, one step's
    # gates instead, a (1, n) tensor no larger than the gates.
    output, _, _, gates, cells = forward
    dtype = _dtype_code(output.dtype)
    expected = collections.Counter(forward_allocations)
    left_out = [(tuple(cells.shape), dtype)]
    if output.dtype in SIXTEEN_BITS:
        left_out.append((tuple(gates.shape), dtype))
    for key in left_out:
        assert expected[key] > 0, f"sequence_forward made no {key}: {forward_allocations}"
        expected[key] -= 1
    extra = inference_allocations - expected
    if output.dtype in SIXTEEN_BITS and not persistent:
        ((sizes, scratch_dtype), count), *others = extra.items()
        assert not others and count == 1 and scratch_dtype == dtype, extra
        assert len(sizes) == 2 and sizes[0] == 1 and sizes[1] <= gates.numel(), extra
    else:
        assert not extra, (inference_allocations, forward_allocations)
    assert not expected - inference_allocations, (inference_allocations, forward_allocations)

    def elements(allocations: collections.Counter) -> int:
        return sum(torch.Size(sizes).numel() * n for (sizes, _), n in allocations.items())

    assert elements(inference_allocations) <= elements(forward_allocations) - cells.numel()
    return persistent


# --- The persistent kernels ----------------------------------------------------------------

# SIZES of tests/test_cuda_persistent.py (every state of 1 to 33, batch of 0
# to 7, length of 0 to 7; padded and packed), and a state and an input of
# width 0.
ODD_SIZES = [(*size, 3) for size in SIZES] + [(3, 2, 0, False, 3), (4, 3, 5, True, 0)]


def _cases() -> list:
    """Each size in every dtype, both modes and both directions; the GPU and
    the schedule order rotate through the cases."""
    cases = []
    settings = itertools.cycle(itertools.product(GPUS, ORDERS))
    for (steps, batch, state, packed, features), dtype, mode, reverse in itertools.product(
        ODD_SIZES, DTYPES, MODES, (False, True)
    ):
        gpu, order = next(settings)
        next(settings)  # a stride of 2 through the 9 settings: all of them, in turn
        cases.append(
            pytest.param(
                steps, batch, state, packed, features, dtype, mode, reverse, gpu, order,
                id=f"{str(dtype)[6:]}-t{steps}-b{batch}-s{state}-f{features}"
                f"-{'packed' if packed else 'padded'}-{mode}{'-reverse' if reverse else ''}"
                f"-{gpu.replace(' ', '')}-{order}",
            )
        )  # fmt: skip
    return cases


@pytest.mark.parametrize(
    ("steps", "batch", "state", "packed", "features", "dtype", "mode", "reverse", "gpu", "order"),
    _cases(),
)  # fmt: skip
def test_persistent_kernels(
    steps, batch, state, packed, features, dtype, mode, reverse, gpu, order
):
    args = forward_args(steps, batch, state, packed, reverse, dtype=dtype, features=features)
    with emulated(mode, gpu, order=order, seed=steps + batch + state) as emulation:
        rule = path(_element_size(dtype), batch, state)
        persistent = assert_inference_is_forward(emulation, args)
    assert persistent == (batch > 0 and state > 0), rule
    if persistent:
        mode_text = "clusters" if mode == "clusters" else "cooperative grid"
        assert rule.startswith(f"forward: persistent, {mode_text}"), rule
        assert ("tensor cores" in rule.splitlines()[0]) == (dtype in SIXTEEN_BITS), rule


@pytest.mark.parametrize("dtype", SIXTEEN_BITS, ids=str)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_16_bit_on_the_cuda_cores(dtype, reverse):
    # Below compute capability 8.0 the 16-bit products run on the CUDA cores.
    args = forward_args(6, 7, 33, packed=True, reverse=reverse, dtype=dtype)
    with emulated("cooperative", "12 SMs", order="random", seed=1) as gpu:
        gpu.set_capability(7, 5)
        rule = path(2, 7, 33).splitlines()[0]
        assert assert_inference_is_forward(gpu, args)
    assert "persistent" in rule and "tensor cores" not in rule, rule


@pytest.mark.parametrize(
    ("dtype", "batch", "state", "capability", "kib"),
    GLOBAL_CASES,
    ids=[f"{str(c[0])[6:]}-s{c[2]}-sm{c[3][0]}{c[3][1]}" for c in GLOBAL_CASES],
)
def test_h_read_from_global_memory(dtype, batch, state, capability, kib):
    args = forward_args(5, batch, state, packed=True, reverse=True, dtype=dtype)
    with emulated("cooperative", order="random", seed=state) as gpu:
        _small_gpu(gpu, capability, kib)
        forward = path(_element_size(dtype), batch, state).splitlines()[0]
        assert assert_inference_is_forward(gpu, args)
    assert "2 groups x 2 blocks" in forward and GLOBAL in forward, forward


@pytest.mark.parametrize(
    ("packed", "reverse"), [(False, False), (True, True)], ids=["padded", "packed-reverse"]
)
@pytest.mark.parametrize("case", WAVE_CASES)
def test_waves(case, packed, reverse):
    dtype, batch, state, set_up, forward_waves, _ = WAVE_CASES[case]
    args = forward_args(4, batch, state, packed=packed, reverse=reverse, dtype=dtype)
    with emulated("clusters", order="random", seed=batch) as gpu:
        set_up(gpu)
        forward = path(_element_size(dtype), batch, state).splitlines()[0]
        assert assert_inference_is_forward(gpu, args)
    assert _waves(forward) == forward_waves > 1, forward


# --- The per-step path ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("steps", "batch", "state", "packed", "reverse"),
    [
        (6, 3, 5, True, True),
        (6, 3, 5, True, False),
        (5, 4, 17, False, False),
        (5, 4, 17, False, True),
        (7, 7, 33, True, True),
        (0, 3, 5, False, False),
        (2, 0, 5, False, True),
    ],
    ids=lambda v: str(v),
)
def test_per_step_path(monkeypatch, dtype, steps, batch, state, packed, reverse):
    # State 5, 17, 33: in 16 bits, steps' gates at every alignment (3S a row).
    args = forward_args(steps, batch, state, packed, reverse, dtype=dtype)
    monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
    with emulated() as gpu:
        assert "per-step (" in path(_element_size(dtype), max(batch, 1), state)
        assert not assert_inference_is_forward(gpu, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_per_step_path_with_cublas_products(monkeypatch, dtype):
    # An inner dimension past 384: the recurrent product is cuBLAS's (torch's
    # addmm) rather than lltm's own kernel.
    args = forward_args(3, 2, 400, packed=True, reverse=True, dtype=dtype)
    monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
    with emulated() as gpu:
        assert not assert_inference_is_forward(gpu, args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_gpu_without_persistent_launches(dtype):
    # Neither cooperative nor cluster launches: the per-step path by the rule.
    args = forward_args(5, 3, 17, packed=True, reverse=False, dtype=dtype)
    with emulated() as gpu:
        gpu.set_capability(8, 0)
        gpu.set_cooperative_launch(False)
        assert "neither cooperative nor cluster" in path(_element_size(dtype), 3, 17)
        assert not assert_inference_is_forward(gpu, args)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_a_launch_the_gpu_refuses(dtype):
    # The cooperative grid's plan counts on all 132 multiprocessors, 4 are
    # free: the launch is refused and both ops run the per-step path.
    args = forward_args(6, 7, 33, packed=False, reverse=True, dtype=dtype)
    with emulated("cooperative") as gpu:
        gpu.set_free_multiprocessors(4)
        assert "persistent, cooperative grid" in path(_element_size(dtype), 7, 33)
        assert not assert_inference_is_forward(gpu, args)
        assert gpu.peek_last_error() == gpu.cudaSuccess


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-step"])
def test_no_step_at_all(monkeypatch, dtype, persistent):
    # A packed batch of no step: every row keeps its initial state.
    generator = torch.Generator().manual_seed(3)
    batch, state, features = 3, 5, 2

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)

    args = [
        draw(0, features),
        draw(3 * state, state + features),
        draw(3 * state),
        draw(batch, state),
        draw(batch, state),
        torch.zeros(0, dtype=torch.long),
        False,
    ]
    if not persistent:
        monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
    with emulated() as gpu:
        assert assert_inference_is_forward(gpu, args) == persistent
    output, h_n, c_n = torch.ops.lltm_cuda_host.sequence_inference(*args)
    assert output.shape == (0, state)
    assert torch.equal(h_n, args[3]) and torch.equal(c_n, args[4])


# --- Arguments -----------------------------------------------------------------------------


def _bad_arguments() -> dict[str, list]:
    good = forward_args(3, 2, 5, packed=True, reverse=False, dtype=torch.float32)
    x, w, b, h, c, batch_sizes, _ = good

    def replaced(index: int, value) -> list:
        args = list(good)
        args[index] = value
        return args

    return {
        "input features": replaced(0, x[:, :2]),
        "weights": replaced(1, w[:, :-1]),
        "bias": replaced(2, b[:-1]),
        "old_h": replaced(3, h[:1]),
        "old_cell dtype": replaced(4, c.double()),
        "batch_sizes increasing": replaced(5, torch.arange(1, len(batch_sizes) + 1)),
        "batch_sizes sum": replaced(5, batch_sizes + 1),
        "input rank": replaced(0, x[None]),
    }


@pytest.mark.parametrize("case", _bad_arguments())
def test_arguments_are_checked_as_sequence_forwards(case):
    args = _bad_arguments()[case]
    ops = torch.ops.lltm_cuda_host
    with emulated():
        with pytest.raises((RuntimeError, ValueError)) as forward:
            ops.sequence_forward(*args)
        with pytest.raises((RuntimeError, ValueError)) as inference:
            ops.sequence_inference(*args)
    assert type(inference.value) is type(forward.value)
    assert str(inference.value) == str(forward.value)
