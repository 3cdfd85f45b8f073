"""float32's matrix products follow torch's setting: the ``allow_tf32`` every sequence call passes.

lltm's sequence operators take ``allow_tf32`` (csrc/lltm_ops.cpp), and the
entry points pass torch's float32 matmul setting read at call time
(lltm/ops/precision.py). These tests record the operators' calls with a
TorchDispatchMode and read the flag each one received, through every entry
point, in each setting and dtype; check that the backward gets its forward's
value, that a compiled graph is traced again when the setting changes, and
that an exported or traced program keeps the value it was made under. The
CPU has no TF32: its results are the same bits in either setting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence
from torch.utils._python_dispatch import TorchDispatchMode

import lltm
from lltm.ops import precision

FEATURES, STATE = 3, 4
SEQUENCE_OPS = (
    "sequence_forward",
    "sequence_inference",
    "sequence_backward",
    "sequence_gate_grads",
)


def _set_precision(setting: str) -> None:
    """torch's float32 matmul precision, set with the legacy API ("highest", "high")."""
    torch.set_float32_matmul_precision(setting)


@pytest.fixture
def matmul_precision() -> Iterator[Callable[[str], None]]:
    """Sets torch's float32 matmul precision; puts "highest" or what it was back."""
    try:
        before = torch.get_float32_matmul_precision()
    except RuntimeError:  # a mix of the legacy and the new API: torch will not say
        before = "highest"
    try:
        yield _set_precision
    finally:
        # The legacy setter writes the new API's cuBLAS setting too.
        torch.set_float32_matmul_precision(before)


class SequenceCalls(TorchDispatchMode):
    """Records each sequence operator's call: (name, the allow_tf32 it received)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = sequence_op_name(func)
        if name is not None:
            self.calls.append((name, allow_tf32_of(func, args, kwargs)))
        return func(*args, **kwargs)


def sequence_op_name(op: Any) -> str | None:
    """ "sequence_forward" for ``torch.ops.lltm.sequence_forward.default``; None for other ops."""
    schema = getattr(op, "_schema", None)
    if schema is None or not schema.name.startswith("lltm::"):
        return None
    name: str = schema.name[len("lltm::") :]
    return name if name in SEQUENCE_OPS else None


def allow_tf32_of(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The ``allow_tf32`` a call of ``op`` with ``args``, ``kwargs`` passes (its default if none).

    torch leaves out trailing arguments equal to their defaults when it hands
    a call to a dispatch mode or records it in a graph.
    """
    for index, argument in enumerate(op._schema.arguments):
        if argument.name == "allow_tf32":
            if index < len(args):
                return bool(args[index])
            return bool(kwargs.get("allow_tf32", argument.default_value))
    raise AssertionError(f"{op} has no allow_tf32 argument")


def _inputs(
    dtype: torch.dtype, steps: int = 5, batch: int = 3, seed: int = 0
) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [
        (steps, batch, FEATURES),
        (3 * STATE, STATE + FEATURES),
        (3 * STATE,),
        (batch, STATE),
        (batch, STATE),
    ]
    return [
        (torch.randn(s, generator=generator, dtype=torch.float64) / 2).to(dtype) for s in shapes
    ]


def _module(dtype: torch.dtype, **kwargs: Any) -> lltm.LLTMSequence:
    torch.manual_seed(0)
    return lltm.LLTMSequence(FEATURES, STATE, **kwargs).to(dtype)


LENGTHS = torch.tensor([5, 2, 4])


def _functional(dtype):
    x, w, b, h, c = _inputs(dtype)
    return (w.requires_grad_(),), lambda: lltm.lltm_sequence(x, w, b, h, c)[0]


def _functional_lengths(dtype):
    x, w, b, h, c = _inputs(dtype)
    return (w.requires_grad_(),), lambda: lltm.lltm_sequence(x, w, b, h, c, lengths=LENGTHS)[0]


def _module_padded(dtype):
    m = _module(dtype, num_layers=2, bidirectional=True, batch_first=True)
    x = _inputs(dtype)[0].transpose(0, 1)
    return tuple(m.parameters()), lambda: m(x)[0]


def _module_packed(dtype):
    m = _module(dtype)
    x = _inputs(dtype)[0]
    packed = pack_sequence([x[:5, 0], x[:3, 1], x[:1, 2]])
    return tuple(m.parameters()), lambda: m(packed)[0].data


