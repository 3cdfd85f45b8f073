"""Autocast: inside a region lltm's ops run as nn.LSTM's do (arguments cast to
the region's dtype, outputs in it, float32 parameters' gradients in float32),
eager, compiled and exported."""

from __future__ import annotations

import pytest
import torch
from conftest import GRAD_NAMES, assert_all_close, make_inputs

import lltm

DTYPES = [torch.bfloat16, torch.float16]


def _cell(*args):
    return lltm.lltm_cell(*args)


def _op(*args):
    return torch.ops.lltm.forward(*args)[:2]


def _sequence(input, *args):
    output, (h_n, c_n) = lltm.lltm_sequence(input, *args)
    return output, h_n, c_n


ENTRIES = {"lltm_cell": _cell, "registered_op": _op, "lltm_sequence": _sequence}


def _args(entry, dtype=torch.float32, seed=0):
    args = make_inputs(4, 6, 8, dtype=dtype, requires_grad=True, seed=seed)
    if entry == "lltm_sequence":
        steps = torch.randn(5, 4, 6, generator=torch.Generator().manual_seed(seed), dtype=dtype)
        args[0] = steps.requires_grad_()
    return args


def _run(fn, args, cotangent_seed=1):
    outputs = fn(*args)
    generator = torch.Generator().manual_seed(cotangent_seed)
    cotangents = [torch.randn(o.shape, generator=generator).to(o.dtype) for o in outputs]
    grads = torch.autograd.grad(outputs, args, cotangents)
    return [o.detach() for o in outputs], list(grads)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("entry", ENTRIES)
def test_region_casts_like_torch(entry, dtype):
    # Inside the region: exactly the op on arguments cast to the region's
    # dtype by hand, outputs in that dtype, gradients of the float32 leaves
    # in float32 (through the casts).
    fn, args = ENTRIES[entry], _args(entry)
    with torch.autocast("cpu", dtype=dtype):
        outputs, grads = _run(fn, args)
    by_hand, by_hand_grads = _run(lambda *a: fn(*(t.to(dtype) for t in a)), args)
    assert all(o.dtype == dtype for o in outputs)
    assert all(g.dtype == torch.float32 for g in grads)
    assert_all_close(outputs, by_hand, [f"output {i}" for i in range(len(outputs))], rtol=0, atol=0)
    assert_all_close(grads, by_hand_grads, GRAD_NAMES, rtol=0, atol=0)


@pytest.mark.parametrize("entry", ["lltm_cell", "lltm_sequence"])
def test_in_a_region_an_entry_point_enters_its_operator_once(entry):
    # In a region and no other mode an entry point casts the arguments as
    # the operator's Autocast kernel would and applies the autograd Function
    # itself: the operator is entered once (its CPU kernel), not at the
    # Autocast, Autograd and CPU keys in turn.
    fn, args = ENTRIES[entry], _args(entry)
    name = "lltm::forward" if entry == "lltm_cell" else "lltm::sequence_forward"
    activities = [torch.profiler.ProfilerActivity.CPU]
    region = torch.autocast("cpu", dtype=torch.bfloat16)
    with torch.profiler.profile(activities=activities) as profile, region:
        outputs = fn(*args)
    assert all(o.dtype == torch.bfloat16 and o.requires_grad for o in outputs)
    assert [e.name for e in profile.events()].count(name) == 1


def test_modules_under_autocast_train_in_float32_parameters():
    torch.manual_seed(0)
    cell, sequence = lltm.LLTM(6, 8), lltm.LLTMSequence(6, 8, 2, batch_first=True)
    x = torch.randn(3, 5, 6)
    h, c = torch.zeros(3, 8), torch.zeros(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        new_h, new_c = cell(x[:, 0], (h, c))
        output, (h_n, c_n) = sequence(x)
        loss = new_h.float().sum() + new_c.float().sum() + output.float().pow(2).mean()
    assert {t.dtype for t in (new_h, new_c, output, h_n, c_n)} == {torch.bfloat16}
    loss.backward()
    for p in [*cell.parameters(), *sequence.parameters()]:
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_float64_and_backward_inside_the_region():
    # float64 is never cast (torch's policy), and a backward that runs
    # inside the region gets what the forward saved.
    args = _args("lltm_cell", dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs, grads = _run(_cell, args)
    expected, expected_grads = _run(_cell, args)
    assert all(o.dtype == torch.float64 for o in outputs)
    assert_all_close(outputs + grads, expected + expected_grads, ["h", "c", *GRAD_NAMES])


def test_mixed_dtypes_outside_autocast_are_an_error():
    args = make_inputs(2, 3, 4, dtype=torch.float32)
    args[0] = args[0].bfloat16()
    with pytest.raises(ValueError, match=r"lltm: weights has dtype torch\.float32 but input has"):
        lltm.lltm_cell(*args)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("entry", ["lltm_cell", "lltm_sequence"])
def test_compiled_region_matches_eager(entry):
    fn = ENTRIES[entry]

    def in_region(*args):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(*args)

    args = _args(entry, seed=2)
    compiled = torch.compile(in_region, backend="aot_eager", fullgraph=True)
    outputs, grads = _run(compiled, args)
    expected, expected_grads = _run(in_region, args)
    assert all(o.dtype == torch.bfloat16 for o in outputs)
    names = [f"output {i}" for i in range(len(outputs))] + list(GRAD_NAMES)
    assert_all_close(outputs + grads, expected + expected_grads, names)


class _MixedPrecisionModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        self.rnn = lltm.LLTMSequence(8, 16, 2, batch_first=True)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output, _ = self.rnn(torch.tanh(self.encoder(x)))
            return self.head(output[:, -1]).float()


def test_exported_region_matches_eager():
    torch.manual_seed(0)
    model = _MixedPrecisionModel().eval()
    x = torch.randn(3, 7, 4)
    exported = torch.export.export(model, (x,))
    # The region is a wrap_with_autocast submodule holding lltm's operator.
    targets = [
        str(node.target)
        for module in exported.graph_module.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
    ]
    assert "lltm.sequence_forward.default" in targets, targets
    torch.testing.assert_close(exported.module()(x), model(x), rtol=0, atol=0)


def test_small_model_learns_under_bfloat16_autocast():
    # The sum of a sequence's values, 12 steps: a few dozen Adam steps under
    # bf16 autocast bring the loss well down, with float32 parameters.
    # (float32 -> bfloat16 casts and 16-bit CPU products are slow: small sizes.)
    torch.manual_seed(0)
    model = _MixedPrecisionModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(40):
        x = torch.rand(16, 12, 4, generator=generator)
        target = x[..., 0].sum(dim=1, keepdim=True) / 6
        loss = torch.nn.functional.mse_loss(model(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.3 * first, (first, last)
