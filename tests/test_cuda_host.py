"""The CUDA sources built for the host (tests/cuda_host/): the emulation
itself, the kernels' index space and launch limits, kernels with barriers and
shared memory, the launch checks, the CUDA kernels against the CPU kernels
call for call, and the CUDA plugin's device probe.

That the emulation runs a grid as the GPU would is shown first: every
(blockIdx, threadIdx) of the GPU's index space once, the launch limits and
alignment rules of the GPU enforced. Then the grid-stride loops of every
pointwise kernel (csrc/cuda/lltm_cuda_launch.cuh's for_each_pack, under the
tiling row_tiling chooses) write each element of a matrix exactly once, for
many sizes, pack widths and multiprocessor counts. Probe kernels with block,
cluster and grid barriers give the right answer in every schedule and a wrong
one in some schedule without their barrier; barriers that can never complete
are faults; cudaLaunchKernelEx's checks return a GPU's errors and agree with
the occupancy functions. The suites of conftest.py's ``kernels`` fixture then
hold the kernels to the references.

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
import warnings

import cuda_host
import pytest
import torch
from conftest import GRAD_NAMES, make_backward_args, make_inputs, rms
from test_sequence import _backward_args as sequence_backward_args
from test_sequence import _op_args, make_sequence_inputs

import lltm
from lltm import _backends

pytestmark = cuda_host.ONLY


@pytest.fixture
def emulation():
    """The emulated GPU, as it starts, for one test (and as it starts after)."""
    emulated = cuda_host.emulation()
    emulated.reset()
    yield emulated
    emulated.reset()


# --- The emulation runs a grid as the GPU does -------------------------------------------


@pytest.mark.parametrize(
    ("grid", "block"),
    [((1, 1, 1), (1, 1, 1)), ((3, 1, 1), (5, 1, 1)), ((2, 3, 1), (4, 2, 1)),
     ((3, 2, 2), (4, 3, 2)), ((1, 65535, 1), (1, 1, 1)), ((2, 1, 1), (1024, 1, 1)),
     ((1, 1, 1), (8, 8, 16))],
    ids=str,
)  # fmt: skip
def test_grid_index_space_is_the_gpus(emulation, grid, block):
    seen = emulation.index_space(grid, block)
    # Every block of the grid, every thread of the block, once: x fastest.
    expected = [
        (bx, by, bz, tx, ty, tz)
        for bz, by, bx in itertools.product(*(range(n) for n in reversed(grid)))
        for tz, ty, tx in itertools.product(*(range(n) for n in reversed(block)))
    ]
    assert [s[:6] for s in seen] == expected
    # gridDim and blockDim as launched, in every thread.
    assert {s[6:] for s in seen} == {(*grid, *block)}


@pytest.mark.parametrize(
    ("grid", "block", "why"),
    [((1, 1, 1), (1025, 1, 1), "1025 threads"), ((1, 1, 1), (32, 33, 1), "1056 threads"),
     ((1, 1, 1), (1, 1, 65), "block.z 65"), ((1, 65536, 1), (1, 1, 1), "grid.y 65536"),
     ((1, 1, 65536), (1, 1, 1), "grid.z 65536"), ((0, 1, 1), (1, 1, 1), "empty grid"),
     ((1, 1, 1), (0, 1, 1), "empty block")],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_launches_the_gpu_refuses_are_refused(emulation, grid, block, why):
    # As the GPU reports it: a launch error, which the launchers' check turns
    # into an exception naming the kernel; no thread runs.
    launches = emulation.launches()
    with pytest.raises(RuntimeError, match="launching record_thread failed: invalid configuration"):
        emulation.index_space(grid, block)
    assert emulation.launches() == launches


def test_a_refused_launch_is_lltms_error_and_cleared(emulation):
    # The launch's own error is the one reported, whatever was pending before
    # (another library's), and it is cleared from the thread's last error, as
    # torch clears the errors it raises.
    emulation.set_last_error(emulation.cudaErrorNoKernelImageForDevice)
    with pytest.raises(RuntimeError, match="launching record_thread failed: invalid configuration"):
        emulation.index_space((0, 1, 1), (1, 1, 1))
    assert emulation.peek_last_error() == emulation.cudaSuccess


def test_a_launch_failed_by_an_earlier_kernel_says_so(emulation):
    # A kernel that faulted (asynchronously, before) leaves the context
    # unusable: every launch after fails with its error, lltm's too. The
    # error is lltm's call's, and cleared, but the message says whose it is.
    cell = make_inputs(3, 5, 7, dtype=torch.float64)
    with cuda_host.routed() as gpu:
        gpu.set_last_error(gpu.cudaErrorInvalidConfiguration)  # another library's
        gpu.inject("launch", gpu.cudaErrorIllegalAddress)
        with pytest.raises(
            RuntimeError,
            match=r"launching lltm forward_kernel failed: an illegal memory access was "
            r"encountered \(an earlier kernel's error, which left the CUDA context unusable\)",
        ):
            torch.ops.lltm.forward(*cell)
        assert gpu.peek_last_error() == gpu.cudaSuccess


@pytest.mark.parametrize("persistent", ["1", "0"], ids=["persistent", "per-step"])
def test_another_librarys_pending_error_is_neither_lltms_nor_cleared(
    emulation, monkeypatch, persistent
):
    # Another library's failed launch leaves its error in the thread's last
    # error (cudaGetLastError) until its owner reads it. lltm's launches that
    # succeed neither report it as theirs nor clear it: the cell's pointwise
    # kernels, the sequence's (per-step: recurrent products, pointwise and
    # previous-state kernels; else the persistent kernels, after their kernel
    # attributes and the occupancy calculator).
    monkeypatch.setenv("LLTM_CUDA_PERSISTENT", persistent)
    foreign = emulation.cudaErrorInvalidConfiguration
    cell = make_inputs(3, 5, 7, dtype=torch.float64)
    sequence = _op_args("padded", torch.float64, state=16, features=5)
    with cuda_host.routed() as gpu:
        launches = gpu.launches()
        gpu.set_last_error(foreign)
        torch.ops.lltm.forward(*cell)
        torch.ops.lltm.backward(*make_backward_args(cell))
        outputs = torch.ops.lltm.sequence_forward(*sequence)
        torch.ops.lltm.sequence_backward(*sequence_backward_args(sequence, outputs))
        assert gpu.peek_last_error() == foreign
        assert gpu.launches() - launches >= 4


def test_launches_go_to_torchs_current_stream(emulation):
    emulation.launch_on_stream(False)
    with pytest.raises(RuntimeError, match="another stream than torch's current stream"):
        emulation.launch_on_stream(True)


@pytest.mark.parametrize("store", [False, True], ids=["load", "store"])
@pytest.mark.parametrize("offset", [0, 1, 2, 4, 8, 12, 16])
def test_vector_accesses_must_be_aligned(emulation, offset, store):
    if offset % 16 == 0:
        emulation.vector_access(offset, store)
    else:
        with pytest.raises(RuntimeError, match="misaligned address: a 16-byte vector access"):
            emulation.vector_access(offset, store)


# --- The grid-stride loops write every element once ---------------------------------------

# Pack widths: 1 (the scalar path) and the 16-byte packs of each dtype.
PACKS = {"scalar": 1, "float64": 2, "float32": 4, "16-bit": 8}
# Rows: one, a few, past one block of rows, past grid.y's 65535; columns: one
# pack, odd, past one block of packs (256), past the grid's width.
ROWS = [1, 3, 257, 70_001]
COLUMN_PACKS = [1, 3, 255, 1_031]
# A small GPU (one multiprocessor: every thread loops in both directions),
# a few odd ones, an H100's 132, and more than grid.y holds.
MULTIPROCESSORS = [1, 3, 7, 132, 4_000]


def _cases():
    cases = []
    for rows, packs, (pack, vec), sms in itertools.product(
        ROWS, COLUMN_PACKS, PACKS.items(), MULTIPROCESSORS
    ):
        if rows * packs <= 2_000_000:  # seconds, not minutes, of emulation
            cases.append(
                pytest.param(rows, packs * vec, vec, sms, id=f"{rows}x{packs * vec}-{pack}-sm{sms}")
            )
    return cases


@pytest.mark.parametrize(("rows", "cols", "vec", "multiprocessors"), _cases())
def test_every_element_written_exactly_once(emulation, rows, cols, vec, multiprocessors):
    emulation.set_multiprocessors(multiprocessors)
    missing, duplicates, outside, grid, block = emulation.coverage(rows, cols, vec)
    assert (missing, duplicates, outside) == (0, 0, 0), f"grid {grid}, block {block}"
    assert grid[1] <= 65535 and block[0] * block[1] * block[2] <= 1024


def test_every_element_written_exactly_once_past_32_bit_offsets(emulation):
    # 65537 x 32768 = 2**31 + 2**15 elements, in 16-bit packs.
    missing, duplicates, outside, grid, block = emulation.coverage(65_537, 32_768, 8)
    assert (missing, duplicates, outside) == (0, 0, 0), f"grid {grid}, block {block}"


def test_no_multiprocessor_reported_still_tiles():
    # A driver that reports no multiprocessor must not divide by zero: in a
    # process of its own, since an integer division by zero kills it.
    script = (
        "import cuda_host; e = cuda_host.emulation(); e.set_multiprocessors(0); "
        "print(e.coverage(5, 24, 8))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False,
        cwd=cuda_host.ROOT / "tests", timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("(0, 0, 0,"), result.stdout


# --- Kernels with barriers and shared memory: fibers --------------------------------------
#
# cudaLaunchKernelEx runs each thread as a fiber, so that threads can wait at
# barriers; between barriers they run in the schedule's order. Each probe
# kernel gives the right answer under every schedule with its barriers, and a
# wrong one under some schedule without them: the barriers are what order it.

SCHEDULES = [("forward", 0), ("reverse", 0), ("random", 1), ("random", 2)]
# Blocks of one thread, odd shapes in 2-D, a full 1024-thread block.
BLOCK_SHAPES = [((3, 1, 1), (5, 2, 1)), ((2, 3, 1), (1, 1, 1)), ((2, 1, 2), (7, 3, 2)),
                ((1, 1, 1), (1024, 1, 1))]  # fmt: skip


def _schedule_id(schedule):
    return f"{schedule[0]}{schedule[1] or ''}"


def _blocks(dims):
    return dims[0] * dims[1] * dims[2]


def _neighbour_answers(grid, block):
    """What each thread of neighbour_kernel reads: its block's rank, and the
    next thread's rank in the block (block << 16 | thread)."""
    n = _blocks(block)
    return [b << 16 | (t + 1) % n for b in range(_blocks(grid)) for t in range(n)]