def _module_lengths(dtype):
    m = _module(dtype, bidirectional=True)
    x = _inputs(dtype)[0]
    return tuple(m.parameters()), lambda: m(x, lengths=LENGTHS)[0]


ENTRY_POINTS = {
    "lltm_sequence": _functional,
    "lltm_sequence_lengths": _functional_lengths,
    "LLTMSequence": _module_padded,
    "LLTMSequence_packed": _module_packed,
    "LLTMSequence_lengths": _module_lengths,
}


# --- What each entry point passes ----------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("setting", ["highest", "high", "medium"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_every_call_passes_torchs_setting(entry, setting, dtype, matmul_precision):
    matmul_precision(setting)
    parameters, run = ENTRY_POINTS[entry](dtype)
    expected = setting != "highest" and dtype == torch.float32
    with SequenceCalls() as training:
        output = run()
        torch.autograd.grad(output.sum(), parameters)
    with torch.no_grad(), SequenceCalls() as inference:
        run()
    names = {name for name, _ in training.calls}
    assert {"sequence_forward", "sequence_backward"} <= names, training.calls
    assert {name for name, _ in inference.calls} == {"sequence_inference"}
    assert [flag for _, flag in training.calls + inference.calls] == [expected] * len(
        training.calls + inference.calls
    ), training.calls + inference.calls


def test_the_new_api_is_followed(matmul_precision):
    # torch.backends.cuda.matmul.fp32_precision, which the legacy getter
    # does not follow: lltm reads what torch's cuBLAS reads.
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.fail(f"torch {torch.__version__} lacks torch.backends.cuda.matmul.fp32_precision")
    _parameters, run = _functional(torch.float32)
    for setting, expected in (("tf32", True), ("ieee", False)):
        torch.backends.cuda.matmul.fp32_precision = setting
        assert precision.torch_allows_tf32() is expected
        with torch.no_grad(), SequenceCalls() as calls:
            run()
        assert calls.calls == [("sequence_inference", expected)]


def test_the_backward_computes_in_its_forwards_precision(matmul_precision):
    x, w, b, h, c = _inputs(torch.float32)
    w.requires_grad_()
    for forward_setting, backward_setting in (("high", "highest"), ("highest", "high")):
        matmul_precision(forward_setting)
        with SequenceCalls() as calls:
            output = lltm.lltm_sequence(x, w, b, h, c)[0]
            matmul_precision(backward_setting)
            torch.autograd.grad(output.sum(), w)
        expected = forward_setting == "high"
        assert calls.calls == [("sequence_forward", expected), ("sequence_backward", expected)]


@pytest.mark.parametrize("transform", ["vmap", "jvp", "per_sample_grad"])
def test_torch_func_transforms_pass_it(transform, matmul_precision):
    matmul_precision("high")
    x, w, b, h, c = _inputs(torch.float32)
    samples = torch.stack([x, x.flip(0)])

    def run(x, w):
        return lltm.lltm_sequence(x, w, b, h, c)[0]

    with SequenceCalls() as calls:
        if transform == "vmap":
            torch.func.vmap(run, in_dims=(0, None))(samples, w)
        elif transform == "jvp":
            torch.func.jvp(run, (x, w), (torch.ones_like(x), torch.ones_like(w)))
        else:
            grad = torch.func.grad(lambda x, w: run(x, w).sum(), argnums=1)
            torch.func.vmap(grad, in_dims=(0, None))(samples, w)
    assert calls.calls, "no sequence operator ran"
    assert all(flag for _, flag in calls.calls), calls.calls


# --- What the CPU computes -----------------------------------------------------------------


@pytest.mark.parametrize("entry", ["lltm_sequence", "LLTMSequence", "LLTMSequence_lengths"])
def test_the_cpu_computes_exact_float32_in_either_setting(entry, matmul_precision):
    results = []
    for setting in ("highest", "high"):
        matmul_precision(setting)
        parameters, run = ENTRY_POINTS[entry](torch.float32)
        output = run()
        results.append([output, *torch.autograd.grad(output.pow(2).sum(), parameters)])
    for exact, allowed in zip(*results, strict=True):
        assert torch.equal(exact, allowed)


