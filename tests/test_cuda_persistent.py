"""The persistent sequence kernels (csrc/cuda/lltm_cuda_persistent.cuh) on the
host build's emulated GPU (tests/cuda_host/), where every CUDA thread is a
fiber and block, cluster and grid barriers are real.

* The kernels against the float64 oracle (tests/oracle.py: the reference cell
  step by step, differentiated by autograd), forward, backward and the gate
  gradients, at odd sizes (state 1 to 33, batch 0 to 7, 0 to 7 steps), padded
  and packed, in both directions, with the output gradient dense, absent,
  broadcast (as ``output.sum()`` gives it) or strided, in both launch modes
  (thread-block clusters on the emulated H100, a cooperative grid at compute
  capability 8.0), on GPUs of 132, 12 and 1 multiprocessors (which change
  the split: blocks per group, rows per block, the products' tiles), with
  the threads run in every schedule order the emulation has.
* The plan rule (lltm_cuda_persistent_plan.h) as the plugin answers it:
  which mode, split and shared memory the GPU sizes get, and every way to the
  per-step path (LLTM_CUDA_PERSISTENT=0, a state too large, a GPU without
  cooperative or cluster launches), and the fallback at run time when the
  GPU refuses the launch (too few multiprocessors free).

The 16-bit kernels: tests/test_cuda_persistent_16_bit.py.
* The barriers: dropping any kind the kernels use makes them wrong.

Runs in ``nox -s cuda_host`` (LLTM_CUDA_HOST=1); skipped, saying so, elsewhere.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from types import ModuleType

import cuda_host
import pytest
import torch
from oracle import sequence_oracle
from test_sequence import _packed_batch_sizes

pytestmark = cuda_host.ONLY

# The launch modes, as the emulated GPU is set up for them: its default H100
# takes clusters; below compute capability 9.0 there are none.
MODES: dict[str, Callable[[ModuleType], None]] = {
    "clusters": lambda gpu: None,
    "cooperative": lambda gpu: gpu.set_capability(8, 0),
}
# Multiprocessor counts: fewer of them, fewer blocks (larger groups of rows,
# more units a block, tiles of four rows, several pairs a thread).
GPUS: dict[str, Callable[[ModuleType], None]] = {
    "132 SMs": lambda gpu: None,
    "12 SMs": lambda gpu: gpu.set_multiprocessors(12),
    "1 SM": lambda gpu: gpu.set_multiprocessors(1),
}
ORDERS = ("forward", "reverse", "random")
GRAD_OUTPUTS = ("dense", "none", "broadcast", "strided")


@contextlib.contextmanager
def emulated(
    mode: str = "clusters", gpu: str = "132 SMs", order: str = "forward", seed: int = 0
) -> Iterator[ModuleType]:
    """lltm's ops served by the host build on the GPU described, until the block ends."""
    with cuda_host.routed() as emulation:
        MODES[mode](emulation)
        GPUS[gpu](emulation)
        emulation.set_schedule(order, seed)
        yield emulation


def path(element_size: int, batch: int, state: int) -> str:
    """The plugin's rule for the emulated GPU as it is set up now, both passes."""
    return cuda_host.modules()[0].sequence_path(-1, element_size, batch, state)


# --- Arguments and the oracle --------------------------------------------------------------


