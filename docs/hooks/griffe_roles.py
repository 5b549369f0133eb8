"""Griffe extension: Sphinx roles in lit-rag's docstrings (:class:`Example`) shown as code."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|meth|func|data|attr|mod|exc|obj):`~?([^`]+)`")


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:  # noqa: ARG002
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value)