def _cluster_answers(grid, cluster, block):
    """(value, block rank, cluster size) of each thread of
    cluster_neighbour_kernel: the slot of the next block of its cluster."""
    n, size = _blocks(block), _blocks(cluster)
    cx, cy, _ = cluster
    answers = []
    for bz, by, bx in itertools.product(*(range(d) for d in reversed(grid))):
        rank = (bz % cluster[2] * cy + by % cy) * cx + bx % cx
        peer = (rank + 1) % size
        px = bx - bx % cx + peer % cx
        py = by - by % cy + peer // cx % cy
        pz = bz - bz % cluster[2] + peer // (cx * cy)
        peer_block = (pz * grid[1] + py) * grid[0] + px
        for t in range(n):
            answers += [peer_block << 16 | t, rank, size]
    return answers


def _grid_answers(grid, block, steps):
    """Each thread's value after grid_exchange_kernel's `steps` exchanges."""
    n, stride = _blocks(grid) * _blocks(block), _blocks(block)
    values = list(range(n))
    for s in range(steps):
        values = [(values[(g + stride) % n] * 3 + s) & 0xFFFFFFFF for g in range(n)]
    return values


@pytest.mark.parametrize("group", [False, True], ids=["__syncthreads", "thread_block"])
@pytest.mark.parametrize("cooperative", [False, True], ids=["block_by_block", "cooperative"])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=_schedule_id)
def test_block_barrier_orders_shared_memory(emulation, schedule, cooperative, group):
    # Each block has its own shared memory: in a cooperative launch under the
    # forward schedule every block writes its slots before any thread reads,
    # so one arena for all would give the last block's values everywhere.
    emulation.set_schedule(*schedule)
    for grid, block in BLOCK_SHAPES:
        got = emulation.neighbours(grid, block, cooperative, group)
        assert got == _neighbour_answers(grid, block), (grid, block)


