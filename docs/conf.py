"""Sphinx configuration of lltm's documentation site (``nox -s docs``).

The build imports the installed lltm (autodoc reads the docstrings, the
operator reference reads the registered schemas) and needs no network: there
is no intersphinx, so names of torch and Python are written out in the pages
rather than linked, and ``nitpick_ignore_regex`` below lists the ones that
autodoc's signatures cannot link.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lltm

DOCS = Path(__file__).parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "lltm"
author = "The lltm developers"
copyright = "the lltm developers, BSD-3-Clause"
release = lltm.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinxarg.ext",
    "sphinx_copybutton",
    "lltm_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The API reference: Google-style docstrings, signatures with their types.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_class_signature = "mixed"
autodoc_default_options = {"members": True}

# Warnings are errors (nox -s docs passes -W), and every reference must
# resolve, except to what lives outside this site: without intersphinx
# inventories (no network at build time) torch's and Python's own names have
# no target here.
nitpicky = True
nitpick_ignore_regex = [
    ("py:.*", r"(torch|collections\.abc|typing|argparse|pathlib)(\..*)?"),
    ("py:class", r"(Tensor|PackedSequence|Module|OpOverload|Sequence|Callable|Any|NoReturn)"),
    ("py:class", r"(int|float|bool|str|None|tuple|list|dict|type)"),
    ("py:class", r"(device|dtype)"),
]

lltm_repository_url = "https://github.com/lltm/lltm"

html_theme = "furo"
html_title = f"lltm {release}"
html_static_path: list[str] = []
html_theme_options = {
    "source_repository": f"{lltm_repository_url}/",
    "source_branch": "main",
    "source_directory": "docs/",
}
