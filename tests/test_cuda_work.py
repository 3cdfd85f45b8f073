"""What a sequence asks of the GPU does not grow with its length.

On the persistent path a sequence's forward and backward are each a fixed
number of device operations, whatever T: the input projection, one
persistent launch, and after the backward's recurrence the weights' gradient
from views of ``[old_h; output[:-1]]`` and ``input`` (a padded sequence), or
one gather of every row's previous state (a packed batch of several lengths):
never a copy, launch or view per step, whose host time (about 10 us each on
a GPU) would outgrow the kernels' at the tutorial's size.

The host build's emulation counts every kernel launch and every call of
torch's C shim that makes work or tensors (``emulation.calls()``:
allocations, views, GEMMs, dispatcher operators by name). Here a forward and
a backward of ``lltm.LLTMSequence`` at T = 5 and T = 50 make the same calls,
padded and packed, in one direction and both, with the initial state given
(its gradient wanted) and not; and the weights' gradient of a packed batch
of more lengths than one gather launch carries matches the float64 oracle.

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from types import ModuleType

import cuda_host
import pytest
import torch
from test_cuda_persistent import F64, assert_matches_oracle, path
from test_sequence import _packed_batch_sizes
from torch.nn.utils.rnn import pack_padded_sequence

import lltm

pytestmark = cuda_host.ONLY

BATCH, FEATURES, STATE = 5, 3, 6


def lengths(steps: int) -> list[int]:
    """A packed batch's lengths, four distinct ones whatever `steps` (so as
    many runs of equal batch sizes at T = 5 and T = 50)."""
    return [steps, steps, steps - 1, steps // 2, 1]


# What the CUDA sources ask the GPU, counted by the emulation too: a first
# call asks, later ones reuse the answers (tests/test_cuda_repeat_calls.py).
QUERIES = (
    "cudaDeviceGetAttribute",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveClusters",
    "cudaFuncSetAttribute",
    "cudaFuncGetAttributes",
)


def device_work(calls: collections.Counter[str]) -> collections.Counter[str]:
    """``calls`` without the queries of the GPU: the work a call makes."""
    return collections.Counter({k: n for k, n in calls.items() if k not in QUERIES})


def counted(gpu: ModuleType, call: Callable[[], object]) -> collections.Counter[str]:
    """The launches and shim calls `call` makes, by name."""
    before = gpu.calls()
    call()
    after = gpu.calls()
    return collections.Counter(
        {name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}
    )


def work(
    gpu: ModuleType,
    steps: int,
    packed: bool,
    bidirectional: bool,
    initial_state: bool,
    autocast: torch.dtype | None = None,
):
    """(forward's calls, backward's calls) of one training step of T = steps:
    in float64, or with ``autocast``, a float32 model and its loss under
    ``torch.autocast`` in that dtype (the sequence op in 16 bits), as GPU
    users train."""
    torch.manual_seed(0)
    dtype = torch.float64 if autocast is None else torch.float32
    model = lltm.LLTMSequence(FEATURES, STATE, bidirectional=bidirectional).to(dtype)
    x = torch.randn(steps, BATCH, FEATURES, dtype=dtype)
    directions = 2 if bidirectional else 1
    hx = None
    if initial_state:
        hx = tuple(
            torch.randn(directions, BATCH, STATE, dtype=dtype, requires_grad=True) for _ in range(2)
        )
    sequence = pack_padded_sequence(x, lengths(steps)) if packed else x
    outputs: list = []
    region = torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext()
    with region:
        forward = counted(gpu, lambda: outputs.append(model(sequence, hx)))
        output, (h_n, c_n) = outputs[0]
        data = output.data if packed else output
        loss = data.float().sum() + h_n.float().sum() + c_n.float().sum()
    backward = counted(gpu, loss.backward)
    return device_work(forward), device_work(backward)


@pytest.mark.parametrize("initial_state", [True, False], ids=["h0", "no-h0"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["one-way", "bidirectional"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_step_makes_as_many_device_calls_at_t5_as_at_t50(packed, bidirectional, initial_state):
    directions = 2 if bidirectional else 1
    with cuda_host.routed() as gpu:
        assert path(8, BATCH, STATE).count("persistent, clusters") == 2
        short = work(gpu, 5, packed, bidirectional, initial_state)
        long = work(gpu, 50, packed, bidirectional, initial_state)
    for name, at_5, at_50 in zip(("forward", "backward"), short, long, strict=True):
        assert at_5 == at_50, f"{name}: T=5 {dict(at_5)}, T=50 {dict(at_50)}"
        # The recurrence in one persistent launch a direction; the GEMMs
        # around it (and the counting) are there.
        assert at_5["cudaLaunchKernelEx"] == directions, f"{name}: {dict(at_5)}"
        assert at_5["aoti_torch_cuda_addmm_out"] >= directions, f"{name}: {dict(at_5)}"
        assert at_5["aoti_torch_empty_strided"] > 0, f"{name}: {dict(at_5)}"
    forward, backward = short
    # Forward: no plain kernel at all.
    assert forward["LLTM_LAUNCH"] == 0, dict(forward)
    # Backward: the gather of h_prev for a packed batch of several lengths,
    # nothing for a padded one (its weights' gradient reads views).
    assert backward["LLTM_LAUNCH"] == (directions if packed else 0), dict(backward)
    assert "aten::copy_" not in backward, dict(backward)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_under_autocast_a_step_makes_as_many_device_calls_at_t5_as_at_t50(packed, dtype):
    # The 16-bit persistent kernels, as autocast gives the op 16-bit tensors.
    with cuda_host.routed() as gpu:
        assert path(2, BATCH, STATE).count("persistent, clusters") == 2
        short = work(gpu, 5, packed, bidirectional=False, initial_state=True, autocast=dtype)
        long = work(gpu, 50, packed, bidirectional=False, initial_state=True, autocast=dtype)
    for name, at_5, at_50 in zip(("forward", "backward"), short, long, strict=True):
        assert at_5 == at_50, f"{name}: T=5 {dict(at_5)}, T=50 {dict(at_50)}"
        assert at_5["cudaLaunchKernelEx"] == 1, f"{name}: {dict(at_5)}"


def test_the_per_step_path_makes_calls_a_step(monkeypatch):
    # The count sees per-step work where there is some: the per-step path
    # (LLTM_CUDA_PERSISTENT=0) launches a product and a pointwise kernel a step.
    monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
    with cuda_host.routed() as gpu:
        short = work(gpu, 5, packed=False, bidirectional=False, initial_state=True)
        long = work(gpu, 50, packed=False, bidirectional=False, initial_state=True)
    for at_5, at_50 in zip(short, long, strict=True):
        assert at_50["LLTM_LAUNCH"] - at_5["LLTM_LAUNCH"] >= 2 * 45


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_packed_weights_gradient_over_more_runs_than_one_gather_carries(reverse):
    # 60 distinct lengths, 60 runs of equal batch sizes: two gather launches
    # (48 runs each at most), every boundary between runs, one sequence of
    # each length down to 1.
    steps, batch, state, features = 60, 60, 3, 2
    generator = torch.Generator().manual_seed(5)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float64) / 2

    batch_sizes = _packed_batch_sizes(list(range(steps, 0, -1)))
    args = [
        draw(int(batch_sizes.sum()), features),
        draw(3 * state, state + features),
        draw(3 * state),
        draw(batch, state),
        draw(batch, state),
        batch_sizes,
        reverse,
    ]
    with cuda_host.routed() as gpu:
        launches = gpu.launches()
        assert_matches_oracle(args, "dense", "both", [True] * 5, F64)
        # Forward, backward and gate gradients persistent; two gathers.
        assert gpu.launches() - launches == 3 + 2
