"""LLTMSequence takes nn.LSTM's constructor: its arguments in its order, with
nn.LSTM's meaning (bias, dropout, device, dtype), and flatten_parameters."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import lltm

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

# nn.LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
#         dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None)
NN_LSTM_ORDER = [
    "num_layers",
    "bias",
    "batch_first",
    "dropout",
    "bidirectional",
    "proj_size",
    "device",
    "dtype",
]


def test_arguments_in_nn_lstm_order():
    names = list(inspect.signature(lltm.LLTMSequence).parameters)
    assert names == ["input_features", "state_size", *NN_LSTM_ORDER]
    # The same positional call configures both alike.
    args = (5, 6, 2, False, True, 0.25, True)
    ours, theirs = lltm.LLTMSequence(*args), torch.nn.LSTM(*args)
    for name in ("num_layers", "batch_first", "dropout", "bidirectional"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert (ours.input_size, ours.hidden_size) == (theirs.input_size, theirs.hidden_size)
    assert ours.has_bias == theirs.bias is False


def _module(**kwargs):
    torch.manual_seed(0)
    return lltm.LLTMSequence(3, 4, **kwargs).double()


class _RecordBias(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.biases = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "lltm" and "forward" in func.__name__:
            self.biases.append(args[2])
        return func(*args, **(kwargs or {}))


def test_no_bias_means_no_parameter_and_no_bias_work():
    module = _module(num_layers=2, bidirectional=True, bias=False)
    assert [n for n, _ in module.named_parameters() if "bias" in n] == []
    assert not module.has_bias and "bias=False" in repr(module)
    x = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with _RecordBias() as recorder:
        output, (h_n, c_n) = module(x)
    # The kernels get no bias to add, in every layer and direction.
    assert recorder.biases == [None] * 4
    # ... and compute what a zero bias computes.
    with_zero_bias = _module(num_layers=2, bidirectional=True)
    with torch.no_grad():
        for name, p in with_zero_bias.named_parameters():
            p.copy_(getattr(module, name) if "weights" in name else torch.zeros_like(p))
    expected, (expected_h, expected_c) = with_zero_bias(x)
    torch.testing.assert_close((output, h_n, c_n), (expected, expected_h, expected_c))
    # Gradients flow to the weights as usual.
    output.sum().backward()
    assert all(p.grad is not None for p in module.parameters())
    # Frozen (nothing requires grad, grad mode on): the same outputs, no graph.
    module.requires_grad_(False)
    frozen, (frozen_h, frozen_c) = module(x)
    torch.testing.assert_close((frozen, frozen_h, frozen_c), (output, h_n, c_n))
    assert frozen.grad_fn is None


def test_a_cell_without_bias_when_nothing_requires_grad():
    x, weights, bias, h, c = lltm.reference.example_inputs(2, 3, 4)
    new_h, new_cell = lltm.lltm_cell(x, weights, None, h, c)
    expected = lltm.reference.lltm_cell(x, weights, torch.zeros_like(bias), h, c)
    torch.testing.assert_close((new_h, new_cell), expected)
    assert new_h.grad_fn is None


def test_no_bias_when_nothing_requires_grad():
    # Grad mode on, no tensor requiring grad: the eager path asks each argument
    # whether autograd needs a graph, and a bias of None is no tensor to ask.
    args = lltm.reference.example_inputs()
    args[2] = None
    new_h, new_cell = lltm.lltm_cell(*args)
    torch.testing.assert_close((new_h, new_cell), lltm.reference.lltm_cell(*args))
    input, weights, _, old_h, old_cell = args
    output, (h_n, c_n) = lltm.lltm_sequence(input[None], weights, None, old_h, old_cell)
    torch.testing.assert_close((output[0], h_n, c_n), (new_h, new_h, new_cell))
    # A module without bias whose parameters are frozen, as for inference.
    module = _module(bias=False).requires_grad_(False)
    x = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = _module(bias=False)(x)
    torch.testing.assert_close(module(x), expected)


def _layer_by_layer(module, x, dropout):
    """The module's output computed layer by layer with lltm_sequence, with
    F.dropout between layers, the order in which the module draws masks."""
    layer_input = x
    for layer in range(module.num_layers):
        outputs = []
        for direction in range(module.directions):
            weights_name, bias_name = module._parameter_names[layer * module.directions + direction]
            zeros = x.new_zeros(x.shape[1], module.state_size)
            output, _, _ = lltm.ops.sequence(
                layer_input,
                getattr(module, weights_name),
                getattr(module, bias_name),
                zeros,
                zeros,
                None,
                direction == 1,
            )
            outputs.append(output)
        layer_input = torch.cat(outputs, dim=-1)
        if layer < module.num_layers - 1:
            layer_input = F.dropout(layer_input, dropout, training=True)
    return layer_input


def test_dropout_between_layers_in_training_mode_only():
    module = _module(num_layers=3, bidirectional=True, dropout=0.5)
    x = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.manual_seed(7)
    trained, _ = module(x)
    torch.manual_seed(7)
    torch.testing.assert_close(trained, _layer_by_layer(module, x, 0.5))
    # Evaluation: no dropout at all, the same as without it.
    module.eval()
    without = _module(num_layers=3, bidirectional=True)
    without.load_state_dict(module.state_dict())
    torch.testing.assert_close(module(x)[0], without(x)[0], rtol=0, atol=0)
    assert not torch.equal(trained, module(x)[0])


def test_dropout_arguments():
    with pytest.warns(UserWarning, match="every layer but the last"):
        lltm.LLTMSequence(3, 4, dropout=0.2)
    for bad in (-0.1, 1.5, "0.1", True):
        with pytest.raises(ValueError, match="lltm: LLTMSequence dropout must be a number in"):
            lltm.LLTMSequence(3, 4, 2, dropout=bad)


def test_projection_is_a_clear_error():
    with pytest.raises(ValueError, match="has no projection: proj_size must be 0, got 2"):
        lltm.LLTMSequence(3, 4, proj_size=2)


@pytest.mark.parametrize("module_type", ["cell", "sequence"])
def test_device_and_dtype(module_type):
    def make(**factory):
        if module_type == "cell":
            return lltm.LLTM(3, 4, **factory)
        return lltm.LLTMSequence(3, 4, 2, **factory)

    assert {p.dtype for p in make(dtype=torch.float64).parameters()} == {torch.float64}
    on_meta = make(device="meta")
    assert {p.device.type for p in on_meta.parameters()} == {"meta"}
    # Made on meta, then materialised: the initialisation runs on the target.
    materialised = on_meta.to_empty(device="cpu")
    materialised.reset_parameters()
    assert all(torch.isfinite(p).all() for p in materialised.parameters())


def test_flatten_parameters_is_a_documented_no_op():
    module = _module(num_layers=2)
    before = {n: p for n, p in module.named_parameters()}
    assert module.flatten_parameters() is None
    assert {n: p for n, p in module.named_parameters()} == before
    assert "nothing to flatten" in module.flatten_parameters.__doc__
