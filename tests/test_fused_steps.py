"""The fused sequence kernels of the CPU (csrc/cpu/fused_steps/dispatch.h)
against a float64 loop of the reference cell, at the sizes where their
structure has edges.

The kernels tile the batch by 8, 4, 2 and 1 rows (arm64's NEON set by 6, 3
and 1; a padded last tile), the state by vectors of 2 to 16 lanes (panels of
up to three vectors, a partial last vector), and the forward's k by passes of
at most 128 to 512 (float AVX-512 to double baseline); they run rows in blocks
per thread. The sizes
below put a boundary of each inside every instruction set's shapes, and
tests/test_cpu_isa.py runs this file again under every lower set. Both
kernels are checked through the operators themselves:
torch.ops.lltm.sequence_forward (output, h_n, c_n, the saved cells) and
torch.ops.lltm.sequence_backward (all five gradients, for every output mask),
float64 to 1e-12 of each tensor's magnitude, float32 to float32 rounding.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from oracle import sequence_oracle

from lltm import _C

pytestmark = pytest.mark.cpu_kernels_only(reason="the fused kernels are the CPU's")

NAMES = ("input", "weights", "bias", "old_h", "old_cell")
FORWARD_NAMES = ("output", "h_n", "c_n")
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}


def make_args(steps, batch, features, state, batch_sizes=None, seed=0):
    """float64 (input, weights, bias, old_h, old_cell) at the modules' scale;
    with batch_sizes the input is packed, (sum(batch_sizes), features)."""
    generator = torch.Generator().manual_seed(seed)
    scale = 1 / max(state, 1) ** 0.5
    rows = sum(batch_sizes) if batch_sizes is not None else None
    input_shape = (rows, features) if batch_sizes is not None else (steps, batch, features)
    shapes = [
        (input_shape, 1.0),
        ((3 * state, state + features), scale),
        ((3 * state,), scale),
        ((batch, state), 1.0),
        ((batch, state), 1.0),
    ]
    return [torch.randn(shape, generator=generator, dtype=torch.float64) * s for shape, s in shapes]


def expected(args, batch_sizes, reverse, upstream, mask):
    """The oracle's outputs, cells and gradients (of the inputs the mask asks
    for, None for the others), in float64."""
    leaves = [a.detach().clone().requires_grad_(m) for a, m in zip(args, mask, strict=True)]
    sizes = None if batch_sizes is None else torch.tensor(batch_sizes)
    cells: list[torch.Tensor] = []
    outputs = sequence_oracle(*leaves, batch_sizes=sizes, reverse=reverse, cells=cells)
    wanted = [leaf for leaf in leaves if leaf.requires_grad]
    grads = iter(
        torch.autograd.grad(outputs, wanted, upstream, allow_unused=True, materialize_grads=True)
        if wanted
        else []
    )
    return [o.detach() for o in outputs], [next(grads) if m else None for m in mask]


def fused(args, batch_sizes, reverse, upstream, mask, dtype):
    """The operators in `dtype`: (output, h_n, c_n), the saved cells, and the
    five gradients of sequence_backward."""
    cast = [a.to(dtype) for a in args]
    sizes = None if batch_sizes is None else torch.tensor(batch_sizes)
    output, h_n, c_n, gates, cells = torch.ops.lltm.sequence_forward(*cast, sizes, reverse)
    grads = torch.ops.lltm.sequence_backward(
        *[u.to(dtype) for u in upstream],
        output,
        gates,
        cells,
        cast[0],
        cast[1],
        cast[3],
        sizes,
        reverse,
        list(mask),
    )
    return [output, h_n, c_n], cells, list(grads)


def upstream_of(outputs, seed=7):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=generator, dtype=torch.float64) for o in outputs]


def assert_close(actual, expected, name, dtype):
    """To TOLERANCE of the expected tensor's magnitude (its RMS, at least 1)."""
    assert actual is not None and actual.dtype == dtype, name
    tol = TOLERANCE[dtype]
    scale = max(1.0, expected.pow(2).mean().sqrt().item() if expected.numel() else 0.0)
    torch.testing.assert_close(
        actual.double(), expected, rtol=tol, atol=tol * scale, msg=lambda m: f"{name}: {m}"
    )


