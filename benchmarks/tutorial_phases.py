"""Where a step of the tutorial's benchmark goes: lltm against the tutorial's module.

The tutorial's loop, ``new_h, new_C = rnn(X, (h, C))`` then
``(new_h.sum() + new_C.sum()).backward()``, timed in three phases (forward,
loss, backward) inside the loop, so that each phase sees the caches the
others leave; the two modules alternate in rounds on the same inputs. Then,
each in a loop of its own: lltm's module call, its autograd Function, its
forward and backward kernels and the two matrix products the kernels (and
the reference) compute, so that what lltm's Python layer and its kernels cost
can be read off. One thread; medians, microseconds.

    python benchmarks/tutorial_phases.py                    # (16, 32, 128), the tutorial's size
    python benchmarks/tutorial_phases.py --size 64,256,512 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import lltm
from lltm.ops.cell_ops.autograd import CellFunction
from lltm.reference import LLTM as Reference

PHASES = ("forward", "loss", "backward", "step")


def median_us(call: Callable[[], object], count: int) -> float:
    """The median time of ``call`` in microseconds, after a warm-up."""
    for _ in range(count // 10 + 1):
        call()
    times = []
    for _ in range(count):
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def phases(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], steps: int) -> list[float]:
    """Medians of the tutorial loop's phases and of the whole step, microseconds."""
    x, h, c = inputs
    clock = time.perf_counter_ns
    samples: list[list[int]] = [[] for _ in PHASES]
    for step in range(steps + steps // 5):
        start = clock()
        new_h, new_c = module(x, (h, c))
        forwarded = clock()
        loss = new_h.sum() + new_c.sum()
        summed = clock()
        loss.backward()
        done = clock()
        if step >= steps // 5:  # the first fifth warms up
            for sample, value in zip(
                samples,
                (forwarded - start, summed - forwarded, done - summed, done - start),
                strict=True,
            ):
                sample.append(value)
    return [statistics.median(sample) / 1e3 for sample in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size", default="16,32,128", help="batch,features,state (default: %(default)s)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds (default: %(default)s)"
    )
    parser.add_argument(
        "--steps", type=int, default=500, help="steps a round (default: %(default)s)"
    )
    args = parser.parse_args()
    batch, features, state = (int(v) for v in args.size.split(","))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    inputs = (torch.randn(batch, features), torch.randn(batch, state), torch.randn(batch, state))
    modules = {"reference": Reference(features, state), "lltm": lltm.LLTM(features, state)}
    rounds: dict[str, list[list[float]]] = {name: [] for name in modules}
    for _ in range(args.rounds):
        for name, module in modules.items():
            rounds[name].append(phases(module, inputs, args.steps))
    print(f"(B, F, S) = ({batch}, {features}, {state}), 1 thread, torch {torch.__version__}")
    print("tutorial loop, in place:  " + "".join(f"{p:>10}" for p in PHASES))
    for name, values in rounds.items():
        medians = [statistics.median(r[i] for r in values) for i in range(len(PHASES))]
        print(f"  {name:<23}" + "".join(f"{m:>10.1f}" for m in medians))
    steps = [statistics.median(r[-1] for r in rounds[name]) for name in modules]
    print(f"  lltm's speed-up: {steps[0] / steps[1]:.2f}x")

    x, h, c = inputs
    module = modules["lltm"]
    weights, bias = module.weights, module.bias
    plain_w, plain_b = weights.detach(), bias.detach()
    _new_h, new_c, gates = torch.ops.lltm.forward(x, plain_w, plain_b, h, c)
    ones = torch.ones(()).expand(batch, state)  # what .sum()'s backward hands on
    mask = [False, True, True, False, False]  # the tutorial's: the parameters' gradients
    stacked = torch.cat([h, x], 1)
    count = args.steps * 2
    parts = {
        "module call (forward, with grad)": lambda: module(x, (h, c)),
        "CellFunction.apply": lambda: CellFunction.apply(x, weights, bias, h, c),
        "lltm::forward kernel": lambda: torch.ops.lltm.forward(x, plain_w, plain_b, h, c),
        "lltm::backward kernel": lambda: torch.ops.lltm.backward(
            ones, ones, new_c, gates, x, h, plain_w, mask
        ),
        "gates product (addmm)": lambda: torch.addmm(plain_b, stacked, plain_w.t()),
        "weights' gradient product (mm)": lambda: gates.t().mm(stacked),
    }
    print("each alone, in a loop of its own:")
    for name, call in parts.items():
        print(f"  {name:<33}{median_us(call, count):>8.1f}")


if __name__ == "__main__":
    main()