def lengths_of(steps: int, batch: int) -> list[int]:
    """Sorted lengths of a packed batch: the first `steps` long, some equal, down to 1."""
    return sorted(
        (max(1, steps - (i * steps) // max(batch, 1) // 2 * 2) for i in range(batch)),
        reverse=True,
    )


def forward_args(
    steps: int,
    batch: int,
    state: int,
    packed: bool,
    reverse: bool,
    dtype: torch.dtype = torch.float64,
    features: int = 3,
) -> list:
    """sequence_forward's arguments, at the modules' initialisation scale."""
    generator = torch.Generator().manual_seed(steps * 1000 + batch * 100 + state)
    scale = 1 / max(state, 1) ** 0.5

    def draw(*shape: int, s: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * s).to(dtype)

    batch_sizes = _packed_batch_sizes(lengths_of(steps, batch)) if packed else None
    x = draw(int(batch_sizes.sum()), features) if packed else draw(steps, batch, features)
    return [
        x,
        draw(3 * state, state + features, s=scale),
        draw(3 * state, s=scale),
        draw(batch, state),
        draw(batch, state),
        batch_sizes,
        reverse,
    ]


def grad_output_like(output: torch.Tensor, how: str) -> torch.Tensor | None:
    """The output gradient on output's device: random, None, a broadcast one
    (all strides 0, as ``output.sum()`` gives it) or a strided one (every
    other column of a wider tensor, and for padded sequences batch-major)."""
    generator = torch.Generator().manual_seed(11)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=output.dtype).to(output.device)

    if how == "none":
        return None
    if how == "broadcast":
        return torch.ones((), dtype=output.dtype, device=output.device).expand(output.shape)
    if how == "dense":
        return draw(*output.shape)
    *outer, state = output.shape
    if len(outer) == 2:  # (steps, batch, state), laid out (batch, steps, 2 state)
        return draw(outer[1], outer[0], 2 * state)[..., ::2].transpose(0, 1)
    return draw(*outer, 2 * state)[..., ::2]


def oracle(args: list, grad_output, grad_h_n, grad_c_n):
    """(output, h_n, c_n, cells in step order), and the gradients of the five
    inputs, of the reference cell step by step, in float64."""
    x, w, b, h, c, batch_sizes, reverse = args
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b, h, c)]
    cells: list[torch.Tensor] = []
    output, h_n, c_n = sequence_oracle(*leaves, batch_sizes, reverse, cells=cells)
    if reverse:
        cells.reverse()
    if batch_sizes is None:
        cells_t = torch.stack(cells) if cells else output.new_zeros(output.shape)
    else:
        cells_t = torch.cat(cells) if cells else output.new_zeros(output.shape)
    upstream = [
        torch.zeros_like(output) if grad_output is None else grad_output.double(),
        torch.zeros_like(h_n) if grad_h_n is None else grad_h_n.double(),
        torch.zeros_like(c_n) if grad_c_n is None else grad_c_n.double(),
    ]
    grads = torch.autograd.grad(
        [output, h_n, c_n], leaves, upstream, allow_unused=True, materialize_grads=True
    )
    return [output.detach(), h_n.detach(), c_n.detach(), cells_t], list(grads)


def run_ops(args: list, grad_how: str, final_grads: str, mask: list[bool]):
    """sequence_forward, sequence_backward and sequence_gate_grads as lltm's ops
    run them; (outputs, grads, gate grads, the upstream gradients)."""
    output, h_n, c_n, gates, cells = torch.ops.lltm.sequence_forward(*args)
    grad_output = grad_output_like(output, grad_how)
    generator = torch.Generator().manual_seed(12)
    grad_h_n = torch.randn(h_n.shape, generator=generator, dtype=h_n.dtype).to(h_n.device)
    grad_c_n = torch.randn(c_n.shape, generator=generator, dtype=c_n.dtype).to(c_n.device)
    if final_grads in ("none", "c only"):
        grad_h_n = None
    if final_grads == "none":
        grad_c_n = None
    x, w, _b, h, _c, batch_sizes, reverse = args
    saved = [output, gates, cells, x, w, h, batch_sizes, reverse]
    grads = torch.ops.lltm.sequence_backward(grad_output, grad_h_n, grad_c_n, *saved, mask)
    gate_grads = torch.ops.lltm.sequence_gate_grads(grad_output, grad_h_n, grad_c_n, *saved)
    return (
        [output, h_n, c_n, cells],
        list(grads),
        list(gate_grads),
        (grad_output, grad_h_n, grad_c_n),
    )


def on(device: str | torch.device, args: list) -> list:
    """The arguments with their floating-point tensors on `device` (batch_sizes
    stays on the CPU, as a PackedSequence keeps it)."""
    return [
        t.to(device) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in args
    ]