def check(args, batch_sizes=None, reverse=False, mask=(True,) * 5, dtype=torch.float64):
    """The fused kernels' forward and backward against the oracle."""
    with torch.no_grad():
        outputs = sequence_oracle(
            *args,
            batch_sizes=None if batch_sizes is None else torch.tensor(batch_sizes),
            reverse=reverse,
        )
    upstream = upstream_of(outputs)
    want, want_grads = expected(args, batch_sizes, reverse, upstream, mask)
    got, cells, grads = fused(args, batch_sizes, reverse, upstream, mask, dtype)
    for name, a, e in zip(FORWARD_NAMES, got, want, strict=True):
        assert_close(a, e, name, dtype)
    oracle_cells: list[torch.Tensor] = []
    sequence_oracle(
        *args,
        batch_sizes=None if batch_sizes is None else torch.tensor(batch_sizes),
        reverse=reverse,
        cells=oracle_cells,
    )
    if oracle_cells:
        order = reversed(oracle_cells) if reverse else oracle_cells
        stacked = torch.cat(list(order)) if batch_sizes is not None else torch.stack(list(order))
        assert_close(cells, stacked, "cells", dtype)
    for name, g, e, m in zip(NAMES, grads, want_grads, mask, strict=True):
        if m:
            assert_close(g, e, f"grad of {name}", dtype)
        else:
            assert g is None, f"grad of {name} was not asked for"


# (steps, batch, features, state): every state size from 1 to 17 and around
# 24, 32 and 48 (2, 4, 8 and 16 lanes; panels of 1 to 3 vectors, 4 vectors
# split 2 + 2), each with a batch that ends in a padded or a smaller tile.
EDGES = [
    (3, 1, 2, 1),
    (2, 2, 1, 2),
    (3, 3, 4, 3),
    (2, 5, 3, 4),
    (3, 7, 0, 5),
    (2, 9, 6, 6),
    (3, 13, 2, 7),
    (2, 4, 5, 8),
    (3, 6, 1, 9),
    (2, 11, 3, 12),
    (2, 10, 4, 15),
    (3, 17, 2, 16),
    (2, 3, 7, 17),
    (2, 8, 3, 23),
    (2, 5, 9, 24),
    (2, 12, 2, 25),
    (2, 9, 3, 31),
    (2, 6, 5, 33),
    (2, 3, 4, 47),
    (2, 19, 3, 48),
    (2, 2, 6, 49),
]


def _ids(shape):
    return "T{}-b{}-f{}-s{}".format(*shape)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("shape", EDGES, ids=_ids)
def test_tile_and_vector_edges(shape, dtype):
    check(make_args(*shape), dtype=dtype)


# The forward's k (features + state) beyond one pass for every set: the
# boundary between passes inside the input's columns, inside h_prev's, and
# several passes.
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize(
    "shape", [(2, 3, 300, 20), (2, 5, 6, 300), (2, 2, 700, 9), (1, 4, 129, 130)], ids=_ids
)
def test_forward_passes(shape, dtype):
    check(make_args(*shape), dtype=dtype)


# Packed sequences in both directions: rows leaving (forward) and joining
# (reverse) between steps, in tiles that straddle them.
PACKED = [[5, 5, 3, 2, 1, 1], [9, 7, 7, 4, 1], [3, 3, 3], [1]]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("sizes", PACKED, ids=lambda s: "-".join(map(str, s)))
def test_packed_sequences(sizes, reverse, dtype):
    check(make_args(len(sizes), sizes[0], 3, 11, batch_sizes=sizes), sizes, reverse, dtype=dtype)


def test_reverse_padded():
    check(make_args(4, 6, 3, 10), reverse=True)


# Which gradients are wanted changes the work: without old_h the last
# product (into the gradient of h_0) is skipped, in packed reverse runs too.
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("mask", list(itertools.product([False, True], repeat=5)), ids=str)
def test_every_output_mask(mask, reverse):
    sizes = [6, 6, 4, 1]
    check(make_args(4, 6, 3, 9, batch_sizes=sizes), sizes, reverse, mask=mask)


