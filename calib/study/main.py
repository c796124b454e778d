"""A study script's exits: user errors as one ``error:`` line and exit 2, a stop by signal as exit 3, the
study's own exit code from what it stored."""

from __future__ import annotations

import atexit
import signal
import sys
from collections.abc import Callable
from typing import Any

from calib._config import ConfigError
from calib._registry import UnknownNameError
from calib.datasets import DatasetNotFoundError
from calib.exit_codes import ExitCode

__all__ = ["guarded_main", "study_exit_code"]


def guarded_main(main: Callable[[list[str] | None], Any]) -> Callable[[list[str] | None], int]:
    """Turn the errors a user can fix (bad config, unknown name, missing data) into one message and exit 2;
    a run stopped by SIGTERM into its last line and exit 3; a :class:`~calib.run.CheckedOnly` that ``main``
    returns (``--check-only``) into its line and exit 0; otherwise ``main``'s exit code."""
    # Not at the top: calib.run costs 3 s to import, and studies/report.py, which trains nothing, exits here too.
    from calib.run.stopping import StudyInterrupted
    from calib.run.tuner import CheckedOnly

    def wrapper(argv: list[str] | None = None) -> int:
        try:
            result = main(argv)
        except (ConfigError, UnknownNameError, DatasetNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return ExitCode.BAD_INPUT
        except StudyInterrupted as stopped:
            print(stopped, flush=True)
            _ignore_further_sigterm()
            return ExitCode.INTERRUPTED
        except SystemExit as exiting:  # Ray's driver's own SIGTERM handler (sys.exit(15)), in the study's start-up
            if exiting.code == signal.SIGTERM:
                _ignore_further_sigterm()
            raise
        if isinstance(result, CheckedOnly):
            print(result, flush=True)
            return ExitCode.OK
        if result == ExitCode.INTERRUPTED:
            _ignore_further_sigterm()
        return result

    wrapper.__doc__ = main.__doc__
    return wrapper


def _ignore_further_sigterm() -> None:
    """A study stopped by SIGTERM is ending: a later one (Slurm signals every process of the job, and the job script
    its study too) must change nothing then. Ray's handler, back in place, would raise SystemExit inside Ray's
    ``atexit`` shutdown: a traceback after the study's last line. So the process ignores SIGTERM from the start of
    its exit (an ``atexit`` function registered after Ray's runs before it), not before: a study run in-process
    (tests) leaves its caller's handler alone."""
    if not _IGNORING_AT_EXIT:
        _IGNORING_AT_EXIT.append(True)
        atexit.register(signal.signal, signal.SIGTERM, signal.SIG_IGN)


_IGNORING_AT_EXIT: list[bool] = []


def study_exit_code(study: str, store: str, failed: int, finished: int) -> int:
    """A study's exit code: 0 when every trial of the run is in the store as ok, 1 when ``failed`` > 0
    or none finished (bad input exits 2 earlier). Prints how to read the failed rows."""
    if failed:
        print(f"[{study}] {failed} trial{'s' if failed > 1 else ''} failed; their errors: python -c \"import pandas "
              f"as pd; t = pd.read_parquet('{store}/trials', filters=[('status', '==', 'failed')]); "
              f"print(t[['study', 'trial_id', 'failed_stage', 'failed_epoch', 'error']])\"", flush=True)
        return ExitCode.FAILED
    if not finished:
        print(f"[{study}] no finished trial in the store", flush=True)
        return ExitCode.FAILED
    return ExitCode.OK
