"""Thread safety: concurrent callers and intra-op thread counts.

The CPU kernel splits the batch across torch's intra-op threads and keeps no
state between calls, so neither several Python threads calling at once nor a
different thread count may change a result.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import GRAD_NAMES, OUTPUT_NAMES, assert_all_close, make_inputs, run_cell

import lltm

NAMES = OUTPUT_NAMES + GRAD_NAMES
# Different shapes per job, so that a kernel sharing a buffer between calls
# would mix up sizes as well as values. Batch 600 spans several grains.
JOBS = [
    ((b, f, s), seed)
    for seed, (b, f, s) in enumerate(
        [(3, 5, 7), (16, 32, 128), (600, 4, 9), (1, 1, 1), (0, 3, 4)] * 4
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


@pytest.mark.parametrize("shape", [(600, 4, 9), (64, 32, 128)], ids=str)
def test_one_thread_matches_default(shape, restore_num_threads):
    torch.set_num_threads(1)
    single = _job((shape, 0))
    torch.set_num_threads(max(2, restore_num_threads))
    multi = _job((shape, 0))
    # The pointwise pass is per element; GEMMs may sum in another order.
    assert_all_close(multi, single, NAMES, rtol=1e-12, atol=1e-12)