def assert_matches_oracle(
    args: list, grad_how: str, final_grads: str, mask, tol, device: str | torch.device = "cpu"
) -> None:
    """lltm's ops on `device` against the float64 oracle on the CPU."""
    outputs, grads, gate_grads, upstream = run_ops(on(device, args), grad_how, final_grads, mask)

    def exact(t: torch.Tensor) -> torch.Tensor:
        assert t.device.type == torch.device(device).type
        return t.cpu().double()

    expected_outputs, expected_grads = oracle(
        args, *(None if t is None else t.cpu() for t in upstream)
    )
    names = ["output", "h_n", "c_n", "cells"]
    for name, got, want in zip(names, outputs, expected_outputs, strict=True):
        torch.testing.assert_close(exact(got), want, **tol, msg=lambda m, n=name: f"{n}: {m}")
    grad_names = ["input", "weights", "bias", "old_h", "old_cell"]
    for name, wanted, got, want in zip(grad_names, mask, grads, expected_grads, strict=True):
        if not wanted:
            assert got is None, name
            continue
        torch.testing.assert_close(exact(got), want, **tol, msg=lambda m, n=name: f"grad_{n}: {m}")
    d_gates, grad_h, grad_c = gate_grads
    torch.testing.assert_close(exact(grad_h), expected_grads[3], **tol)
    torch.testing.assert_close(exact(grad_c), expected_grads[4], **tol)
    # grad_bias is d_gates summed over every row.
    rows = exact(d_gates).reshape(-1, d_gates.shape[-1])
    torch.testing.assert_close(rows.sum(0), expected_grads[2], **tol)


F64 = dict(rtol=1e-9, atol=1e-10)

# (steps, batch, state, packed): every state of 1, 3, 5, 17, 33, every batch of
# 0, 1, 3, 7 and every length of 0, 1, 2, 7 in some case, padded and packed
# (packed: lengths down from `steps`, some equal, so that the batch sizes come
# in runs).
SIZES = [
    (0, 3, 5, False),
    (1, 1, 1, False),
    (2, 7, 3, False),
    (7, 3, 17, False),
    (7, 7, 33, False),
    (2, 0, 5, False),
    (1, 7, 17, True),
    (7, 7, 3, True),
    (7, 3, 33, True),
    (2, 1, 5, True),
]


def _cases() -> list:
    """Each size in both modes and both directions; the schedule order, the
    output gradient, the final states' gradients and the mask rotate through
    the cases, so that every value of each meets many of the others."""
    cases = []
    settings = itertools.cycle(
        itertools.product(
            ORDERS,
            GRAD_OUTPUTS,
            ("both", "none", "c only"),
            ((True,) * 5, (True, True, True, False, True), (False, True, False, True, True)),
        )
    )
    for (steps, batch, state, packed), mode, reverse in itertools.product(
        SIZES, MODES, (False, True)
    ):
        order, grad_how, final_grads, mask = next(settings)
        for _ in range(7):  # a coprime stride through the settings
            next(settings)
        cases.append(
            pytest.param(
                steps, batch, state, packed, mode, reverse, order, grad_how, final_grads, mask,
                id=f"t{steps}-b{batch}-s{state}-{'packed' if packed else 'padded'}-{mode}"
                f"{'-reverse' if reverse else ''}-{order}-{grad_how}-{final_grads.replace(' ', '')}"
                f"-{''.join('1' if m else '0' for m in mask)}",
            )
        )  # fmt: skip
    return cases


@pytest.mark.parametrize(
    ("steps", "batch", "state", "packed", "mode", "reverse", "order", "grad_how", "final_grads",
     "mask"),
    _cases(),
)  # fmt: skip
def test_kernels_match_the_float64_oracle(
    steps, batch, state, packed, mode, reverse, order, grad_how, final_grads, mask
):
    args = forward_args(steps, batch, state, packed, reverse)
    with emulated(mode, order=order, seed=steps + batch + state) as gpu:
        rule = path(8, batch, state)
        launches = gpu.launches()
        assert_matches_oracle(args, grad_how, final_grads, list(mask), F64)
        launched = gpu.launches() - launches
    if batch == 0:
        assert "nothing to run" in rule
        return
    mode_text = "clusters" if mode == "clusters" else "cooperative grid"
    assert rule.count(f"persistent, {mode_text}") == 2, rule
    # One launch an op: sequence_forward, sequence_backward, sequence_gate_grads;
    # and the gather of every row's previous state for the weights' gradient
    # of a packed batch of several lengths (tests/test_cuda_work.py).
    assert launched == 3 + _gathers(args, mask)


