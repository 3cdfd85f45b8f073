"""Writes what examples/cpp's program runs, into DIR:

* ``model.pt2``: an AOTInductor package of a small model holding
  ``lltm.LLTMSequence`` (exported with a dynamic length and batch size);
* ``traced.pt``: the same model traced to TorchScript;
* ``eager.pt``: an input of another size and eager PyTorch's outputs for it.

    python examples/cpp/make_artifacts.py DIR
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch
from torch.export import Dim

import lltm


class Model(torch.nn.Module):
    """Two bidirectional lltm layers and a linear head on every step."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = lltm.LLTMSequence(4, 8, num_layers=2, bidirectional=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        output, (h_n, c_n) = self.rnn(x)
        return self.head(output), h_n, c_n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    out = parser.parse_args().dir
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Model().eval()
    example = (torch.randn(5, 3, 4),)  # (steps, batch, features)

    start = time.perf_counter()
    dims = {0: Dim("steps", min=1, max=1024), 1: Dim("batch", min=1, max=1024)}
    program = torch.export.export(model, example, dynamic_shapes=(dims,))
    torch._inductor.aoti_compile_and_package(program, package_path=str(out / "model.pt2"))
    print(f"model.pt2: AOTInductor package, {time.perf_counter() - start:.1f} s")

    with warnings.catch_warnings():
        # torch >= 2.13 deprecates TorchScript (tracing still works).
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(model, example)
    traced.save(str(out / "traced.pt"))
    print("traced.pt: TorchScript module")

    input = torch.randn(7, 2, 4)  # another length and batch size than the export's
    with torch.no_grad():
        output = list(model(input))
    torch.save({"input": input, "output": output}, out / "eager.pt")
    print("eager.pt: an input and eager PyTorch's outputs")


if __name__ == "__main__":
    main()
