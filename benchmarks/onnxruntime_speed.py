"""lltm and nn.LSTM exported to ONNX, timed in onnxruntime side by side.

Each model is one recurrent layer over T steps, exported with a plain
``torch.onnx.export(model, (x,), path)``, as a user would: nn.LSTM becomes
ONNX's LSTM operator (one fused kernel in onnxruntime), lltm's sequence its
input projection of all steps (one MatMul) and then an ONNX Scan over the
steps. lltm is also exported once more with a dynamic batch and length, the
file that runs every length (torch 2.13 exports nn.LSTM with its length
fixed, whatever dynamic_shapes say).
The sessions run with one thread and are timed interleaved, so that the
machine's load falls on all alike; medians in milliseconds.

    python benchmarks/onnxruntime_speed.py                 # the bench's two sizes, T = 50
    python benchmarks/onnxruntime_speed.py --sizes 16,32,128 --rounds 300
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import onnxruntime as ort
import torch
from torch.export import Dim

import lltm


class Layer(torch.nn.Module):
    """One recurrent layer; returns (output, h_n, c_n)."""

    def __init__(self, rnn: torch.nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        output, (h_n, c_n) = self.rnn(x)
        return output, h_n, c_n


def export(model: torch.nn.Module, x: torch.Tensor, path: Path, dynamic: bool) -> Path:
    shapes = ({0: Dim("steps", min=1, max=4096), 1: Dim("batch", min=1, max=4096)},)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamic_shapes=shapes if dynamic else None)
    return path


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options)


def bench(batch: int, features: int, state: int, steps: int, rounds: int, out: Path) -> dict:
    torch.manual_seed(0)
    x = torch.randn(steps, batch, features)
    name = f"{batch}_{features}_{state}"
    files = {
        "nn.LSTM": export(
            Layer(torch.nn.LSTM(features, state)).eval(), x, out / f"lstm_{name}.onnx", False
        ),
        "lltm": export(
            Layer(lltm.LLTMSequence(features, state)).eval(), x, out / f"lltm_{name}.onnx", False
        ),
        "lltm, any length": export(
            Layer(lltm.LLTMSequence(features, state)).eval(), x, out / f"lltm_dyn_{name}.onnx", True
        ),
    }
    sessions = {label: session(path) for label, path in files.items()}
    feed = x.numpy()
    times: dict[str, list[float]] = {label: [] for label in sessions}
    for _ in range(3):  # warm-up
        for s in sessions.values():
            s.run(None, {s.get_inputs()[0].name: feed})
    for _ in range(rounds):
        for label, s in sessions.items():
            start = time.perf_counter()
            s.run(None, {s.get_inputs()[0].name: feed})
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        nargs="*",
        default=["16,32,128", "64,256,512"],
        help="batch,features,state (default: the bench's two sizes)",
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="timed runs per model (default: 200 for small sizes, 20 for large)",
    )
    args = parser.parse_args()
    print(
        f"onnxruntime {ort.__version__}, torch {torch.__version__}, lltm {lltm.__version__}; "
        f"one thread, T = {args.steps}, forward, medians (ms)"
    )
    print(
        "| batch, features, state | nn.LSTM | lltm | lltm / nn.LSTM | lltm, any length | any length / nn.LSTM |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            batch, features, state = (int(v) for v in size.split(","))
            rounds = args.rounds or (200 if batch * state <= 4096 else 20)
            t = bench(batch, features, state, args.steps, rounds, Path(tmp))
            lstm, fixed, dynamic = t["nn.LSTM"], t["lltm"], t["lltm, any length"]
            print(
                f"| ({batch}, {features}, {state}) | {lstm:.3f} | {fixed:.3f} | {fixed / lstm:.2f} "
                f"| {dynamic:.3f} | {dynamic / lstm:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
