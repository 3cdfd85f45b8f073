"""lltm.LLTM is a drop-in replacement for the tutorial's module (reference.LLTM)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.utils.parametrize
import torch.nn.utils.prune
from conftest import (
    assert_all_close,
    assert_as_accurate_as_reference,
    make_grad_outputs,
    make_inputs,
)

import lltm
from lltm import reference


def _pair(features=5, state=7, seed=0):
    """(lltm.LLTM, reference.LLTM) in float64 holding the same parameters."""
    torch.manual_seed(seed)
    ours = lltm.LLTM(features, state).double()
    theirs = reference.LLTM(features, state).double()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def test_parameters_are_the_tutorials():
    rnn = lltm.LLTM(input_features=32, state_size=128)
    assert rnn.input_features == 32
    assert rnn.state_size == 128
    shapes = {name: tuple(p.shape) for name, p in rnn.named_parameters()}
    assert shapes == {"weights": (3 * 128, 32 + 128), "bias": (3 * 128,)}
    assert all(p.dtype == torch.float32 and p.requires_grad for p in rnn.parameters())
    assert list(rnn.state_dict()) == list(reference.LLTM(32, 128).state_dict())
    assert "input_features=32" in repr(rnn) and "state_size=128" in repr(rnn)


@pytest.mark.parametrize("state", [1, 4, 128])
def test_init_is_uniform_within_tutorial_bounds(state):
    torch.manual_seed(0)
    rnn = lltm.LLTM(input_features=16, state_size=state)
    bound = 1.0 / math.sqrt(state)
    for name, p in rnn.named_parameters():
        assert p.abs().max() <= bound, name
        if p.numel() >= 1000:
            # Uniform(-b, b): fills the interval, mean 0, variance b^2 / 3.
            assert p.max() > 0.95 * bound and p.min() < -0.95 * bound, name
            assert abs(p.mean().item()) < 0.05 * bound, name
            assert p.var().item() == pytest.approx(bound**2 / 3, rel=0.1), name


def test_same_seed_same_init_as_tutorial():
    # The tutorial draws weights, then bias, from one uniform_ each: the same
    # global seed must give the same parameters.
    torch.manual_seed(3)
    ours = lltm.LLTM(6, 9)
    torch.manual_seed(3)
    theirs = reference.LLTM(6, 9)
    assert_all_close(
        list(ours.parameters()), list(theirs.parameters()), ("weights", "bias"), rtol=0, atol=0
    )


def test_reference_state_dict_loads_and_matches():
    torch.manual_seed(1)
    theirs = reference.LLTM(5, 7).double()
    ours = lltm.LLTM(5, 7).double()
    ours.load_state_dict(theirs.state_dict())  # strict: same keys and shapes
    x, _, _, h, c = make_inputs(4, 5, 7, requires_grad=True)
    _assert_same_step(ours, theirs, x, h, c)


def test_state_dict_loads_back_into_reference():
    ours, _ = _pair(seed=2)
    theirs = reference.LLTM(5, 7).double()
    theirs.load_state_dict(ours.state_dict())
    x, _, _, h, c = make_inputs(3, 5, 7, requires_grad=True)
    _assert_same_step(ours, theirs, x, h, c)


def test_state_dict_of_wrong_size_is_rejected():
    with pytest.raises(RuntimeError, match="size mismatch"):
        lltm.LLTM(5, 7).load_state_dict(reference.LLTM(5, 8).state_dict())


def _assert_same_step(ours, theirs, x, h, c):
    """One call, ``new_h, new_c = rnn(x, (h, c))``: outputs and every grad."""
    results = []
    for rnn in (ours, theirs):
        rnn.zero_grad()
        leaves = [t.detach().clone().requires_grad_() for t in (x, h, c)]
        new_h, new_c = rnn(leaves[0], (leaves[1], leaves[2]))
        (new_h * 3 - new_c).sum().backward()
        results.append([new_h, new_c, *(t.grad for t in leaves), rnn.weights.grad, rnn.bias.grad])
    names = ("new_h", "new_c", "grad_x", "grad_h", "grad_c", "grad_weights", "grad_bias")
    assert_all_close(results[0], results[1], names)


@pytest.mark.parametrize("batch", [0, 1, 16])
def test_call_convention_and_outputs(batch):
    ours, theirs = _pair()
    x, _, _, h, c = make_inputs(batch, 5, 7)
    out = ours(x, (h, c))
    assert isinstance(out, tuple) and len(out) == 2
    new_h, new_c = out
    assert new_h.shape == new_c.shape == (batch, 7)
    assert_all_close(out, theirs(x, (h, c)), ("new_h", "new_c"))


def test_sequence_loop_matches_reference():
    # The tutorial's usage: the state of one step feeds the next; gradients
    # flow back through every step into the parameters and the first state.
    ours, theirs = _pair(features=6, state=10, seed=4)
    generator = torch.Generator().manual_seed(5)
    xs = torch.randn(12, 3, 6, generator=generator, dtype=torch.float64)
    h0 = torch.randn(3, 10, generator=generator, dtype=torch.float64)
    c0 = torch.randn(3, 10, generator=generator, dtype=torch.float64)

    def unroll(rnn):
        rnn.zero_grad()
        h, c = h0.clone().requires_grad_(), c0.clone().requires_grad_()
        state, hs = (h, c), []
        for x in xs:
            state = rnn(x, state)
            hs.append(state[0])
        loss = torch.stack(hs).pow(2).sum() + state[1].sum()
        loss.backward()
        return [torch.stack(hs), state[1], h.grad, c.grad, rnn.weights.grad, rnn.bias.grad]

    names = ("hs", "final_c", "grad_h0", "grad_c0", "grad_weights", "grad_bias")
    assert_all_close(unroll(ours), unroll(theirs), names)


def test_float32_module_matches_reference():
    torch.manual_seed(6)
    ours = lltm.LLTM(32, 128)
    theirs = reference.LLTM(32, 128)
    theirs.load_state_dict(ours.state_dict())
    x, _, _, h, c = make_inputs(16, 32, 128, dtype=torch.float32)
    assert_all_close(ours(x, (h, c)), theirs(x, (h, c)), ("new_h", "new_c"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_module_moves_with_to(dtype):
    # .to(dtype) moves the parameters, and the module then computes in that
    # dtype as accurately as the reference module moved alike.
    torch.manual_seed(7)
    ours = lltm.LLTM(32, 128)
    theirs = reference.LLTM(32, 128)
    theirs.load_state_dict(ours.state_dict())
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    assert all(p.dtype == dtype for p in ours.parameters())
    exact = reference.LLTM(32, 128).double()
    exact.load_state_dict(ours.state_dict())  # the rounded values, in float64
    x, _, _, h, c = make_inputs(16, 32, 128, dtype=dtype)

    def step(module, cast=lambda t: t):
        module.zero_grad()
        new_h, new_c = module(cast(x), (cast(h), cast(c)))
        # Rounded to `dtype` for every module: the oracle sees the same values.
        upstream = [g.to(dtype).to(g.dtype) for g in make_grad_outputs(new_h, new_c)]
        torch.autograd.backward((new_h, new_c), upstream)
        return [new_h.detach(), new_c.detach(), module.weights.grad, module.bias.grad]

    result = step(ours)
    assert all(t.dtype == dtype for t in result)
    assert_as_accurate_as_reference(
        ("new_h", "new_c", "grad_weights", "grad_bias"),
        result,
        step(theirs),
        step(exact, lambda t: t.double()),
        dtype,
    )


class _Doubled(torch.nn.Module):
    def forward(self, weights):
        return 2 * weights


def _doubled_weights(module):
    torch.nn.utils.parametrize.register_parametrization(module, "weights", _Doubled())


def _pruned_weights(module):
    mask = torch.ones_like(module.weights)
    mask[::2, 1::3] = 0
    torch.nn.utils.prune.custom_from_mask(module, "weights", mask)


def _assigned_weights(module):
    module.weights = torch.nn.Parameter(2 * module.weights.detach())


def _no_bias(module):
    module.bias = None


@pytest.mark.parametrize(
    "change",
    [_doubled_weights, _pruned_weights, _assigned_weights, _no_bias],
    ids=["parametrize", "prune", "assigned", "bias-none"],
)
def test_parameters_are_read_where_torch_keeps_them(change):
    # lltm.LLTM reads its parameters from the module's parameter dict when
    # they are there; wherever torch's utilities move them, the module must
    # compute with what the attribute gives, as the reference does.
    ours, theirs = _pair()
    for module in (ours, theirs):
        change(module)
    x, _, _, h, c = make_inputs(3, 5, 7)

    def step(module):
        new_h, new_c = module(x, (h, c))
        leaves = list(module.parameters())
        grads = torch.autograd.grad((new_h, new_c), leaves, make_grad_outputs(new_h, new_c))
        return [new_h, new_c, *grads]

    expected = step(theirs)
    assert len(expected) == 2 + len(list(ours.parameters()))
    assert_all_close(step(ours), expected, [f"output {i}" for i in range(len(expected))])


def test_functional_call_replaces_the_parameters():
    ours, theirs = _pair()
    x, _, _, h, c = make_inputs(3, 5, 7)
    replaced = {name: 2 * p.detach() for name, p in ours.named_parameters()}
    result = torch.func.functional_call(ours, replaced, (x, (h, c)))
    expected = torch.func.functional_call(theirs, replaced, (x, (h, c)))
    assert_all_close(result, expected, ("new_h", "new_c"))
    # The replacements, not the module's own parameters, were used; and the
    # module's own are back afterwards.
    assert not torch.allclose(result[0], ours(x, (h, c))[0])
    assert_all_close(ours(x, (h, c)), theirs(x, (h, c)), ("new_h", "new_c"))
