"""Sphinx configuration for slotkit's documentation.

Build with warnings as errors, as CI does::

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

# Document the working tree even when slotkit is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# docs/_ext: the autointerface directive for zope interfaces.
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "slotkit"
author = "slotkit contributors"
copyright = "slotkit contributors"
release = "0.1.0"
version = "0.1"

extensions = [
    "sphinx.ext.autodoc",
    "zope_interfaces",
]

# Builds must work offline, so no intersphinx.
nitpicky = False

root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_theme = "alabaster"
html_title = f"slotkit {release}"
