"""lltm's entry points compute exactly what its operators compute, in every mode a user can be in.

``lltm.lltm_cell``, ``lltm.lltm_sequence`` and the modules skip the
dispatcher's trip to the operators' Autograd kernels in plain eager mode
(lltm/ops/dispatch.py). Each test here runs one mode twice, once through an
entry point and once through the operator (``torch.ops.lltm.*``), on fresh
copies of the same inputs, and asks for the same outputs, the same
gradients (bit for bit, None where None), the same error type and message,
and, where a mode watches, the same operators seen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from conftest import make_inputs
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import lltm
from lltm.ops.dispatch import plain_eager

pytestmark = pytest.mark.usefixtures("kernels")

B, F, S, T = 3, 4, 5, 4


def _cell_entry(*args):
    return lltm.lltm_cell(*args)


def _cell_operator(*args):
    return torch.ops.lltm.forward.default(*args)[:2]


def _sequence_entry(input, weights, bias, old_h, old_cell):
    output, (h_n, c_n) = lltm.lltm_sequence(input, weights, bias, old_h, old_cell)
    return output, h_n, c_n


def _sequence_operator(*args):
    return torch.ops.lltm.sequence_forward.default(*args, None, False)[:3]


PAIRS = {
    "cell": (_cell_entry, _cell_operator),
    "sequence": (_sequence_entry, _sequence_operator),
}


def _inputs(kind: str, dtype=torch.float64, device="cpu") -> list[torch.Tensor]:
    input, weights, bias, old_h, old_cell = make_inputs(B, F, S, dtype=dtype, device=device)
    if kind == "sequence":
        generator = torch.Generator().manual_seed(3)
        input = torch.randn(T, B, F, generator=generator, dtype=torch.float64).to(device, dtype)
    return [input, weights, bias, old_h, old_cell]


def _leaves(inputs, requires_grad=True):
    return [t.detach().clone().requires_grad_(requires_grad) for t in inputs]


def _run(fn, inputs, *, backward=True, requires_grad=True):
    """Outputs of fn on fresh leaves, and the leaves' gradients of a dense and a .sum() loss."""
    leaves = _leaves(inputs, requires_grad)
    outputs = fn(*leaves)
    grads = None
    if backward and any(o.requires_grad for o in outputs):
        generator = torch.Generator().manual_seed(1)
        cotangents = [torch.randn(o.shape, generator=generator, dtype=o.dtype) for o in outputs]
        dense = torch.autograd.grad(outputs, leaves, cotangents, retain_graph=True)
        summed = torch.autograd.grad(sum(o.sum() for o in outputs), leaves)
        grads = (dense, summed)
    return outputs, grads


def _assert_identical(a, b, what=""):
    if a is None or b is None:
        assert a is None and b is None, what
        return
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b), what
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_identical(x, y, f"{what}[{k}]")
        return
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, what
    assert a.requires_grad == b.requires_grad, what
    if a.device.type != "meta":
        assert torch.equal(a, b), what


def _assert_same(kind, mode, inputs=None, **run):
    entry, operator = PAIRS[kind]
    inputs = inputs if inputs is not None else _inputs(kind)
    with mode():
        ours = _run(entry, inputs, **run)
    with mode():
        theirs = _run(operator, inputs, **run)
    _assert_identical(ours[0], theirs[0], "outputs")
    _assert_identical(ours[1], theirs[1], "gradients")
    return ours


@contextlib.contextmanager
def _inference_then_grad() -> Iterator[None]:
    with torch.inference_mode(), torch.enable_grad():
        yield


@contextlib.contextmanager
def _nested_grad_modes() -> Iterator[None]:
    with (
        torch.no_grad(),
        torch.enable_grad(),
        torch.inference_mode(False),
        torch.no_grad(),
        torch.enable_grad(),
    ):
        yield


def _pack(t):
    return t * 2, t.dtype


def _unpack(packed):
    t, _ = packed
    return t / 2  # exact: a power of two


MODES: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "plain": contextlib.nullcontext,
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "enable_grad inside inference_mode": _inference_then_grad,
    "nested no_grad/enable_grad/inference_mode": _nested_grad_modes,
    "anomaly mode": lambda: torch.autograd.detect_anomaly(check_nan=True),
    "saved-tensor hooks": lambda: torch.autograd.graph.saved_tensors_hooks(_pack, _unpack),
    "forward-mode AD level": fwAD.dual_level,
    "deterministic algorithms": lambda: _deterministic(),
}


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", PAIRS)
def test_same_outputs_and_gradients(kind, mode):
    _assert_same(kind, MODES[mode])


@pytest.mark.parametrize("kind", PAIRS)
def test_inputs_that_need_no_grad(kind):
    # The tutorial's configuration: only the parameters need gradients.
    inputs = _inputs(kind)
    entry, operator = PAIRS[kind]
    results = []
    for fn in (entry, operator):
        leaves = _leaves(inputs, requires_grad=False)
        leaves[1].requires_grad_()
        leaves[2].requires_grad_()
        outputs = fn(*leaves)
        sum(o.sum() for o in outputs).backward()
        results.append((outputs, [leaves[1].grad, leaves[2].grad]))
    _assert_identical(results[0], results[1])


