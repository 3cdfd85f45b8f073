"""Peak memory of one call (``lltm bench --memory``): inference and a training step.

Each measurement runs in a process of its own, so that nothing another case
allocated (or the allocator keeps from it) is counted: the process builds the
case (model, inputs), then runs one phase once and reports how far that call
raised the memory in use above what the case itself holds. On a CPU that is
the growth of the process's peak resident set (Linux's ``VmHWM``, reset
after the case is built): everything the call touched,
torch's allocations and those of libraries it calls (oneDNN's workspaces
included), and the one-time costs of a first call (a few MiB at most). On a
GPU it is the CUDA caching allocator's peak of allocated bytes
(``torch.cuda.max_memory_allocated``), reset after the case is built.

The phases: ``no_grad``, the forward under ``torch.no_grad()``, what serving
runs; and ``step``, forward and backward, what training runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from . import cases, kinds
from .kinds import Size

PHASES = (kinds.NO_GRAD, "step")


def peak_bytes(
    impl: str,
    size: Size,
    device: torch.device,
    dtype: torch.dtype,
    *,
    inputs_grad: bool = False,
    kind: kinds.Kind | None = None,
    autocast: torch.dtype | None = None,
    phase: str = kinds.NO_GRAD,
) -> int:
    """How far one call of ``phase`` raises the memory in use, measured in a new process."""
    spec = {
        "impl": impl,
        "size": asdict(size),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "inputs_grad": inputs_grad,
        "kind": (kind or kinds.kind_of(size)).name,
        "autocast": None if autocast is None else str(autocast).removeprefix("torch."),
        "phase": phase,
    }
    # The measuring process gets this one's threads and environment.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = subprocess.run(
        # Not `-m lltm.bench.memory`: lltm.bench imports this module first.
        [sys.executable, "-c", _CHILD, json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"measuring {impl} {phase}: {lines[-1]}")
    return int(done.stdout.strip().splitlines()[-1])


_CHILD = "import sys; from lltm.bench.memory import main; sys.exit(main(sys.argv[1:]))"


def _measure(spec: dict[str, Any]) -> int:
    """The measurement itself, in the process ``peak_bytes`` started."""
    device = torch.device(spec["device"])
    autocast = None if spec["autocast"] is None else getattr(torch, spec["autocast"])
    case = cases.make_case(
        spec["impl"],
        Size(**spec["size"]),
        device,
        getattr(torch, spec["dtype"]),
        inputs_grad=spec["inputs_grad"],
        kind=kinds.KINDS[spec["kind"]],
        autocast=autocast,
    )
    return peak_of(case.phase(spec["phase"]), device)


def peak_of(run: Callable[[], Any], device: torch.device) -> int:
    """How far ``run()`` raises the memory in use on ``device``, in this process.

    Only the first such measurement of a process means what it says on a
    CPU where the peak cannot be reset (see the module's docstring).
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    if _reset_peak_rss():
        base = _status_bytes("VmRSS")
        run()
        return _status_bytes("VmHWM") - base
    # Elsewhere, the peak since the process started: a call that stays below
    # what importing torch touched counts as 0.
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run()
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * scale


def _reset_peak_rss() -> bool:
    """Resets the process's peak resident set (Linux >= 4.0: VmHWM); whether it could."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
        _status_bytes("VmHWM")
    except (OSError, KeyError):
        return False
    return True


def _status_bytes(field: str) -> int:
    """A size from /proc/self/status (``VmRSS``, ``VmHWM``), in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0]) * 1024  # kB
    raise KeyError(field)


def main(argv: list[str] | None = None) -> int:
    """Measures the case its one argument (JSON, from :func:`peak_bytes`) names."""
    parser = argparse.ArgumentParser(prog="lltm.bench.memory")
    parser.add_argument("spec", help="the case, as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    print(_measure(json.loads(args.spec)))
    return 0
