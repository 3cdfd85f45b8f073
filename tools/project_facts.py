"""Facts of the project the packaging checks compare against, read from the
source (setup.py, src/lltm/_version.py, tools/nox_matrix.py) without importing or
running it."""

from __future__ import annotations

import ast
import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def version() -> str:
    """lltm's version, as src/lltm/_version.py states it (as setup.py reads it)."""
    return runpy.run_path(str(ROOT / "src" / "lltm" / "_version.py"))["__version__"]


def arch_lists() -> dict[int, str]:
    """setup.py's DEFAULT_ARCH_LIST: the architectures per CUDA major."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "DEFAULT_ARCH_LIST" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no DEFAULT_ARCH_LIST")


def nox_default(variable: str) -> str:
    """The value the nox sessions take where environment variable ``variable`` is
    unset (its ``os.environ.get`` or ``env_list`` default in tools/nox_matrix.py),
    e.g. LLTM_BUILD_TORCH: the torch executorch is built for."""
    text = (ROOT / "tools" / "nox_matrix.py").read_text()
    found = re.search(rf'\(\s*"{re.escape(variable)}",\s*"([^"]*)"\s*\)', text)
    if found is None:
        raise AssertionError(f"tools/nox_matrix.py gives {variable} no default")
    return found.group(1)