@pytest.mark.parametrize("kind", PAIRS)
def test_autocast(kind):
    # Autocast casts to bfloat16: the kernels then compute in bfloat16.
    inputs = _inputs(kind, dtype=torch.float32)
    _assert_same(kind, lambda: torch.autocast("cpu", dtype=torch.bfloat16), inputs)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("kind", PAIRS)
def test_activation_checkpointing(kind, reentrant):
    inputs = _inputs(kind)
    results = []
    for fn in PAIRS[kind]:
        leaves = _leaves(inputs)
        outputs = checkpoint(fn, *leaves, use_reentrant=reentrant)
        sum(o.sum() for o in outputs).backward()  # the reentrant kind takes no .grad()
        results.append((outputs, [t.grad for t in leaves]))
    _assert_identical(results[0], results[1])


def test_functional_call():
    module = lltm.LLTM(F, S).double()
    x, _, _, h, c = _inputs("cell")
    params = {name: p.detach().clone().requires_grad_() for name, p in module.named_parameters()}
    new_h, new_cell = torch.func.functional_call(module, params, (x, (h, c)))
    ours = torch.autograd.grad(new_h.sum() + new_cell.sum(), list(params.values()))
    weights, bias = (p.detach().clone().requires_grad_() for p in params.values())
    op_h, op_cell, _ = torch.ops.lltm.forward(x, weights, bias, h, c)
    theirs = torch.autograd.grad(op_h.sum() + op_cell.sum(), [weights, bias])
    _assert_identical(
        (new_h.detach(), new_cell.detach(), ours), (op_h.detach(), op_cell.detach(), theirs)
    )


# --- Modes that watch the operators ---------------------------------------------------


class _SeeingFunctions(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if "lltm" in str(func):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class _SeeingOperators(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "lltm":
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("watcher", [_SeeingFunctions, _SeeingOperators])
@pytest.mark.parametrize("kind", PAIRS)
def test_modes_see_the_same_operators(kind, watcher):
    seen = []
    for fn in PAIRS[kind]:
        mode = watcher()
        with mode:
            _run(fn, _inputs(kind))
        seen.append(mode.seen)
    assert seen[0] == seen[1] and seen[0], seen


class _Scaled(torch.Tensor):
    """A subclass that sees lltm's operators and doubles the forward's input on the way."""

    seen: ClassVar[list[str]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "lltm" in str(func):
            cls.seen.append(str(func))
            if "lltm.forward" in str(func) or "lltm.sequence_forward" in str(func):
                args = (args[0] * 2, *args[1:])
        return super().__torch_function__(func, types, args, kwargs)


@pytest.mark.parametrize("kind", PAIRS)
def test_a_tensor_subclass_sees_the_same_operators_and_gets_the_same_gradients(kind):
    results, seen = [], []
    for fn in PAIRS[kind]:
        _Scaled.seen = []
        leaves = _leaves(_inputs(kind))
        outputs = fn(leaves[0].as_subclass(_Scaled), *leaves[1:])
        grads = torch.autograd.grad(sum(o.sum() for o in outputs), leaves)
        results.append(([o.as_subclass(torch.Tensor) for o in outputs], grads))
        seen.append(list(_Scaled.seen))
    _assert_identical(results[0], results[1])
    assert seen[0] == seen[1] and seen[0], seen


def test_flop_counter_counts_the_entry_points():
    from torch.utils.flop_counter import FlopCounterMode

    counts = []
    for fn in PAIRS["cell"]:
        with FlopCounterMode(display=False) as counter:
            _run(fn, _inputs("cell"))
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] > 0


@pytest.mark.parametrize("kind", PAIRS)
def test_fake_tensors_and_meta(kind):
    from torch._subclasses.fake_tensor import FakeTensorMode

    entry, operator = PAIRS[kind]
    with FakeTensorMode() as fake:
        inputs = [fake.from_tensor(t) for t in _inputs(kind)]
        ours, theirs = entry(*inputs), operator(*inputs)
        assert [o.shape for o in ours] == [o.shape for o in theirs]
    meta = [t.to("meta") for t in _inputs(kind)]
    _assert_identical(_run(entry, meta, backward=False), _run(operator, meta, backward=False))


# --- torch.func and forward-mode AD -------------------------------------------------------


@pytest.mark.parametrize("kind", PAIRS)
def test_torch_func_transforms(kind):
    entry, operator = PAIRS[kind]
    inputs = _inputs(kind)

    def loss(fn):
        return lambda *a: sum(o.sum() for o in fn(*a))

    for transform in (
        lambda fn: torch.func.grad(loss(fn), argnums=(0, 1, 2, 3, 4))(*inputs),
        lambda fn: torch.func.jvp(fn, tuple(inputs), tuple(torch.ones_like(t) for t in inputs)),
        lambda fn: torch.func.vmap(fn, in_dims=(0, None, None, 0, 0))(
            *(
                t.unsqueeze(0).expand(2, *t.shape) if k in (0, 3, 4) else t
                for k, t in enumerate(inputs)
            )
        ),
    ):
        _assert_identical(transform(entry), transform(operator))


@pytest.mark.parametrize("kind", PAIRS)
def test_dual_tensors(kind):
    entry, operator = PAIRS[kind]
    inputs = _inputs(kind)
    tangents = [torch.ones_like(t) for t in inputs]
    results = []
    for fn in (entry, operator):
        with fwAD.dual_level():
            duals = [fwAD.make_dual(t, d) for t, d in zip(inputs, tangents, strict=True)]
            results.append([tuple(fwAD.unpack_dual(o)) for o in fn(*duals)])
    _assert_identical(results[0], results[1])


# --- Errors -----------------------------------------------------------------------------------


def _bad(kind):
    inputs = _inputs(kind)
    inputs[1] = inputs[1][:, :-1]  # weights one column short
    return inputs


@pytest.mark.parametrize(
    "mode", ["plain", "no_grad", "inference_mode", "enable_grad inside inference_mode"]
)
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("kind", PAIRS)
def test_same_error(kind, mode, autocast):
    region = (
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        if autocast
        else contextlib.nullcontext
    )
    errors = []
    for fn in PAIRS[kind]:
        with MODES[mode](), region(), pytest.raises(Exception) as info:
            fn(*_leaves(_bad(kind)))
        errors.append((type(info.value), str(info.value)))
    entry, operator = errors
    assert entry[0] is ValueError and entry[1].startswith("lltm: input has input_features"), entry
    if "inference" in mode and not autocast:
        # The operator called directly in inference mode reaches the kernel
        # with no Python in between: torch's type, the kernel's own text
        # (test_errors.py). lltm's entry points raise the documented type.
        assert operator[1] == "lltm: [ValueError] " + entry[1].removeprefix("lltm: ")
    else:
        assert operator == entry


class _HookError(RuntimeError):
    pass


@pytest.mark.parametrize("kind", PAIRS)
def test_a_foreign_error_passes_through_untouched(kind):
    # A saved-tensor hook's error, raised while lltm saves its activations:
    # the same object, with its type, message and cause.
    cause = KeyError("the storage the hook wanted")
    raised = []

    def pack(t):
        error = _HookError("the hook's own message")
        error.__cause__ = cause
        raised.append(error)
        raise error

    for fn in PAIRS[kind]:
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda p: p),
            pytest.raises(_HookError) as info,
        ):
            fn(*_leaves(_inputs(kind)))
        assert info.value is raised[-1] and info.value.__cause__ is cause