@pytest.mark.parametrize(
    "shape", [(0, 3, 4, 5), (3, 0, 4, 5), (0, 0, 2, 3), (2, 4, 3, 0)], ids=_ids
)
def test_zero_steps_empty_batch_zero_state(shape):
    check(make_args(*shape))


def _poison_the_heap(dtype, largest):
    """Frees NaN-filled blocks of every size up to `largest` values, so that
    memory the kernels take without writing it would hold NaN."""
    blocks = [torch.full((n,), float("nan"), dtype=dtype) for n in range(64, largest, 97)]
    del blocks


# The kernels pack the weights into uninitialised memory on every call: the
# lanes past the state size, and the bias slots of a call without bias, must
# be written as zeros. Without bias, every output and gradient must equal a
# zero bias's, bit for bit, after the memory they could reuse held NaN.
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("state", [1, 5, 8, 11, 13, 24], ids=lambda s: f"s{s}")
def test_packed_weights_hold_zeros_not_stale_memory(state, dtype):
    args = make_args(3, 5, 4, state)
    input, weights, bias, old_h, old_cell = (a.to(dtype) for a in args)
    upstream = [u.to(dtype) for u in upstream_of(sequence_oracle(*args))]
    results = []
    for b in (None, torch.zeros_like(bias)):
        _poison_the_heap(dtype, 3 * state * (state + 4 + 1) * 16 + 4096)
        output, h_n, c_n, gates, cells = torch.ops.lltm.sequence_forward(
            input, weights, b, old_h, old_cell, None, False
        )
        _poison_the_heap(dtype, 3 * state * state * 16 + 4096)
        grads = torch.ops.lltm.sequence_backward(
            *upstream, output, gates, cells, input, weights, old_h, None, False,
            [True, True, False, True, True],
        )  # fmt: skip
        results.append([output, h_n, c_n, gates, cells, *(g for g in grads if g is not None)])
    for name, a, b in zip(
        ("output", "h_n", "c_n", "gates", "cells", *[f"grad of {n}" for n in NAMES if n != "bias"]),
        *results,
        strict=True,
    ):
        assert torch.isfinite(a).all() and torch.equal(a, b), name


