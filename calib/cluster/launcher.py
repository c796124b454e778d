"""What each command of ``python -m calib.cluster`` is: a :class:`Launcher`, listed in
:data:`calib.cluster.LAUNCHERS`, from which the CLI builds its subcommands and runs the one asked for.

Adding one (docs/extending.md, "Adding a launcher"): a module of calib/cluster/ that defines its ``Launcher``
(name, one-line help, the function adding its flags to its subparser, the function running it), and one entry
in ``LAUNCHERS``. Bad input is a :class:`calib._config.ConfigError`: the CLI prints each of its lines as an
``error:`` line and exits :attr:`calib.exit_codes.ExitCode.BAD_INPUT`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Launcher"]


@dataclass(frozen=True)
class Launcher:
    """One subcommand of ``python -m calib.cluster``."""

    name: str
    """The subcommand, e.g. ``slurm``."""
    help: str
    """Its line in ``python -m calib.cluster --help``."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Adds its flags to its subparser."""
    run: Callable[[argparse.Namespace, list[str]], int]
    """Runs it with the parsed flags and the whole command line; its exit code (:mod:`calib.exit_codes`)."""
