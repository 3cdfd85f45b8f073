"""``python -m lltm bench``: the tutorial's benchmark, lltm against the reference."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import torch
from torch.utils import benchmark

from . import reference
from .functional import lltm_cell


def _inputs(args: argparse.Namespace, device: torch.device) -> list[torch.Tensor]:
    dtype = torch.float64 if args.double else torch.float32
    b, f, s = args.batch_size, args.features, args.state_size
    make = lambda *shape: torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)  # noqa: E731
    return [make(b, f), make(3 * s, f + s), make(3 * s), make(b, s), make(b, s)]


def _time(fn: Callable[[], object], runs: int) -> benchmark.Measurement:
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=runs * 1e-4)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lltm bench", description=__doc__)
    parser.add_argument("-b", "--batch-size", type=int, default=16)
    parser.add_argument("-f", "--features", type=int, default=32)
    parser.add_argument("-s", "--state-size", type=int, default=128)
    parser.add_argument("-r", "--runs", type=int, default=1000)
    parser.add_argument("-c", "--cuda", action="store_true")
    parser.add_argument("-d", "--double", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if args.cuda else "cpu")
    inputs = _inputs(args, device)
    print(f"{'impl':<10} {'forward us':>12} {'backward us':>12}")
    for name, cell in (("reference", reference.lltm_cell), ("lltm", lltm_cell)):
        def forward(cell=cell):
            return cell(*inputs)

        new_h, new_cell = forward()
        loss = new_h.sum() + new_cell.sum()

        def backward(loss=loss):
            torch.autograd.grad(loss, inputs, retain_graph=True)

        fwd = _time(forward, args.runs).median * 1e6
        bwd = _time(backward, args.runs).median * 1e6
        print(f"{name:<10} {fwd:>12.1f} {bwd:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