# Every row runs the same arithmetic wherever it sits: in a full register
# tile, or as the last real row of a padded one (batches of 3, 5, 6, 7 ... rows
# end in one for every set). A compiler that fuses a multiply-add in one place
# and not in the other breaks this by one rounding, and with it the promise
# that two threads' blocks of rows give one thread's bits.
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("batch", [3, 5, 6, 7, 9, 11, 13, 23], ids=lambda b: f"b{b}")
def test_identical_rows_give_identical_bits(batch, dtype):
    one = make_args(3, 1, 4, 13)
    args = [one[0].expand(3, batch, 4), one[1], one[2], *(a.expand(batch, 13) for a in one[3:])]
    args = [a.contiguous().to(dtype) for a in args]
    output, h_n, c_n, gates, cells = torch.ops.lltm.sequence_forward(*args, None, False)
    upstream = [u.to(dtype) for u in upstream_of(sequence_oracle(*one))]
    grads = torch.ops.lltm.sequence_backward(
        upstream[0].expand(3, batch, 13), upstream[1].expand(batch, 13),
        upstream[2].expand(batch, 13), output, gates, cells, args[0], args[1], args[3], None,
        False, [True, False, False, True, True],
    )  # fmt: skip
    rows = {"output": output, "gates": gates, "cells": cells, "h_n": h_n, "c_n": c_n}
    rows.update(
        {"grad of input": grads[0], "grad of old_h": grads[3], "grad of old_cell": grads[4]}
    )
    for name, t in rows.items():
        by_row = t.reshape(-1, batch, t.shape[-1])
        assert torch.equal(by_row, by_row[:, :1].expand_as(by_row)), name


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout: every other element of a
    twice-as-long last dimension, transposed storage for matrices."""
    if t.dim() == 2:
        return t.t().contiguous().t()
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_non_contiguous_arguments_and_saved_tensors(dtype):
    args = make_args(3, 5, 4, 10)
    strided = [_strided(a) for a in args]
    strided[0] = args[0].transpose(0, 1).contiguous().transpose(0, 1)  # (T, B, F) from (B, T, F)
    assert not any(a.is_contiguous() for a in strided)
    with torch.no_grad():
        outputs = sequence_oracle(*args)
    upstream = upstream_of(outputs)
    want, want_grads = expected(args, None, False, upstream, (True,) * 5)
    cast = [a.to(dtype) for a in strided]
    output, h_n, c_n, gates, cells = torch.ops.lltm.sequence_forward(*cast, None, False)
    for name, a, e in zip(FORWARD_NAMES, (output, h_n, c_n), want, strict=True):
        assert_close(a, e, name, dtype)
    # Upstream gradients as broadcasts and transposes, saved tensors strided.
    grad_output = upstream[0].to(dtype).transpose(0, 1).contiguous().transpose(0, 1)
    grads = torch.ops.lltm.sequence_backward(
        grad_output,
        _strided(upstream[1].to(dtype)),
        upstream[2].to(dtype).t().contiguous().t(),
        _strided(output),
        _strided(gates),
        _strided(cells),
        cast[0],
        cast[1],
        cast[3],
        None,
        False,
        [True] * 5,
    )
    for name, g, e in zip(NAMES, grads, want_grads, strict=True):
        assert_close(g, e, f"grad of {name}", dtype)


# Output gradients whose rows are not dense are gathered a row at a time
# before the vector loop reads them: output.sum()'s gradient reaches the
# kernel as ones with strides 0, a slice's as every other column. States of
# less than a vector (5 floats) and of whole vectors and a tail (21).
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("state", [5, 21], ids=lambda s: f"S{s}")
@pytest.mark.parametrize("layout", ["sum", "every other column"])
def test_output_gradient_with_rows_not_dense(layout, state, dtype):
    args = make_args(4, 5, 3, state)
    cast = [a.to(dtype) for a in args]
    output, _, _, gates, cells = torch.ops.lltm.sequence_forward(*cast, None, False)
    if layout == "sum":
        grad_output = torch.ones((), dtype=dtype).expand_as(output)
    else:
        grad_output = _strided(torch.randn_like(output))
    assert grad_output.stride(-1) != 1
    grads = torch.ops.lltm.sequence_backward(
        grad_output, None, None, output, gates, cells, cast[0], cast[1], cast[3], None, False,
        [True] * 5,
    )  # fmt: skip
    leaves = [a.clone().requires_grad_() for a in args]
    ref = torch.autograd.grad(sequence_oracle(*leaves)[0], leaves, grad_output.double())
    for name, g, e in zip(NAMES, grads, ref, strict=True):
        assert_close(g, e, f"grad of {name}", dtype)


@pytest.mark.parametrize("batch", [32, 37], ids=lambda b: f"b{b}")
def test_blocks_of_rows_per_thread_match_one_thread(batch, restore_num_threads):
    # Large enough that two threads split the batch into blocks of rows:
    # every row's values are computed alike, grad_bias is summed per block.
    args = [a.float() for a in make_args(4, batch, 16, 64)]
    upstream = upstream_of(sequence_oracle(*[a.double() for a in args]))
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append(
            fused([a.double() for a in args], None, False, upstream, (True,) * 5, torch.float32)
        )
    (one, one_cells, one_grads), (two, two_cells, two_grads) = results
    for name, a, b in zip(
        (*FORWARD_NAMES, "cells"), [*one, one_cells], [*two, two_cells], strict=True
    ):
        assert torch.equal(a, b), name
    for name, a, b in zip(NAMES, one_grads, two_grads, strict=True):
        if name == "bias":
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(a, b), f"grad of {name}"


def test_the_set_in_use_is_reported():
    # tests/test_cpu_isa.py runs this file under every lower set; the name
    # says which one these results are for.
    assert _C.cpu_isa() in ("baseline", "avx2", "avx512", "neon")
