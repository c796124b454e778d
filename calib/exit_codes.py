"""calib's exit codes: one table for the studies, ``python -m calib.cluster``, ``python -m calib.store`` and the
Slurm job script (README "Studies", docs/studies/index.md#exit-codes, docs/how-to/result-store.md).

A code means the same wherever it appears; tests/core/test_exit_codes.py checks the documentation against
:data:`STUDY_EXIT_CODES` and :data:`COMPACT_EXIT_CODES`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from enum import IntEnum

__all__ = ["COMPACT_EXIT_CODES", "STUDY_EXIT_CODES", "ExitCode", "exit_codes_epilog"]


class ExitCode(IntEnum):
    """A process's exit status (``sys.exit(ExitCode.BAD_INPUT)``, ``return ExitCode.OK`` from a ``main``)."""

    OK = 0
    """Done: every trial of a study's run is in the store as ``ok``; a command did what it was asked."""
    FAILED = 1
    """Some trial of a study failed (its row is in the store); a command could not do its job (``wait`` timed
    out, a worker's Ray could not be stopped, a Slurm job's Ray did not start); an error with a traceback."""
    BAD_INPUT = 2
    """Bad input: one ``error:`` line naming the value and what is allowed, before anything starts (argparse
    exits 2 too)."""
    INTERRUPTED = 3
    """A study stopped by SIGTERM or Ctrl-C (or a Slurm job by its time limit, a requeue, scancel) before its
    trials ended: the same command continues it. Never 0."""
    COMPACTION_SKIPPED = 4
    """``python -m calib.store compact`` skipped a study another process was compacting (not a failure)."""


STUDY_EXIT_CODES: dict[ExitCode, str] = {
    ExitCode.OK: "every trial of the run is stored `ok`",
    ExitCode.FAILED: "some trial failed",
    ExitCode.BAD_INPUT: "bad input",
    ExitCode.INTERRUPTED: "stopped by SIGTERM or Ctrl-C",
}
"""What a study's exit code says, as the README's sentence and docs/studies/index.md's list begin each entry."""

COMPACT_EXIT_CODES: dict[ExitCode, str] = {
    ExitCode.OK: "every study compacted",
    ExitCode.FAILED: "an error",
    ExitCode.BAD_INPUT: "bad input",
    ExitCode.COMPACTION_SKIPPED: "a study skipped",
}
"""What ``python -m calib.store compact``'s exit code says (its ``--help`` and docs/how-to/result-store.md)."""


def exit_codes_epilog(codes: Mapping[ExitCode, str], details: Mapping[ExitCode, str] | None = None) -> str:
    """The ``exit codes:`` block of a command's ``--help``: each code of ``codes`` with what it says there, then
    its ``details`` after a colon, wrapped under the text.

    >>> print(exit_codes_epilog({ExitCode.OK: "done"}, {ExitCode.OK: "nothing left"}))
    exit codes:
      0  done: nothing left
    """
    lines = ["exit codes:"]
    for code, what in codes.items():
        text = f"{what}: {details[code]}" if details and code in details else what
        lines += textwrap.wrap(text, width=110, initial_indent=f"  {code:d}  ", subsequent_indent="     ")
    return "\n".join(lines)
