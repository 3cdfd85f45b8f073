"""Directives of lltm's documentation.

``lltm-operator``: one of ``torch.ops.lltm.*`` in the API reference. An operator's schema is declared once, in csrc/lltm_ops.cpp; its contract is
the docstring of its handle in its family's contract.py (lltm/ops/cell_ops/,
lltm/ops/sequence_ops/). The directive renders
both from the installed lltm: the signature and schema as torch registered
them, the docstring as autodoc would (napoleon's Google style).

``lltm-parser-description``: the description a command's ``--help`` prints,
as it prints it (plain text, not reStructuredText).

Links to the repository's files: the pages that include a README of the
repository (examples/README.md, benchmarks/RESULTS.md, CONTRIBUTING.md) keep
its relative links to files that are no pages (scripts, data); they become
links to the file in the repository (``lltm_repository_url``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch
from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.ext.napoleon.docstring import GoogleDocstring
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

# The modules that hold the handles, one an operator family.
HANDLES = ("lltm.ops.cell_ops.contract", "lltm.ops.sequence_ops.contract")

# TorchScript's names of the schema types, in Python's spelling.
PYTHON_TYPES = {
    "Tensor": "Tensor",
    "Optional[Tensor]": "Tensor | None",
    "bool": "bool",
    "List[bool]": "list[bool]",
}


def _python_type(jit_type: Any) -> str:
    name = str(jit_type)
    if name not in PYTHON_TYPES:
        raise ValueError(f"no Python spelling for the schema type {name!r}")
    return PYTHON_TYPES[name]


def _signature(name: str) -> tuple[str, str]:
    """(Python signature, schema) of ``torch.ops.lltm.<name>``."""
    import lltm  # noqa: F401  (registers the operators)

    schema = getattr(torch.ops.lltm, name).default._schema
    arguments = ", ".join(f"{a.name}: {_python_type(a.type)}" for a in schema.arguments)
    returns = ", ".join(_python_type(r.type) for r in schema.returns)
    return f"{name}({arguments}) -> tuple[{returns}]", str(schema)


class OperatorDirective(SphinxDirective):
    """``.. lltm-operator:: forward``."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        found = [
            (module, docs)
            for module in HANDLES
            if ("", name) in (docs := ModuleAnalyzer.for_module(module).find_attr_docs())
        ]
        if not found:
            raise self.error(f"no handle named {name} with a docstring in {', '.join(HANDLES)}")
        module, docs = found[0]
        signature, schema = _signature(name)
        body = GoogleDocstring(list(docs[("", name)]), self.config, what="function").lines()
        lines = [
            f".. py:function:: {signature}",
            "   :module: torch.ops.lltm",
            "",
            *(f"   {line}" for line in body),
            "",
            "   Its schema, as ``csrc/lltm_ops.cpp`` declares it:",
            "",
            "   .. code-block:: text",
            "",
            f"      lltm::{schema.removeprefix('lltm::')}",
            "",
        ]
        self.env.note_dependency(ModuleAnalyzer.for_module(module).srcname)
        container = nodes.section()
        self.state.nested_parse(StringList(lines, source=f"{module}.{name}"), 0, container)
        return container.children


class ParserDescription(SphinxDirective):
    """``.. lltm-parser-description:: lltm.bench.cli:parser``."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module, function = self.arguments[0].split(":")
        description = getattr(importlib.import_module(module), function)().description or ""
        return [nodes.literal_block(description, description)]


def _link_repository_files(app: Sphinx, doctree: nodes.document) -> None:
    root = Path(app.srcdir).parent
    base = app.config.lltm_repository_url.rstrip("/")
    for node in list(doctree.findall(addnodes.pending_xref)):
        target = node.get("reftarget", "")
        if node.get("reftype") != "myst" or not node.source or "://" in target:
            continue
        path = (Path(node.source).parent / target).resolve()
        if not path.exists() or not path.is_relative_to(root) or path.suffix == ".md":
            continue
        kind = "tree" if path.is_dir() else "blob"
        uri = f"{base}/{kind}/main/{path.relative_to(root).as_posix()}"
        node.replace_self(nodes.reference("", "", *node.children, refuri=uri, internal=False))


def setup(app: Sphinx) -> dict[str, Any]:
    """Registers the directives."""
    app.add_directive("lltm-operator", OperatorDirective)
    app.add_directive("lltm-parser-description", ParserDescription)
    app.add_config_value("lltm_repository_url", "", "env")
    app.connect("doctree-read", _link_repository_files)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
