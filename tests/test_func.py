"""torch.func: grad, vjp, jacrev, jacfwd, hessian, functional_call and vmap
over lltm's cell, sequence and modules, held to the reference in float64;
per-sample gradients and ensembles against loops."""

from __future__ import annotations

import pytest
import torch
from conftest import ARG_NAMES, make_inputs
from oracle import sequence_oracle
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, vjp, vmap

import lltm
from lltm import reference

# Each test runs against lltm's CPU kernels and the CUDA sources built for
# the host (conftest.py's `kernels`).
pytestmark = pytest.mark.usefixtures("kernels")

TIGHT = {"rtol": 1e-10, "atol": 1e-12}
ALL = tuple(range(5))


def _close(ours, theirs, what):
    ours, theirs = torch.utils._pytree.tree_leaves(ours), torch.utils._pytree.tree_leaves(theirs)
    assert len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        torch.testing.assert_close(a, b, msg=lambda m, i=i: f"{what}[{i}]: {m}", **TIGHT)


def _loss(cell):
    # Both outputs, non-linearly: second derivatives see every path.
    def loss(*args):
        new_h, new_cell = cell(*args)
        return (new_h * new_cell).sum() + new_cell.pow(2).sum()

    return loss


def _op_cell(*args):
    new_h, new_cell, _ = torch.ops.lltm.forward(*args)
    return new_h, new_cell


CELLS = {"lltm_cell": lltm.lltm_cell, "registered_op": _op_cell}

