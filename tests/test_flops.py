"""FlopCounterMode counts what lltm's kernels compute: the formulas, checked by hand.

torch counts 2 FLOPs per multiply-add of a matrix product and nothing for
pointwise work (the families' fake.py, lltm/ops); B batch, F features, S state, T steps.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_inputs
from torch.nn.utils.rnn import pack_sequence
from torch.utils.flop_counter import FlopCounterMode

import lltm

B, F, S, T = 3, 4, 5, 6


def _counted(fn) -> dict[str, int]:
    """FLOPs per lltm operator (and in all, under "total") of one call of fn."""
    with FlopCounterMode(display=False) as counter:
        fn()
    per_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    return {**per_op, "total": counter.get_total_flops()}


def _leaves(*tensors, grad=(True,) * 5):
    return [t.detach().requires_grad_(g) for t, g in zip(tensors, grad, strict=True)]


FORWARD = 2 * B * (S + F) * 3 * S  # [old_h, input] @ W^T
WEIGHTS_GRAD = 2 * 3 * S * B * (S + F)  # d_gates^T @ [old_h, input]


def test_cell_forward():
    counted = _counted(lambda: lltm.lltm_cell(*make_inputs(B, F, S)))
    assert counted == {"lltm.forward": FORWARD, "total": FORWARD}


@pytest.mark.parametrize(
    ("grad", "backward"),
    [
        # The tutorial's configuration: the parameters' gradients only.
        ((False, True, True, False, False), WEIGHTS_GRAD),
        # Everything: d_gates @ W, all of it, for old_h and input.
        ((True,) * 5, WEIGHTS_GRAD + 2 * B * 3 * S * (S + F)),
        # The state's gradients only (a frozen cell): d_gates @ W_h.
        ((False, False, False, True, True), 2 * B * 3 * S * S),
        # The input's only: d_gates @ W_x.
        ((True, False, False, False, False), 2 * B * 3 * S * F),
    ],
)
def test_cell_forward_and_backward(grad, backward):
    def step():
        new_h, new_cell = lltm.lltm_cell(*_leaves(*make_inputs(B, F, S), grad=grad))
        (new_h.sum() + new_cell.sum()).backward()

    counted = _counted(step)
    assert counted == {
        "lltm.forward": FORWARD,
        "lltm.backward": backward,
        "total": FORWARD + backward,
    }


def test_the_module_and_nn_lstmcell_are_both_counted():
    x, h, c = torch.randn(B, F), torch.randn(B, S), torch.randn(B, S)
    ours = _counted(lambda: lltm.LLTM(F, S)(x, (h, c)))["total"]
    theirs = _counted(lambda: torch.nn.LSTMCell(F, S)(x, (h, c)))["total"]
    # Three gates to the LSTM's four, from the same operands.
    assert ours == FORWARD and theirs == FORWARD // 3 * 4


def _sequence_inputs():
    _, weights, bias, old_h, old_cell = make_inputs(B, F, S)
    return torch.randn(T, B, F, dtype=torch.float64), weights, bias, old_h, old_cell


SEQUENCE_FORWARD = 2 * T * B * (S + F) * 3 * S


@pytest.mark.parametrize("state_grad", [True, False])
def test_sequence(state_grad):
    grad = (True, True, True, state_grad, state_grad)

    def step():
        output, (h_n, c_n) = lltm.lltm_sequence(*_leaves(*_sequence_inputs(), grad=grad))
        (output.sum() + h_n.sum() + c_n.sum()).backward()

    # The recurrence carries d_gates_t @ W_h back through every step, and
    # into old_h only when its gradient is wanted.
    carried = T * B if state_grad else (T - 1) * B
    backward = 2 * carried * 3 * S * S + 2 * 3 * S * T * B * (S + F) + 2 * T * B * 3 * S * F
    counted = _counted(step)
    assert counted == {
        "lltm.sequence_forward": SEQUENCE_FORWARD,
        "lltm.sequence_backward": backward,
        "total": SEQUENCE_FORWARD + backward,
    }


def test_packed_bidirectional_sequences():
    lengths = [6, 4, 1]
    module = lltm.LLTMSequence(F, S, bidirectional=True).double()
    sequences = [torch.randn(n, F, dtype=torch.float64) for n in lengths]
    packed = pack_sequence(sequences)
    rows = sum(lengths)

    def step():
        output, _ = module(packed)
        output.data.sum().backward()

    # Each direction: the products of every row; its backward carries the
    # gradient through every step but the first it runs (old_h, the zeros the
    # module starts from, needs none): forward direction's first step has all
    # 3 sequences, the reverse direction's first (the last step) only 1.
    forward = 2 * rows * (S + F) * 3 * S
    gradients = 2 * 3 * S * rows * (S + F)  # the weights'; the input needs none
    backward = (2 * (rows - 3) * 3 * S * S + gradients) + (2 * (rows - 1) * 3 * S * S + gradients)
    counted = _counted(step)
    assert counted["lltm.sequence_forward"] == 2 * forward
    assert counted["lltm.sequence_backward"] == backward


def test_sequence_gate_grads():
    args = _sequence_inputs()
    output, _h_n, _c_n, gates, cells = torch.ops.lltm.sequence_forward(*args, None, False)
    input, weights, _, old_h, _ = args
    counted = _counted(
        lambda: torch.ops.lltm.sequence_gate_grads(
            torch.ones_like(output),
            None,
            None,
            output,
            gates,
            cells,
            input,
            weights,
            old_h,
            None,
            False,
        )
    )
    assert counted == {
        "lltm.sequence_gate_grads": 2 * T * B * 3 * S * S,
        "total": 2 * T * B * 3 * S * S,
    }
