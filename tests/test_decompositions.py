"""lltm's operators lowered to core ATen (the families' lowering.py, src/lltm/ops):
``ExportedProgram.run_decompositions()`` and every consumer that lowers with
torch.export's default table (the ONNX exporter, ExecuTorch) get plain core
ATen ops with eager's results, while the exported program itself,
torch.compile and AOTInductor keep the fused operators."""

from __future__ import annotations

import functools

import pytest
import torch
from deploy_models import CASES, Packed, flat, lltm_nodes, make
from torch.export import Dim

import lltm
from lltm.ops import decompositions
from lltm.ops.cell_ops import composite as cell_composite
from lltm.ops.sequence_ops import lowering as sequence_lowering

FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}
FORWARD_OPS = (
    torch.ops.lltm.forward.default,
    torch.ops.lltm.sequence_forward.default,
    torch.ops.lltm.sequence_inference.default,
)


def _dims() -> tuple[Dim, Dim]:
    return Dim("batch", min=1, max=64), Dim("steps", min=1, max=256)


@functools.cache
def _export(name: str, dynamic: bool, dtype: torch.dtype = torch.float32):
    """(model, exported program), for inputs of 5 steps of 3 sequences;
    shared by the tests (exporting is most of their time)."""
    model = make(name).to(dtype)
    case = CASES[name]
    shapes = case.dynamic_shapes(*_dims()) if dynamic else None
    return model, torch.export.export(model, case.inputs(5, 3, dtype), dynamic_shapes=shapes)


@functools.cache
def _lowered(name: str, dynamic: bool, dtype: torch.dtype = torch.float32):
    return _export(name, dynamic, dtype)[1].run_decompositions()


def _assert_core_aten(program: torch.export.ExportedProgram) -> None:
    """Every operator of every graph (scan bodies too) is a core ATen op;
    besides them only higher-order ops (scan) and Python's getitem and
    arithmetic on sizes."""
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function":
                continue
            target = node.target
            if isinstance(target, torch._ops.OpOverload):
                assert target.namespace == "aten" and torch.Tag.core in target.tags, target
            else:
                assert isinstance(target, torch._ops.HigherOrderOperator) or (
                    getattr(target, "__module__", None) in ("_operator", "operator")
                ), target


def _assert_outputs(ours, theirs, **tolerance) -> None:
    for a, b in zip(flat(ours), flat(theirs), strict=True):
        torch.testing.assert_close(a, b, **tolerance)


@pytest.fixture(autouse=True)
def _inference():
    # Lowered programs are for inference: with grad enabled, torch's scan
    # traces its backward on every eager call (seconds each).
    with torch.no_grad():
        yield


# --- The default program keeps the fused operators -------------------------------------


def test_default_program_keeps_the_fused_operators():
    # Exported under no_grad (_inference): the sequence's inference operator.
    _, program = _export("sequence_layers_bidirectional_state", True)
    assert lltm_nodes(program.graph_module).count("lltm.sequence_inference.default") == 4
    _, cell = _export("cell", False)
    assert lltm_nodes(cell.graph_module) == ["lltm.forward.default"]


def test_the_default_table_holds_the_forward_operators():
    table = torch.export.default_decompositions()
    for op in FORWARD_OPS:
        assert op in table
    # The backward operators only appear in joint graphs, which are not lowered.
    assert torch.ops.lltm.backward.default not in table


def test_torch_compile_calls_the_fused_operators():
    from torch._inductor.utils import run_and_get_code

    model = make("sequence_unbatched")
    inputs = CASES["sequence_unbatched"].inputs(5, 3)
    compiled = torch.compile(model, fullgraph=True)
    outputs, code = run_and_get_code(compiled, *inputs)
    _assert_outputs(outputs, model(*inputs), **FLOAT32)
    assert any("torch.ops.lltm.sequence_inference.default" in source for source in code)


# --- run_decompositions(): core ATen, eager's results ---------------------------------


