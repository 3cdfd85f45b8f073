"""The cibuildwheel configurations as cibuildwheel reads them on Linux."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # nox itself may run on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CPU_CONFIG = ROOT / "pyproject.toml"
CUDA_CONFIG = ROOT / "tools" / "cibuildwheel-cuda.toml"
CONFIGS = {"cpu": CPU_CONFIG, "cuda": CUDA_CONFIG}


def linux_options(config_file: Path, identifier: str = "cp310-manylinux_x86_64") -> dict[str, Any]:
    """[tool.cibuildwheel] of ``config_file`` with its Linux section and the
    overrides that select the build ``identifier`` applied, in order, as
    cibuildwheel applies them."""
    with config_file.open("rb") as f:
        options = dict(tomllib.load(f)["tool"]["cibuildwheel"])
    options.update(options.pop("linux", {}))
    for platform in ("macos", "windows", "pyodide", "android", "ios"):
        options.pop(platform, None)
    for override in options.pop("overrides", []):
        if any(fnmatch.fnmatch(identifier, p) for p in override["select"].split()):
            options.update({k: v for k, v in override.items() if k != "select"})
    return options
