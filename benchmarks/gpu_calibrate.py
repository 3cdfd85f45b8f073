"""What one GPU run measures to check and correct the persistent kernels' rule.

    python benchmarks/gpu_calibrate.py --json OUT.json [--sections plans,float32,captured]
        [--deadline-s 150] [--grid 1x32x64,...] [--sizes 16x32x128,...] [--seq-len 50]
    python benchmarks/gpu_calibrate.py --summary OUT.json   # its summary again

Three sections, each a list in the JSON file, written again after every
measurement (a run stopped at its deadline, or killed, still leaves what it
measured; ``"complete"`` says whether it finished):

* ``plans``: at every point of the speed-up map (benchmarks/gpu.sh's grid:
  batch 1-256 by state 64-1024, features half the state, T = 50) and in each
  precision (float32 with exact products, float32 under
  ``torch.set_float32_matmul_precision("high")``, bf16 and fp16 autocast),
  every plan ``LLTM_CUDA_PLAN`` can force (docs/cuda.md, "Forcing a plan")
  beside the rule's: the plan each pass took (the plugin's ``sequence_path``;
  a forced plan that does not fit falls back to the rule's, and is recorded
  as not fitting and not timed), and the median time of a forward (that
  records the graph, as the bench's) and of a training step (the ``.sum()``
  loss of the bench), timed with CUDA events. Plans that come out the same as one
  already timed at that point (``clusters`` where the rule takes clusters)
  are recorded as ``same_as`` it. Each entry names the fastest plan of each
  phase and the rule's time over it.
* ``float32``: at the bench's four GPU sizes, lltm under the ``"highest"``
  float32 matmul precision against nn.LSTM with cuDNN's TF32 off, and under
  ``"high"`` against nn.LSTM with TF32 on (torch's default), the time of a
  forward and of a step and each one's error against the float64 model;
  whether lltm's results changed with the setting (``lltm_follows_high``:
  its products through cuBLAS follow it; the error says how far) and the
  plan it took under each.
* ``captured``: at the same sizes, lltm and nn.LSTM (TF32 on and off),
  float32, a training step (forward and backward) captured in one CUDA graph
  on static inputs, and the time of a replay (no host work) beside an eager
  step's.

Timings are medians of few repeats: enough to rank plans that differ by
more than a few per cent, not to resolve closer ones. On a machine without a
GPU (``--device cpu``) the sections run at the sizes given, with wall-clock
timers and the rule alone (no plans to force; no CUDA graphs): a check of
the script, not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import lltm
from lltm import _backends, reference
from lltm.bench import report

# Every plan LLTM_CUDA_PLAN forces (csrc/cuda/lltm_cuda_persistent_plan.h),
# after the rule's ("auto"); cuda-cores only for 16-bit dtypes, whose
# products are otherwise on the tensor cores.
PLANS = ("auto", "per-step", "clusters", "cooperative", "cooperative-global-h")
PLANS += tuple(f"waves={n}" for n in range(1, 5))
PLANS_16_BIT = ("cuda-cores",)
# The precisions of the plans section: (name, autocast dtype or None,
# float32 matmul precision).
PRECISIONS = (
    ("float32", None, "highest"),
    ("float32-high", None, "high"),
    ("bf16-autocast", torch.bfloat16, "highest"),
    ("fp16-autocast", torch.float16, "highest"),
)
GRID = [(b, s // 2, s) for b in (1, 4, 16, 64, 256) for s in (64, 128, 256, 512, 1024)]
SIZES = [(16, 32, 128), (8, 32, 256), (64, 256, 512), (256, 256, 256)]
SECTIONS = ("plans", "float32", "captured")


# --- Timing --------------------------------------------------------------------------------


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls, after one to warm up.

    On a GPU each call is bracketed by CUDA events on the current stream: the
    GPU's time from the call's first launch to its last, which includes
    whatever the GPU waited on the host in between.
    """
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


