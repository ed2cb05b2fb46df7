"""Sphinx configuration of actorgraph's documentation site.

Build it with `python -m sphinx -W --keep-going -b html docs docs/_build/html` after
`pip install -e ".[docs]"` in the checkout. Pages are MyST Markdown; the example notebooks
in examples/ are rendered with their committed outputs (never executed here); the API
reference comes from the docstrings (Google style, read by napoleon).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import actorgraph

DOCS = Path(__file__).resolve().parent
EXAMPLES = DOCS.parent / "examples"
NOTEBOOKS = DOCS / "notebooks"  # copies of examples/*.ipynb, made here (git-ignored)

project = "actorgraph"
author = "the actorgraph authors"
copyright = "the actorgraph authors"
release = version = actorgraph.__version__

extensions = [
    "myst_nb",  # MyST Markdown pages and notebooks (it brings myst_parser)
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]
html_theme = "furo"
html_title = f"actorgraph {release}"
html_static_path = ["_static"]

# Single backticks in docstrings are code, as in the project's Markdown.
default_role = "code"
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # the notebooks carry their outputs; the tests run them
nb_merge_streams = True

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_class_signature = "separated"
autodoc_default_options = {"exclude-members": "__init__, __new__"}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False


def _copy_notebooks() -> None:
    """The example notebooks as the site's pages: copied here, since Sphinx reads pages
    from this folder only."""
    NOTEBOOKS.mkdir(exist_ok=True)
    wanted = {path.name for path in EXAMPLES.glob("*.ipynb")}
    for stale in NOTEBOOKS.glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()
    for path in EXAMPLES.glob("*.ipynb"):
        target = NOTEBOOKS / path.name
        if not target.exists() or target.read_bytes() != path.read_bytes():
            shutil.copyfile(path, target)


_copy_notebooks()