def test_without_the_block_barrier_threads_read_garbage(emulation):
    # A thread that reads before its neighbour wrote gets the arena's garbage
    # (0xff bytes): forward, every thread but the last of each block; reverse,
    # the last.
    emulation.drop_barrier("block")
    grid, block = (3, 1, 1), (5, 2, 1)
    wrong = {}
    for schedule in SCHEDULES:
        emulation.set_schedule(*schedule)
        got = emulation.neighbours(grid, block, True, False)
        expected = _neighbour_answers(grid, block)
        wrong[schedule] = sum(g != e for g, e in zip(got, expected, strict=True))
    assert wrong[("forward", 0)] == 3 * 9
    assert wrong[("reverse", 0)] == 3
    assert all(wrong.values()), wrong
    emulation.drop_barrier("")
    assert emulation.neighbours(grid, block, True, False) == _neighbour_answers(grid, block)


def test_schedules_order_the_threads_between_barriers(emulation):
    grid, block = (2, 1, 1), (3, 1, 1)
    forward = [(r, b, t) for r in range(2) for b in range(2) for t in range(3)]
    assert emulation.schedule_seen(grid, block, True) == forward
    emulation.set_schedule("reverse")
    reverse = [(r, b, t) for r in range(2) for b in reversed(range(2)) for t in reversed(range(3))]
    assert emulation.schedule_seen(grid, block, True) == reverse
    # Block by block (no cooperative launch), the blocks run in the order too.
    assert emulation.schedule_seen(grid, block, False) == [
        (r, b, t) for b in reversed(range(2)) for r in range(2) for t in reversed(range(3))
    ]
    # Random: every thread once a round, the rounds apart, in an order the
    # seed decides.
    runs = {}
    for seed in (1, 1, 2):
        emulation.set_schedule("random", seed)
        seen = emulation.schedule_seen((4, 1, 1), (8, 1, 1), True)
        assert sorted(seen[:32]) == [(0, b, t) for b in range(4) for t in range(8)]
        assert sorted(seen[32:]) == [(1, b, t) for b in range(4) for t in range(8)]
        runs.setdefault(seed, []).append(seen)
    assert runs[1][0] == runs[1][1]
    assert runs[1][0] != runs[2][0]
    assert runs[1][0][:32] != sorted(runs[1][0][:32])


@pytest.mark.parametrize("schedule", SCHEDULES, ids=_schedule_id)
@pytest.mark.parametrize(
    ("grid", "cluster", "block"),
    [((4, 1, 1), (2, 1, 1), (32, 1, 1)), ((6, 2, 1), (3, 2, 1), (8, 2, 1)),
     ((8, 1, 1), (8, 1, 1), (16, 1, 1)), ((2, 2, 2), (2, 2, 2), (5, 1, 1)),
     ((3, 1, 1), (1, 1, 1), (4, 1, 1))],
    ids=str,
)  # fmt: skip
def test_cluster_barrier_and_distributed_shared_memory(emulation, schedule, grid, cluster, block):
    emulation.set_schedule(*schedule)
    assert emulation.cluster_neighbours(grid, cluster, block) == _cluster_answers(
        grid, cluster, block
    )


def test_without_the_cluster_barrier_blocks_read_garbage(emulation):
    # Forward, each block reads the next before it ran; reverse, the next has
    # already exited (its shared memory is garbage once it has).
    emulation.drop_barrier("cluster")
    shape = (4, 1, 1), (2, 1, 1), (32, 1, 1)
    expected = _cluster_answers(*shape)
    for schedule in SCHEDULES:
        emulation.set_schedule(*schedule)
        assert emulation.cluster_neighbours(*shape) != expected, schedule


@pytest.mark.parametrize("schedule", SCHEDULES, ids=_schedule_id)
def test_grid_barrier_orders_global_memory(emulation, schedule):
    emulation.set_schedule(*schedule)
    for grid, block, steps in [((3, 1, 1), (4, 1, 1), 5), ((2, 2, 1), (3, 2, 1), 4),
                               ((5, 1, 1), (64, 1, 1), 3), ((1, 1, 1), (7, 1, 1), 6)]:  # fmt: skip
        assert emulation.grid_exchange(grid, block, steps) == _grid_answers(grid, block, steps)


def test_without_the_grid_barrier_threads_read_garbage(emulation):
    emulation.drop_barrier("grid")
    expected = _grid_answers((3, 1, 1), (4, 1, 1), 5)
    for schedule in SCHEDULES:
        emulation.set_schedule(*schedule)
        assert emulation.grid_exchange((3, 1, 1), (4, 1, 1), 5) != expected, schedule


STALLS = {
    0: r"in lltm::cuda_host::probes::stall_kernel\(int\), __syncthreads\(\) .* in block "
    r"\((\d),0,0\) can never complete: it waits for all 64 threads; 32 wait there, 32 returned "
    r"without reaching it \(thread \(32,0,0\) of block \(\1,0,0\) first\)",
    1: r"cg::this_grid\(\).sync\(\) in the grid can never complete: it waits for all 128 "
    r"threads; 96 wait there, 32 returned without reaching it \(thread \(0,0,0\) of block "
    r"\(1,0,0\) first\)",
    2: r"cg::this_cluster\(\).sync\(\) in the cluster of block \([02],0,0\) can never complete: "
    r"it waits for all 64 threads; 32 wait there, 32 returned",
    3: r"cg::this_grid\(\).sync\(\) in the grid can never complete: it waits for all 64 "
    r"threads; 32 wait there, 32 wait at __syncthreads\(\)",
}


@pytest.mark.parametrize("schedule", SCHEDULES[:2], ids=_schedule_id)
@pytest.mark.parametrize(
    "which", STALLS, ids=["exit_before_block", "exit_before_grid", "exit_before_cluster",
                          "different_barriers"],
)  # fmt: skip
def test_barriers_that_never_complete_are_faults(emulation, which, schedule):
    emulation.set_schedule(*schedule)
    with pytest.raises(RuntimeError, match=STALLS[which]):
        emulation.stall(which)
    # Every thread still waiting was unwound (its objects destroyed).
    assert emulation.alive() == 0
    # And the emulation runs the next launch as if nothing happened.
    assert emulation.neighbours((2, 1, 1), (8, 1, 1), True, False) == _neighbour_answers(
        (2, 1, 1), (8, 1, 1)
    )


MISUSES = {
    0: r"__syncthreads\(\) .* in a plain launch \(LLTM_LAUNCH .*\): kernels with barriers or "
    r"shared memory are launched with cudaLaunchKernelEx",
    1: r"lltm::cuda::dynamic_shared_memory\(\) in a plain launch",
    2: r"misuse_kernel\(int, unsigned int\*\), cg::this_grid\(\).sync\(\) in a launch without "
    r"cudaLaunchAttributeCooperative",
    3: r"cg::this_cluster\(\).sync\(\) on a GPU of compute capability 8.0: clusters need 9.0",
    4: r"map_shared_rank\(\) of an address outside the block's 64 bytes of shared memory",
    5: r"map_shared_rank\(\) to rank 2 of a cluster of 1 blocks",
    6: r"the kernel executed __trap\(\)",
}


