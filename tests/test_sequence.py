"""Whole sequences: lltm::sequence_forward / sequence_backward and LLTMSequence.

The oracle is a Python loop of the tutorial's cell (lltm.reference.lltm_cell),
differentiated by autograd; packed sequences are checked against loops over
each sequence on its own, which knows nothing of batch sizes. float64 parity
is tight (1e-12), so a wrong gate, step order, state carried to the wrong
row or gradient routed to the wrong step shows far above rounding.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import ARG_NAMES, GRAD_NAMES, INDUCTOR, assert_all_close, kernel_text
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence
from torch.utils._python_dispatch import TorchDispatchMode

import lltm
from lltm import _errors, reference
from lltm.ops.sequence_ops import composite as sequence_composite

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

TIGHT = dict(rtol=1e-12, atol=1e-12)


def assert_tight(actual, expected, names):
    """float64 parity to 1e-12 of each tensor's magnitude (its RMS, at least
    1): gradients through time grow with the sizes and randn weights."""
    for name, a, e in zip(names, actual, expected, strict=True):
        scale = max(1.0, e.double().pow(2).mean().sqrt().item() if e.numel() else 0.0)
        torch.testing.assert_close(
            a, e, rtol=1e-12, atol=1e-12 * scale, msg=lambda m, name=name: f"{name}: {m}"
        )


OUTPUT_NAMES = ("output", "h_n", "c_n")


def make_sequence_inputs(steps, batch, features, state, dtype=torch.float64, seed=0):
    """(input, weights, bias, old_h, old_cell) for a sequence, seeded, float64
    values converted to `dtype`. Weights and bias at the modules'
    initialisation scale (1 / sqrt(state)): at randn scale the gates saturate
    and gradients through time grow by orders of magnitude (see
    test_saturated_gates_match_loop)."""
    generator = torch.Generator().manual_seed(seed)
    scale = 1 / max(state, 1) ** 0.5
    shapes = [
        ((steps, batch, features), 1.0),
        ((3 * state, state + features), scale),
        ((3 * state,), scale),
        ((batch, state), 1.0),
        ((batch, state), 1.0),
    ]
    return [
        (torch.randn(shape, generator=generator, dtype=torch.float64) * s).to(dtype)
        for shape, s in shapes
    ]


def loop_of_cells(input, weights, bias, old_h, old_cell, reverse=False):
    """The oracle: the reference cell step by step; (output, (h_n, c_n))."""
    h, c = old_h, old_cell
    outputs = [None] * input.shape[0]
    steps = range(input.shape[0] - 1, -1, -1) if reverse else range(input.shape[0])
    for t in steps:
        h, c = reference.lltm_cell(input[t], weights, bias, h, c)
        outputs[t] = h
    if not outputs:
        return input.new_empty((0, old_h.shape[0], old_h.shape[1])), (h + 0, c + 0)
    return torch.stack(outputs), (h, c)


def _upstream(outputs, seed=7):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.device, t.dtype)
        for t in outputs
    ]


def run_sequence(fn, inputs, requires_grad=(True,) * 5, seed=7):
    """Outputs of fn (output, h_n, c_n) and the gradients of the inputs that
    require grad, for random upstream gradients of all three outputs."""
    leaves = [
        t.detach().clone().requires_grad_(r) for t, r in zip(inputs, requires_grad, strict=True)
    ]
    output, (h_n, c_n) = fn(*leaves)
    outputs = [output, h_n, c_n]
    # Without steps the loop's output is a new empty tensor, outside the graph.
    pairs = [(o, g) for o, g in zip(outputs, _upstream(outputs, seed), strict=True) if o.grad_fn]
    wanted = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad(
        [o for o, _ in pairs],
        wanted,
        [g for _, g in pairs],
        allow_unused=True,
        materialize_grads=True,
    )
    return [t.detach() for t in outputs], list(grads)


SHAPES = [
    (1, 1, 1, 1),
    (5, 3, 4, 6),
    (0, 3, 4, 5),
    (4, 0, 3, 5),
    (1, 16, 32, 128),
    (7, 17, 33, 129),
    (3, 2, 0, 4),
    (6, 9, 5, 200),
]


def _ids(shape):
    return "T{}-b{}-f{}-s{}".format(*shape)


# --- Values and gradients against a loop of the reference cell ---------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_float64_matches_loop_of_reference_cell(shape):
    inputs = make_sequence_inputs(*shape)
    out, grads = run_sequence(lltm.lltm_sequence, inputs)
    ref_out, ref_grads = run_sequence(loop_of_cells, inputs)
    for t, r in zip(out + grads, ref_out + ref_grads, strict=True):
        assert t.shape == r.shape and t.dtype == torch.float64
    assert_tight(out + grads, ref_out + ref_grads, OUTPUT_NAMES + GRAD_NAMES)


def test_step_t_equals_the_cell_on_step_t():
    # The state dict of the cell loads into the sequence module, and each
    # step of the sequence is the cell applied to that step.
    torch.manual_seed(0)
    cell = lltm.LLTM(5, 8).double()
    sequence = lltm.LLTMSequence(5, 8).double()
    sequence.load_state_dict(cell.state_dict())
    x, h, c = torch.randn(6, 4, 5).double(), torch.randn(4, 8).double(), torch.randn(4, 8).double()
    output, (h_n, c_n) = sequence(x, (h[None], c[None]))
    for t in range(6):
        h, c = cell(x[t], (h, c))
        torch.testing.assert_close(output[t], h, **TIGHT)
    torch.testing.assert_close(h_n[0], h, **TIGHT)
    torch.testing.assert_close(c_n[0], c, **TIGHT)


class _RecordMasks(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.masks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.lltm.sequence_backward.default:
            self.masks.append(list(args[-1]))
        return func(*args, **(kwargs or {}))


MASKS = [list(m) for m in itertools.product([False, True], repeat=5) if any(m)]


@pytest.mark.parametrize(
    "mask", MASKS, ids=lambda m: "+".join(n for n, w in zip(ARG_NAMES, m, strict=True) if w)
)
def test_gradients_only_where_needed(mask):
    inputs = make_sequence_inputs(4, 3, 5, 6)
    with _RecordMasks() as recorder:
        out, grads = run_sequence(lltm.lltm_sequence, inputs, mask)
    assert recorder.masks == [mask]
    ref_out, ref_grads = run_sequence(loop_of_cells, inputs, mask)
    names = [n for n, w in zip(GRAD_NAMES, mask, strict=True) if w]
    assert_all_close(out + grads, ref_out + ref_grads, [*OUTPUT_NAMES, *names], **TIGHT)


@pytest.mark.parametrize("used", ["output", "h_n", "c_n", "h_n+c_n"])
def test_outputs_that_do_not_reach_the_loss(used):
    # An output outside the loss has no gradient (None): the kernel treats it
    # as zero without being handed a tensor of zeros.
    inputs = make_sequence_inputs(5, 3, 4, 6)

    def loss(fn):
        leaves = [t.clone().requires_grad_() for t in inputs]
        output, (h_n, c_n) = fn(*leaves)
        chosen = {"output": output, "h_n": h_n, "c_n": c_n}
        total = sum((chosen[name] * (i + 1)).sum() for i, name in enumerate(used.split("+")))
        return torch.autograd.grad(total, leaves)

    assert_all_close(loss(lltm.lltm_sequence), loss(loop_of_cells), GRAD_NAMES, **TIGHT)


def test_gradcheck_and_gradgradcheck():
    inputs = [t.requires_grad_() for t in make_sequence_inputs(3, 2, 3, 4)]

    def fn(*args):
        output, (h_n, c_n) = lltm.lltm_sequence(*args)
        return output, h_n, c_n

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.parametrize("shape", [(6, 4, 5, 9), (6, 9, 5, 200)], ids=_ids)
def test_saturated_gates_match_loop(shape):
    # randn-scale weights: pre-activations of tens, saturated gates, gradients
    # through time in the hundreds. The GEMMs' summation order (lltm's and the
    # reference's differ) then shows at 1e-12 of the magnitude; 1e-10 still
    # catches any slip in the math.
    inputs = [t * 3 * shape[-1] ** 0.5 if t.dim() < 3 else t for t in make_sequence_inputs(*shape)]
    out, grads = run_sequence(lltm.lltm_sequence, inputs)
    ref_out, ref_grads = run_sequence(loop_of_cells, inputs)
    for name, a, e in zip(OUTPUT_NAMES + GRAD_NAMES, out + grads, ref_out + ref_grads, strict=True):
        scale = max(1.0, e.pow(2).mean().sqrt().item())
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10 * scale, msg=name)


# --- The operators directly: native against composite, packed and reverse --------------


def _packed_batch_sizes(lengths):
    """batch_sizes of sorted (non-increasing) lengths."""
    return torch.tensor(
        [sum(1 for n in lengths if n > t) for t in range(max(lengths, default=0))],
        dtype=torch.int64,
    )


OP_CASES = {
    "padded": (None, False),
    "padded_reverse": (None, True),
    "packed": ([6, 4, 4, 1], False),
    "packed_reverse": ([6, 4, 4, 1], True),
    "packed_one": ([3], True),
}


def _op_args(case, dtype=torch.float64, state=7, features=5):
    lengths, reverse = OP_CASES[case]
    if lengths is None:
        x, w, b, h, c = make_sequence_inputs(5, 4, features, state, dtype)
        return [x, w, b, h, c, None, reverse]
    batch_sizes = _packed_batch_sizes(lengths)
    x, w, b, h, c = make_sequence_inputs(1, len(lengths), features, state, dtype)
    data = torch.randn(sum(lengths), features, generator=torch.Generator().manual_seed(3))
    return [data.to(dtype), w, b, h, c, batch_sizes, reverse]


def _backward_args(forward_args, outputs, mask=(True,) * 5):
    input, weights, _, old_h, _, batch_sizes, reverse = forward_args
    output, h_n, c_n, gates, cells = outputs
    grad_output, grad_h_n, grad_c_n = _upstream([output, h_n, c_n])
    return [
        grad_output, grad_h_n, grad_c_n, output, gates, cells,
        input, weights, old_h, batch_sizes, reverse, list(mask),
    ]  # fmt: skip


@pytest.mark.parametrize("case", OP_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_native_equals_composite(case, dtype):
    args = _op_args(case, dtype)
    native = torch.ops.lltm.sequence_forward(*args)
    composite = sequence_composite.sequence_forward(*args)
    names = ("output", "h_n", "c_n", "gates", "cells")
    assert_all_close(native, composite, names)
    backward_args = _backward_args(args, native)
    assert_all_close(
        torch.ops.lltm.sequence_backward(*backward_args),
        sequence_composite.sequence_backward(*backward_args),
        GRAD_NAMES,
    )
    gate_grads_args = backward_args[:-1]  # no output_mask
    assert_all_close(
        torch.ops.lltm.sequence_gate_grads(*gate_grads_args),
        sequence_composite.sequence_gate_grads(*gate_grads_args),
        ("grad_gates", "grad_old_h", "grad_old_cell"),
    )


@pytest.mark.parametrize("case", ["padded", "packed_reverse"])
def test_gate_grads_are_what_the_backward_multiplies(case):
    # sequence_backward = sequence_gate_grads, then the products: grad_input
    # = d_gates @ W_x and grad_bias = the sum of d_gates.
    args = _op_args(case)
    backward_args = _backward_args(args, torch.ops.lltm.sequence_forward(*args))
    grad_input, _, grad_bias, grad_old_h, grad_old_cell = torch.ops.lltm.sequence_backward(
        *backward_args
    )
    d_gates, gate_old_h, gate_old_cell = torch.ops.lltm.sequence_gate_grads(*backward_args[:-1])
    weights, state = args[1], args[3].shape[1]
    assert_tight(
        [
            d_gates @ weights[:, state:],
            d_gates.reshape(-1, 3 * state).sum(0),
            gate_old_h,
            gate_old_cell,
        ],
        [grad_input, grad_bias, grad_old_h, grad_old_cell],
        ["grad_input", "grad_bias", "grad_old_h", "grad_old_cell"],
    )


@pytest.mark.parametrize("case", OP_CASES)
def test_opcheck_sequence_forward(case):
    args = _op_args(case)
    for t in args[:5]:
        t.requires_grad_()
    torch.library.opcheck(torch.ops.lltm.sequence_forward.default, tuple(args))


@pytest.mark.parametrize("case", OP_CASES)
@pytest.mark.parametrize("mask", [(True,) * 5, (False, True, True, False, False)], ids=str)
def test_opcheck_sequence_backward(case, mask):
    args = _op_args(case)
    outputs = torch.ops.lltm.sequence_forward(*args)
    torch.library.opcheck(
        torch.ops.lltm.sequence_backward.default, tuple(_backward_args(args, outputs, mask))
    )


@pytest.mark.parametrize("case", OP_CASES)
def test_opcheck_sequence_gate_grads(case):
    args = _op_args(case)
    outputs = torch.ops.lltm.sequence_forward(*args)
    torch.library.opcheck(
        torch.ops.lltm.sequence_gate_grads.default, tuple(_backward_args(args, outputs)[:-1])
    )


def test_backward_without_upstream_gradients():
    args = _op_args("packed_reverse")
    outputs = torch.ops.lltm.sequence_forward(*args)
    backward_args = _backward_args(args, outputs)
    backward_args[:3] = [None, None, None]
    grads = torch.ops.lltm.sequence_backward(*backward_args)
    for g in grads:
        assert torch.count_nonzero(g) == 0


# --- LLTMSequence: nn.LSTM's conventions ----------------------------------------------


def _module(features=5, state=6, **kwargs):
    torch.manual_seed(0)
    return lltm.LLTMSequence(features, state, **kwargs).double()


def reference_module(module, sequences, h_0, c_0):
    """The module's result computed sequence by sequence, layer by layer,
    direction by direction, with loops of the reference cell: per-sequence
    outputs (length, directions * state) and h_n, c_n."""
    directions = module.directions
    outputs, h_n, c_n = [], [], []
    if not sequences:
        empty = h_0[:, :0]
        return [], empty.clone(), empty.clone()
    for b, sequence in enumerate(sequences):
        layer_input = sequence[:, None, :]  # (length, 1, features)
        finals_h, finals_c = [], []
        for layer in range(module.num_layers):
            per_direction = []
            for direction in range(directions):
                index = layer * directions + direction
                weights_name, bias_name = module._parameter_names[index]
                out, (h, c) = loop_of_cells(
                    layer_input,
                    getattr(module, weights_name),
                    getattr(module, bias_name),
                    h_0[index, b : b + 1],
                    c_0[index, b : b + 1],
                    reverse=direction == 1,
                )
                per_direction.append(out)
                finals_h.append(h[0])
                finals_c.append(c[0])
            layer_input = torch.cat(per_direction, dim=-1)
        outputs.append(layer_input[:, 0])
        h_n.append(torch.stack(finals_h))
        c_n.append(torch.stack(finals_c))
    return outputs, torch.stack(h_n, dim=1), torch.stack(c_n, dim=1)


MODULE_KINDS = {
    "plain": {},
    "bidirectional": {"bidirectional": True},
    "layers": {"num_layers": 3},
    "layers_bidirectional": {"num_layers": 2, "bidirectional": True},
}


@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_padded_batch_matches_reference(kind):
    module = _module(**MODULE_KINDS[kind])
    layers = module.num_layers * module.directions
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, 5, generator=generator, dtype=torch.float64)
    h_0 = torch.randn(layers, 3, 6, generator=generator, dtype=torch.float64)
    c_0 = torch.randn(layers, 3, 6, generator=generator, dtype=torch.float64)
    output, (h_n, c_n) = module(x, (h_0, c_0))
    ref_outputs, ref_h, ref_c = reference_module(module, list(x.unbind(1)), h_0, c_0)
    assert output.shape == (6, 3, module.directions * 6)
    torch.testing.assert_close(output, torch.stack(ref_outputs, dim=1), **TIGHT)
    torch.testing.assert_close(h_n, ref_h, **TIGHT)
    torch.testing.assert_close(c_n, ref_c, **TIGHT)


@pytest.mark.parametrize("kind", MODULE_KINDS)
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_packed_sequences_match_per_sequence_loops(kind, enforce_sorted):
    module = _module(**MODULE_KINDS[kind])
    layers = module.num_layers * module.directions
    lengths = [7, 5, 5, 2, 1] if enforce_sorted else [2, 7, 1, 5, 5]
    generator = torch.Generator().manual_seed(2)
    sequences = [torch.randn(n, 5, generator=generator, dtype=torch.float64) for n in lengths]
    leaves = [s.clone().requires_grad_() for s in sequences]
    h_0 = torch.randn(layers, 5, 6, generator=generator, dtype=torch.float64)
    c_0 = torch.randn(layers, 5, 6, generator=generator, dtype=torch.float64)

    packed = pack_sequence(leaves, enforce_sorted=enforce_sorted)
    output, (h_n, c_n) = module(packed, (h_0, c_0))
    assert isinstance(output, torch.nn.utils.rnn.PackedSequence)
    padded, out_lengths = pad_packed_sequence(output)
    assert out_lengths.tolist() == lengths
    ref_outputs, ref_h, ref_c = reference_module(module, leaves, h_0, c_0)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(padded[:n, b], ref_outputs[b], **TIGHT)
    torch.testing.assert_close(h_n, ref_h, **TIGHT)
    torch.testing.assert_close(c_n, ref_c, **TIGHT)

    # Gradients flow to each sequence's own steps and to the parameters.
    weights = list(module.parameters())
    upstream = _upstream([output.data, h_n, c_n])
    grads = torch.autograd.grad([output.data, h_n, c_n], leaves + weights, upstream)
    ref_packed = pack_sequence(ref_outputs, enforce_sorted=enforce_sorted).data
    ref_grads = torch.autograd.grad([ref_packed, ref_h, ref_c], leaves + weights, upstream)
    names = [f"grad of sequence {b}" for b in range(len(leaves))] + [
        f"grad of {name}" for name, _ in module.named_parameters()
    ]
    assert_all_close(grads, ref_grads, names, **TIGHT)


def test_packed_output_matches_padded_when_lengths_are_equal():
    module = _module(bidirectional=True)
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    padded_output, (h, c) = module(x)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, [4, 4, 4])
    packed_output, (h_p, c_p) = module(packed)
    torch.testing.assert_close(pad_packed_sequence(packed_output)[0], padded_output, **TIGHT)
    torch.testing.assert_close((h_p, c_p), (h, c), **TIGHT)


def test_batch_first_and_unbatched_input():
    module = _module(num_layers=2, bidirectional=True)
    batch_first = _module(num_layers=2, bidirectional=True, batch_first=True)
    batch_first.load_state_dict(module.state_dict())
    x = torch.randn(6, 3, 5, dtype=torch.float64)
    output, (h_n, c_n) = module(x)
    output_bf, (h_bf, c_bf) = batch_first(x.transpose(0, 1).contiguous())
    assert output_bf.shape == (3, 6, 12)
    torch.testing.assert_close(output_bf.transpose(0, 1), output, **TIGHT)
    torch.testing.assert_close((h_bf, c_bf), (h_n, c_n), **TIGHT)

    single, (h_1, c_1) = module(x[:, 1])
    assert single.shape == (6, 12) and h_1.shape == (4, 6)
    torch.testing.assert_close(single, output[:, 1], **TIGHT)
    torch.testing.assert_close((h_1, c_1), (h_n[:, 1], c_n[:, 1]), **TIGHT)


def test_state_is_optional_and_zero_by_default():
    module = _module(num_layers=2)
    x = torch.randn(3, 2, 5, dtype=torch.float64)
    zeros = torch.zeros(2, 2, 6, dtype=torch.float64)
    assert_all_close(
        [module(x)[0], *module(x)[1]],
        [module(x, (zeros, zeros))[0], *module(x, (zeros, zeros))[1]],
        OUTPUT_NAMES,
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("shape", [(0, 3), (1, 3), (4, 0)], ids=["T0", "T1", "batch0"])
def test_edge_lengths_and_batches(shape):
    steps, batch = shape
    module = _module(bidirectional=True)
    x = torch.randn(steps, batch, 5, dtype=torch.float64, requires_grad=True)
    h_0 = torch.randn(2, batch, 6, dtype=torch.float64, requires_grad=True)
    c_0 = torch.randn(2, batch, 6, dtype=torch.float64, requires_grad=True)
    output, (h_n, c_n) = module(x, (h_0, c_0))
    assert output.shape == (steps, batch, 12) and h_n.shape == (2, batch, 6)
    ref_outputs, ref_h, ref_c = reference_module(module, list(x.unbind(1)), h_0, c_0)
    if batch:
        torch.testing.assert_close(output, torch.stack(ref_outputs, dim=1), **TIGHT)
    torch.testing.assert_close((h_n, c_n), (ref_h, ref_c), **TIGHT)
    (output.sum() + h_n.sum() + c_n.sum()).backward()
    if steps == 0:
        # No step: the state passes through unchanged.
        torch.testing.assert_close(h_0.grad, torch.ones_like(h_0), rtol=0, atol=0)


def test_non_contiguous_and_broadcast_arguments():
    x, w, b, h, c = make_sequence_inputs(5, 4, 6, 7)
    expected = loop_of_cells(x, w, b, h, c)
    arranged = [
        x.transpose(0, 1).contiguous().transpose(0, 1),  # batch-major storage
        w.t().contiguous().t(),
        torch.stack([b, torch.zeros_like(b)], dim=1)[:, 0],
        h.t().contiguous().t(),
        c.t().contiguous().t(),
    ]
    assert not any(t.is_contiguous() for t in arranged)
    output, (h_n, c_n) = lltm.lltm_sequence(*arranged)
    assert_all_close([output, h_n, c_n], [expected[0], *expected[1]], OUTPUT_NAMES, **TIGHT)
    # An input broadcast over time and batch (stride 0 everywhere).
    expanded = x[0, 0].expand(5, 4, 6)
    output, _ = lltm.lltm_sequence(expanded, w, b, h, c)
    torch.testing.assert_close(output, loop_of_cells(expanded.contiguous(), w, b, h, c)[0], **TIGHT)


def test_gradient_of_a_sum_is_a_broadcast():
    # output.sum() hands backward a stride-0 gradient.
    inputs = [t.requires_grad_() for t in make_sequence_inputs(4, 3, 2, 5)]
    output, (h_n, _) = lltm.lltm_sequence(*inputs)
    grads = torch.autograd.grad(output.sum() + h_n.sum(), inputs)
    output, (h_n, _) = loop_of_cells(*inputs)
    expected = torch.autograd.grad(output.sum() + h_n.sum(), inputs)
    assert_all_close(grads, expected, GRAD_NAMES, **TIGHT)


def test_parameters_are_the_cells_with_one_layer_and_nn_lstm_names_otherwise():
    cell = lltm.LLTM(5, 6)
    plain = lltm.LLTMSequence(5, 6)
    assert [(n, p.shape) for n, p in plain.named_parameters()] == [
        (n, p.shape) for n, p in cell.named_parameters()
    ]
    plain.load_state_dict(cell.state_dict())
    cell.load_state_dict(plain.state_dict())
    deep = lltm.LLTMSequence(5, 6, num_layers=2, bidirectional=True)
    assert [n for n, _ in deep.named_parameters()] == [
        "weights_l0", "bias_l0", "weights_l0_reverse", "bias_l0_reverse",
        "weights_l1", "bias_l1", "weights_l1_reverse", "bias_l1_reverse",
    ]  # fmt: skip
    assert deep.weights_l1.shape == (18, 6 + 12)
    bound = 1 / 6**0.5
    assert all(p.abs().max() <= bound for p in deep.parameters())
    assert "bidirectional=True" in repr(deep)


# --- Bad input ------------------------------------------------------------------------


def _forward_with(**changes):
    x, w, b, h, c = make_sequence_inputs(4, 3, 5, 6)
    args = dict(input=x, weights=w, bias=b, old_h=h, old_cell=c, batch_sizes=None, reverse=False)
    args.update({k: v(args[k]) if callable(v) else v for k, v in changes.items()})
    return list(args.values())


SEQUENCE_ERRORS = {
    "input_2d": (_forward_with(input=lambda t: t[0]), r"input must be 3-D \(seq_len, batch"),
    "features": (
        _forward_with(input=lambda t: t[..., :-1]),
        r"input has input_features = 4; the weights expect 5 \(weights have shape \(18, 11\) = "
        r"\(3 \* state_size, state_size \+ input_features\) with state_size = 6\)",
    ),
    "old_h_batch": (
        _forward_with(old_h=lambda t: t[:2]),
        r"old_h must have shape \(batch, state_size\) = \(3, 6\), got \(2, 6\)",
    ),
    "old_cell_state": (
        _forward_with(old_cell=lambda t: t[:, :5]),
        r"old_cell must have shape \(batch, state_size\) = \(3, 6\), got \(3, 5\)",
    ),
    "bias": (_forward_with(bias=lambda t: t[:-1]), r"bias must have shape \(3 \* state_size,\)"),
    "dtype": (
        _forward_with(old_h=lambda t: t.float()),
        r"old_h has dtype torch\.float32 but input",
    ),
    "packed_3d": (
        _forward_with(batch_sizes=torch.tensor([3, 3, 3, 3])),
        r"input must be 2-D \(sum\(batch_sizes\), input_features\) when batch_sizes is given",
    ),
    "batch_sizes_dtype": (
        _forward_with(input=lambda t: t.reshape(12, 5), batch_sizes=torch.tensor([3.0] * 4)),
        r"batch_sizes must be a 1-D int64 tensor on the CPU",
    ),
    "batch_sizes_increasing": (
        _forward_with(input=lambda t: t.reshape(12, 5), batch_sizes=torch.tensor([3, 2, 3, 3, 1])),
        r"batch_sizes must be positive and non-increasing, starting at the batch of old_h \(3\); got 3 at step 2",
    ),
    "batch_sizes_first": (
        _forward_with(input=lambda t: t.reshape(12, 5)[:8], batch_sizes=torch.tensor([2, 2, 2, 2])),
        r"batch_sizes must be positive and non-increasing, starting at the batch of old_h \(3\); got 2 at step 0",
    ),
    "batch_sizes_sum": (
        _forward_with(input=lambda t: t.reshape(12, 5), batch_sizes=torch.tensor([3, 3, 3])),
        r"batch_sizes must sum to the rows of input \(12\), got 9",
    ),
}


@pytest.mark.parametrize("case", SEQUENCE_ERRORS)
@pytest.mark.parametrize("kernel", ["native", "composite"])
def test_bad_arguments_name_the_argument(case, kernel):
    args, pattern = SEQUENCE_ERRORS[case]
    fn = (
        torch.ops.lltm.sequence_forward
        if kernel == "native"
        else sequence_composite.sequence_forward
    )
    with pytest.raises(ValueError, match=r"^lltm: " + pattern):
        fn(*args)


@pytest.mark.parametrize("case", SEQUENCE_ERRORS)
def test_a_kernels_argument_error_gets_its_type_back(case):
    # The kernel's text as torch >= 2.15 delivers it, a RuntimeError (only
    # the text crosses the stable ABI): lltm._errors restores the ValueError.
    args, _ = SEQUENCE_ERRORS[case]
    with pytest.raises(ValueError) as info:
        torch.ops.lltm.sequence_forward(*args)
    message = str(info.value)
    restored = _errors.documented(RuntimeError(kernel_text(torch.ops.lltm.sequence_forward, args)))
    assert type(restored) is ValueError and str(restored) == message


def _sequence_backward_with(case="padded", mask=(True,) * 5, **changes):
    args = _op_args(case)
    backward = _backward_args(args, torch.ops.lltm.sequence_forward(*args), mask)
    names = (
        "grad_output", "grad_h_n", "grad_c_n", "output", "gates", "cells",
        "input", "weights", "old_h", "batch_sizes", "reverse", "output_mask",
    )  # fmt: skip
    named = dict(zip(names, backward, strict=True))
    named.update({k: v(named[k]) for k, v in changes.items()})
    return list(named.values())


SEQUENCE_BACKWARD_ERRORS = {
    "gates_width": (
        _sequence_backward_with(gates=lambda t: t[..., :-1]),
        r"gates must have shape \(seq_len, batch, 3 \* state_size\) = \(5, 4, 21\), got \(5, 4, 20\)",
    ),
    "grad_h_n_dtype": (
        _sequence_backward_with(grad_h_n=lambda t: t.float()),
        r"grad_h_n has dtype torch\.float32 but input has torch\.float64",
    ),
    "cells_steps": (
        _sequence_backward_with(cells=lambda t: t[:-1]),
        r"cells must have shape \(seq_len, batch, state_size\) = \(5, 4, 7\), got \(4, 4, 7\)",
    ),
    "packed_batch_sizes_sum": (
        _sequence_backward_with("packed", batch_sizes=lambda t: t[:-1]),
        r"batch_sizes must sum to the rows of input",
    ),
    "output_mask": (
        _sequence_backward_with(output_mask=lambda m: m[:4]),
        r"output_mask must have 5 entries \(input, weights, bias, old_h, old_cell\), got 4",
    ),
}


@pytest.mark.parametrize(
    ("case", "op"),
    [(case, "sequence_backward") for case in SEQUENCE_BACKWARD_ERRORS]
    # sequence_gate_grads: the same arguments but output_mask.
    + [(case, "sequence_gate_grads") for case in SEQUENCE_BACKWARD_ERRORS if case != "output_mask"],
)
def test_bad_backward_arguments_name_the_argument(case, op):
    args, pattern = SEQUENCE_BACKWARD_ERRORS[case]
    if op == "sequence_gate_grads":
        args = args[:-1]
    native, composite = getattr(torch.ops.lltm, op), getattr(sequence_composite, op)
    with pytest.raises(ValueError, match=r"^lltm: " + pattern) as info:
        native(*args)
    message = str(info.value)
    with pytest.raises(ValueError) as composite_info:
        composite(*args)
    assert str(composite_info.value) == message
    # As torch >= 2.15 delivers it: a RuntimeError with the kernel's text.
    restored = _errors.documented(RuntimeError(kernel_text(native, args)))
    assert type(restored) is ValueError and str(restored) == message


def test_module_rejects_bad_state_and_input():
    module = _module(num_layers=2)
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    h = torch.zeros(1, 3, 6, dtype=torch.float64)
    with pytest.raises(
        ValueError, match=r"^lltm: LLTMSequence h_0 must have shape .* = \(2, 3, 6\)"
    ):
        module(x, (h, h))
    with pytest.raises(ValueError, match=r"^lltm: LLTMSequence input must be 3-D"):
        module(x[None])
    with pytest.raises(TypeError, match=r"^lltm: LLTMSequence input must be a Tensor"):
        module([x])
    with pytest.raises(ValueError, match=r"^lltm: LLTMSequence num_layers must be an integer >= 1"):
        lltm.LLTMSequence(5, 6, num_layers=0)


# --- torch.compile ----------------------------------------------------------------------


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("backend", ["aot_eager", INDUCTOR])
def test_compiled_module_matches_eager(backend):
    module = _module(num_layers=2, bidirectional=True)
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    x = torch.randn(5, 3, 5, dtype=torch.float64)

    def run(fn):
        output, (h_n, c_n) = fn(x)
        loss = output.sum() + (h_n * 2).sum() + (c_n * 3).sum()
        return [output, h_n, c_n, *torch.autograd.grad(loss, list(module.parameters()))]

    assert_all_close(run(compiled), run(module), [f"t{i}" for i in range(3 + 8)])


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_packed_sequence_has_no_graph_break():
    module = _module(bidirectional=True)
    packed = pack_sequence([torch.randn(n, 5, dtype=torch.float64) for n in (4, 2, 3)], False)
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    output, (h_n, c_n) = compiled(packed)
    expected, (h_e, c_e) = module(packed)
    torch.testing.assert_close(output.data, expected.data)
    torch.testing.assert_close((h_n, c_n), (h_e, c_e))


# --- 16-bit and float32 ------------------------------------------------------------------


def _rms(t):
    return t.double().pow(2).mean().sqrt().item() if t.numel() else 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_lower_precision_as_accurate_as_a_loop_in_that_precision(dtype):
    # RMS error against float64 on the same rounded inputs; a loop of the
    # reference cell in `dtype` sets the bar.
    inputs = [t * 0.5 for t in make_sequence_inputs(8, 16, 32, 64, dtype)]
    ours_out, ours_grads = run_sequence(lltm.lltm_sequence, inputs)
    loop_out, loop_grads = run_sequence(loop_of_cells, inputs)
    exact_out, exact_grads = run_sequence(loop_of_cells, [t.double() for t in inputs])
    for name, ours, loop, exact in zip(
        OUTPUT_NAMES + GRAD_NAMES,
        ours_out + ours_grads,
        loop_out + loop_grads,
        exact_out + exact_grads,
        strict=True,
    ):
        assert ours.dtype == dtype, name
        scale = max(_rms(exact), 1e-30)
        error = _rms(ours.double() - exact) / scale
        bar = _rms(loop.double() - exact) / scale
        assert error <= 2 * bar + torch.finfo(dtype).eps, f"{name}: {error:.2e} vs {bar:.2e}"


# --- Threads ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_two_threads_match_one(dtype, restore_num_threads):
    # Batch 32 x state 128: each step's rows are split between the threads.
    inputs = make_sequence_inputs(6, 32, 16, 128, dtype)
    torch.set_num_threads(1)
    one = run_sequence(lltm.lltm_sequence, inputs)
    torch.set_num_threads(2)
    two = run_sequence(lltm.lltm_sequence, inputs)
    tol = TIGHT if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    assert_all_close(one[0] + one[1], two[0] + two[1], OUTPUT_NAMES + GRAD_NAMES, **tol)
