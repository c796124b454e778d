"""``--help`` formatting and argument errors shared by every command of calib: the studies, ``python -m calib.store``
and ``python -m calib.cluster``."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from calib.exit_codes import ExitCode

__all__ = ["CommandParser", "HelpFormatter"]


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


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors are one ``error:`` line on stderr and exit code 2 (bad input), as every
    other user error of calib: no usage block before it (``--help`` prints that). Its subcommands' parsers are
    of the same class."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        command = f"{self.prog} --help" if self.prog.startswith("python ") else "--help"  # a script's is its file
        print(f"error: {text} ({command} lists the flags)", file=sys.stderr, flush=True)
        sys.exit(ExitCode.BAD_INPUT)
