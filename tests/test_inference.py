"""lltm::sequence_inference: the sequence's forward that keeps nothing for a backward.

Its outputs must be sequence_forward's, bit for bit, on every path (the fused
steps of every instruction set, torch's GEMM in 16 bits, the CUDA sources
built for the host); the entry points must take it exactly when no gradient
can be asked of the call, and it must allocate none of the activations only
a backward reads. Called where autograd must differentiate it, it gives
sequence_forward's gradients.
"""

from __future__ import annotations

import pytest
import torch
from test_sequence import OP_CASES, _op_args, make_sequence_inputs
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils._python_dispatch import TorchDispatchMode

import lltm

pytestmark = pytest.mark.usefixtures("kernels")

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]

forward_op = torch.ops.lltm.sequence_forward
inference_op = torch.ops.lltm.sequence_inference


def assert_same_bits(inference, training):
    for name, a, b in zip(("output", "h_n", "c_n"), inference, training[:3], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}: max difference {(a - b).abs().max().item()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", OP_CASES)
def test_inference_equals_training_bit_for_bit(case, dtype):
    args = _op_args(case, dtype)
    assert_same_bits(inference_op(*args), forward_op(*args))


# Sizes where the fused steps take several passes over k (features + state
# past a pass's depth), several panels and a last, padded row tile; one
# thread's block of rows and several; and the edges.
SIZES = [(7, 17, 9, 33), (3, 9, 300, 400), (4, 1, 3, 5), (0, 3, 4, 5), (4, 0, 3, 5), (3, 5, 0, 8)]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_inference_equals_training_at_every_size(size, dtype, reverse):
    x, w, b, h, c = make_sequence_inputs(*size, dtype=dtype)
    c = c.t().contiguous().t()  # c_0 is read in place, with any strides
    args = [x, w, b, h, c, None, reverse]
    assert_same_bits(inference_op(*args), forward_op(*args))
    if size[0] and size[1] and size[2]:  # torch packs no empty tensor
        # Packed, from unsorted lengths: rows that stop early (forward) or
        # join late (reverse) keep or take their running cell.
        lengths = torch.arange(size[1], 0, -1).remainder(size[0]) + 1
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        h, c = h[packed.sorted_indices], c[packed.sorted_indices]
        args = [packed.data, w, b, h, c, packed.batch_sizes, reverse]
        assert_same_bits(inference_op(*args), forward_op(*args))


def test_no_bias_and_strided_input():
    x, w, _, h, c = make_sequence_inputs(6, 4, 5, 7, dtype=torch.float32)
    x = x.transpose(0, 1).contiguous().transpose(0, 1)  # batch-major storage
    args = [x, w, None, h, c, None, False]
    assert_same_bits(inference_op(*args), forward_op(*args))


# --- The decision ------------------------------------------------------------------------


class _Ops(TorchDispatchMode):
    """The lltm operators a block calls."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "lltm":
            self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def _ops_called(fn):
    with _Ops() as ops:
        fn()
    return ops.names


def _model():
    torch.manual_seed(0)
    return lltm.LLTMSequence(5, 7, num_layers=2, bidirectional=True)


def test_entry_points_take_it_when_no_gradient_can_be_asked():
    model, x = _model(), torch.randn(6, 3, 5)
    with torch.no_grad():
        assert set(_ops_called(lambda: model(x))) == {"sequence_inference"}
    with torch.inference_mode():
        assert set(_ops_called(lambda: model(x))) == {"sequence_inference"}
    model.requires_grad_(False)
    assert set(_ops_called(lambda: model(x))) == {"sequence_inference"}
    w, b = model.weights_l0, model.bias_l0
    h = torch.zeros(3, 7)
    assert _ops_called(lambda: lltm.lltm_sequence(x, w, b, h, h)) == ["sequence_inference"]


def test_entry_points_keep_the_activations_when_a_gradient_can_be_asked():
    model, x = _model(), torch.randn(6, 3, 5)
    assert set(_ops_called(lambda: model(x))) == {"sequence_forward"}
    model.requires_grad_(False)
    x.requires_grad_(True)  # the input alone
    assert set(_ops_called(lambda: model(x))) == {"sequence_forward"}
    x.requires_grad_(False)
    params = dict(model.named_parameters())
    grads = torch.func.grad(
        lambda p: torch.func.functional_call(model, p, (x,))[0].sum()
    )  # a torch.func transform
    assert "sequence_inference" not in _ops_called(lambda: grads(params))
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        assert set(_ops_called(lambda: model(dual))) == {"sequence_forward"}


def test_outputs_the_same_in_both_modes():
    model, x = _model(), torch.randn(6, 3, 5)
    trained = model(x)
    with torch.inference_mode():
        served = model(x)
    torch.testing.assert_close(served[0], trained[0], rtol=0, atol=0)
    for a, b in zip(served[1], trained[1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --- Differentiated after all ------------------------------------------------------------


def test_differentiated_directly_gives_sequence_forwards_gradients():
    args = _op_args("packed_reverse")
    leaves = [a.clone().requires_grad_() for a in args[:5]]
    inference = inference_op(*leaves, *args[5:])
    training = forward_op(*leaves, *args[5:])[:3]
    ones = [torch.randn_like(t) for t in inference]
    got = torch.autograd.grad(inference, leaves, ones)
    expected = torch.autograd.grad(training, leaves, ones)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_gradcheck():
    args = _op_args("packed")
    leaves = [a.clone().requires_grad_() for a in args[:5]]
    assert torch.autograd.gradcheck(lambda *t: inference_op(*t, *args[5:]), leaves)


@pytest.mark.parametrize("case", ["padded", "packed_reverse"])
def test_opcheck(case):
    args = _op_args(case)
    torch.library.opcheck(inference_op.default, args)
    args[:5] = [a.requires_grad_() for a in args[:5]]
    torch.library.opcheck(inference_op.default, args)


def test_vmap_of_the_operator():
    x, w, b, h, c = make_sequence_inputs(4, 3, 5, 7)
    xs, hs, cs = (
        t.unsqueeze(0).expand(2, *t.shape) * torch.tensor([1.0, -1.0]).view(2, *[1] * t.dim())
        for t in (x, h, c)
    )
    batched = torch.vmap(lambda x, h, c: inference_op(x, w, b, h, c, None, False))(xs, hs, cs)
    for i in range(2):
        one = inference_op(xs[i], w, b, hs[i], cs[i], None, False)
        for a, e in zip(batched, one, strict=True):
            torch.testing.assert_close(a[i], e, rtol=1e-12, atol=1e-12)


# --- What it allocates -------------------------------------------------------------------


def _peak_bytes(fn):
    """Peak of torch's CPU allocations during ``fn()``, above those at its start.

    From the profiler's memory events (each allocation's bytes, each free's
    negated), in the order they happened.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    assert events, "the profiler reported no allocation"
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


@pytest.mark.cpu_kernels_only(reason="torch's CPU allocator, as the profiler reports it")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_keeps_no_activations(dtype):
    steps, batch, features, state = 200, 8, 16, 64
    args = [*make_sequence_inputs(steps, batch, features, state, dtype=dtype), None, False]
    element = torch.empty((), dtype=dtype).element_size()
    output = steps * batch * state * element
    gates_and_cells = 4 * output
    training = _peak_bytes(lambda: forward_op(*args))
    inference = _peak_bytes(lambda: inference_op(*args))
    assert training >= output + gates_and_cells
    # The output, h_n and c_n, and scratch of a step's size (16-bit: a step's
    # gates and [h, x_t]), with room for small allocations.
    small = 4 * batch * (3 * state + state + features) * element + 64 * 1024
    assert inference <= output + small, (inference, output)
