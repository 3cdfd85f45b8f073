"""Failures inside torch, raised from lltm's kernels, keep torch's message.

An allocation that cannot succeed is the failure every machine can produce:
inputs broadcast (stride 0) to a huge batch cost no memory, the outputs would
need terabytes. The error must say what lltm was doing and what torch said,
not "API call failed at lltm_tensor.h, line N".
"""

from __future__ import annotations

import pytest
import torch
from conftest import TORCH

import lltm
from lltm import _errors

# Rows: the (HUGE, 3 * state) gates alone would need 2**57.6 bytes, past any
# address space (57 bits with 5-level paging), so the allocation fails even
# where the kernel grants any request (vm.overcommit_memory=1), rather than
# succeeding and the process being killed when the kernel writes to it.
HUGE = 2**52


def _huge_cell_inputs():
    x = torch.zeros(1, 3).expand(HUGE, 3)
    h = torch.zeros(1, 4).expand(HUGE, 4)
    return [x, torch.zeros(12, 7), torch.zeros(12), h, h]


CALLS = {
    "lltm_cell": lambda: lltm.lltm_cell(*_huge_cell_inputs()),
    "op": lambda: torch.ops.lltm.forward(*_huge_cell_inputs()),
    "lltm_sequence": lambda: lltm.lltm_sequence(
        torch.zeros(1, 1, 3).expand(2, HUGE, 3),
        torch.zeros(12, 7),
        torch.zeros(12),
        torch.zeros(1, 4).expand(HUGE, 4),
        torch.zeros(1, 4).expand(HUGE, 4),
    ),
}


@pytest.mark.parametrize("call", CALLS)
def test_allocation_failure_says_out_of_memory_in_torchs_words(call, capfd):
    with pytest.raises(RuntimeError) as info:
        CALLS[call]()
    message = str(info.value)
    assert message.startswith("lltm: allocating an output tensor failed: "), message
    assert "API call failed" not in message, message
    # torch's own text (CPU allocator), not a file and line of lltm's source.
    if TORCH >= (2, 13):
        # torch_exception_get_what_without_backtrace, new in 2.13, hands it over.
        assert "can't allocate memory" in message, message
    else:
        # Before 2.13 the shim only prints it: the message says where to look.
        assert message.endswith(
            "torch < 2.13 passes no message across its stable ABI; it printed the reason to stderr"
        ), message
        assert "can't allocate memory" in capfd.readouterr().err


def test_cuda_out_of_memory_becomes_torch_out_of_memory_error():
    # What a CUDA out-of-memory reaching Python from a kernel looks like:
    # a RuntimeError with the caching allocator's text.
    text = "lltm: allocating an output tensor failed: CUDA out of memory. Tried to allocate 2 GiB."
    converted = _errors.documented(RuntimeError(text))
    assert isinstance(converted, torch.OutOfMemoryError) and isinstance(converted, RuntimeError)
    assert str(converted) == text
    other = RuntimeError("lltm: the matrix product failed: CUBLAS_STATUS_INVALID_VALUE")
    assert _errors.documented(other) is None