def test_gradcheck_under_high_in_float64(matmul_precision):
    matmul_precision("high")
    m = _module(torch.float64, bidirectional=True)
    x = _inputs(torch.float64, steps=3, batch=2)[0].requires_grad_()
    params = dict(m.named_parameters())

    def run(x, *values):
        out = torch.func.functional_call(m, dict(zip(params, values, strict=True)), (x,))
        return out[0]

    assert torch.autograd.gradcheck(run, (x, *params.values()))


@pytest.mark.parametrize("op", SEQUENCE_OPS)
def test_opcheck_with_allow_tf32(op):
    x, w, b, h, c = _inputs(torch.float32)
    forward = [x, w, b, h, c, None, False, True]
    if op in ("sequence_forward", "sequence_inference"):
        for t in forward[:5]:
            t.requires_grad_()
        torch.library.opcheck(getattr(torch.ops.lltm, op).default, tuple(forward))
        return
    output, h_n, c_n, gates, cells = torch.ops.lltm.sequence_forward(*forward)
    grads = [torch.randn_like(t) for t in (output, h_n, c_n)]
    args = [*grads, output, gates, cells, x, w, h, None, False]
    if op == "sequence_backward":
        args.append([True] * 5)
    torch.library.opcheck(getattr(torch.ops.lltm, op).default, (*args, True))


# --- Compiled, exported and traced programs --------------------------------------------------


class GraphRecorder:
    """A torch.compile backend that keeps each graph it is given, and runs it as it is."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.ran: list[int] = []  # the index of the graph each call ran

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        index = len(self.graphs)
        self.graphs.append(gm)

        def run(*args: Any) -> Any:
            self.ran.append(index)
            return gm.forward(*args)

        return run

    def flags(self, graph: torch.fx.GraphModule) -> list[bool]:
        return _flags_in(graph.graph)


def _flags_in(graph: torch.fx.Graph) -> list[bool]:
    """The allow_tf32 of each sequence operator's call in ``graph``."""
    flags = []
    for node in graph.nodes:
        if node.op == "call_function" and sequence_op_name(node.target) is not None:
            flags.append(allow_tf32_of(node.target, node.args, node.kwargs))
    return flags


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_a_compiled_graph_is_traced_again_when_the_setting_changes(
    grad, matmul_precision, fresh_dynamo
):
    m = _module(torch.float32, bidirectional=True).requires_grad_(grad)
    x = _inputs(torch.float32)[0]
    recorder = GraphRecorder()
    compiled = torch.compile(m, backend=recorder, fullgraph=True)
    for setting in ("highest", "high", "highest", "high"):
        matmul_precision(setting)
        compiled(x)
    # One graph per setting, each holding its own value; a later call under
    # a setting runs that setting's graph again.
    assert len(recorder.graphs) == 2
    assert recorder.flags(recorder.graphs[0]) == [False, False]
    assert recorder.flags(recorder.graphs[1]) == [True, True]
    assert recorder.ran == [0, 1, 0, 1]


@pytest.mark.parametrize("setting", ["highest", "high"])
@pytest.mark.parametrize("lengths", [False, True], ids=["padded", "lengths"])
def test_export_keeps_the_setting_it_was_made_under(setting, lengths, matmul_precision):
    matmul_precision(setting)
    m = _module(torch.float32, bidirectional=True).eval()
    x = _inputs(torch.float32)[0]
    inputs = (x,) if not lengths else (x, None, LENGTHS)
    exported = torch.export.export(m, inputs)
    assert _flags_in(exported.graph) == [setting == "high"] * 2
    # Run under the other setting, the program computes in its own.
    matmul_precision("high" if setting == "highest" else "highest")
    with SequenceCalls() as calls:
        exported.module()(*inputs)
    assert [flag for _, flag in calls.calls] == [setting == "high"] * 2


def test_jit_trace_keeps_the_setting_it_was_made_under(matmul_precision):
    matmul_precision("high")
    m = _module(torch.float32).eval()
    x = _inputs(torch.float32)[0]
    with torch.no_grad():
        traced = torch.jit.trace(m, (x,), check_trace=False)
    matmul_precision("highest")
    with torch.no_grad(), SequenceCalls() as calls:
        traced(x)
    assert calls.calls and all(flag for _, flag in calls.calls), calls.calls
