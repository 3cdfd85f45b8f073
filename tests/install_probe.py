"""Run by test_fallback.py with the Python of a test environment: imports
lltm as a user would, computes one step on the CPU and prints, as JSON, what
lltm reported (``python -m lltm info --json``), the warnings the import raised
and the largest difference from the reference."""

from __future__ import annotations

import json
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import lltm

import torch

from lltm import info, reference

generator = torch.Generator().manual_seed(0)
batch, features, state = 4, 3, 5
shapes = [
    (batch, features),
    (3 * state, state + features),
    (3 * state,),
    (batch, state),
    (batch, state),
]
inputs = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
error = max(
    (ours - theirs).abs().max().item()
    for ours, theirs in zip(lltm.lltm_cell(*inputs), reference.lltm_cell(*inputs), strict=True)
)
print(
    json.dumps(
        {
            "info": info.collect(),
            "lltm_warnings": [
                f"{w.category.__name__}: {w.message}"
                for w in caught
                if str(w.message).startswith("lltm")
            ],
            "max_error": error,
        }
    )
)
