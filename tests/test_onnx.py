"""ONNX: ``torch.onnx.export`` of a model holding lltm, with nothing else to
pass or register, runs in onnxruntime with eager's results; with a dynamic
length one file serves every length. tests/test_deployment.py exports every
form of LLTMSequence and the cell in a loop with every kind of shape."""

from __future__ import annotations

import copy

import pytest
import torch
from deploy_models import CASES, Packed, flat, make
from torch.export import Dim

_WHY = (
    "onnx, onnxscript and onnxruntime are not installed: the ONNX tests run in nox's tests "
    "session of torch 2.13.0 (elsewhere: pip install --group deploy)"
)
onnx = pytest.importorskip("onnx", reason=_WHY)
pytest.importorskip("onnxscript", reason=_WHY)
ort = pytest.importorskip("onnxruntime", reason=_WHY)

FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # errors only: not its notes on unused initializers
    return ort.InferenceSession(str(path), options)


def _run(session: ort.InferenceSession, inputs) -> list[torch.Tensor]:
    feed = {arg.name: t.numpy() for arg, t in zip(session.get_inputs(), flat(inputs), strict=True)}
    return [torch.from_numpy(out) for out in session.run(None, feed)]


def _assert_outputs(ours, theirs) -> None:
    for a, b in zip(flat(ours), flat(theirs), strict=True):
        torch.testing.assert_close(a, b, **FLOAT32)


def _dims() -> tuple[Dim, Dim]:
    return Dim("batch", min=1, max=64), Dim("steps", min=1, max=256)


# The forms test_deployment.py's zoo does not hold: the cell alone between
# plain layers, the functional forms, no bias.
@pytest.mark.parametrize("name", ["cell", "functional", "sequence_no_bias"])
def test_plain_export_runs_in_onnxruntime(name, tmp_path):
    model, inputs = make(name), CASES[name].inputs(5, 3)
    torch.onnx.export(model, inputs, tmp_path / "model.onnx")  # nothing else
    with torch.no_grad():
        _assert_outputs(_run(_session(tmp_path / "model.onnx"), inputs), model(*inputs))


def test_one_file_runs_every_length_and_batch(tmp_path):
    # No bound needed on either size: onnxruntime's Scan carries a state of
    # any batch size.
    model, case = make("functional"), CASES["functional"]
    shapes = case.dynamic_shapes(Dim("batch"), Dim("steps"))
    torch.onnx.export(model, case.inputs(5, 3), tmp_path / "model.onnx", dynamic_shapes=shapes)
    session = _session(tmp_path / "model.onnx")
    with torch.no_grad():
        for steps, batch in [(5, 3), (1, 1), (2, 8), (7, 3), (33, 70)]:
            inputs = case.inputs(steps, batch)
            _assert_outputs(_run(session, inputs), model(*inputs))
        # Longer: float32 rounding, the kernels' and onnxruntime's alike, grows
        # with the steps (the LLTM's cell only accumulates); onnxruntime stays
        # as close to the float64 result as eager float32 is.
        inputs = case.inputs(100, 4)
        exact = flat(copy.deepcopy(model).double()(*[_double(t) for t in inputs]))
        eager_error = _max_error(flat(model(*inputs)), exact)
        assert _max_error(_run(session, inputs), exact) <= 2 * eager_error + 1e-6


def _double(value):
    return torch.utils._pytree.tree_map(lambda t: t.double(), value)


def _max_error(outputs, exact) -> float:
    return max((a.double() - b).abs().max().item() for a, b in zip(outputs, exact, strict=True))


def _nodes(graph):
    return [node.op_type for node in graph.node]


def test_the_graph_projects_every_step_ahead_of_the_recurrence(tmp_path):
    # As the fused operator works: the input projection of all steps ahead of
    # the loop (a product per gate), and in the loop a product per gate and
    # the pointwise math, few operators (onnxruntime fuses each product with
    # its sigmoid): no split or slices, no Elu (slow in onnxruntime), the
    # state carried and only the outputs stacked.
    model, case = make("sequence"), CASES["sequence"]
    torch.onnx.export(
        model,
        case.inputs(5, 3),
        tmp_path / "model.onnx",
        dynamic_shapes=case.dynamic_shapes(*_dims()),
    )
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    products = {"MatMul", "Gemm"}
    assert _nodes(graph).count("Scan") == 1
    assert len([op for op in _nodes(graph) if op in products]) == 3
    (scan,) = [node for node in graph.node if node.op_type == "Scan"]
    (body,) = [attribute.g for attribute in scan.attribute if attribute.name == "body"]
    body_nodes = _nodes(body) + [
        op
        for function in onnx.load(str(tmp_path / "model.onnx")).functions
        for op in _nodes(function)
    ]
    assert len([op for op in body_nodes if op in products]) == 3
    assert not {"Split", "Slice", "Elu", "Concat"} & set(body_nodes), body_nodes
    # 17 as torch 2.13 exports them: three MatMul and Add pairs, which
    # onnxruntime turns into a Gemm each, two of them with their Sigmoid.
    assert len(body_nodes) <= 17, body_nodes
    assert (len(scan.input), len(scan.output)) == (2 + 3, 2 + 1)


def test_a_packed_sequence_is_refused_with_what_to_do_instead(tmp_path):
    inputs = (torch.randn(5, 3, 4), torch.tensor([5, 3, 2]))
    with pytest.raises(Exception, match=r"lltm: LLTMSequence cannot be exported .*pad_packed"):
        torch.onnx.export(Packed(), inputs, tmp_path / "packed.onnx")
    assert not (tmp_path / "packed.onnx").exists()
