"""Report steps that never fail a run: the trials are stored before any table or figure is made."""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator

__all__ = ["report_step"]


@contextlib.contextmanager
def report_step(study: str, what: str, *, log: Callable[[str], None] = print) -> Iterator[None]:
    """Run a step that only reads stored trials (a table, a figure, importances); if it raises, log one
    line naming the step and the error and go on. A table or a plot that cannot be made never fails
    a study (its exit code says whether trials failed). ``CALIB_DEBUG=1`` prints the traceback too."""
    try:
        yield
    except Exception as err:
        text = f"{type(err).__name__}: {err}".splitlines()[0]
        log(f"[{study}] {what} not made: {text}")
        if os.environ.get("CALIB_DEBUG"):
            traceback.print_exc()