TRANSFORMS = {
    "grad": lambda f: grad(_loss(f), argnums=ALL),
    "vjp": lambda f: lambda *a: vjp(f, *a)[1](tuple(o.cos() for o in f(*a))),
    "jacrev": lambda f: jacrev(f, argnums=ALL),
    "jacfwd": lambda f: jacfwd(f, argnums=ALL),
    "hessian": lambda f: hessian(_loss(f), argnums=ALL),
    "jacrev_jacrev": lambda f: jacrev(jacrev(_loss(f), argnums=1), argnums=(0, 3)),
    "jacfwd_jacfwd": lambda f: jacfwd(jacfwd(_loss(f), argnums=1), argnums=(0, 3)),
    # Reverse mode over forward mode: the gradient of a directional derivative.
    "grad_of_jvp": lambda f: grad(
        lambda *a: sum(t.sum() for t in torch.func.jvp(f, a, tuple(x.sin() for x in a))[1]),
        argnums=ALL,
    ),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("entry", CELLS)
def test_cell_transforms_match_reference(entry, transform):
    args = make_inputs(2, 3, 4)
    make = TRANSFORMS[transform]
    _close(make(CELLS[entry])(*args), make(reference.lltm_cell)(*args), transform)


def _batched(args, dims, size=3, seed=31):
    """``args`` with a vmapped dimension of ``size`` added at 0 where ``dims``
    says so."""
    generator = torch.Generator().manual_seed(seed)
    out = list(args)
    for i, dim in enumerate(dims):
        if dim is not None:
            noise = torch.randn((size, *args[i].shape), generator=generator, dtype=args[i].dtype)
            out[i] = args[i] + 0.3 * noise
    return out


# vmap over each argument alone, then over all of them.
IN_DIMS = [tuple(0 if j == i else None for j in range(5)) for i in range(5)] + [(0,) * 5]


def _dims_id(dims):
    return "all" if all(d == 0 for d in dims) else ARG_NAMES[dims.index(0)]


@pytest.mark.parametrize("in_dims", IN_DIMS, ids=_dims_id)
def test_cell_vmap_matches_reference(in_dims):
    args = _batched(make_inputs(2, 3, 4, seed=1), in_dims)
    _close(
        vmap(lltm.lltm_cell, in_dims=in_dims)(*args),
        vmap(reference.lltm_cell, in_dims=in_dims)(*args),
        "vmap",
    )
    _close(
        vmap(grad(_loss(lltm.lltm_cell), argnums=ALL), in_dims=in_dims)(*args),
        vmap(grad(_loss(reference.lltm_cell), argnums=ALL), in_dims=in_dims)(*args),
        "vmap(grad)",
    )


def test_cell_nested_vmap_and_other_dims():
    args = make_inputs(2, 3, 4, seed=2)
    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    # vmapped dimension 1 of the input, then a vmap of a vmap.
    _close(
        vmap(lltm.lltm_cell, in_dims=(1, None, None, None, None))(x, *args[1:]),
        vmap(reference.lltm_cell, in_dims=(1, None, None, None, None))(x, *args[1:]),
        "in_dims=1",
    )
    stacked = _batched(args, (0, None, 0, 0, None), size=2)
    stacked = [
        t.unsqueeze(0).expand(3, *t.shape) if i in (0, 2, 3) else t for i, t in enumerate(stacked)
    ]
    nested = (0, None, 0, 0, None)
    _close(
        vmap(vmap(lltm.lltm_cell, in_dims=nested), in_dims=nested)(*stacked),
        vmap(vmap(reference.lltm_cell, in_dims=nested), in_dims=nested)(*stacked),
        "vmap(vmap)",
    )


SEQUENCE_CASES = {
    "padded": (None, False),
    "padded_reverse": (None, True),
    "packed": ([3, 2, 2, 1], False),
    "packed_reverse": ([3, 2, 2, 1], True),
    "no_steps": (None, False),  # a padded sequence of length 0
    "no_steps_reverse": (None, True),
}


def _sequence_args(case, seed=4):
    lengths, reverse = SEQUENCE_CASES[case]
    _, weights, bias, h, c = make_inputs(3, 2, 4, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    if lengths is None:
        steps = 0 if case.startswith("no_steps") else 4
        data = torch.randn(steps, 3, 2, generator=generator, dtype=torch.float64)
        return (
            [data, weights, bias, h, c],
            None,
            reverse,
        )
    data = torch.randn(sum(lengths), 2, generator=generator, dtype=torch.float64)
    return [data, weights, bias, h, c], torch.tensor(lengths), reverse


def _sequence_loss(fn):
    def loss(*args):
        output, h_n, c_n = fn(*args)
        return output.pow(2).sum() + (h_n * c_n).sum()

    return loss


@pytest.mark.parametrize(
    "in_dims", [*IN_DIMS, (0, None, None, 0, 0)], ids=[*map(_dims_id, IN_DIMS), "rows"]
)
@pytest.mark.parametrize("case", SEQUENCE_CASES)
def test_sequence_vmap_grad_matches_reference(case, in_dims):
    args, batch_sizes, reverse = _sequence_args(case)
    args = _batched(args, in_dims, size=2)
    ours = _sequence_loss(lambda *a: lltm.ops.sequence(*a, batch_sizes, reverse))
    theirs = _sequence_loss(lambda *a: sequence_oracle(*a, batch_sizes, reverse))
    _close(
        vmap(grad(ours, argnums=ALL), in_dims=in_dims)(*args),
        vmap(grad(theirs, argnums=ALL), in_dims=in_dims)(*args),
        "vmap(grad)",
    )


def test_sequence_hessian_and_jacfwd_match_reference():
    args, batch_sizes, reverse = _sequence_args("packed_reverse", seed=5)
    ours = _sequence_loss(lambda *a: lltm.ops.sequence(*a, batch_sizes, reverse))
    theirs = _sequence_loss(lambda *a: sequence_oracle(*a, batch_sizes, reverse))
    _close(hessian(ours, argnums=(1, 3))(*args), hessian(theirs, argnums=(1, 3))(*args), "hessian")
    _close(
        jacfwd(lambda *a: lltm.ops.sequence(*a, batch_sizes, reverse), argnums=ALL)(*args),
        jacrev(lambda *a: sequence_oracle(*a, batch_sizes, reverse), argnums=ALL)(*args),
        "jacfwd",
    )


# --- Modules: functional_call, per-sample gradients, ensembles ---------------------------


def _sequence_module(**kwargs):
    torch.manual_seed(0)
    return lltm.LLTMSequence(3, 4, **kwargs).double()


def _per_sample_loss(module):
    """The loss of one sample (no batch dimension: (seq_len, features))."""

    def loss(params, x, target):
        output, (h_n, _) = functional_call(module, params, (x,))
        return (output - target).pow(2).mean() + h_n.sum()

    return loss


@pytest.mark.parametrize(
    "kind", [{}, {"num_layers": 2, "bidirectional": True}], ids=["plain", "layers_bidirectional"]
)
def test_per_sample_gradients_match_a_loop(kind):
    module = _sequence_module(**kind)
    params = {k: v.detach() for k, v in module.named_parameters()}
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(5, 6, 3, generator=generator, dtype=torch.float64)  # 5 samples, T=6
    target = torch.randn(5, 6, 4 * module.directions, generator=generator, dtype=torch.float64)
    loss = _per_sample_loss(module)
    batched = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, target)
    for k in range(x.shape[0]):
        leaves = {name: p.clone().requires_grad_() for name, p in params.items()}
        expected = torch.autograd.grad(loss(leaves, x[k], target[k]), list(leaves.values()))
        for (name, value), e in zip(batched.items(), expected, strict=True):
            torch.testing.assert_close(
                value[k], e, msg=lambda m, n=name, k=k: f"{n}[{k}]: {m}", **TIGHT
            )


def test_per_sample_gradients_of_the_cell_module():
    torch.manual_seed(0)
    module = lltm.LLTM(3, 4).double()
    params = {k: v.detach() for k, v in module.named_parameters()}
    x, _, _, h, c = make_inputs(6, 3, 4, seed=7)

    def loss(params, x, h, c):
        new_h, new_c = functional_call(module, params, (x[None], (h[None], c[None])))
        return new_h.pow(2).sum() + new_c.sum()

    batched = vmap(grad(loss), in_dims=(None, 0, 0, 0))(params, x, h, c)
    for k in range(6):
        leaves = {n: p.clone().requires_grad_() for n, p in params.items()}
        expected = torch.autograd.grad(loss(leaves, x[k], h[k], c[k]), list(leaves.values()))
        for value, e in zip(batched.values(), expected, strict=True):
            torch.testing.assert_close(value[k], e, **TIGHT)


def test_ensemble_of_modules_matches_a_loop():
    # Parameters batched: several models evaluated in one vmap.
    models = [_sequence_module(num_layers=2) for _ in range(3)]
    for seed, model in enumerate(models):
        torch.manual_seed(seed)
        model.reset_parameters()
    params, buffers = torch.func.stack_module_state(models)
    x = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64)

    def run(params, buffers, x):
        return functional_call(models[0], (params, buffers), (x,))[0]

    together = vmap(run, in_dims=(0, 0, None))(params, buffers, x)
    for k, model in enumerate(models):
        torch.testing.assert_close(together[k], model(x)[0], **TIGHT)
    grads = vmap(grad(lambda p, b, x: run(p, b, x).pow(2).sum()), in_dims=(0, 0, None))(
        params, buffers, x
    )
    for k, model in enumerate(models):
        model.zero_grad()
        model(x)[0].pow(2).sum().backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name][k], p.grad, **TIGHT)


