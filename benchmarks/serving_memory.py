"""Serving: lltm's inference forward against its training forward and nn.LSTM.

Per size, at T steps (default 1000, the bench's four GPU sizes), float32 on
the CPU:

* peak memory of one call (lltm.bench.memory: each call in a process of its
  own, the growth of the peak resident set): the inference forward under
  ``torch.no_grad()`` (lltm's ``sequence_inference``), the same call with
  lltm's training forward (``sequence_forward``, what every call ran before
  the inference forward existed), nn.LSTM's, and one training step of each
  (forward, ``.sum()`` loss, backward);
* time of the forward under ``torch.no_grad()``: ``sequence_inference`` and
  ``sequence_forward`` called directly on the same inputs, and nn.LSTM,
  interleaved in rounds; medians (ms) and the ratio of the two lltm
  forwards, with its spread over the rounds.

    python benchmarks/serving_memory.py
    python benchmarks/serving_memory.py --sizes 64,256,512 --steps 1000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

import lltm
from lltm.bench import kinds, memory

SIZES = ["16,32,128", "8,32,256", "64,256,512", "256,256,256"]
CPU = torch.device("cpu")


def _inputs(batch: int, features: int, state: int, steps: int) -> list:
    torch.manual_seed(0)
    model = lltm.LLTMSequence(features, state)
    x = torch.randn(steps, batch, features)
    h = torch.zeros(batch, state)
    return [x, model.weights.detach(), model.bias.detach(), h, h.clone(), None, False]


def _training_forward_peak(batch: int, features: int, state: int, steps: int) -> int:
    """Peak of lltm's training forward under no_grad, in a process of its own."""
    code = (
        "import sys, torch, json; sys.path.insert(0, 'benchmarks'); import serving_memory as s;"
        "from lltm.bench import memory;"
        f"args = s._inputs({batch}, {features}, {state}, {steps});"
        "op = torch.ops.lltm.sequence_forward;"
        "print(memory.peak_of(lambda: op(*args), torch.device('cpu')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def _times(batch: int, features: int, state: int, steps: int, rounds: int) -> dict:
    args = _inputs(batch, features, state, steps)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(features, state).eval()
    runs = {
        "inference": lambda: torch.ops.lltm.sequence_inference(*args),
        "training": lambda: torch.ops.lltm.sequence_forward(*args),
        "nn.LSTM": lambda: lstm(args[0]),
    }
    medians: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for run in runs.values():
            run()
        for _ in range(rounds):
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(3):
                for name, run in runs.items():
                    start = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - start)
            for name, t in times.items():
                medians[name].append(statistics.median(t) * 1e3)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="*", default=SIZES, help="batch,features,state")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the measurements here")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, lltm {lltm.__version__}, {torch.get_num_threads()} threads, "
        f"float32, T = {args.steps}; peak MiB of one call, each in a process of its own"
    )
    print()
    print(
        "| batch, features, state | output MiB | lltm inference | lltm training forward "
        "| nn.LSTM inference | lltm step | nn.LSTM step "
        "| ms: lltm inference | lltm training forward | nn.LSTM | inference / training |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    records = []
    for text in args.sizes:
        batch, features, state = (int(v) for v in text.split(","))
        size = kinds.Size(batch, features, state, args.steps, "sum")
        peaks = {
            (impl, phase): memory.peak_bytes(impl, size, CPU, torch.float32, phase=phase)
            for impl in ("lltm-sequence", "lstm")
            for phase in memory.PHASES
        }
        before = _training_forward_peak(batch, features, state, args.steps)
        medians = _times(batch, features, state, args.steps, args.rounds)
        ratios = [a / b for a, b in zip(medians["inference"], medians["training"], strict=True)]
        mib = 2**20
        output = args.steps * batch * state * 4 / mib
        cells = [
            f"({batch}, {features}, {state})",
            f"{output:.1f}",
            f"{peaks['lltm-sequence', kinds.NO_GRAD] / mib:.1f}",
            f"{before / mib:.1f}",
            f"{peaks['lstm', kinds.NO_GRAD] / mib:.1f}",
            f"{peaks['lltm-sequence', 'step'] / mib:.1f}",
            f"{peaks['lstm', 'step'] / mib:.1f}",
            *(f"{statistics.median(medians[name]):.1f}" for name in medians),
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
        ]
        print("| " + " | ".join(cells) + " |", flush=True)
        records.append(
            {
                "size": [batch, features, state],
                "steps": args.steps,
                "peak_bytes": {f"{i} {p}": v for (i, p), v in peaks.items()},
                "peak_bytes_lltm_training_forward_no_grad": before,
                "forward_ms": medians,
            }
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"torch": torch.__version__, "results": records}, out, indent=2)


if __name__ == "__main__":
    main()
