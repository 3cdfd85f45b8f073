"""ExecuTorch: a model holding lltm lowers with ExecuTorch's own
``to_edge_transform_and_lower(torch.export.export(...)).to_executorch()``,
and ExecuTorch's runtime gives eager's results, with a dynamic length or a
dynamic batch size."""

from __future__ import annotations

import pytest
import torch
from deploy_models import Sequence, flat
from torch.export import Dim

import lltm

pytest.importorskip(
    "executorch",
    reason="executorch is not installed: the ExecuTorch tests run in nox's tests session of "
    "torch 2.13.0, which executorch 1.5.1 is built for (pip install --group deploy)",
)
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}


class _Model(torch.nn.Module):
    """A cell step, then a bidirectional layer over a batch_first input from
    the state the cell left."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = lltm.LLTM(4, 6)
        self.rnn = Sequence(batch_first=True, bidirectional=True)

    def forward(self, x, h, c):
        h, c = self.cell(x[:, 0], (h, c))
        state = (h.expand(2, -1, -1).contiguous(), c.expand(2, -1, -1).contiguous())
        return (h, *self.rnn(x, state))


def _inputs(batch: int, steps: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(100 * steps + batch)
    return (
        torch.randn(batch, steps, 4, generator=g),
        torch.randn(batch, 6, generator=g),
        torch.randn(batch, 6, generator=g),
    )


def _lower(model, shapes, tmp_path):
    program = torch.export.export(model, _inputs(3, 5), dynamic_shapes=shapes)
    path = tmp_path / "model.pte"
    path.write_bytes(to_edge_transform_and_lower(program).to_executorch().buffer)
    return Runtime.get().load_program(str(path)).load_method("forward")


def _model() -> _Model:
    torch.manual_seed(0)
    return _Model().eval()


# A fixed shape is one of the sizes each of these programs runs.
@pytest.mark.parametrize("dynamic", ["length", "batch"], ids=["dynamic_length", "dynamic_batch"])
def test_pte_runs_in_executorch_with_eagers_results(dynamic, tmp_path):
    model = _model()
    batch, steps = Dim("batch", min=1, max=16), Dim("steps", min=1, max=128)
    shapes, sizes = {
        "length": (({1: steps}, None, None), [(3, 5), (3, 1), (3, 2), (3, 33)]),
        "batch": (({0: batch}, {0: batch}, {0: batch}), [(3, 5), (1, 5), (9, 5)]),
    }[dynamic]
    method = _lower(model, shapes, tmp_path)
    with torch.no_grad():
        for size in sizes:
            inputs = _inputs(*size)
            outputs = method.execute(list(inputs))
            for ours, theirs in zip(outputs, flat(model(*inputs)), strict=True):
                torch.testing.assert_close(ours, theirs, **FLOAT32)


def test_a_dynamic_length_and_batch_together_are_refused(tmp_path):
    # ExecuTorch's loops carry their state at one size: a .pte would answer
    # other batch sizes with the largest one's shape. lltm says so instead.
    batch, steps = Dim("batch", min=1, max=16), Dim("steps", min=1, max=128)
    program = torch.export.export(
        _model(), _inputs(3, 5), dynamic_shapes=({0: batch, 1: steps}, {0: batch}, {0: batch})
    )
    with pytest.raises(ValueError, match=r"lltm: ExecuTorch cannot run .* both dynamic"):
        to_edge_transform_and_lower(program)
