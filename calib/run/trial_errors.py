"""What a failed trial died of, in one line: its stored row, or the error Ray Tune pickled for it, read once."""

from __future__ import annotations

import functools
import os
from typing import Any

import cloudpickle
import pandas as pd
import pyarrow.dataset as pads

from calib.store import read_trials

__all__ = ["TrialError", "failure_line"]


class TrialError:
    """The error Ray Tune pickled for ``trial`` (``trial.pickled_error_file``, written locally before Tune calls
    back): loaded on first use, once, however many of the trial's configs and questions need it."""

    def __init__(self, trial: Any) -> None:
        self._path = getattr(trial, "pickled_error_file", None)

    @functools.cached_property
    def cause(self) -> BaseException | None:
        """The trial's own exception (a ``RayTaskError``'s cause), or Ray's error; None when none was recorded
        or it cannot be read."""
        if not self._path or not os.path.exists(self._path):
            return None
        try:
            with open(self._path, "rb") as f:
                error = cloudpickle.load(f)
        except Exception:  # unreadable: reported as no error recorded, never a failed callback
            return None
        return getattr(error, "cause", None) or error

    def worker_died(self) -> bool:
        """Whether the trial ended because its worker process died (Ray's actor error), not of its own error."""
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
        from ray.exceptions import RayActorError

        return isinstance(self.cause, RayActorError)

    def first_line(self) -> str:
        """``<type>: <message>``'s first line, or ``no error recorded``."""
        if self.cause is None:
            return "no error recorded"
        return f"{type(self.cause).__name__}: {self.cause}".strip().splitlines()[0]


def failure_line(store: str, study: str, calib_id: str, error: TrialError) -> str:
    """What a failed trial died of, in one line: its stored row's stage, epoch and first error line,
    or, when the trial could not store a row (its worker was killed), the first line of Ray's ``error``."""
    rows = read_trials(store, study=study, columns=["error", "failed_stage", "failed_epoch"],
                       filters=(pads.field("trial_id") == calib_id) & (pads.field("status") == "failed"))
    if not rows.empty:
        row = rows.iloc[0]
        where = "" if pd.isna(row["failed_stage"]) else f"in {row['failed_stage']}"
        where += "" if pd.isna(row["failed_epoch"]) else f" at epoch {int(row['failed_epoch'])}"
        return (f"{where.strip()}: " if where else "") + str(row["error"]).strip().splitlines()[0]
    return error.first_line()
