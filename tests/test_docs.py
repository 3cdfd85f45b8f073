"""The documentation's code runs, so that no page drifts from the code.

Every ``python`` code block of the README, CONTRIBUTING.md and the site's pages
(docs/) runs, a page's blocks in order in one namespace, as a reader would run
them; blocks meant to be read, not run, are ``{code-block} python`` directives.
The examples in lltm's docstrings run as doctests.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import torch

import lltm

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def _blocks(page: Path) -> list[str]:
    return PYTHON_BLOCK.findall(page.read_text(encoding="utf-8"))


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


# A page shows that torch.jit.script of lltm's modules says what to use instead.
@pytest.mark.filterwarnings("ignore:`torch.jit.script.*` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p)], ids=_name)
def test_code_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever a block writes lands here
    torch.manual_seed(0)
    namespace: dict = {"__name__": "__main__"}
    for number, code in enumerate(_blocks(page), start=1):
        exec(compile(code, f"{_name(page)}, code block {number}", "exec"), namespace)


def test_the_pages_have_code_to_run():
    # The pattern above still finds the blocks: a page that shows how to use
    # lltm runs its examples.
    for page in ("README.md", "docs/quickstart.md", "docs/guide/composability.md"):
        assert _blocks(ROOT / page), page


def _modules() -> list[str]:
    names = ["lltm"]
    for info in pkgutil.walk_packages(lltm.__path__, "lltm."):
        if info.name != "lltm.__main__":
            names.append(info.name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(module, name):
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing example(s) in {name}'s docstrings"
