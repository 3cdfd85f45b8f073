"""The deployment product: every way of exporting every form of model, on
every target, runs with eager's results. (What lltm refuses, a dynamic
length and an unbounded batch size lowered for ExecuTorch, and the order of
the lowering calls are test_executorch.py's.)

Shapes: static, a dynamic length, a dynamic batch size, both. Forms (one
program each, deploy_models.Zoo): the cell in a Python loop, one layer, two
layers, both directions, batch_first, unbatched, with and without an initial
state. Targets: ONNX in onnxruntime, ExecuTorch's portable kernels, ExecuTorch
with the XNNPACK partitioner. Each program runs at its export's size (new
values) and at other sizes its dynamic dimensions allow, the bounds included.
nn.LSTM's zoo is the control, run the same way where torch can export it.

The whole product takes minutes (each ExecuTorch lowering takes seconds): the
tests marked ``deploy_full`` run in ``nox -s deploy`` (the GitHub workflow);
the others, a representative part, in every run of the suite that has the
deploy dependency group.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from deploy_models import FORMS, flat, zoo, zoo_inputs, zoo_shapes
from torch.export import Dim

FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}

_WHY = (
    "{} is not installed: the deployment tests run in nox's tests session of torch 2.13.0, "
    "which executorch 1.5.1 is built for, and in nox -s deploy (pip install --group deploy)"
)

# Export at (steps, batch) = (3, 5), then run at these sizes. (Exported with
# two sequences, nn.LSTM's zoo once came out of torch.onnx.export with a fixed
# batch size.)
BATCH, STEPS = Dim("batch", min=1, max=6), Dim("steps", min=1, max=12)
SHAPES: dict[str, tuple[Dim | None, Dim | None, list[tuple[int, int]]]] = {
    "static": (None, None, [(3, 5)]),
    "length": (None, STEPS, [(3, 5), (1, 5), (12, 5), (8, 5)]),
    "batch": (BATCH, None, [(3, 5), (3, 1), (3, 6), (3, 2)]),
    "both": (BATCH, STEPS, [(3, 5), (1, 1), (12, 6), (7, 2), (2, 4)]),
}
TARGETS = ("onnx", "executorch", "xnnpack")
# In every run of the suite with the deploy group: every form on ONNX with a
# dynamic length and batch, two layers and the cell's loop lowered with a
# fixed length for XNNPACK (each ExecuTorch lowering takes seconds per layer,
# the XNNPACK partitioner's more). test_executorch.py lowers a dynamic
# length and batch for the portable kernels.
REPRESENTATIVE = {
    ("static", "xnnpack"): ("layers_batch_first", "cell_loop"),
    ("both", "onnx"): FORMS,
}

Runner = Callable[[tuple[torch.Tensor, ...]], list[torch.Tensor]]


def _onnx(model, inputs, shapes, path) -> Runner:
    pytest.importorskip("onnx", reason=_WHY.format("onnx"))
    pytest.importorskip("onnxscript", reason=_WHY.format("onnxscript"))
    ort = pytest.importorskip("onnxruntime", reason=_WHY.format("onnxruntime"))
    torch.onnx.export(model, inputs, path, dynamic_shapes=shapes)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options)
    names = [arg.name for arg in session.get_inputs()]

    def run(args):
        feed = {name: t.numpy() for name, t in zip(names, args, strict=True)}
        return [torch.from_numpy(out) for out in session.run(None, feed)]

    return run


def _executorch(model, inputs, shapes, path, xnnpack: bool) -> Runner:
    pytest.importorskip("executorch", reason=_WHY.format("executorch"))
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    partitioner = []
    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    program = torch.export.export(model, inputs, dynamic_shapes=shapes)
    path.write_bytes(
        to_edge_transform_and_lower(program, partitioner=partitioner).to_executorch().buffer
    )
    method = Runtime.get().load_program(str(path)).load_method("forward")
    return lambda args: list(method.execute(list(args)))


def deploy(model, inputs, shapes, target: str, directory) -> Runner:
    """``model`` exported for ``target`` from ``inputs`` with ``dynamic_shapes=shapes``."""
    if target == "onnx":
        return _onnx(model, inputs, shapes, directory / "model.onnx")
    return _executorch(model, inputs, shapes, directory / "model.pte", target == "xnnpack")


def _cases() -> list:
    """(shape, target, forms): the whole product, and the representative part."""
    cases = []
    for shape in SHAPES:
        for target in TARGETS:
            always = REPRESENTATIVE.get((shape, target)) == FORMS
            marks = () if always else pytest.mark.deploy_full
            cases.append(pytest.param(shape, target, FORMS, marks=marks, id=f"{shape}-{target}"))
    cases += [
        pytest.param(shape, target, forms, id=f"{shape}-{target}-{'-'.join(forms)}")
        for (shape, target), forms in REPRESENTATIVE.items()
        if forms != FORMS
    ]
    return cases


def _run_as_eager(run: Runner, model, sizes) -> None:
    with torch.no_grad():
        for size in sizes:
            inputs = zoo_inputs(*size, seed=1)  # new values at the export's size too
            outputs, expected = run(inputs), flat(model(*inputs))
            assert len(outputs) == len(expected)
            for number, (ours, theirs) in enumerate(zip(outputs, expected, strict=True)):
                assert ours.shape == theirs.shape, (size, number)
                torch.testing.assert_close(ours, theirs, **FLOAT32, msg=f"{size}, output {number}")


@pytest.mark.parametrize(("shape", "target", "forms"), _cases())
def test_every_form_runs_with_eagers_results(shape, target, forms, tmp_path):
    batch, steps, sizes = SHAPES[shape]
    # The cell stepped in a Python loop fixes the length: with a dynamic
    # length it is test_a_python_loop_fixes_the_length's.
    model = zoo("lltm", tuple(f for f in forms if steps is None or f != "cell_loop"))
    run = deploy(model, zoo_inputs(3, 5), zoo_shapes(batch, steps), target, tmp_path)
    _run_as_eager(run, model, sizes)


# The control: nn.LSTM's zoo, where torch can export it (a dynamic length it
# cannot: test_nn_lstm_fixes_the_length).
@pytest.mark.deploy_full
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", ["static", "batch"])
def test_nn_lstm_control(shape, target, tmp_path):
    batch, steps, sizes = SHAPES[shape]
    forms = FORMS
    if shape == "batch" and target != "onnx":  # test_nn_lstm_cell_loop_control
        forms = tuple(form for form in FORMS if form != "cell_loop")
    model = zoo("nn.LSTM", forms)
    run = deploy(model, zoo_inputs(3, 5), zoo_shapes(batch, steps), target, tmp_path)
    _run_as_eager(run, model, sizes)


@pytest.mark.deploy_full
@pytest.mark.parametrize("target", ["executorch", "xnnpack"])
def test_nn_lstm_cell_loop_control(target, tmp_path):
    # nn.LSTMCell stepped in a Python loop with a dynamic batch size: ExecuTorch
    # 1.5.1's program runs at the export's batch size only, and fails at any
    # other (lltm.LLTM's runs at every one: test_every_form_runs_...[batch-*]).
    model = zoo("nn.LSTM", ("cell_loop",))
    run = deploy(model, zoo_inputs(3, 5), zoo_shapes(BATCH, None), target, tmp_path)
    _run_as_eager(run, model, [(3, 5)])
    with pytest.raises(RuntimeError, match=r"method->execute\(\) failed"):
        run(zoo_inputs(3, 1))


def test_nn_lstm_fixes_the_length():
    # The control's limit: torch 2.13 lowers nn.LSTM by unrolling the steps it
    # traced, so a dynamic length is a constraint violation at export.
    with pytest.raises(Exception, match=r"(?s)steps.*specialized|Constraints violated"):
        torch.export.export(
            zoo("nn.LSTM", tuple(f for f in FORMS if f != "cell_loop")),
            zoo_inputs(5, 3),
            dynamic_shapes=zoo_shapes(None, STEPS),
        )


@pytest.mark.parametrize("kind", ["lltm", "nn.LSTM"])
def test_a_python_loop_fixes_the_length(kind):
    # A model that steps a cell in a Python loop fixes its length itself, for
    # lltm.LLTM as for nn.LSTMCell: torch.export says so at export.
    with pytest.raises(Exception, match=r"(?s)steps.*specialized|Constraints violated"):
        torch.export.export(
            zoo(kind, ("cell_loop",)), zoo_inputs(5, 3), dynamic_shapes=zoo_shapes(None, STEPS)
        )