@pytest.mark.parametrize(
    "which", MISUSES, ids=["plain_barrier", "plain_shared_memory", "grid_not_cooperative",
                           "cluster_below_sm90", "map_outside", "map_past_cluster", "trap"],
)  # fmt: skip
def test_what_kernels_may_not_do_is_a_fault(emulation, which):
    if which == 3:
        emulation.set_capability(8, 0)
    with pytest.raises(RuntimeError, match=MISUSES[which]):
        emulation.misuse(which)
    assert emulation.alive() == 0


# --- The tensor cores: mma.sync m16n8k16 ---------------------------------------------------
#
# The probe builds each lane's fragments from the PTX ISA's layout itself; the
# emulation must give A B + C for them, as the instruction defines it.

MMA_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _bits(t: torch.Tensor) -> list[int]:
    return [b & 0xFFFF for b in t.contiguous().view(torch.int16).flatten().tolist()]


def _mma_operands(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(16, 16, generator=generator).to(dtype)
    b = torch.randn(16, 8, generator=generator).to(dtype)
    c = torch.randn(16, 8, generator=generator)
    return a, b, c


@pytest.mark.parametrize("threads", [32, 96], ids=lambda t: f"{t // 32}warps")
@pytest.mark.parametrize("name", MMA_DTYPES)
def test_mma_computes_a_b_plus_c_from_the_ptx_fragments(emulation, name, threads):
    dtype = MMA_DTYPES[name]
    for seed in range(3):
        a, b, c = _mma_operands(dtype, seed)
        got = torch.tensor(
            emulation.mma(_bits(a), _bits(b), c.flatten().tolist(), name == "bf16", threads, -1)
        ).reshape(16, 8)
        want = a.double() @ b.double() + c.double()
        # Products of 16-bit inputs are exact in float32; 16 of them and C
        # summed in float32.
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
    # Each element is placed: a transposed or shifted reading would differ.
    a, b, c = _mma_operands(dtype, 7)
    got = torch.tensor(emulation.mma(_bits(a), _bits(b), [0.0] * 128, name == "bf16", 32, -1))
    assert not torch.allclose(got.reshape(16, 8).double(), a.double().T @ b.double(), atol=1e-3)


def test_mma_decodes_every_16_bit_value(emulation):
    # The inputs' special values as the hardware reads them: subnormals,
    # signed zeros, infinities (inf - inf is NaN).
    for name, dtype in MMA_DTYPES.items():
        tiny = torch.finfo(dtype).smallest_normal / 4  # a subnormal
        finite = [0.0, -0.0, 1.0, -2.5, tiny, -3 * tiny, 65504.0 if name == "fp16" else 1e38, 0.5]
        cases = {
            "finite": finite * 2,
            "inf": [*finite[:7], float("inf"), *finite],
            "inf - inf": [float("inf"), -float("inf"), *finite, *finite[:6]],
        }
        b = torch.zeros(16, 8, dtype=dtype)
        b[:, 0] = 1.0
        for case, row in cases.items():
            a = torch.zeros(16, 16, dtype=dtype)
            a[0] = torch.tensor(row).to(dtype)
            got = emulation.mma(_bits(a), _bits(b), [0.0] * 128, name == "bf16", 32, -1)[0]
            want = a.double()[0].sum().item()
            if case == "inf - inf":
                assert got != got, (name, got)
            elif case == "inf":
                assert got == float("inf"), (name, got)
            else:
                assert got == pytest.approx(want, rel=1e-6, abs=0), (name, got, want)


@pytest.mark.parametrize(
    ("threads", "absent", "capability", "message"),
    [
        (16, -1, (9, 0), r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32 in a "
         r"warp of 16 threads \(a block of 16\): the instruction needs all 32 lanes"),
        (48, -1, (9, 0), r"in a warp of 16 threads \(a block of 48\)"),
        (32, 5, (9, 0), r"a warp-collective instruction \(mma\.sync\) in warp 0 of block "
         r"\(0,0,0\) can never complete: it waits for all 32 threads; 31 wait there, 1 "
         r"returned without reaching it \(thread \(5,0,0\)"),
        (32, -1, (7, 5), r"on a GPU of compute capability 7\.5: it needs 8\.0"),
    ],
    ids=["half_warp", "partial_last_warp", "lane_missing", "sm75"],
)  # fmt: skip
def test_mma_without_a_whole_warp_or_below_sm80_is_a_fault(
    emulation, threads, absent, capability, message
):
    emulation.set_capability(*capability)
    a, b, c = _mma_operands(torch.bfloat16, 0)
    with pytest.raises(RuntimeError, match=message):
        emulation.mma(_bits(a), _bits(b), c.flatten().tolist(), True, threads, absent)
    assert emulation.neighbours((1, 1, 1), (8, 1, 1), True, False) == _neighbour_answers(
        (1, 1, 1), (8, 1, 1)
    )


# (W rows, X rows, inner, split): a tile and less, odd edges on every side,
# more tiles than warps, the inner dimension split.
PRODUCT_SIZES = [(16, 8, 16, 1), (1, 1, 1, 1), (13, 5, 17, 1), (9, 17, 33, 2), (40, 33, 70, 4),
                 (96, 3, 128, 8), (17, 40, 5, 2)]  # fmt: skip


@pytest.mark.parametrize("k_contiguous", [True, False], ids=["w_by_rows", "w_by_columns"])
@pytest.mark.parametrize("name", MMA_DTYPES)
@pytest.mark.parametrize("size", PRODUCT_SIZES, ids=lambda s: "m{}-n{}-k{}-split{}".format(*s))
def test_the_kernels_tensor_core_product(emulation, size, name, k_contiguous):
    # csrc/cuda/lltm_cuda_tensor_cores.cuh's product, as the persistent
    # kernels call it: W in 16 bits (rows of W_h: each along k in the
    # forward, across in the backward), X float32 (batch rows), read as two
    # 16-bit terms. The parts summed agree with float64 to about 16 bits of
    # X, far below one rounding of X to the dtype.
    ms, ns, inner, split = size
    dtype = MMA_DTYPES[name]
    generator = torch.Generator().manual_seed(ms * 1000 + ns * 10 + inner)
    w = torch.randn(ms, inner, generator=generator).to(dtype)
    x = torch.randn(ns, inner, generator=generator)
    w_layout = w if k_contiguous else w.T.contiguous()
    parts = torch.tensor(
        emulation.tensor_core_product(
            _bits(w_layout), x.flatten().tolist(), ms, ns, inner, split, k_contiguous,
            name == "bf16", 128,
        )
    ).reshape(split, ms, ns)  # fmt: skip
    got = parts.double().sum(0)
    want = w.double() @ x.double().T
    scale = w.double().abs() @ x.double().abs().T
    error = ((got - want).abs() / scale).max().item()
    assert error < 2e-5, error
    # One rounding of X to the dtype is far worse: the split is what holds.
    rounded = w.double() @ x.to(dtype).double().T
    assert ((rounded - want).abs() / scale).max().item() > 10 * error


def test_swapcontext_runs_fibers_as_the_assembly_does(emulation):
    # The emulation switches fibers with its own x86-64 code; swapcontext is
    # the fallback (other architectures, shadow stacks): both run the probes
    # alike.
    for switch in ("ucontext", "assembly"):
        if not emulation.set_fiber_switch(switch):
            continue
        for schedule in SCHEDULES:
            emulation.set_schedule(*schedule)
            assert emulation.neighbours((3, 1, 1), (5, 2, 1), True, True) == _neighbour_answers(
                (3, 1, 1), (5, 2, 1)
            )
            shape = (6, 2, 1), (3, 2, 1), (8, 2, 1)
            assert emulation.cluster_neighbours(*shape) == _cluster_answers(*shape)
            assert emulation.grid_exchange((3, 1, 1), (4, 1, 1), 5) == _grid_answers(
                (3, 1, 1), (4, 1, 1), 5
            )
        with pytest.raises(RuntimeError, match=STALLS[1]):
            emulation.stall(1)
        assert emulation.alive() == 0


# --- cudaLaunchKernelEx checks what a GPU checks ------------------------------------------

KIB = 1024


def _attribute(emulation, name):
    error, value = emulation.device_attribute(getattr(emulation, name))
    assert error == 0, name
    return value


def test_the_emulated_gpu_is_an_h100(emulation):
    expected = {
        "cudaDevAttrMultiProcessorCount": 132,
        "cudaDevAttrComputeCapabilityMajor": 9,
        "cudaDevAttrComputeCapabilityMinor": 0,
        "cudaDevAttrCooperativeLaunch": 1,
        "cudaDevAttrClusterLaunch": 1,
        "cudaDevAttrMaxSharedMemoryPerBlock": 48 * KIB,
        "cudaDevAttrMaxSharedMemoryPerBlockOptin": 227 * KIB,
        "cudaDevAttrMaxSharedMemoryPerMultiprocessor": 228 * KIB,
        "cudaDevAttrMaxThreadsPerMultiProcessor": 2048,
        "cudaDevAttrMaxBlocksPerMultiprocessor": 32,
        "cudaDevAttrReservedSharedMemoryPerBlock": KIB,
    }
    assert {name: _attribute(emulation, name) for name in expected} == expected


def test_device_attributes_follow_the_settings_until_reset(emulation):
    emulation.set_multiprocessors(108)
    emulation.set_capability(8, 0)
    emulation.set_shared_memory(164 * KIB, 163 * KIB)
    emulation.set_multiprocessor_limits(1536, 16)
    emulation.set_cooperative_launch(False)
    settings = {
        "cudaDevAttrMultiProcessorCount": 108,
        "cudaDevAttrComputeCapabilityMajor": 8,
        "cudaDevAttrCooperativeLaunch": 0,
        "cudaDevAttrClusterLaunch": 0,
        "cudaDevAttrMaxSharedMemoryPerBlockOptin": 163 * KIB,
        "cudaDevAttrMaxSharedMemoryPerMultiprocessor": 164 * KIB,
        "cudaDevAttrMaxThreadsPerMultiProcessor": 1536,
        "cudaDevAttrMaxBlocksPerMultiprocessor": 16,
    }
    assert {name: _attribute(emulation, name) for name in settings} == settings
    emulation.set_schedule("reverse")
    emulation.drop_barrier("block")
    assert emulation.launch_check((1, 1, 1), (1, 1, 1), 0, None, False, 100 * KIB, -1)[0] == 0
    emulation.reset()
    assert _attribute(emulation, "cudaDevAttrMultiProcessorCount") == 132
    assert _attribute(emulation, "cudaDevAttrClusterLaunch") == 1
    # The schedule, the barriers and the kernels' attributes too.
    assert emulation.schedule_seen((1, 1, 1), (2, 1, 1), False) == [
        (0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)
    ]  # fmt: skip
    assert emulation.neighbours((2, 1, 1), (8, 1, 1), False, False) == _neighbour_answers(
        (2, 1, 1), (8, 1, 1)
    )
    launch = emulation.launch_check((1, 1, 1), (1, 1, 1), 100 * KIB, None, False, -1, -1)
    assert launch[1] == emulation.cudaErrorInvalidValue


# (grid, block, shared, cluster, cooperative, shared attribute, non-portable),
# and what the GPU answers: (cudaFuncSetAttribute's error, the launch's).
OK, VALUE, CONFIG, CLUSTER, TOO_LARGE, UNSUPPORTED = (
    "cudaSuccess", "cudaErrorInvalidValue", "cudaErrorInvalidConfiguration",
    "cudaErrorInvalidClusterSize", "cudaErrorCooperativeLaunchTooLarge", "cudaErrorNotSupported",
)  # fmt: skip
LAUNCH_CHECKS = {
    "48KiB_without_attribute": (((2, 1, 1), (64, 1, 1), 48 * KIB, None, False, -1, -1), OK, OK),
    "over_48KiB_without_attribute": (
        ((2, 1, 1), (64, 1, 1), 48 * KIB + 16, None, False, -1, -1), OK, VALUE),
    "100KiB_with_attribute": (((2, 1, 1), (64, 1, 1), 100 * KIB, None, False, 100 * KIB, -1), OK, OK),
    "over_the_attribute": (
        ((2, 1, 1), (64, 1, 1), 100 * KIB + 16, None, False, 100 * KIB, -1), OK, VALUE),
    "227KiB_with_attribute": (((1, 1, 1), (64, 1, 1), 227 * KIB, None, False, 227 * KIB, -1), OK, OK),
    "attribute_past_opt_in": (
        ((1, 1, 1), (64, 1, 1), 227 * KIB + 16, None, False, 227 * KIB + 16, -1), VALUE, VALUE),
    "1025_threads": (((1, 1, 1), (1025, 1, 1), 0, None, False, -1, -1), OK, CONFIG),
    "cluster_8": (((16, 1, 1), (32, 1, 1), 0, (8, 1, 1), False, -1, -1), OK, OK),
    "cluster_2x2x2": (((4, 2, 2), (32, 1, 1), 0, (2, 2, 2), False, -1, -1), OK, OK),
    "cluster_9_portable": (((9, 1, 1), (32, 1, 1), 0, (9, 1, 1), False, -1, -1), OK, CLUSTER),
    "cluster_9_non_portable": (((9, 1, 1), (32, 1, 1), 0, (9, 1, 1), False, -1, 1), OK, OK),
    "cluster_16_non_portable": (((16, 1, 1), (32, 1, 1), 0, (16, 1, 1), False, -1, 1), OK, OK),
    "cluster_17_non_portable": (((17, 1, 1), (32, 1, 1), 0, (17, 1, 1), False, -1, 1), OK, CLUSTER),
    "cluster_not_dividing_grid": (((6, 1, 1), (32, 1, 1), 0, (4, 1, 1), False, -1, -1), OK, CLUSTER),
    "cluster_of_zero": (((4, 1, 1), (32, 1, 1), 0, (0, 1, 1), False, -1, -1), OK, CLUSTER),
    # 200 KiB a block: one block a multiprocessor; 16 blocks fit the GPCs of 16 or 18.
    "cluster_16_of_200KiB": (
        ((16, 1, 1), (32, 1, 1), 200 * KIB, (16, 1, 1), False, 200 * KIB, 1), OK, OK),
    # 1024 threads a block: two a multiprocessor, 264 on the GPU at once.
    "cooperative_264": (((264, 1, 1), (1024, 1, 1), 0, None, True, -1, -1), OK, OK),
    "cooperative_265": (((265, 1, 1), (1024, 1, 1), 0, None, True, -1, -1), OK, TOO_LARGE),
    "cooperative_132_of_120KiB": (
        ((132, 1, 1), (64, 1, 1), 120 * KIB, None, True, 120 * KIB, -1), OK, OK),
    "cooperative_133_of_120KiB": (
        ((133, 1, 1), (64, 1, 1), 120 * KIB, None, True, 120 * KIB, -1), OK, TOO_LARGE),
    # Clusters of 8 blocks of 200 KiB: 16 at once (two a GPC).
    "cooperative_clusters_128": (
        ((128, 1, 1), (32, 1, 1), 200 * KIB, (8, 1, 1), True, 200 * KIB, -1), OK, OK),
    "cooperative_clusters_136": (
        ((136, 1, 1), (32, 1, 1), 200 * KIB, (8, 1, 1), True, 200 * KIB, -1), OK, TOO_LARGE),
}  # fmt: skip


def _check_launch(emulation, args):
    attribute, launch, last, ran = emulation.launch_check(*args)
    # The error is also the thread's last error, as the runtime keeps it.
    assert last == launch
    grid, block = args[0], args[1]
    assert ran == (_blocks(grid) * _blocks(block) if launch == 0 else 0)
    return attribute, launch


@pytest.mark.parametrize("case", LAUNCH_CHECKS)
def test_launch_checks_return_the_gpus_errors(emulation, case):
    args, attribute, launch = LAUNCH_CHECKS[case]
    expected = (getattr(emulation, attribute), getattr(emulation, launch))
    assert _check_launch(emulation, args) == expected


def test_launch_checks_of_a_gpu_without_clusters_or_cooperative_launches(emulation):
    emulation.set_capability(8, 0)
    cluster = ((4, 1, 1), (32, 1, 1), 0, (2, 1, 1), False, -1, -1)
    assert _check_launch(emulation, cluster)[1] == emulation.cudaErrorInvalidClusterSize
    no_clusters = (emulation.cudaErrorInvalidClusterSize, -1)
    assert emulation.max_active_clusters((2, 1, 1), (32, 1, 1), 0, -1, -1) == no_clusters
    # A launch without clusters is fine on compute capability 8.0.
    assert _check_launch(emulation, ((4, 1, 1), (32, 1, 1), 0, None, True, -1, -1)) == (0, 0)
    emulation.set_cooperative_launch(False)
    cooperative = ((4, 1, 1), (32, 1, 1), 0, None, True, -1, -1)
    assert _check_launch(emulation, cooperative)[1] == emulation.cudaErrorNotSupported


def test_fewer_free_multiprocessors_hold_fewer_blocks(emulation):
    # MPS, or other work: a cooperative grid must fit the multiprocessors
    # the launch can have.
    emulation.set_free_multiprocessors(100)
    fits = ((200, 1, 1), (1024, 1, 1), 0, None, True, -1, -1)
    assert _check_launch(emulation, fits) == (0, 0)
    too_many = ((201, 1, 1), (1024, 1, 1), 0, None, True, -1, -1)
    assert _check_launch(emulation, too_many)[1] == emulation.cudaErrorCooperativeLaunchTooLarge
    # A cluster of 16 blocks of 200 KiB needs a GPC with 16 free
    # multiprocessors: 20 spread over 8 GPCs have none.
    emulation.set_free_multiprocessors(20)
    assert emulation.max_active_clusters((16, 1, 1), (32, 1, 1), 200 * KIB, 200 * KIB, 1) == (0, 0)
    cluster = ((16, 1, 1), (32, 1, 1), 200 * KIB, (16, 1, 1), False, 200 * KIB, 1)
    assert _check_launch(emulation, cluster)[1] == emulation.cudaErrorInvalidClusterSize


@pytest.mark.parametrize("free", [-1, 100, 7])
@pytest.mark.parametrize(
    ("threads", "shared"),
    [(32, 0), (256, 0), (1024, 0), (96, 40 * KIB), (128, 100 * KIB), (1024, 227 * KIB)],
)
def test_occupancy_agrees_with_the_launch_checks(emulation, threads, shared, free):
    emulation.set_free_multiprocessors(free)
    sms = 132 if free < 0 else free
    error, per_sm = emulation.occupancy(threads, shared, shared)
    assert error == 0
    # As CUDA counts them: whole warps, the shared memory with the 1 KiB the
    # driver reserves a block, at most 32 blocks.
    warps = (threads + 31) // 32
    assert per_sm == min(2048 // (32 * warps), 228 * KIB // (shared + KIB), 32)
    fits = ((per_sm * sms, 1, 1), (threads, 1, 1), shared, None, True, shared, -1)
    assert _check_launch(emulation, fits) == (0, 0)
    one_more = ((per_sm * sms + 1, 1, 1), (threads, 1, 1), shared, None, True, shared, -1)
    assert _check_launch(emulation, one_more)[1] == emulation.cudaErrorCooperativeLaunchTooLarge


@pytest.mark.parametrize("free", [-1, 40])
# Clusters at once on an H100's GPCs (two of 18 multiprocessors, six of 16).
@pytest.mark.parametrize(
    ("size", "shared", "expected"),
    [(2, 200 * KIB, 66), (8, 200 * KIB, 16), (16, 200 * KIB, 8), (16, 100 * KIB, 16),
     (3, 0, 1404)],
)  # fmt: skip
def test_cluster_occupancy_agrees_with_the_launch_checks(emulation, size, shared, expected, free):
    emulation.set_free_multiprocessors(free)
    error, clusters = emulation.max_active_clusters((size, 1, 1), (32, 1, 1), shared, shared, 1)
    assert error == 0
    if free < 0:
        assert clusters == expected
    block = (32, 1, 1)
    one_cluster = ((size, 1, 1), block, shared, (size, 1, 1), False, shared, 1)
    assert _check_launch(emulation, one_cluster)[1] == (
        0 if clusters else emulation.cudaErrorInvalidClusterSize
    )
    if clusters:
        # A cooperative grid of clusters: as many as fit at once.
        fits = ((size * clusters, 1, 1), block, shared, (size, 1, 1), True, shared, 1)
        assert _check_launch(emulation, fits) == (0, 0)
        one_more = ((size * (clusters + 1), 1, 1), block, shared, (size, 1, 1), True, shared, 1)
        assert _check_launch(emulation, one_more)[1] == emulation.cudaErrorCooperativeLaunchTooLarge


def test_cluster_occupancy_needs_a_cluster_within_the_limits(emulation):
    block = (32, 1, 1)
    no_size = (emulation.cudaErrorInvalidValue, -1)
    assert emulation.max_active_clusters(None, block, 0, -1, -1) == no_size
    too_large = (emulation.cudaErrorInvalidClusterSize, -1)
    assert emulation.max_active_clusters((9, 1, 1), block, 0, -1, -1) == too_large
    assert emulation.max_active_clusters((9, 1, 1), block, 0, -1, 1)[0] == 0
    assert emulation.max_active_clusters((17, 1, 1), block, 0, -1, 1) == too_large


# --- The ops are the CUDA kernels while routed, lltm's CPU kernels after -------------------


def test_routing_runs_the_cuda_kernels_and_is_undone():
    inputs = make_inputs(4, 5, 16)
    cpu = torch.ops.lltm.forward(*inputs)
    with cuda_host.routed() as emulated:
        before = emulated.launches()
        host = torch.ops.lltm.forward(*inputs)
        lltm.lltm_sequence(inputs[0][None].expand(3, -1, -1), *inputs[1:])
        # One pointwise kernel for the cell; the sequence's persistent kernel
        # (tests/test_cuda_persistent.py), one launch for every step.
        assert emulated.launches() == before + 1 + 1
    launches = emulated.launches()
    after = torch.ops.lltm.forward(*inputs)
    assert emulated.launches() == launches
    torch.testing.assert_close(host, cpu, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(after, cpu, rtol=0, atol=0)


# --- The CUDA kernels against the CPU kernels, call for call ------------------------------
#
# The two differ by design only in where they round:
# * both sum GEMM products in their own order (cuBLAS or MKL/OpenBLAS, lltm's
#   fused steps for the CPU's sequences), a few units of the dtype's epsilon
#   times the magnitude of the terms;
# * float32 and float64 sequences on CUDA compute each step's pre-activations
#   in two GEMMs (x_t W_x^T + b for all steps at once, then + h W_h^T),
#   rounding them twice; the CPU's fused steps round once;
# * 16-bit grad_bias: the CPU sums the float32 gradients in double, CUDA in
#   float32; both round once.
# Bound on |cuda - cpu|, relative to each tensor's RMS (at least 1):
# ROUNDINGS units of the dtype's epsilon, plus one unit of the type the GEMMs
# sum in (float32 for 16-bit types) per term of the longest sum.
ROUNDINGS = 8
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def _assert_rounding_apart(names, cuda, cpu, dtype, terms):
    eps = torch.finfo(dtype).eps
    eps_sums = torch.finfo(torch.float32 if dtype.itemsize == 2 else dtype).eps
    for name, a, e in zip(names, cuda, cpu, strict=True):
        if a is None or e is None:
            assert a is None and e is None, name
            continue
        scale = max(1.0, rms(e))
        torch.testing.assert_close(
            a, e, rtol=ROUNDINGS * eps, atol=(ROUNDINGS * eps + terms * eps_sums) * scale,
            msg=lambda m, name=name: f"{name}: {m}",
        )  # fmt: skip


def _host_and_cpu(fn):
    with cuda_host.routed():
        host = fn()
    return host, fn()


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cell_ops_equal_the_cpu_kernels(dtype, bias):
    for shape in [(3, 5, 7), (17, 33, 129), (4, 8, 256)]:
        inputs = make_inputs(*shape, dtype=dtype)
        if not bias:
            inputs[2] = None
        host, cpu = _host_and_cpu(lambda inputs=inputs: torch.ops.lltm.forward(*inputs))
        terms = shape[1] + shape[2]
        _assert_rounding_apart(("new_h", "new_cell", "gates"), host, cpu, dtype, terms)
        args = make_backward_args(inputs)
        host, cpu = _host_and_cpu(lambda args=args: torch.ops.lltm.backward(*args))
        _assert_rounding_apart(GRAD_NAMES, host, cpu, dtype, max(shape[0], 3 * shape[2]))


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["padded", "padded_reverse", "packed", "packed_reverse"])
def test_sequence_ops_equal_the_cpu_kernels(case, dtype, bias):
    args = _op_args(case, dtype, state=16, features=5)
    if not bias:
        args[2] = None
    names = ("output", "h_n", "c_n", "gates", "cells")
    host, cpu = _host_and_cpu(lambda: torch.ops.lltm.sequence_forward(*args))
    # A recurrence carries each step's rounding into the next: 5 steps.
    _assert_rounding_apart(names, host, cpu, dtype, 5 * (16 + 5))
    backward = sequence_backward_args(args, cpu)
    host, cpu = _host_and_cpu(lambda: torch.ops.lltm.sequence_backward(*backward))
    _assert_rounding_apart(GRAD_NAMES, host, cpu, dtype, 5 * 3 * 16)


# The sequence's recurrent products (csrc/cuda/lltm_cuda_recurrent.cuh): lltm's own
# kernel up to its size limit, where one multiprocessor or three make every thread
# loop over several output elements, and cuBLAS (torch's GEMM here) past it.
@pytest.mark.parametrize("multiprocessors", [1, 3, 132])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize(
    ("batch", "features", "state"),
    [(40, 5, 120), (17, 5, 129), (64, 3, 256)],
    ids=["own-kernel", "own-kernel-forward", "cublas"],
)
def test_sequence_recurrent_products_equal_the_cpu_kernels(
    emulation, batch, features, state, dtype, multiprocessors, monkeypatch
):
    # The per-step path (where the persistent kernels do not serve a size).
    monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
    emulation.set_multiprocessors(multiprocessors)
    x, w, b, h, c = make_sequence_inputs(3, batch, features, state, dtype)
    args = [x, w, b, h, c, None, False]
    names = ("output", "h_n", "c_n", "gates", "cells")
    before = emulation.launches()
    host, cpu = _host_and_cpu(lambda: torch.ops.lltm.sequence_forward(*args))
    # Per step the pointwise kernel, and the product where lltm's kernel runs
    # it: inner dimension (state) at most 384, at most 2**22 multiply-adds. The
    # backward's inner dimension is 3 * state: 360 runs lltm's kernel, 387 cuBLAS.
    own_kernel = state <= 384 and batch * 3 * state * state <= 2**22
    assert emulation.launches() - before == 3 * (2 if own_kernel else 1)
    _assert_rounding_apart(names, host, cpu, dtype, 3 * (state + features))
    backward = sequence_backward_args(args, cpu)
    host, cpu = _host_and_cpu(lambda: torch.ops.lltm.sequence_backward(*backward))
    _assert_rounding_apart(GRAD_NAMES, host, cpu, dtype, 3 * 3 * state)


# --- The device probe of the CUDA plugin (kernel_image_problem) ---------------------------


@pytest.fixture
def plugin(emulation):
    """The plugin's _C module of the host build; its probe runs against the
    emulated GPU (two devices of compute capability 9.0)."""
    return cuda_host.modules()[0]


def test_probe_leaves_the_callers_device_and_contexts_alone(emulation, plugin):
    # A process working on cuda:1 (a DDP rank) must not get a context on
    # cuda:0, the device its thread never selected.
    assert plugin.kernel_image_problem(1) == ""
    assert emulation.contexts() == (False, True)
    assert emulation.current_device() == 0


def test_probe_names_the_architecture_it_has_no_code_for(emulation, plugin):
    emulation.set_capability(8, 6)
    emulation.inject("load", emulation.cudaErrorNoKernelImageForDevice)
    assert plugin.kernel_image_problem(0) == (
        "no code for this GPU (sm_86): no kernel image is available for execution on the device"
    )
    emulation.inject("load", emulation.cudaErrorUnsupportedPtxVersion)
    assert plugin.kernel_image_problem(0).startswith("no code for this GPU (sm_86): the provided")


def test_probe_ignores_no_failing_capability_query(emulation, plugin):
    emulation.inject("load", emulation.cudaErrorNoKernelImageForDevice)
    emulation.inject("attribute", emulation.cudaErrorInvalidValue)
    problem = plugin.kernel_image_problem(0)
    assert "compute capability unknown: invalid argument" in problem
    assert "sm_00" not in problem


def test_probe_lets_other_python_threads_run(emulation, plugin):
    # Creating a context takes a while (here: until this thread lets it go,
    # which it can only do if the probe released the GIL).
    emulation.hold_load(True)
    problems = []
    thread = threading.Thread(target=lambda: problems.append(plugin.kernel_image_problem(1)))
    thread.start()
    deadline = time.monotonic() + 5
    while not emulation.load_state()[0] and time.monotonic() < deadline:
        time.sleep(0.001)
    emulation.hold_load(False)
    thread.join()
    assert problems == [""]
    assert emulation.load_state() == (False, False), "the probe held the GIL while it waited"


@pytest.mark.parametrize(
    ("call", "error"),
    [("load", "cudaErrorMemoryAllocation"), ("set_device", "cudaErrorDevicesUnavailable"),
     ("set_device", "cudaErrorMemoryAllocation")],
)  # fmt: skip
def test_probe_that_cannot_tell_raises(emulation, plugin, call, error):
    emulation.inject(call, getattr(emulation, error))
    with pytest.raises(RuntimeError, match="cannot tell whether its CUDA kernels run on cuda:1"):
        plugin.kernel_image_problem(1)


@pytest.fixture
def backends_on_the_host_plugin(plugin, monkeypatch):
    """lltm's per-device fallback (_backends) talking to the host build's
    plugin module, with nothing known about any device yet."""
    monkeypatch.setattr(
        _backends,
        "PLUGIN",
        _backends.PluginStatus(loaded=True, module="lltm_cuda_host", reason="host build", fix=None),
    )
    monkeypatch.setitem(sys.modules, "lltm_cuda_host._C", plugin)
    monkeypatch.setattr(_backends, "_device_problems", {})
    return _backends


def test_transient_probe_errors_are_not_remembered(emulation, backends_on_the_host_plugin):
    backends = backends_on_the_host_plugin
    # The context cannot be created now (out of memory): the fused kernels
    # run (and say so themselves if the device stays unusable); nothing is
    # remembered, no warning given.
    emulation.inject("load", emulation.cudaErrorMemoryAllocation)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backends.device_problem(1) == ""
    assert 1 not in backends._device_problems
    # Once the device can be probed, its answer holds for the process.
    emulation.inject("load", 0)
    assert backends.device_problem(1) == ""
    assert backends._device_problems == {1: ""}


def test_missing_code_is_remembered_and_warned_once(emulation, backends_on_the_host_plugin):
    backends = backends_on_the_host_plugin
    emulation.inject("load", emulation.cudaErrorNoKernelImageForDevice)
    with pytest.warns(RuntimeWarning, match="cannot run on cuda:0: no code for this GPU"):
        problem = backends.device_problem(0)
    assert problem.startswith("no code for this GPU (sm_90)")
    emulation.inject("load", 0)
    assert backends.device_problem(0) == problem
