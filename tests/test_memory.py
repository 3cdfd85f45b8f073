"""What the autograd graph keeps for backward: the README's memory claims.

"Only the activated gates are saved for backward" (with new_cell, from which
tanh is recomputed) and "its graph keeps about half as much memory alive for
backward beyond the inputs and parameters" as the reference. Saved tensors
are seen through torch.autograd.graph.saved_tensors_hooks, as the benchmark
counts them (lltm.bench.cases.AutogradCase.saved_for_backward: bytes of the
distinct storages, in all and beyond the inputs and parameters).
"""

from __future__ import annotations

import pytest
import torch

import lltm
from lltm.bench import cases, kinds

CPU = torch.device("cpu")
SIZES = [(16, 32, 128), (5, 3, 7), (64, 256, 512)]


def _saved_beyond_inputs(impl, size, inputs_grad, dtype=torch.float32):
    case = cases.make_case(impl, size, CPU, dtype, inputs_grad=inputs_grad)
    _total, beyond = case.saved_for_backward()
    return beyond


def _saved_tensors(fn, inputs):
    """The tensors ``fn(*inputs)`` saves for backward whose storage is not
    one of ``inputs``'."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outputs = fn(*inputs)
    own = {t.untyped_storage().data_ptr() for t in inputs}
    return [t for t in saved if t.untyped_storage().data_ptr() not in own], outputs


@pytest.mark.parametrize("inputs_grad", [False, True], ids=["parameters", "inputs-grad"])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_cell_keeps_the_activated_gates_and_new_cell_only(size, inputs_grad):
    b, _, s = size
    itemsize = torch.finfo(torch.float32).bits // 8
    beyond = _saved_beyond_inputs("lltm", kinds.Size(*size), inputs_grad)
    assert beyond == (b * 3 * s + b * s) * itemsize


@pytest.mark.parametrize("inputs_grad", [False, True], ids=["parameters", "inputs-grad"])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_cell_keeps_about_half_of_what_the_reference_keeps(size, inputs_grad):
    ours = _saved_beyond_inputs("lltm", kinds.Size(*size), inputs_grad)
    theirs = _saved_beyond_inputs("reference", kinds.Size(*size), inputs_grad)
    # 4 values per (row, state) against the reference's 8.25 to 8.6.
    assert 0.4 <= ours / theirs <= 0.55, f"{ours} bytes vs the reference's {theirs}"


def test_saved_tensors_are_the_gates_and_new_cell():
    generator = torch.Generator().manual_seed(0)
    inputs = [
        torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_()
        for shape in [(4, 3), (15, 8), (15,), (4, 5), (4, 5)]
    ]
    saved, (_new_h, new_cell) = _saved_tensors(lltm.lltm_cell, inputs)
    _, _, gates = torch.ops.lltm.forward(*[t.detach() for t in inputs])
    assert sorted(tuple(t.shape) for t in saved) == [(4, 5), (4, 15)]
    by_shape = {tuple(t.shape): t for t in saved}
    torch.testing.assert_close(by_shape[4, 15], gates, rtol=0, atol=0)
    torch.testing.assert_close(by_shape[4, 5], new_cell.detach(), rtol=0, atol=0)
    # The input and output gates activated (sigmoid), the candidate's
    # pre-activation (ELU's derivative is computed from it).
    x, weights, bias, old_h, _ = (t.detach() for t in inputs)
    pre = torch.nn.functional.linear(torch.cat([old_h, x], 1), weights, bias)
    torch.testing.assert_close(gates[:, :10], torch.sigmoid(pre[:, :10]))
    torch.testing.assert_close(gates[:, 10:], pre[:, 10:])


@pytest.mark.parametrize("inputs_grad", [False, True], ids=["parameters", "inputs-grad"])
@pytest.mark.parametrize("size", [(16, 32, 128, 10), (4, 3, 5, 3)], ids=str)
def test_sequence_keeps_output_gates_and_cells(size, inputs_grad):
    b, f, s, t = size
    itemsize = torch.finfo(torch.float32).bits // 8
    sequence_size = kinds.Size(b, f, s, seq_len=t)
    ours = _saved_beyond_inputs("lltm-sequence", sequence_size, inputs_grad)
    loop = _saved_beyond_inputs("lltm-loop", sequence_size, inputs_grad)
    lstm = _saved_beyond_inputs("lstm", sequence_size, inputs_grad)
    # Every step's new_h (the output), activated gates and new_cell.
    assert ours == t * b * (s + 3 * s + s) * itemsize
    # A loop of lltm.LLTM keeps the same per step, but for the last step's
    # new_h, which no later step takes as its input.
    assert ours == loop + b * s * itemsize
    # nn.LSTM keeps at least its four gates, the cell and the output.
    assert ours < lstm, f"{ours} bytes vs nn.LSTM's {lstm}"


def test_sequence_saved_tensors_are_its_outputs_gates_and_cells():
    generator = torch.Generator().manual_seed(1)
    inputs = [
        torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_()
        for shape in [(3, 4, 2), (15, 7), (15,), (4, 5), (4, 5)]
    ]
    saved, (output, _) = _saved_tensors(lltm.lltm_sequence, inputs)
    _, _, _, gates, cells = torch.ops.lltm.sequence_forward(
        *[t.detach() for t in inputs], None, False
    )
    assert sorted(tuple(t.shape) for t in saved) == [(3, 4, 5), (3, 4, 5), (3, 4, 15)]
    [saved_gates] = [t for t in saved if t.shape[-1] == 15]
    torch.testing.assert_close(saved_gates, gates, rtol=0, atol=0)
    states = [t for t in saved if t.shape[-1] == 5]
    expected = [output.detach(), cells]
    for got in states:
        assert any(torch.equal(got, e) for e in expected)
    assert not torch.equal(states[0], states[1])
