"""lltm in distributed and everyday training machinery.

* DistributedDataParallel over gloo, two processes on 127.0.0.1: the same
  parameters as one process on the same global batch (float64, tight).
* FSDP2 (``torch.distributed.fsdp.fully_shard``), the same way.
* The workers shut down in an order that cannot deadlock gloo
  (``_release_before_destroy``), under a deadline: a rank still running after
  it fails the test with every rank's state and stacks.
* torch.save / torch.load of a module and of an optimizer's state
  (``weights_only=True``), ``copy.deepcopy``, and anomaly detection.
"""

from __future__ import annotations

import copy
import faulthandler
import gc
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

import lltm

FEATURES, STATE, STEPS, GLOBAL_BATCH, WORLD = 3, 5, 4, 8, 2
TRAINING_STEPS = 3
# The two workers finish in well under a minute on two busy cores: past this,
# the test fails with their state and stacks rather than wait for a hung one.
WORKER_DEADLINE_S = 240
# A collective whose peer is gone fails after this, not gloo's default 30 min.
COLLECTIVE_TIMEOUT = timedelta(seconds=120)


class Model(nn.Module):
    """A sequence layer (bidirectional, two layers) read by a cell, then a head:
    both of lltm's modules in one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.sequence = lltm.LLTMSequence(FEATURES, STATE, num_layers=2, bidirectional=True)
        self.cell = lltm.LLTM(2 * STATE, STATE)
        self.head = nn.Linear(STATE, 1)

    def forward(self, x: Tensor) -> Tensor:
        output, _ = self.sequence(x)
        h = c = output.new_zeros(x.shape[1], STATE)
        for step in output.unbind(0):
            h, c = self.cell(step, (h, c))
        return self.head(h)  # (batch, 1): a new tensor, not a view of one


def make_model() -> Model:
    torch.manual_seed(0)
    return Model().double()


def global_batch() -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, GLOBAL_BATCH, FEATURES, generator=generator, dtype=torch.float64)
    y = torch.randn(GLOBAL_BATCH, 1, generator=generator, dtype=torch.float64)
    return x, y


def train(model: nn.Module, x: Tensor, y: Tensor) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for _ in range(TRAINING_STEPS):
        optimizer.zero_grad()
        # The mean over this process's part of the batch: the data-parallel
        # wrappers average the gradients over the processes, which gives the
        # mean over the global batch (the parts are of equal size).
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_part(rank: int, wrapper: str) -> tuple[dict[str, Tensor], weakref.ref[nn.Module]]:
    """Trains ``rank``'s part of the global batch under ``wrapper``. Returns the
    whole parameters (plain tensors) and a weak reference to the wrapped model,
    which must be gone before the process group is destroyed."""
    model = make_model()
    if wrapper == "ddp":
        trained: nn.Module = nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # A CPU mesh, named: with no mesh FSDP2 takes the GPU where there is one.
        mesh = init_device_mesh("cpu", (WORLD,))
        for module in (model.sequence, model.cell, model.head):
            fully_shard(module, mesh=mesh)
        trained = fully_shard(model, mesh=mesh)
    x, y = global_batch()
    part = GLOBAL_BATCH // WORLD
    rows = slice(rank * part, (rank + 1) * part)
    train(trained, x[:, rows], y[rows])
    state = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2: a DTensor
        state[name] = full.detach().clone()
    return state, weakref.ref(trained)


def _release_before_destroy(trained: weakref.ref[nn.Module]) -> None:
    """What must happen before ``destroy_process_group``, or gloo can deadlock.

    A gloo work launched during backward (DDP's all-reduces, FSDP's
    reduce-scatters) keeps the thread-local state of the autograd engine, which
    holds a Python object; gloo's worker thread frees a finished work holding
    the group's work mutex, and so takes the GIL with that mutex held. The
    group's destructor takes the mutex and joins that thread, holding the GIL
    when the last reference goes from Python: the reducer of a DDP wrapper freed
    after ``destroy_process_group`` (when the worker returns) did that and hung
    for good. Hence:

    * the wrappers go first, reference cycles included, while the group is
      still registered: no wrapper holds the last reference;
    * then a barrier: it is queued only once no gloo thread holds the mutex,
      completes only after every earlier collective, and while it waits the GIL
      is free for gloo's threads to finish freeing their works.

    ``destroy_process_group`` then drops the last reference to an idle group
    (under FSDP2, DTensor's sharding caches keep it, idle, until exit).
    """
    gc.collect()
    if trained() is not None:
        raise RuntimeError("the wrapped model outlived training: the process group would too")
    dist.barrier()


def _worker(rank: int, wrapper: str, port: int, out: str, stacks_dir: str) -> None:
    # A crash, or the parent's SIGABRT at its deadline, writes the Python stack
    # of every thread here (the file stays open for faulthandler).
    stacks = open(Path(stacks_dir) / f"rank{rank}.txt", "w")  # noqa: SIM115
    faulthandler.enable(stacks, all_threads=True)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=COLLECTIVE_TIMEOUT,
    )
    try:
        state, trained = _train_part(rank, wrapper)
        _release_before_destroy(trained)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        torch.save(state, out)


def _single_process() -> dict[str, Tensor]:
    model = make_model()
    train(model, *global_batch())
    return {name: p.detach() for name, p in model.named_parameters()}


def _native_stacks(pid: int) -> str:
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return "(py-spy is not installed)"
    dump = subprocess.run(
        [py_spy, "dump", "--native", "--pid", str(pid)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return dump.stdout + dump.stderr


def _workers_report(context: mp.ProcessContext, stacks_dir: Path) -> str:
    """Each rank's state; the stacks of those still running (native ones from
    py-spy, Python ones from faulthandler), which are then killed; the stacks a
    crashed rank left."""
    lines = []
    running = [p for p in context.processes if p.is_alive()]
    for rank, process in enumerate(context.processes):
        state = "still running" if process in running else f"exited with {process.exitcode}"
        lines.append(f"rank {rank} (pid {process.pid}): {state}")
    for process in running:
        lines += [f"--- native stacks of pid {process.pid}:", _native_stacks(process.pid)]
        os.kill(process.pid, signal.SIGABRT)  # faulthandler writes its Python stacks
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
    for rank in range(len(context.processes)):
        stacks = stacks_dir / f"rank{rank}.txt"
        if stacks.is_file() and stacks.stat().st_size:
            lines += [f"--- Python stacks of rank {rank}:", stacks.read_text()]
    return "\n".join(lines)


def _distributed(wrapper: str, tmp_path: Path) -> dict[str, Tensor]:
    out = tmp_path / f"{wrapper}.pt"
    args = (wrapper, _free_port(), str(out), str(tmp_path))
    context = mp.start_processes(_worker, args=args, nprocs=WORLD, join=False)
    deadline = time.monotonic() + WORKER_DEADLINE_S
    try:
        while not context.join(timeout=max(deadline - time.monotonic(), 0)):
            if time.monotonic() >= deadline:
                report = _workers_report(context, tmp_path)
                pytest.fail(f"no result after {WORKER_DEADLINE_S} s:\n{report}", pytrace=False)
    except mp.ProcessExitedException as error:  # no Python exception: a signal, an exit code
        pytest.fail(f"{error}\n{_workers_report(context, tmp_path)}", pytrace=False)
    finally:
        for process in context.processes:  # never left behind, whatever interrupted the wait
            if process.is_alive():
                process.kill()
                process.join()
    return torch.load(out, weights_only=True)


def _assert_same_parameters(actual: dict[str, Tensor], expected: dict[str, Tensor]) -> float:
    assert actual.keys() == expected.keys()
    worst = 0.0
    initial = dict(make_model().named_parameters())
    for name, e in expected.items():
        # Training moved every parameter: the comparison is not trivial.
        assert not torch.equal(e, initial[name].detach()), name
        torch.testing.assert_close(actual[name], e, rtol=1e-12, atol=1e-12, msg=name)
        worst = max(worst, (actual[name] - e).abs().max().item())
    return worst


@pytest.mark.skipif(not dist.is_available(), reason="torch without torch.distributed")
def test_ddp_over_gloo_matches_one_process(tmp_path):
    worst = _assert_same_parameters(_distributed("ddp", tmp_path), _single_process())
    print(f"DDP, 2 processes vs 1: largest parameter difference {worst:.3g}")


@pytest.mark.skipif(not dist.is_available(), reason="torch without torch.distributed")
def test_fsdp2_over_gloo_matches_one_process(tmp_path):
    worst = _assert_same_parameters(_distributed("fsdp2", tmp_path), _single_process())
    print(f"FSDP2, 2 processes vs 1: largest parameter difference {worst:.3g}")


# --- Saving, loading, copying ------------------------------------------------------------


def _round_trip(obj: Any, **load_kwargs: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def _outputs(model: Model) -> list[Tensor]:
    x, y = global_batch()
    loss = nn.functional.mse_loss(model(x), y)
    return [loss.detach(), *torch.autograd.grad(loss, list(model.parameters()))]


def test_state_dicts_round_trip_weights_only():
    model = make_model()
    train(model, *global_batch())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    _outputs(model)  # gradients for the optimizer step
    for p, g in zip(model.parameters(), _outputs(model)[1:], strict=True):
        p.grad = g
    optimizer.step()

    loaded_model = _round_trip(model.state_dict(), weights_only=True)
    loaded_optimizer = _round_trip(optimizer.state_dict(), weights_only=True)
    fresh = Model().double()
    fresh.load_state_dict(loaded_model)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    fresh_optimizer.load_state_dict(loaded_optimizer)
    for a, e in zip(_outputs(fresh), _outputs(model), strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
    # The optimizers continue identically: same moments, same step count.
    for opt, m in ((optimizer, model), (fresh_optimizer, fresh)):
        for p, g in zip(m.parameters(), _outputs(m)[1:], strict=True):
            p.grad = g
        opt.step()
    for a, e in zip(fresh.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def test_whole_module_pickles_and_deepcopies():
    model = make_model()
    # A whole module is a pickle of lltm's classes: weights_only=False, the
    # documented way for trusted files.
    loaded = _round_trip(model, weights_only=False)
    copied = copy.deepcopy(model)
    assert type(loaded.sequence) is lltm.LLTMSequence and type(copied.cell) is lltm.LLTM
    expected = _outputs(model)
    for clone in (loaded, copied):
        assert all(
            a.data_ptr() != b.data_ptr()
            for a, b in zip(clone.parameters(), model.parameters(), strict=True)
        )
        for a, e in zip(_outputs(clone), expected, strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=0)
    # The copy trains on its own: the original is untouched.
    before = [p.detach().clone() for p in model.parameters()]
    train(copied, *global_batch())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# --- Anomaly detection -----------------------------------------------------------------------


@pytest.mark.parametrize("fn", ["lltm_cell", "lltm_sequence"])
def test_anomaly_detection_passes_clean_and_names_nan(fn):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, FEATURES, generator=generator, dtype=torch.float64)
    weights = torch.randn(3 * STATE, STATE + FEATURES, generator=generator, dtype=torch.float64)
    bias = torch.randn(3 * STATE, generator=generator, dtype=torch.float64)
    h = torch.randn(3, STATE, generator=generator, dtype=torch.float64)
    c = torch.randn(3, STATE, generator=generator, dtype=torch.float64)
    leaves = [t.requires_grad_() for t in (x, weights, bias, h, c)]

    def loss(*args: Tensor) -> Tensor:
        if fn == "lltm_cell":
            new_h, new_c = lltm.lltm_cell(args[0][0], *args[1:])
        else:
            output, (new_h, new_c) = lltm.lltm_sequence(*args)
            new_h = new_h + output.sum(0)
        return new_h.sum() + new_c.sum()

    with torch.autograd.set_detect_anomaly(True):
        grads = torch.autograd.grad(loss(*leaves), leaves)
    assert all(g.isfinite().all() for g in grads)
    # A NaN born in lltm's backward is reported, naming lltm's backward node.
    poisoned = [t.detach().clone().requires_grad_() for t in leaves]
    with torch.no_grad():
        poisoned[3][0, 0] = float("nan")
    with (
        torch.autograd.set_detect_anomaly(True),
        pytest.raises(RuntimeError, match=r"returned nan values"),
    ):
        torch.autograd.grad(loss(*poisoned), poisoned[:3])


if __name__ == "__main__":  # pragma: no cover - manual runs
    sys.exit(pytest.main([__file__, "-q", "-s"]))
