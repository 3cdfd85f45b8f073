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


from lltm import info, reference

inputs = reference.example_inputs()
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
