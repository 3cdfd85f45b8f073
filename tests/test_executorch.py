"""ExecuTorch: however a program reaches ExecuTorch, ``to_edge_transform_and_lower``
or ``to_edge``, after ``run_decompositions()`` or not, its .pte gives eager's
results at every size the export allows, or lowering it raises lltm's
ValueError. tests/test_deployment.py runs every form of model on every target."""

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
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.runtime import Runtime

FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}


class _Model(torch.nn.Module):
    """A cell step, then a layer over a batch_first input from the state the
    cell left. (One direction: each loop costs ExecuTorch seconds to lower;
    tests/test_deployment.py lowers both directions.)"""

    def __init__(self) -> None:
        super().__init__()
        self.cell = lltm.LLTM(4, 6)
        self.rnn = Sequence(batch_first=True)

    def forward(self, x, h, c):
        h, c = self.cell(x[:, 0], (h, c))
        return (h, *self.rnn(x, (h.unsqueeze(0), c.unsqueeze(0))))


def _inputs(batch: int, steps: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(100 * steps + batch)
    return (
        torch.randn(batch, steps, 4, generator=g),
        torch.randn(batch, 6, generator=g),
        torch.randn(batch, 6, generator=g),
    )


def _model() -> _Model:
    torch.manual_seed(0)
    return _Model().eval()


def _shapes(batch: Dim) -> tuple:
    steps = Dim("steps", min=1, max=16)
    return ({0: batch, 1: steps}, {0: batch}, {0: batch})


# Each order a user may call them in.
ORDERS = {
    "to_edge_transform_and_lower": lambda p: to_edge_transform_and_lower(p),
    "to_edge": lambda p: to_edge(p),
    "run_decompositions-to_edge": lambda p: to_edge(p.run_decompositions()),
    "run_decompositions-to_edge_transform_and_lower": lambda p: to_edge_transform_and_lower(
        p.run_decompositions()
    ),
}


@pytest.mark.parametrize(
    "order",
    [
        pytest.param(
            order, marks=() if order == "run_decompositions-to_edge" else pytest.mark.deploy_full
        )
        for order in ORDERS
    ],
)
def test_a_dynamic_length_and_batch_run_whatever_the_order(order, tmp_path):
    # ExecuTorch's loops keep their state at the size planned for it: lowered,
    # the state has the batch size's upper bound as its rows, and each step
    # reads and writes the batch's. Every size within the bounds runs.
    model = _model()
    program = torch.export.export(
        model, _inputs(3, 5), dynamic_shapes=_shapes(Dim("batch", min=1, max=8))
    )
    path = tmp_path / "model.pte"
    path.write_bytes(ORDERS[order](program).to_executorch().buffer)
    method = Runtime.get().load_program(str(path)).load_method("forward")
    with torch.no_grad():
        for size in [(3, 5), (1, 1), (8, 16), (2, 9), (5, 2)]:
            inputs = _inputs(*size)
            for ours, theirs in zip(
                method.execute(list(inputs)), flat(model(*inputs)), strict=True
            ):
                assert ours.shape == theirs.shape, size
                torch.testing.assert_close(ours, theirs, **FLOAT32)


@pytest.mark.parametrize("order", ORDERS)
def test_a_dynamic_length_and_an_unbounded_batch_are_refused_whatever_the_order(order):
    # Without an upper bound, there is no size to keep the state at. (ExecuTorch
    # itself plans unbounded sizes at the example's.)
    program = torch.export.export(_model(), _inputs(3, 5), dynamic_shapes=_shapes(Dim("batch")))
    with pytest.raises(ValueError, match=r"lltm: lowering an LLTM sequence .* both dynamic"):
        ORDERS[order](program)
