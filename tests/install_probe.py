"""Run by test_fallback.py with the Python of a test environment: imports
lltm as a user would, computes one step on the CPU and prints, as JSON, what
lltm reported (``python -m lltm info --json``), the warnings the import raised,
the largest difference from the reference, where lltm and torch came from and
which plugin modules got imported.

With ``--cuda-steps``, and a GPU, it also runs three steps on CUDA tensors
and reports their largest error and the warnings they raised.
"""

from __future__ import annotations

import json
import sys
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import lltm

import torch

from lltm import info, reference


def _lltm_warnings(records: list[warnings.WarningMessage]) -> list[str]:
    return [
        f"{w.category.__name__}: {w.message}" for w in records if str(w.message).startswith("lltm")
    ]


def _max_error(device: str) -> float:
    inputs = reference.example_inputs(device=device)
    return max(
        (ours - theirs).abs().max().item()
        for ours, theirs in zip(lltm.lltm_cell(*inputs), reference.lltm_cell(*inputs), strict=True)
    )


report = {
    "info": info.collect(),
    "lltm_warnings": _lltm_warnings(caught),
    "max_error": _max_error("cpu"),
    "lltm_file": lltm.__file__,
    "torch": [torch.__version__, torch.version.cuda],
    "plugin_modules": sorted(m for m in sys.modules if m.startswith("lltm_cuda")),
    "cuda_steps": None,
}
if "--cuda-steps" in sys.argv and torch.cuda.is_available():
    with warnings.catch_warnings(record=True) as during:
        warnings.simplefilter("always")
        errors = [_max_error("cuda") for _ in range(3)]
    report["cuda_steps"] = {"max_error": max(errors), "lltm_warnings": _lltm_warnings(during)}
print(json.dumps(report))
