"""Where the nox sessions, and the scripts they run, get torch.

Two settings, one per build of torch: ``torch-cpu-index`` (a CPU-only build)
and ``torch-cuda-index`` (a CUDA build), under ``[tool.lltm]`` in
pyproject.toml, where their defaults are torch's own indexes. The
environment variables LLTM_TORCH_CPU_INDEX and LLTM_TORCH_CUDA_INDEX
override them. Either is a package index, which pip is given as its
``--index-url`` for torch alone, or ``pip``: whatever pip is configured with
(pip.conf, PIP_INDEX_URL, ...) serves torch, as it serves everything else.
tests/test_fallback.py reads the same settings for the environments it makes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
# "cpu" or "cuda": the variable that overrides pyproject.toml's setting.
VARIABLES = {"cpu": "LLTM_TORCH_CPU_INDEX", "cuda": "LLTM_TORCH_CUDA_INDEX"}
PIP_CONFIGURED = "pip"


def index(build: str) -> str:
    """Where torch's ``build`` ("cpu" or "cuda") comes from: an index's URL, or "pip"."""
    value = os.environ.get(VARIABLES[build])
    if value is None:
        with open(ROOT / "pyproject.toml", "rb") as f:
            value = tomllib.load(f)["tool"]["lltm"][f"torch-{build}-index"]
    return value.strip()


def pip_args(build: str) -> list[str]:
    """pip's arguments that take torch's ``build`` from where ``index`` says."""
    where = index(build)
    return [] if where == PIP_CONFIGURED else ["--index-url", where]


def describe(build: str) -> str:
    """Where torch's ``build`` comes from, in words, for logs."""
    where = index(build)
    setting = VARIABLES[build]
    if where == PIP_CONFIGURED:
        return f"pip's own configuration ({setting}=pip)"
    return f"{where} ({setting})"


def folder_name(build: str) -> str | None:
    """A file name for the index of torch's ``build`` (None: pip's configuration)."""
    where = index(build)
    if where == PIP_CONFIGURED:
        return None
    return re.sub(r"[^A-Za-z0-9.]+", "_", where.split("://")[-1]).strip("_")