@contextlib.contextmanager
def environ(name: str, value: str | None) -> Iterator[None]:
    """Environment variable ``name`` set to ``value`` (None: unset) in the block."""
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def matmul_precision(value: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(value)`` in the block."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def cudnn_tf32(allowed: bool) -> Iterator[None]:
    """cuDNN's TF32 (what nn.LSTM's float32 follows) on or off in the block."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = before


# --- Models and phases ----------------------------------------------------------------------


class Problem:
    """A sequence of ``seq_len`` steps at (batch, features, state), float32, and
    the phases of one model on it: forward (no grad) and training step."""

    def __init__(self, size: tuple[int, int, int], seq_len: int, device: torch.device) -> None:
        self.batch, self.features, self.state = size
        generator = torch.Generator().manual_seed(sum(size) + seq_len)
        self.x = torch.randn(seq_len, self.batch, self.features, generator=generator).to(device)
        self.h_0 = torch.randn(1, self.batch, self.state, generator=generator).to(device) * 0.5
        self.c_0 = torch.randn(1, self.batch, self.state, generator=generator).to(device) * 0.5
        torch.manual_seed(0)
        self.lltm = lltm.LLTMSequence(self.features, self.state).to(device)
        self.lstm = torch.nn.LSTM(self.features, self.state).to(device)

    def run(self, module: torch.nn.Module, autocast: torch.dtype | None) -> list[torch.Tensor]:
        """(output, h_n, c_n) of ``module``, under autocast where given."""
        with torch.autocast(self.x.device.type, autocast, enabled=autocast is not None):
            output, (h_n, c_n) = module(self.x, (self.h_0, self.c_0))
        return [output, h_n, c_n]

    def forward(self, module: torch.nn.Module, autocast: torch.dtype | None) -> Callable[[], Any]:
        """The forward that records the graph for a backward, as the bench's
        forward phase (under ``torch.no_grad()`` lltm runs its inference op)."""
        return lambda: self.run(module, autocast)

    def step(self, module: torch.nn.Module, autocast: torch.dtype | None) -> Callable[[], Any]:
        """Forward and backward of the bench's ``.sum()`` loss, the loss under
        autocast and the backward outside it, as mixed-precision training runs."""

        def call() -> None:
            module.zero_grad(set_to_none=True)
            with torch.autocast(self.x.device.type, autocast, enabled=autocast is not None):
                output, (h_n, c_n) = module(self.x, (self.h_0, self.c_0))
                loss = output.sum() + h_n.sum() + c_n.sum()
            loss.backward()

        return call

    def lltm_exact(self) -> torch.Tensor:
        """lltm's output in float64, as the reference cell computes it step by step
        (a one-layer LLTMSequence has the reference cell's parameters, by name)."""
        cell = reference.LLTM(self.features, self.state).to(self.x.device, torch.float64)
        cell.load_state_dict({k: v.double() for k, v in self.lltm.state_dict().items()})
        h, c = self.h_0[0].double(), self.c_0[0].double()
        outputs = []
        with torch.no_grad():
            for x in self.x.double():
                h, c = cell(x, (h, c))
                outputs.append(h)
        return torch.stack(outputs)

    def lstm_exact(self) -> torch.Tensor:
        """nn.LSTM's output in float64 (cuDNN's double: no TF32)."""
        exact = torch.nn.LSTM(self.features, self.state).to(self.x.device, torch.float64)
        exact.load_state_dict(self.lstm.state_dict())
        with torch.no_grad():
            return exact(self.x.double(), (self.h_0.double(), self.c_0.double()))[0]


def relative_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    """RMS of ``got - want`` over the RMS of ``want``."""
    error = (got.double() - want).pow(2).mean().sqrt()
    return float(error / want.pow(2).mean().sqrt().clamp_min(1e-300))


# --- The sections ---------------------------------------------------------------------------


def paths_of(device: torch.device, dtype: torch.dtype, batch: int, state: int) -> dict | None:
    """The plugin's plan for both passes as LLTM_CUDA_PLAN now is (None: no plugin)."""
    if device.type != "cuda":
        return None
    return _backends.sequence_path(device.index or 0, dtype, batch, state)


def fits(paths: dict | None) -> dict[str, bool]:
    """Per pass, whether the plan asked for is the one that runs."""
    return {p: not paths or "does not fit" not in paths[p] for p in ("forward", "backward")}


def plan_key(paths: dict | None) -> tuple[str, ...]:
    """A plan as it runs, whoever asked for it (the ``forced by`` note dropped)."""
    if not paths:
        return ()
    return tuple(paths[p].split(" (forced by ")[0] for p in ("forward", "backward"))


def plans_at(
    problem: Problem, precision: tuple[str, torch.dtype | None, str], repeats: int
) -> dict[str, Any]:
    """Every plan's times at one point in one precision, and the fastest."""
    name, autocast, matmul = precision
    device = problem.x.device
    compute = autocast or torch.float32
    plans = PLANS + (PLANS_16_BIT if autocast else ())
    if device.type != "cuda":
        plans = ("auto",)
    entry: dict[str, Any] = {
        "batch": problem.batch,
        "features": problem.features,
        "state": problem.state,
        "precision": name,
        "plans": {},
    }
    seen: dict[tuple[str, ...], str] = {}
    with matmul_precision(matmul):
        for plan in plans:
            with environ("LLTM_CUDA_PLAN", None if plan == "auto" else plan):
                paths = paths_of(device, compute, problem.batch, problem.state)
                record: dict[str, Any] = {"path": paths, "fits": fits(paths)}
                entry["plans"][plan] = record
                if plan != "auto" and not any(record["fits"].values()):
                    continue
                key = plan_key(paths)
                if key and key in seen:
                    record["same_as"] = seen[key]
                    continue
                seen[key] = plan
                try:
                    for phase in ("forward", "step"):
                        fn = getattr(problem, phase)(problem.lltm, autocast)
                        record[f"{phase}_us"] = timed(fn, device, repeats) * 1e6
                except Exception as error:  # noqa: BLE001 - recorded, the next plan runs
                    record["error"] = f"{type(error).__name__}: {error}"
    entry.update(fastest(entry["plans"]))
    return entry


def fastest(plans: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fastest plan of each phase, and the rule's time over the fastest's.

    A phase's candidates are the rule's (``auto``) and the forced plans that
    ran as forced in every pass the phase has (the forward: its own; the
    step: both): one that fell back to the rule's in a pass measured the
    rule's there, not itself.
    """
    out: dict[str, Any] = {}
    for phase, passes in (("forward", ("forward",)), ("step", ("forward", "backward"))):
        times = {
            plan: record[f"{phase}_us"]
            for plan, record in plans.items()
            if f"{phase}_us" in record
            and (plan == "auto" or all(record["fits"][p] for p in passes))
        }
        if not times:
            continue
        best = min(times, key=times.__getitem__)
        rule = times.get("auto")
        out[f"{phase}_best"] = best
        out[f"{phase}_rule_over_best"] = rule / times[best] if rule else None
    return out


def float32_at(problem: Problem, repeats: int) -> list[dict[str, Any]]:
    """lltm in both float32 matmul precisions beside nn.LSTM with TF32 to match."""
    device = problem.x.device
    exact = {"lltm": problem.lltm_exact(), "lstm": problem.lstm_exact()}
    rows = []
    results = {}
    for matmul, tf32 in (("highest", False), ("high", True)):
        with matmul_precision(matmul), cudnn_tf32(tf32):
            for impl, module in (("lltm", problem.lltm), ("lstm", problem.lstm)):
                with torch.no_grad():
                    output = problem.run(module, None)[0]
                if impl == "lltm":
                    results[matmul] = output
                row: dict[str, Any] = {
                    "batch": problem.batch,
                    "features": problem.features,
                    "state": problem.state,
                    "impl": impl,
                    "matmul_precision": matmul,
                    "cudnn_tf32": tf32,
                    # What nn.LSTM's float32 follows, as torch reads it now.
                    "cudnn_rnn_fp32_precision": _cudnn_rnn_precision(),
                    "forward_us": timed(problem.forward(module, None), device, repeats) * 1e6,
                    "step_us": timed(problem.step(module, None), device, repeats) * 1e6,
                    "relative_rms_error": relative_rms(output, exact[impl]),
                }
                if impl == "lltm":
                    row["path"] = paths_of(device, torch.float32, problem.batch, problem.state)
                rows.append(row)
    follows = not torch.equal(results["highest"], results["high"])
    for row in rows:
        if row["impl"] == "lltm":
            row["lltm_follows_high"] = follows
    return rows


def captured_at(problem: Problem, replays: int) -> list[dict[str, Any]]:
    """A float32 training step captured in a CUDA graph: a replay's time and an eager step's."""
    device = problem.x.device
    rows = []
    for impl, module, tf32 in (
        ("lltm", problem.lltm, True),
        ("lstm", problem.lstm, True),
        ("lstm", problem.lstm, False),
    ):
        row: dict[str, Any] = {
            "batch": problem.batch,
            "features": problem.features,
            "state": problem.state,
            "impl": impl,
            "cudnn_tf32": tf32,
        }
        rows.append(row)
        with cudnn_tf32(tf32):
            step = problem.step(module, None)
            row["eager_step_us"] = timed(step, device, replays) * 1e6
            try:
                row["replay_us"] = replay_time(problem, module, replays) * 1e6
            except Exception as error:  # noqa: BLE001 - recorded, the next one runs
                row["error"] = f"{type(error).__name__}: {error}"
    return rows


def replay_time(problem: Problem, module: torch.nn.Module, replays: int) -> float:
    """Seconds a replay of the captured step takes, over ``replays`` back to back."""
    parameters = list(module.parameters())

    def step() -> None:
        output, (h_n, c_n) = module(problem.x, (problem.h_0, problem.c_0))
        (output.sum() + h_n.sum() + c_n.sum()).backward()

    # Warm up on a side stream, then capture with the gradients unset, so
    # that the graph allocates them (and later replays overwrite them).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            module.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    module.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    assert all(p.grad is not None for p in parameters)
    del graph
    module.zero_grad(set_to_none=True)
    return start.elapsed_time(end) / 1e3 / replays


# --- The run --------------------------------------------------------------------------------


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "lltm": lltm.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["cudnn_rnn_fp32_precision"] = _cudnn_rnn_precision()
    return env


def _cudnn_rnn_precision() -> str | None:
    rnn = getattr(torch.backends.cudnn, "rnn", None)
    return getattr(rnn, "fp32_precision", None)


def sizes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for item in text.split(","):
        batch, features, state = (int(v) for v in item.lower().split("x"))
        out.append((batch, features, state))
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--summary", type=Path, help="print the summary of a file this wrote")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="of " + ", ".join(SECTIONS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seq-len", type=int, default=50)
    parser.add_argument("--grid", type=sizes, default=GRID, help="the plans' points, BxFxS,...")
    parser.add_argument("--sizes", type=sizes, default=SIZES, help="float32 and captured sizes")
    parser.add_argument(
        "--precisions", default=",".join(p[0] for p in PRECISIONS), help="the plans' precisions"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed calls a plan and phase")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=150.0,
        help="start nothing new past this many seconds (what was measured is kept)",
    )
    args = parser.parse_args(argv)
    if (args.json is None) == (args.summary is None):
        parser.error("one of --json (measure) and --summary (read) is needed")
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: no section {', '.join(sorted(unknown))}")
    names = {p[0]: p for p in PRECISIONS}
    try:
        args.precisions = [names[p] for p in args.precisions.split(",") if p]
    except KeyError as error:
        parser.error(f"--precisions: no precision {error}")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.summary:
        print(summary(json.loads(args.summary.read_text())))
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    began = time.monotonic()
    data: dict[str, Any] = {"environment": environment(device), "complete": False}
    data.update({section: [] for section in args.sections})

    def save() -> None:
        temporary = args.json.with_suffix(".partial")
        temporary.write_text(json.dumps(data, indent=1) + "\n")
        temporary.replace(args.json)

    def work() -> Iterator[tuple[str, Callable[[], Any]]]:
        # Small sizes first: a run stopped at its deadline has the most points.
        if "float32" in args.sections:
            for size in args.sizes:
                yield (
                    "float32",
                    lambda size=size: float32_at(
                        Problem(size, args.seq_len, device), args.repeats + 2
                    ),
                )
        if "captured" in args.sections and device.type == "cuda":
            for size in args.sizes:
                yield (
                    "captured",
                    lambda size=size: captured_at(Problem(size, args.seq_len, device), 20),
                )
        if "plans" in args.sections:
            for size in sorted(args.grid, key=lambda s: s[0] * s[2] * s[2]):
                problem = None
                for precision in args.precisions:

                    def point(size=size, precision=precision) -> dict[str, Any]:
                        nonlocal problem
                        problem = problem or Problem(size, args.seq_len, device)
                        return plans_at(problem, precision, args.repeats)

                    yield "plans", point

    save()
    for section, measure in work():
        if time.monotonic() - began > args.deadline_s:
            data["stopped"] = f"the deadline, {args.deadline_s:g} s, passed"
            save()
            print(f"gpu_calibrate: {data['stopped']}; partial results in {args.json}")
            return 0
        try:
            result = measure()
        except Exception as error:  # noqa: BLE001 - recorded, the next one runs
            result = {"error": f"{type(error).__name__}: {error}"}
        data[section].extend(result if isinstance(result, list) else [result])
        save()
    data["complete"] = True
    data["seconds"] = round(time.monotonic() - began, 1)
    save()
    print(summary(data))
    return 0


def summary(data: dict[str, Any]) -> str:
    """The plans section in a line a point: the fastest plan of each phase,
    the rule's time over it and the rule's path; then the float32 and
    captured rows."""
    lines = []
    for entry in data.get("plans", []):
        if "error" in entry:
            lines.append(f"plans: {entry['error']}")
            continue
        where = f"({entry['batch']}, {entry['features']}, {entry['state']}) {entry['precision']}"
        parts = []
        for phase in ("forward", "step"):
            best, ratio = entry.get(f"{phase}_best"), entry.get(f"{phase}_rule_over_best")
            parts.append(f"{phase} {best} (rule {ratio:.2f}x)" if ratio else f"{phase} -")
        rule = entry["plans"].get("auto", {}).get("path")
        if rule:
            parts.append(f"the rule's: {report.short_path(rule)}")
        lines.append(f"{where}: " + "; ".join(parts))
    for row in data.get("float32", []):
        if "error" in row:
            lines.append(f"float32: {row['error']}")
            continue
        lines.append(
            f"float32 ({row['batch']}, {row['features']}, {row['state']}) {row['impl']} "
            f"{row['matmul_precision']} tf32={row['cudnn_tf32']}: forward "
            f"{row['forward_us']:.0f} us, step {row['step_us']:.0f} us, "
            f"error {row['relative_rms_error']:.1e}"
        )
    for row in data.get("captured", []):
        if "error" in row and "batch" not in row:
            lines.append(f"captured: {row['error']}")
            continue
        replay = f"{row['replay_us']:.0f} us" if "replay_us" in row else row.get("error")
        lines.append(
            f"captured ({row['batch']}, {row['features']}, {row['state']}) {row['impl']} "
            f"tf32={row['cudnn_tf32']}: replay {replay}, eager {row['eager_step_us']:.0f} us"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
