"""A griffe extension for the API reference: calib's docstrings cite code with Sphinx roles
(:func:`compute_all`, :class:`~calib.store.CompactionReport`), which Markdown does not know; each becomes
a code span of the name (the last part after ``~``) before mkdocstrings renders the docstring; reST's
``text::`` before a literal block becomes ``text:`` (the indented block is a code block in Markdown too)."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|exc|obj):`(~?)([^`]+)`")
LITERAL = re.compile(r"(?m)(\S)::$|^\s*::\n")  # reST's "text::" before an indented block: Markdown's is plain


def _name(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(_name, obj.docstring.value)
            obj.docstring.value = LITERAL.sub(lambda m: f"{m.group(1)}:" if m.group(1) else "", text)