# --- The decision itself -------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_the_fast_path_only_in_plain_eager_mode():
    args = tuple(_inputs("cell"))
    assert plain_eager(args)
    for mode in ("no_grad", "saved-tensor hooks", "deterministic algorithms"):
        with MODES[mode]():
            assert plain_eager(args), mode
    for mode in ("inference_mode", "enable_grad inside inference_mode", "anomaly mode",
                 "forward-mode AD level"):  # fmt: skip
        with MODES[mode]():
            assert not plain_eager(args), mode
    with torch.autocast("cpu"):
        assert not plain_eager(args)
    for watcher in (_SeeingFunctions, _SeeingOperators):
        with watcher():
            assert not plain_eager(args)
    assert not plain_eager((args[0].as_subclass(_Scaled), *args[1:]))
    seen = []

    def record(x):
        seen.append(plain_eager(args))
        return x * 2

    torch.func.grad(lambda x: record(x).sum())(torch.ones(2))
    torch.func.vmap(record)(torch.ones(2))
    torch.jit.trace(record, torch.ones(2), check_trace=False)
    torch.compile(record, backend="eager", fullgraph=True)(torch.ones(2))
    assert seen == [False] * 4


def test_the_fast_path_applies_the_operators_function():
    # Same Function, same node: anything that inspects the graph sees the same.
    inputs = _leaves(_inputs("cell"))
    new_h, _ = lltm.lltm_cell(*inputs)
    op_h, _, _ = torch.ops.lltm.forward(*inputs)
    assert type(new_h.grad_fn) is type(op_h.grad_fn)
    assert type(new_h.grad_fn).__name__ == "CellFunctionBackward"


# --- CUDA graphs (on a GPU) -------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", PAIRS)
def test_cuda_graphs_capture_the_same(kind):
    # Each path captured in a graph of its own, forward and backward, then
    # replayed on the same inputs: the same outputs and gradients.
    results = []
    for fn in PAIRS[kind]:
        leaves = _leaves([t.cuda() for t in _inputs(kind)])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture, as torch advises
            for _ in range(2):
                outputs = fn(*leaves)
                torch.autograd.grad(sum(o.sum() for o in outputs), leaves)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = fn(*leaves)
            grads = torch.autograd.grad(sum(o.sum() for o in outputs), leaves)
        graph.replay()
        torch.cuda.synchronize()
        results.append(([o.detach().clone() for o in outputs], [g.clone() for g in grads]))
    _assert_identical(results[0], results[1])
