"""How far the running trial got: the (stage, epoch) its training loops last entered.

The training loops call :func:`record` at the start of every epoch; a failed trial's row carries
:func:`last` (``failed_stage``, ``failed_epoch``). Per thread, so concurrent trials in one process
do not mix.
"""

from __future__ import annotations

import threading

__all__ = ["last", "record", "reset"]

_current = threading.local()


def reset() -> None:
    """Forget the previous trial's progress (``run_trial`` calls this first)."""
    _current.value = None


def record(stage: str, epoch: int) -> None:
    """The loop of ``stage`` ("stage1", "stage2") is entering ``epoch`` (0-based)."""
    _current.value = (stage, epoch)


def last() -> tuple[str, int] | None:
    """The last recorded (stage, epoch) of this thread, or ``None``."""
    return getattr(_current, "value", None)
