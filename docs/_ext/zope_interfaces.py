"""``.. autointerface:: module.IName`` — document a zope interface like a class.

Sphinx's autodoc documents classes; a zope ``Interface`` is an
``InterfaceClass`` instance, so ``automodule`` skips it and links to it
dangle. This directive writes the interface's docstring and each of its
methods (signature and docstring, in definition order) and attributes as
``py:class`` / ``py:method`` / ``py:attribute`` entries, which
``:class:`` and ``:meth:`` roles then reach.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from zope.interface.interface import Method


def _indented(text: str | None, prefix: str) -> list[str]:
    return [prefix + line if line else "" for line in inspect.cleandoc(text or "").splitlines()]


class AutoInterface(SphinxDirective):
    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module_name, _, name = self.arguments[0].rpartition(".")
        interface: Any = getattr(importlib.import_module(module_name), name)
        lines = [f".. py:class:: {name}", f"   :module: {module_name}", ""]
        lines += [*_indented(interface.__doc__, "   "), ""]
        for member in interface.names():  # in definition order
            described = interface[member]
            if isinstance(described, Method):
                lines += [f"   .. py:method:: {member}{described.getSignatureString()}", ""]
            else:
                lines += [f"   .. py:attribute:: {member}", ""]
            lines += [*_indented(described.getDoc(), "      "), ""]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=self.arguments[0]), 0, container)
        return container.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("autointerface", AutoInterface)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