def _gathers(args: list, mask) -> int:
    """Plain launches of sequence_backward on the persistent path: the gather
    of h_prev, for the weights' gradient of a packed batch of several lengths."""
    batch_sizes = args[5]
    several = batch_sizes is not None and len(set(batch_sizes.tolist())) > 1
    return 1 if several and mask[1] else 0


# Few multiprocessors, larger blocks: (GPU, mode, state) -> the split the
# rule makes of 7 rows. 12 SMs: tiles of four rows in clusters; groups of 3,
# 3 and 1 rows cooperatively. 1 SM: one block of 7 rows and 29 units, 203
# pairs for 128 threads (two pairs a thread, in both passes).
LARGER_BLOCKS = {
    ("12 SMs", "clusters", 33): "2 groups x 6 blocks (6 state units, 4 batch rows a block), 128",
    ("12 SMs", "cooperative", 33): "3 groups x 4 blocks (9 state units, 3 batch rows a block)",
    ("1 SM", "clusters", 29): "1 group x 1 block (29 state units, 7 batch rows a block), 128 thr",
    ("1 SM", "cooperative", 29): "1 group x 1 block (29 state units, 7 batch rows a block), 128 t",
}


@pytest.mark.parametrize(("gpu_size", "mode", "state"), LARGER_BLOCKS)
def test_larger_blocks_match_the_float64_oracle(gpu_size, mode, state):
    args = forward_args(5, 7, state, packed=True, reverse=True)
    with emulated(mode, gpu_size, order="random", seed=3) as gpu:
        rule = path(8, 7, state)
        launches = gpu.launches()
        assert_matches_oracle(args, "strided", "both", [True] * 5, F64)
        assert gpu.launches() - launches == 3 + _gathers(args, [True] * 5)
    assert rule.count(LARGER_BLOCKS[gpu_size, mode, state]) == 2, rule


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("state", [16, 17])
def test_float32_matches_the_float64_oracle(mode, state):
    # 16: whole 16-byte vectors of h (the cooperative mode's vector reads);
    # 17: the scalar ones.
    args = forward_args(7, 5, state, packed=False, reverse=False, dtype=torch.float32)
    tol = dict(rtol=2e-5, atol=2e-5)
    with emulated(mode, "12 SMs", order="random", seed=5) as gpu:
        assert "persistent" in path(4, 5, state)
        launches = gpu.launches()
        assert_matches_oracle(args, "broadcast", "both", [True] * 5, tol)
        assert gpu.launches() - launches == 3


def test_the_tutorial_size_matches_the_float64_oracle():
    # The GPU plan of (16, 32, 128): 8 clusters of 16 blocks, 8 units and 2
    # rows a block, the forward's dot products split 8 ways; three steps.
    args = forward_args(3, 16, 128, packed=False, reverse=False, features=32)
    with emulated() as gpu:
        rule = path(8, 16, 128)
        launches = gpu.launches()
        assert_matches_oracle(args, "broadcast", "both", [True] * 5, F64)
        assert gpu.launches() - launches == 3
    assert "8 groups x 16 blocks (8 state units, 2 batch rows a block)" in rule, rule


# --- The rule, and the per-step path ---------------------------------------------------------


