"""``--help`` formatting shared by every command of calib: the studies, ``python -m calib.store`` and
``python -m calib.cluster``."""

from __future__ import annotations

import argparse

__all__ = ["HelpFormatter"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` that shows each flag's default once: the module docstring as written, and
    ``(default: X)`` after every flag whose help does not state its default already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("(default" in text or action.default in (None, argparse.SUPPRESS) or action.nargs == 0
                or action.option_strings == []):
            return text
        default = " ".join(map(str, action.default)) if isinstance(action.default, list) else "%(default)s"
        return f"{text} (default: {default})"
