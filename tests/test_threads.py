"""Thread safety: concurrent callers and intra-op thread counts.

The CPU kernels split their work between torch's intra-op threads and keep no
state between calls, so neither several Python threads calling at once nor a
different thread count may change a result. Where the work is split:

* the cell's forward: rows, once batch x state >= 8192 elements;
* the cell's backward: 128-column spans (kSpanColumns), so from state 129 on;
* the sequence kernels: each step's rows, in blocks of 8, once a step's
  recurrent product has batch x state x 3 state >= 2^18 multiply-adds (the
  packed AVX2/AVX-512 path; test_cpu_isa.py runs this file with the baseline
  set, where torch's GEMM splits the product and lltm the pointwise pass from
  8192 elements on).

The shapes below split with two threads, and are held to the reference.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import (
    GRAD_NAMES,
    OUTPUT_NAMES,
    assert_all_close,
    assert_as_accurate_as_reference,
    make_inputs,
    run_cell,
)
from test_sequence import (
    OUTPUT_NAMES as SEQUENCE_OUTPUTS,
)
from test_sequence import (
    assert_tight,
    loop_of_cells,
    make_sequence_inputs,
    run_sequence,
)

import lltm
from lltm import reference
from lltm.ops.cell_ops import composite as cell_composite
from lltm.ops.sequence_ops import composite as sequence_composite

NAMES = OUTPUT_NAMES + GRAD_NAMES
# Different shapes per job, so that a kernel sharing a buffer between calls
# would mix up sizes as well as values. Batch 600 spans several grains;
# (256, 8, 300) splits forward rows and backward spans between threads.
JOBS = [
    ((b, f, s), seed)
    for seed, (b, f, s) in enumerate(
        [(3, 5, 7), (16, 32, 128), (600, 4, 9), (1, 1, 1), (0, 3, 4), (256, 8, 300)] * 3
    )
]


def _job(job, dtype=torch.float64):
    shape, seed = job
    out, grads = run_cell(
        lltm.lltm_cell, make_inputs(*shape, dtype=dtype, seed=seed), seed=seed + 1
    )
    return out + grads


# Same thread count, same kernel: only a GEMM library that splits work by the
# calling thread could make a (rounding-level) difference.
SAME_RESULT_TOL = {torch.float64: 1e-12, torch.bfloat16: 1e-2}


def _assert_same_results(results, expected, dtype):
    tol = SAME_RESULT_TOL[dtype]
    for i, (got, want) in enumerate(zip(results, expected, strict=True)):
        assert_all_close(got, want, [f"job {i} {name}" for name in NAMES], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_concurrent_calls_match_serial(dtype):
    serial = [_job(job, dtype) for job in JOBS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = list(pool.map(lambda job: _job(job, dtype), JOBS))
    _assert_same_results(concurrent, serial, dtype)


def test_concurrent_module_calls_share_parameters():
    # One module used from several threads (e.g. a serving process): the
    # parameter gradients accumulate from every thread's backward.
    torch.manual_seed(0)
    rnn = lltm.LLTM(6, 10).double()
    batches = [make_inputs(4, 6, 10, seed=seed) for seed in range(8)]

    def step(inputs):
        x, _, _, h, c = inputs
        new_h, new_c = rnn(x, (h, c))
        (new_h.sum() + new_c.pow(2).sum()).backward()
        return new_h.detach()

    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent_h = list(pool.map(step, batches))
    concurrent_grads = [rnn.weights.grad.clone(), rnn.bias.grad.clone()]
    rnn.zero_grad()
    serial_h = [step(inputs) for inputs in batches]
    names = [f"new_h {i}" for i in range(len(batches))]
    assert_all_close(concurrent_h, serial_h, names, rtol=0, atol=0)
    # Accumulation order differs between the runs: rounding only.
    assert_all_close(
        concurrent_grads,
        [rnn.weights.grad, rnn.bias.grad],
        ("weights", "bias"),
        rtol=1e-12,
        atol=1e-12,
    )


@pytest.mark.parametrize("shape", [(600, 4, 9), (64, 32, 128), (256, 8, 300)], ids=str)
def test_one_thread_matches_default(shape, restore_num_threads):
    torch.set_num_threads(1)
    single = _job((shape, 0))
    torch.set_num_threads(max(2, restore_num_threads))
    multi = _job((shape, 0))
    # The pointwise pass is per element; GEMMs may sum in another order.
    assert_all_close(multi, single, NAMES, rtol=1e-12, atol=1e-12)


# --- Split work against the reference --------------------------------------------

# (batch, features, state): forward rows split (batch x state >= 8192),
# backward spans split (state > 128, with a last partial span), grad_bias
# summed over several 16-row blocks; and the same with batch 2, where only
# the spans split.
SPLIT_SHAPES = [(256, 8, 300), (40, 3, 260), (2, 5, 385)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=str)
def test_split_work_matches_reference(shape, dtype, restore_num_threads):
    torch.set_num_threads(2)
    inputs = make_inputs(*shape, dtype=dtype, seed=3)
    out, grads = run_cell(lltm.lltm_cell, inputs)
    ref_out, ref_grads = run_cell(reference.lltm_cell, inputs)
    if dtype == torch.float64:
        assert_all_close(out + grads, ref_out + ref_grads, NAMES)
        return
    exact_out, exact_grads = run_cell(reference.lltm_cell, [t.double() for t in inputs])
    assert_as_accurate_as_reference(
        NAMES, out + grads, ref_out + ref_grads, exact_out + exact_grads, dtype
    )


def test_split_backward_op_matches_composite(restore_num_threads):
    # The backward op on its own, every output_mask: grad_bias and the spans
    # of d_gates with and without each other.
    torch.set_num_threads(2)
    inputs = make_inputs(256, 8, 300, seed=4)
    new_h, new_cell, gates = torch.ops.lltm.forward(*inputs)
    input, weights, _, old_h, _ = inputs
    generator = torch.Generator().manual_seed(5)
    grad_h, grad_cell = (
        torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in (new_h, new_cell)
    )
    for mask in (
        [True] * 5,
        [False, False, True, False, False],
        [False, False, False, False, True],
    ):
        args = (grad_h, grad_cell, new_cell, gates, input, old_h, weights, mask)
        native, composite = torch.ops.lltm.backward(*args), cell_composite.backward(*args)
        for name, n, c, want in zip(GRAD_NAMES, native, composite, mask, strict=True):
            assert (n is not None) == want, name
            if want:
                torch.testing.assert_close(n, c, msg=lambda m, name=name: f"{name}: {m}")


# (steps, batch, features, state) of sequences whose steps split: 37 rows
# (blocks of 8: 24 + 13) x 130 x 390 = 1.9e6 multiply-adds a step; 64 x 130
# also splits the baseline set's pointwise pass (8320 elements).
SPLIT_SEQUENCES = [(4, 37, 5, 130), (3, 64, 4, 130)]


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape", SPLIT_SEQUENCES, ids=str)
def test_split_sequence_matches_loop_of_reference_cells(shape, reverse, restore_num_threads):
    torch.set_num_threads(2)
    inputs = make_sequence_inputs(*shape)

    def lltm_fn(*args):
        output, h_n, c_n = lltm.ops.sequence(*args, reverse=reverse)
        return output, (h_n, c_n)

    def loop_fn(*args):
        return loop_of_cells(*args, reverse=reverse)

    out, grads = run_sequence(lltm_fn, inputs)
    ref_out, ref_grads = run_sequence(loop_fn, inputs)
    assert_tight(out + grads, ref_out + ref_grads, SEQUENCE_OUTPUTS + GRAD_NAMES)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_split_packed_sequence_matches_composite(reverse, restore_num_threads):
    # Packed: the active batch shrinks from 40 (split) to 3 (not split) rows
    # over the steps, so steps of both kinds follow each other.
    torch.set_num_threads(2)
    lengths = [5] * 3 + [3] * 20 + [1] * 17
    batch_sizes = torch.tensor([sum(n > t for n in lengths) for t in range(5)])
    _, weights, bias, h, c = make_sequence_inputs(1, len(lengths), 6, 130, seed=6)
    data = torch.randn(
        sum(lengths), 6, generator=torch.Generator().manual_seed(7), dtype=torch.float64
    )
    args = [data, weights, bias, h, c, batch_sizes, reverse]
    native = torch.ops.lltm.sequence_forward(*args)
    composite = sequence_composite.sequence_forward(*args)
    assert_tight(native, composite, ("output", "h_n", "c_n", "gates", "cells"))
    generator = torch.Generator().manual_seed(8)
    upstream = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in native[:3]]
    backward_args = [
        *upstream,
        *native[0:1],
        *native[3:],
        data,
        weights,
        h,
        batch_sizes,
        reverse,
        [True] * 5,
    ]
    assert_tight(
        torch.ops.lltm.sequence_backward(*backward_args),
        sequence_composite.sequence_backward(*backward_args),
        GRAD_NAMES,
    )