def test_the_gpu_sizes_on_an_h100():
    with emulated():
        rules = {size: path(4, *size) for size in ((16, 128), (8, 256), (64, 512))}
    forward = {size: text.splitlines()[0] for size, text in rules.items()}
    assert forward[16, 128] == (
        "forward: persistent, clusters: 8 groups x 16 blocks (8 state units, 2 batch rows a "
        "block), 128 threads, 16.1 KiB shared memory"
    )
    assert forward[8, 256] == (
        "forward: persistent, clusters: 8 groups x 16 blocks (16 state units, 1 batch row a "
        "block), 128 threads, 52.4 KiB shared memory"
    )
    # W_h of 512 units, 3 x 32 rows a block, is 194 KiB: clusters would need a
    # second buffer of h; the cooperative grid reads h back from memory.
    assert forward[64, 512] == (
        "forward: persistent, cooperative grid: 8 groups x 16 blocks (32 state units, 8 batch "
        "rows a block), 512 threads, 223.6 KiB shared memory"
    )
    assert rules[64, 512].splitlines()[1].startswith("backward: persistent, cooperative grid: 8")


def test_below_compute_capability_9_the_grid_is_cooperative():
    with emulated("cooperative"):
        assert path(4, 16, 128).count("persistent, cooperative grid") == 2


def test_without_non_portable_clusters_at_most_8_blocks():
    with emulated() as gpu:
        gpu.set_cluster_sizes(8, 8)
        rule = path(4, 16, 128)
    assert rule.count("persistent, clusters: 16 groups x 8 blocks") == 2, rule


@pytest.mark.parametrize(
    ("setup", "element_size", "batch", "state", "why"),
    [
        (lambda gpu: None, 4, 0, 128, "nothing to run"),
        (lambda gpu: None, 2, 0, 128, "nothing to run"),
        (lambda gpu: None, 4, 16, 4096, "no split fits on chip"),
        (lambda gpu: None, 2, 16, 4096, "no split fits on chip"),
        (lambda gpu: None, 8, 16, 2048, "no split fits on chip"),
        (
            lambda gpu: (gpu.set_capability(8, 0), gpu.set_cooperative_launch(False)),
            4, 16, 128, "the device has neither cooperative nor cluster launches",
        ),
    ],
    ids=[
        "empty",
        "16-bit empty",
        "state too large",
        "16-bit too large",
        "float64 too large",
        "no cooperative launch",
    ],
)  # fmt: skip
def test_the_per_step_path_and_why(setup, element_size, batch, state, why):
    with emulated() as gpu:
        setup(gpu)
        rule = path(element_size, batch, state)
    assert rule.count("per-step (") == 2 and why in rule, rule


def _per_step_launches(args: list, gpu: ModuleType) -> tuple[int, list]:
    """Launches of one forward and backward, and their results."""
    launches = gpu.launches()
    outputs, grads, _, _ = run_ops(args, "dense", "both", [True] * 5)
    return gpu.launches() - launches, outputs + grads


def test_lltm_cuda_persistent_0_takes_the_per_step_path(monkeypatch):
    args = forward_args(6, 3, 5, packed=True, reverse=True)
    with emulated() as gpu:
        persistent, expected = _per_step_launches(args, gpu)
        monkeypatch.setenv("LLTM_CUDA_PERSISTENT", "0")
        assert path(4, 3, 5).count("per-step (LLTM_CUDA_PERSISTENT=0)") == 2
        launches, results = _per_step_launches(args, gpu)
    assert persistent == 3 + _gathers(args, [True] * 5)
    assert launches > 12  # a product and a pointwise kernel a step
    for got, want in zip(results, expected, strict=True):
        torch.testing.assert_close(got, want, **F64)


@pytest.mark.parametrize(
    ("mode", "free", "rule"),
    [
        ("cooperative", 4, "persistent, cooperative grid: 4 groups x 33 blocks"),
        ("clusters", 0, "persistent, cooperative grid: 4 groups x 33 blocks"),
    ],
    ids=["cooperative", "clusters-none-free"],
)
def test_a_launch_the_gpu_refuses_falls_back_to_the_per_step_path(mode, free, rule):
    # Other work holds the multiprocessors but `free`: the cooperative grid's
    # plan counts on the device's 132 (the occupancy calculator gives blocks
    # a multiprocessor), the GPU refuses the launch as too large, and the op
    # runs the per-step path, with no error. (With none free, no cluster fits
    # and the rule has taken the cooperative grid.)
    args = forward_args(6, 7, 33, packed=False, reverse=True)
    with emulated(mode) as gpu:
        persistent, expected = _per_step_launches(args, gpu)
        gpu.set_free_multiprocessors(free)
        assert path(8, 7, 33).count(rule) == 2
        launches, results = _per_step_launches(args, gpu)
        # The refusal, answered, is not left in the thread's last error.
        assert gpu.peek_last_error() == gpu.cudaSuccess
    assert persistent == 3
    assert launches > 12
    for got, want in zip(results, expected, strict=True):
        torch.testing.assert_close(got, want, **F64)