# Each way into the operators once (batch_first and the functional forms
# differ from these only outside them; test_onnx.py exports every case).
LOWERED_CASES = [
    "cell",
    "cell_loop",
    "sequence_layers_bidirectional_state",
    "sequence_unbatched",
    "sequence_no_bias",
]


@pytest.mark.parametrize("name", LOWERED_CASES)
def test_lowered_program_is_core_aten_and_runs_every_size(name):
    model, _ = _export(name, True)
    lowered = _lowered(name, dynamic=True)
    assert lltm_nodes(lowered.graph_module) == []
    _assert_core_aten(lowered)
    # One lowered program, several sizes (one length for the cell alone, whose
    # export has no length, and for the loop, which unrolls it).
    sizes = [(5, 3), (5, 1), (5, 9)] if name.startswith("cell") else [(5, 3), (1, 2), (37, 5)]
    for steps, batch in sizes:
        inputs = CASES[name].inputs(steps, batch)
        _assert_outputs(lowered.module()(*inputs), model(*inputs), **FLOAT32)


@pytest.mark.parametrize("dynamic", ["none", "length", "batch", "both"])
def test_the_lowered_form_follows_the_shapes(dynamic):
    # A length fixed at export is unrolled, as torch lowers nn.LSTM; a dynamic
    # one is a scan over the steps, for any length, whose carried state has
    # the batch size's upper bound as its rows when the batch size is dynamic
    # too (ExecuTorch's loops cannot resize their state).
    name = "sequence_layers_bidirectional_state"
    model, case = make(name), CASES[name]
    batch, steps = Dim("batch", min=1, max=8), Dim("steps", min=1, max=16)
    shapes = {
        "none": None,
        "length": ({0: steps}, (None, None)),
        "batch": ({1: batch}, ({1: batch}, {1: batch})),
        "both": ({0: steps, 1: batch}, ({1: batch}, {1: batch})),
    }[dynamic]
    program = torch.export.export(model, case.inputs(5, 3), dynamic_shapes=shapes)
    lowered = program.run_decompositions()
    scans = [n for n in lowered.graph.nodes if n.target is torch.ops.higher_order.scan]
    assert len(scans) == (4 if dynamic in ("length", "both") else 0)
    for scan in scans:
        carried = scan.args[1]
        assert {c.meta["val"].shape[0] for c in carried} == {8 if dynamic == "both" else 3}
    _assert_core_aten(lowered)
    sizes = {
        "none": [(5, 3)],
        "length": [(5, 3), (1, 3), (16, 3)],
        "batch": [(5, 3), (5, 8)],
        "both": [(5, 3), (16, 8), (1, 1), (9, 2)],  # the bounds too
    }[dynamic]
    for size in sizes:
        inputs = case.inputs(*size)
        _assert_outputs(lowered.module()(*inputs), model(*inputs), **FLOAT32)


