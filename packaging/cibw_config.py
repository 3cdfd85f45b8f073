"""The cibuildwheel configurations as cibuildwheel reads them on Linux."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # nox itself may run on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CPU_CONFIG = ROOT / "pyproject.toml"
CUDA_CONFIG = ROOT / "packaging" / "cibuildwheel-cuda.toml"
CONFIGS = {"cpu": CPU_CONFIG, "cuda": CUDA_CONFIG}


def linux_options(config_file: Path) -> dict[str, Any]:
    """[tool.cibuildwheel] of ``config_file`` with its Linux section applied."""
    with config_file.open("rb") as f:
        options = dict(tomllib.load(f)["tool"]["cibuildwheel"])
    options.update(options.pop("linux", {}))
    for platform in ("macos", "windows", "pyodide", "android", "ios"):
        options.pop(platform, None)
    return options
