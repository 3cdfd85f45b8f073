"""Forward-mode AD: tangents through the cell, the sequence, the modules and
the operators, held to the reference's tangents in float64.

Two ways in, both tested: ``torch.func.jvp`` and ``torch.autograd.forward_ad``
dual tensors. Every argument's tangent alone, and all together.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from conftest import ARG_NAMES, make_inputs
from oracle import module_oracle, sequence_oracle
from torch.func import functional_call, jvp

import lltm
from lltm import reference

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

TIGHT = {"rtol": 1e-10, "atol": 1e-12}
# Tangents of each argument alone, then of all five.
WRT = [(i,) for i in range(5)] + [tuple(range(5))]


def _wrt_id(wrt):
    return "all" if len(wrt) == 5 else ARG_NAMES[wrt[0]]


def _tangents_for(primals, seed=21):
    generator = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype) for p in primals
    )


def _jvp_wrt(fn, args, wrt):
    """torch.func.jvp of ``fn`` with respect to the arguments at ``wrt``."""
    primals = tuple(args[i] for i in wrt)

    def partial(*chosen):
        full = list(args)
        for i, value in zip(wrt, chosen, strict=True):
            full[i] = value
        return tuple(fn(*full))

    return jvp(partial, primals, _tangents_for(primals))


def _assert_jvp_equal(ours, theirs, names):
    (out, tangent), (ref_out, ref_tangent) = ours, theirs
    for name, a, b in zip(names, out, ref_out, strict=True):
        torch.testing.assert_close(a, b, msg=lambda m, n=name: f"{n}: {m}", **TIGHT)
    for name, a, b in zip(names, tangent, ref_tangent, strict=True):
        assert a is not None, f"no tangent for {name}"
        torch.testing.assert_close(a, b, msg=lambda m, n=name: f"tangent of {n}: {m}", **TIGHT)


def _registered_op(*args):
    new_h, new_cell, _ = torch.ops.lltm.forward(*args)
    return new_h, new_cell


CELLS = {"lltm_cell": lltm.lltm_cell, "registered_op": _registered_op}


@pytest.mark.parametrize("wrt", WRT, ids=_wrt_id)
@pytest.mark.parametrize("entry", CELLS)
def test_cell_jvp_matches_reference(entry, wrt):
    args = make_inputs(3, 4, 5)
    _assert_jvp_equal(
        _jvp_wrt(CELLS[entry], args, wrt),
        _jvp_wrt(reference.lltm_cell, args, wrt),
        ("new_h", "new_cell"),
    )


def _dual_call(fn, args, wrt):
    """fn on dual tensors (torch.autograd.forward_ad): outputs and tangents."""
    tangents = _tangents_for(tuple(args[i] for i in wrt))
    with fwAD.dual_level():
        duals = list(args)
        for i, tangent in zip(wrt, tangents, strict=True):
            duals[i] = fwAD.make_dual(args[i], tangent)
        unpacked = [fwAD.unpack_dual(t) for t in fn(*duals)]
    return tuple(u.primal for u in unpacked), tuple(u.tangent for u in unpacked)


@pytest.mark.parametrize("wrt", [(0,), (1,), (4,), tuple(range(5))], ids=_wrt_id)
@pytest.mark.parametrize("entry", CELLS)
def test_cell_dual_tensors_match_reference(entry, wrt):
    args = make_inputs(3, 4, 5, seed=1)
    _assert_jvp_equal(
        _dual_call(CELLS[entry], args, wrt),
        _dual_call(reference.lltm_cell, args, wrt),
        ("new_h", "new_cell"),
    )


def test_module_dual_tensors_match_reference():
    # The tutorial's module, parameters as dual tensors through functional_call.
    torch.manual_seed(0)
    module = lltm.LLTM(4, 5).double()
    x, _, _, h, c = make_inputs(3, 4, 5, seed=2)
    params = dict(module.named_parameters())

    def run(impl):
        def call(*values):
            named = dict(zip(params, values[:2], strict=True))
            return functional_call(impl, named, (values[2], (values[3], values[4])))

        return _dual_call(call, [*params.values(), x, h, c], tuple(range(5)))

    theirs = reference.LLTM(4, 5).double()
    _assert_jvp_equal(run(module), run(theirs), ("new_h", "new_cell"))


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 4, 5), (0, 2, 3)], ids=str)
def test_gradcheck_forward_mode(shape):
    # torch's own check: the tangents against finite differences, batched
    # tangents (vmap over jvp) included.
    inputs = make_inputs(*shape, requires_grad=True)
    for fn in (lltm.lltm_cell, torch.ops.lltm.forward):
        assert torch.autograd.gradcheck(
            fn, inputs, check_forward_ad=True, check_batched_forward_grad=True
        )


def test_forward_over_reverse():
    # Hessian-vector products the forward-AD way: dual tensors through a
    # create_graph backward.
    inputs = make_inputs(2, 3, 4, requires_grad=True, seed=4)
    assert torch.autograd.gradgradcheck(lltm.lltm_cell, inputs, check_fwd_over_rev=True)


@pytest.mark.parametrize("entry", CELLS)
def test_reverse_over_forward(entry):
    # The gradient of a directional derivative computed with dual tensors.
    def grads(cell):
        leaves = [t.clone().requires_grad_() for t in make_inputs(2, 3, 4, seed=10)]
        with fwAD.dual_level():
            duals = [
                fwAD.make_dual(t, d) for t, d in zip(leaves, _tangents_for(leaves), strict=True)
            ]
            tangents = [fwAD.unpack_dual(o).tangent for o in cell(*duals)]
        return torch.autograd.grad(sum((t * t).sum() for t in tangents), leaves)

    for ours, theirs in zip(grads(CELLS[entry]), grads(reference.lltm_cell), strict=True):
        torch.testing.assert_close(ours, theirs, **TIGHT)


def test_16_bit_tangents_are_16_bit_and_close():
    args = make_inputs(4, 6, 8, dtype=torch.bfloat16, seed=5)
    tangents = _tangents_for(args)
    _, ours = jvp(lltm.lltm_cell, tuple(args), tangents)
    _, exact = jvp(
        reference.lltm_cell, tuple(a.double() for a in args), tuple(t.double() for t in tangents)
    )
    for a, e in zip(ours, exact, strict=True):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.double(), e, rtol=0.05, atol=0.05)


# --- Sequences ------------------------------------------------------------------------

SEQUENCE_CASES = {
    "padded": (None, False),
    "padded_reverse": (None, True),
    "packed": ([4, 3, 3, 1], False),
    "packed_reverse": ([4, 3, 3, 1], True),
    "no_steps": (None, False),  # a padded sequence of length 0
    "no_steps_reverse": (None, True),
}


def _sequence_args(case, seed=6):
    lengths, reverse = SEQUENCE_CASES[case]
    _, weights, bias, h, c = make_inputs(4, 3, 5, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    if lengths is None:
        steps = 0 if case.startswith("no_steps") else 5
        data = torch.randn(steps, 4, 3, generator=generator, dtype=torch.float64)
        batch_sizes = None
    else:
        batch_sizes = torch.tensor(lengths)
        data = torch.randn(sum(lengths), 3, generator=generator, dtype=torch.float64)
    return [data, weights, bias, h, c], batch_sizes, reverse


@pytest.mark.parametrize("wrt", WRT, ids=_wrt_id)
@pytest.mark.parametrize("case", SEQUENCE_CASES)
def test_sequence_jvp_matches_reference(case, wrt):
    args, batch_sizes, reverse = _sequence_args(case)
    names = ("output", "h_n", "c_n")
    theirs = _jvp_wrt(lambda *a: sequence_oracle(*a, batch_sizes, reverse), args, wrt)
    entries = {
        "lltm_sequence": lambda *a: lltm.ops.sequence(*a, batch_sizes, reverse),
        "registered_op": lambda *a: torch.ops.lltm.sequence_forward(*a, batch_sizes, reverse)[:3],
    }
    for entry, fn in entries.items():
        try:
            _assert_jvp_equal(_jvp_wrt(fn, args, wrt), theirs, names)
        except AssertionError as error:
            raise AssertionError(f"{entry}: {error}") from None


@pytest.mark.parametrize("case", ["padded", "packed_reverse"])
def test_sequence_dual_tensors_match_reference(case):
    args, batch_sizes, reverse = _sequence_args(case, seed=7)
    everything = tuple(range(5))
    _assert_jvp_equal(
        _dual_call(lambda *a: lltm.ops.sequence(*a, batch_sizes, reverse), args, everything),
        _dual_call(lambda *a: sequence_oracle(*a, batch_sizes, reverse), args, everything),
        ("output", "h_n", "c_n"),
    )


def test_sequence_gradcheck_forward_mode():
    # Small: gradgradcheck differentiates every first-order gradient entry.
    _, weights, bias, h, c = make_inputs(3, 2, 3, seed=8)
    batch_sizes, reverse = torch.tensor([3, 2, 1]), True
    data = torch.randn(6, 2, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    args = [a.requires_grad_() for a in (data, weights, bias, h, c)]
    assert torch.autograd.gradcheck(
        lambda *a: lltm.ops.sequence(*a, batch_sizes, reverse),
        args,
        check_forward_ad=True,
        check_batched_forward_grad=True,
    )
    assert torch.autograd.gradgradcheck(
        lambda *a: lltm.ops.sequence(*a, batch_sizes, reverse), args, check_fwd_over_rev=True
    )


MODULE_KINDS = {
    "plain": {},
    "layers_bidirectional": {"num_layers": 2, "bidirectional": True},
    "no_bias": {"bias": False, "num_layers": 2},
}


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_module_jvp_matches_reference(kind, packed):
    # Tangents of every parameter, the input and the initial state at once.
    torch.manual_seed(0)
    module = lltm.LLTMSequence(3, 4, **MODULE_KINDS[kind]).double()
    layers = module.num_layers * module.directions
    generator = torch.Generator().manual_seed(9)
    h_0 = torch.randn(layers, 3, 4, generator=generator, dtype=torch.float64)
    c_0 = torch.randn(layers, 3, 4, generator=generator, dtype=torch.float64)
    if packed:
        batch_sizes = torch.tensor([3, 2, 2, 1])
        x = torch.randn(8, 3, generator=generator, dtype=torch.float64)
    else:
        batch_sizes = None
        x = torch.randn(4, 3, 3, generator=generator, dtype=torch.float64)
    params = dict(module.named_parameters())
    names = list(params)

    def ours(*values):
        named = dict(zip(names, values[:-3], strict=True))
        data, h, c = values[-3:]
        given = torch.nn.utils.rnn.PackedSequence(data, batch_sizes) if packed else data
        output, (h_n, c_n) = functional_call(module, named, (given, (h, c)))
        return (output.data if packed else output), h_n, c_n

    def theirs(*values):
        named = dict(zip(names, values[:-3], strict=True))
        return module_oracle(module, named, *values[-3:], batch_sizes)

    args = [*params.values(), x, h_0, c_0]
    everything = tuple(range(len(args)))
    _assert_jvp_equal(
        _jvp_wrt(ours, args, everything),
        _jvp_wrt(theirs, args, everything),
        ("output", "h_n", "c_n"),
    )