@pytest.mark.parametrize("mode", ["clusters", "cooperative"])
def test_another_librarys_pending_error_stays_pending(mode):
    # Another library's failed launch leaves its error in the thread's last
    # error until its owner reads it: setting the kernels' attributes, the
    # occupancy calculator and the persistent launches (all succeeding)
    # neither report it as lltm's nor clear it.
    args = forward_args(6, 7, 33, packed=False, reverse=True)
    with emulated(mode) as gpu:
        foreign = gpu.cudaErrorInvalidConfiguration
        gpu.set_last_error(foreign)
        launches, results = _per_step_launches(args, gpu)
        assert gpu.peek_last_error() == foreign
        gpu.set_last_error(gpu.cudaSuccess)
        _, expected = _per_step_launches(args, gpu)
    assert launches == 3
    for got, want in zip(results, expected, strict=True):
        torch.testing.assert_close(got, want, **F64)


def test_clusters_fit_what_multiprocessors_are_free():
    # The cluster occupancy calculator counts the multiprocessors free (here,
    # as under MPS): a smaller split, still persistent.
    args = forward_args(6, 7, 33, packed=False, reverse=True)
    with emulated() as gpu:
        gpu.set_free_multiprocessors(4)
        rule = path(8, 7, 33)
        launches = gpu.launches()
        assert_matches_oracle(args, "dense", "both", [True] * 5, F64)
        assert gpu.launches() - launches == 3
    # With all 132 free: 7 groups x 11 blocks (test_kernels_match_the_float64_oracle).
    assert rule.count("persistent, clusters: 7 groups x 7 blocks") == 2, rule


# --- The barriers ---------------------------------------------------------------------------

# The barrier kinds each mode's kernels wait at.
USED = {"clusters": ("block", "cluster"), "cooperative": ("block", "grid")}


def _gives(run: Callable[[], list], expected: list) -> bool:
    """Whether run() gives `expected`; False where the emulation faults (a
    barrier it can see will never complete)."""
    try:
        got = run()
    except RuntimeError as fault:
        assert "lltm host emulation" in str(fault)
        return False
    return all(torch.allclose(g.double(), e, **F64) for g, e in zip(got, expected, strict=True))


@pytest.mark.parametrize("order", ["forward", "random"])
@pytest.mark.parametrize(
    ("mode", "kind"), [(mode, kind) for mode in MODES for kind in ("block", "cluster", "grid")]
)
def test_every_barrier_is_needed(mode, kind, order):
    # Dropping a kind the kernels use makes each pass wrong (the emulation
    # fills shared memory with garbage: NaN); dropping one they do not use
    # changes nothing.
    args = forward_args(4, 3, 17, packed=True, reverse=True)
    x, w, _b, h, _c, batch_sizes, reverse = args
    # The backward's input from lltm's CPU kernels, so that it alone is judged.
    output, _, _, gates, cells = torch.ops.lltm.sequence_forward(*args)
    grad_output = torch.ones_like(output)
    (expected_output, *_), expected_grads = oracle(args, grad_output, None, None)
    with emulated(mode, order=order, seed=9) as gpu:
        gpu.drop_barrier(kind)
        forward_ok = _gives(lambda: [torch.ops.lltm.sequence_forward(*args)[0]], [expected_output])
        saved = [output, gates, cells, x, w, h, batch_sizes, reverse, [True] * 5]
        backward_ok = _gives(
            lambda: list(torch.ops.lltm.sequence_backward(grad_output, None, None, *saved)),
            expected_grads,
        )
    needed = kind in USED[mode]
    assert forward_ok != needed and backward_ok != needed, (forward_ok, backward_ok)