def _kernel_calls(fn, *args):
    """How many times each lltm kernel ran (the profiler's record of op calls)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        fn(*args)
    counts = {}
    for event in profile.events():
        if event.name.startswith("lltm::"):
            counts[event.name] = counts.get(event.name, 0) + 1
    return counts


def test_vmap_over_samples_is_one_kernel_call():
    # Inputs and state batched, parameters shared: the vmapped dimension is
    # folded into the kernels' batch, not looped over.
    module = _sequence_module()
    params = {k: v.detach() for k, v in module.named_parameters()}
    x = torch.randn(16, 5, 3, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    target = torch.zeros(16, 5, 4, dtype=torch.float64)
    loss = _per_sample_loss(module)
    # The profiler counts every entry into the dispatcher: the call on the
    # batched tensor, the one of the batching rule, and under grad the one
    # of the autograd Function. A loop would add one per sample (16).
    counts = _kernel_calls(vmap(lambda x: functional_call(module, params, (x,))[0]), x)
    assert counts["lltm::sequence_forward"] == 2, counts
    counts = _kernel_calls(vmap(grad(loss), in_dims=(None, 0, 0)), params, x, target)
    assert counts["lltm::sequence_forward"] == 3, counts


@pytest.mark.parametrize("op", ["cell", "sequence"])
def test_vmap_over_samples_that_are_not_matrices_names_the_argument(op):
    # A sample of the wrong rank is the operator's own ValueError, one call
    # per sample, not an error of the batching rule's folding.
    input, weights, bias, old_h, old_cell = lltm.reference.example_inputs(dtype=torch.float64)
    fn = lltm.lltm_cell if op == "cell" else lltm.lltm_sequence
    samples = torch.randn(2, *input.shape[1:], dtype=torch.float64)  # each (features,)
    if op == "sequence":
        samples = samples[:, None]  # each (1, features): not (seq_len, batch, features)
    with pytest.raises(ValueError, match=r"^lltm: input must be"):
        vmap(fn, in_dims=(0, None, None, None, None))(samples, weights, bias, old_h, old_cell)
