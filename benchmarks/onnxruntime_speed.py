"""lltm and nn.LSTM deployed, timed side by side: onnxruntime and ExecuTorch.

Each model is one recurrent layer over T steps, exported as a user would:

* onnxruntime: a plain ``torch.onnx.export(model, (x,), path)``. nn.LSTM
  becomes ONNX's LSTM operator (one fused kernel in onnxruntime), lltm's
  sequence its input projections of all steps and then an ONNX Scan over the
  steps. lltm is also exported once more with a dynamic batch and length, the
  file that runs every size (torch 2.13 exports nn.LSTM with its length
  fixed, whatever dynamic_shapes say).
* ExecuTorch: ``to_edge_transform_and_lower(torch.export.export(model,
  (x,)), partitioner=[XnnpackPartitioner()]).to_executorch()``. Both are
  unrolled over the T steps and run by XNNPACK. lltm is also lowered once
  more with a dynamic length (up to 2 T): its loop runs on ExecuTorch's
  portable kernels, as the partitioner takes no loop.

Every model runs on one thread (ExecuTorch's threadpool is reset to one). The
calls are interleaved, so that the machine's load falls on all alike, in
rounds: each round's medians give each model's time and its ratio to
nn.LSTM's; the table shows the median over the rounds, milliseconds, and the
ratios' spread (lowest-highest).

    python benchmarks/onnxruntime_speed.py                 # both runtimes, the bench's two sizes, T = 50
    python benchmarks/onnxruntime_speed.py --runtimes onnxruntime --sizes 16,32,128 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.export import Dim

import lltm

LSTM, LLTM, ANY_LENGTH = "nn.LSTM", "lltm", "lltm, any length"


class Layer(torch.nn.Module):
    """One recurrent layer; returns (output, h_n, c_n)."""

    def __init__(self, rnn: torch.nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        output, (h_n, c_n) = self.rnn(x)
        return output, h_n, c_n


def models(features: int, state: int) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    lstm = Layer(torch.nn.LSTM(features, state)).eval()
    ours = Layer(lltm.LLTMSequence(features, state)).eval()
    return {LSTM: lstm, LLTM: ours, ANY_LENGTH: ours}


def onnxruntime_runs(x: torch.Tensor, state: int, out: Path) -> dict[str, Callable[[], object]]:
    """One call of each model's onnxruntime session on ``x``, by label."""
    import onnxruntime as ort

    runs = {}
    for label, model in models(x.shape[2], state).items():
        path = out / f"{label.replace(', ', '_').replace('.', '_')}.onnx"
        shapes = None
        if label == ANY_LENGTH:
            shapes = ({0: Dim("steps", min=1, max=4096), 1: Dim("batch", min=1, max=4096)},)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), path, dynamic_shapes=shapes, verbose=False)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options)
        feed = {session.get_inputs()[0].name: x.numpy()}
        runs[label] = lambda session=session, feed=feed: session.run(None, feed)
    return runs


def executorch_runs(x: torch.Tensor, state: int, out: Path) -> dict[str, Callable[[], object]]:
    """One call of each model's ExecuTorch method (XNNPACK) on ``x``, by label."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    from executorch.runtime import Runtime

    _unsafe_reset_threadpool(1)
    runs = {}
    for label, model in models(x.shape[2], state).items():
        shapes = None
        if label == ANY_LENGTH:
            shapes = ({0: Dim("steps", min=1, max=2 * x.shape[0])},)
        program = torch.export.export(model, (x,), dynamic_shapes=shapes)
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
        path = out / f"{label.replace(', ', '_').replace('.', '_')}.pte"
        path.write_bytes(lowered.to_executorch().buffer)
        method = Runtime.get().load_program(str(path)).load_method("forward")
        runs[label] = lambda method=method: method.execute([x])
    return runs


def timed(runs: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, list[float]]:
    """Per round, each model's median time in ms over ``calls`` interleaved calls."""
    for _ in range(3):  # warm-up
        for run in runs.values():
            run()
    medians: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(rounds):
        times: dict[str, list[float]] = {label: [] for label in runs}
        for _ in range(calls):
            for label, run in runs.items():
                start = time.perf_counter()
                run()
                times[label].append(time.perf_counter() - start)
        for label, t in times.items():
            medians[label].append(statistics.median(t) * 1e3)
    return medians


def row(size: str, medians: dict[str, list[float]]) -> str:
    def ratio(label: str) -> str:
        each = [ours / lstm for ours, lstm in zip(medians[label], medians[LSTM], strict=True)]
        return f"{statistics.median(each):.2f} ({min(each):.2f}-{max(each):.2f})"

    def ms(label: str) -> str:
        return f"{statistics.median(medians[label]):.3f}"

    cells = [size, ms(LSTM), ms(LLTM), ratio(LLTM), ms(ANY_LENGTH), ratio(ANY_LENGTH)]
    return "| " + " | ".join(cells) + " |"


RUNTIMES = {"onnxruntime": onnxruntime_runs, "executorch": executorch_runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        nargs="*",
        default=["16,32,128", "64,256,512"],
        help="batch,features,state (default: the bench's two sizes)",
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--runtimes", nargs="*", default=list(RUNTIMES), choices=list(RUNTIMES))
    parser.add_argument("--rounds", type=int, default=7, help="rounds of interleaved calls")
    parser.add_argument(
        "--calls",
        type=int,
        default=0,
        help="calls per model and round (default: 40 for small sizes, 5 for large)",
    )
    args = parser.parse_args()
    versions = [f"torch {torch.__version__}", f"lltm {lltm.__version__}"]
    if "onnxruntime" in args.runtimes:
        import onnxruntime

        versions.append(f"onnxruntime {onnxruntime.__version__}")
    if "executorch" in args.runtimes:
        from importlib.metadata import version

        versions.append(f"executorch {version('executorch')}")
    print(
        f"{', '.join(versions)}; one thread, T = {args.steps}, forward; medians over "
        f"{args.rounds} rounds (ms), ratios to nn.LSTM with their spread"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for runtime in args.runtimes:
            print(f"\n{runtime}\n")
            print(f"| batch, features, state | {LSTM} | {LLTM} | lltm / nn.LSTM ", end="")
            print(f"| {ANY_LENGTH} | any length / nn.LSTM |")
            print("|---|---:|---:|---:|---:|---:|")
            for size in args.sizes:
                batch, features, state = (int(v) for v in size.split(","))
                torch.manual_seed(0)
                x = torch.randn(args.steps, batch, features)
                out = Path(tmp) / f"{runtime}_{batch}_{features}_{state}"
                out.mkdir()
                runs = RUNTIMES[runtime](x, state, out)
                calls = args.calls or (40 if batch * state <= 4096 else 5)
                print(
                    row(f"({batch}, {features}, {state})", timed(runs, args.rounds, calls)),
                    flush=True,
                )


if __name__ == "__main__":
    main()