class _Operator(torch.nn.Module):
    """torch.ops.lltm.sequence_forward called directly, all five outputs, in
    both directions."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = lltm.LLTM(4, 6)

    def forward(self, x, h, c):
        w, b = self.cell.weights, self.cell.bias
        return [
            *torch.ops.lltm.sequence_forward(x, w, b, h, c, None, False),
            *torch.ops.lltm.sequence_forward(x, w, b, h, c, None, True),
        ]


def _operator_inputs(steps: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(steps)
    shapes = [(steps, 3, 4), (3, 6), (3, 6)]
    return tuple(torch.randn(*shape, generator=g).to(dtype) for shape in shapes)


TOLERANCES = {
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
    torch.float32: FLOAT32,
    torch.float16: {},  # assert_close's own for the type
    torch.bfloat16: {},
}


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed_length", "dynamic_length"])
@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
def test_lowered_operator_computes_what_the_kernel_computes(dtype, dynamic):
    # Every output in every type the kernels take, gates and cells (what
    # backward reads) too: products and pointwise math in float32 for 16-bit
    # types, pre-activations rounded once to the type, the state carried in
    # it and rounded at every step. The cells are that state: the last is c_n.
    torch.manual_seed(0)
    model = _Operator().to(dtype).eval()
    batch, steps = _dims()
    shapes = ({0: steps, 1: batch}, {0: batch}, {0: batch}) if dynamic else None
    program = torch.export.export(model, _operator_inputs(7, dtype), dynamic_shapes=shapes)
    lowered = program.run_decompositions()
    assert lltm_nodes(lowered.graph_module) == []
    # 200 steps in 16 bits: a running sum kept in float32 drifts from the
    # kernels' by whole units there.
    lengths = [7, 200 if dtype.itemsize == 2 else 33] if dynamic else [7]
    for length in lengths:
        inputs = _operator_inputs(length, dtype)
        outputs = lowered.module()(*inputs)
        assert all(t.dtype == dtype for t in outputs)
        _assert_outputs(outputs, model(*inputs), **TOLERANCES[dtype])
        for first, reverse in ((0, False), (5, True)):
            cells, c_n = outputs[first + 4], outputs[first + 2]
            last = cells[0] if reverse else cells[-1]
            if dtype.itemsize == 2 or not dynamic:
                assert torch.equal(last, c_n)  # the loop's own state
            else:  # rebuilt after the loop, the kernels' running sum
                torch.testing.assert_close(last, c_n, **TOLERANCES[dtype])


# --- Tables that say otherwise ---------------------------------------------------------


def test_a_table_without_lltm_keeps_the_fused_operators():
    model, program = _export("functional", True)
    table = torch.export.default_decompositions()
    for op in FORWARD_OPS:
        del table[op]
    kept = program.run_decompositions(table)
    assert sorted(lltm_nodes(kept.graph_module)) == [
        "lltm.forward.default",
        "lltm.sequence_inference.default",
    ]
    inputs = CASES["functional"].inputs(5, 3)
    _assert_outputs(kept.module()(*inputs), model(*inputs), **FLOAT32)
    assert lltm_nodes(program.run_decompositions({}).graph_module)  # nothing lowered


def test_a_table_entry_of_ones_own_is_applied():
    calls = []

    def cell(*args):
        calls.append(len(args))
        return cell_composite.forward(*args)

    model, program = _export("cell", False)
    lowered = program.run_decompositions({torch.ops.lltm.forward.default: cell})
    assert calls and lltm_nodes(lowered.graph_module) == []
    inputs = CASES["cell"].inputs(5, 3)
    _assert_outputs(lowered.module()(*inputs), model(*inputs), **FLOAT32)


def test_outside_a_lowering_the_table_entry_declines():
    # Inductor's table and fake tensors call the entry too; it leaves the
    # operator to them.
    table = torch.export.default_decompositions()
    args = CASES["cell"].inputs(1, 2)
    assert table[torch.ops.lltm.forward.default](*args) is NotImplemented
    assert decompositions._installed_entry(torch.ops.lltm.forward.default) is None


# --- What cannot be lowered ------------------------------------------------------------


def test_a_packed_sequence_cannot_be_exported_and_says_what_to_do():
    inputs = (torch.randn(5, 3, 4), torch.tensor([5, 3, 2]))
    with pytest.raises(
        ValueError, match=r"lltm: LLTMSequence cannot be exported .* PackedSequence"
    ):
        torch.export.export(Packed(), inputs)
    # Outside an export, packed sequences run as ever.
    Packed()(*inputs)


def test_a_packed_operator_call_cannot_be_lowered():
    data, sizes = torch.randn(6, 4), torch.tensor([3, 2, 1])
    weights, bias, h, c = torch.randn(18, 10), torch.randn(18), torch.randn(3, 6), torch.randn(3, 6)
    with pytest.raises(ValueError, match=r"lltm: a packed sequence .* cannot be lowered"):
        sequence_lowering.sequence_forward(data, weights, bias, h, c, sizes, False)
