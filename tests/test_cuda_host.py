"""The CUDA sources built for the host (tests/cuda_host.py): the emulation
itself, the kernels' index space and launch limits, the CUDA kernels against
the CPU kernels call for call, and the CUDA plugin's device probe.

That the emulation runs a grid as the GPU would is shown first: every
(blockIdx, threadIdx) of the GPU's index space once, the launch limits and
alignment rules of the GPU enforced. Then the grid-stride loops of every
pointwise kernel (csrc/cuda/lltm_cuda_launch.cuh's for_each_pack, under the
tiling row_tiling chooses) write each element of a matrix exactly once, for
many sizes, pack widths and multiprocessor counts. The suites of
conftest.py's ``kernels`` fixture then hold the kernels to the references.

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

pytestmark = [
    pytest.mark.cuda_host,
    pytest.mark.skipif(
        not cuda_host.ENABLED,
        reason=f"the CUDA sources built for the host run in {cuda_host.WHERE}",
    ),
]


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


# --- The ops are the CUDA kernels while routed, lltm's CPU kernels after -------------------


def test_routing_runs_the_cuda_kernels_and_is_undone():
    inputs = make_inputs(4, 5, 16)
    cpu = torch.ops.lltm.forward(*inputs)
    with cuda_host.routed() as emulated:
        before = emulated.launches()
        host = torch.ops.lltm.forward(*inputs)
        lltm.lltm_sequence(inputs[0][None].expand(3, -1, -1), *inputs[1:])
        # One pointwise kernel for the cell; per step of the sequence, the
        # recurrent product (lltm's own kernel at this size) and the pointwise one.
        assert emulated.launches() == before + 1 + 3 * 2
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
    emulation, batch, features, state, dtype, multiprocessors
):
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
