"""What a study run prints while its trials run: one progress line, one line per failed trial and per
Stage-I wait, takeover or handover, and a warning line per degenerate post-hoc fit (the first
:data:`DEGENERATE_LINES`).

On a terminal the progress is a single line rewritten in place (done / running / failed / pruned of
the total, trials waiting on another trial's Stage I and for how long, the best objective so far,
elapsed time and ETA). Anywhere else (CI, ``ray submit``, a log file) every start, finish and failure
prints its own line, and the progress line is repeated every minute while a trial waits, so a log
keeps the whole story. The display knows nothing of Ray; :mod:`calib.run.tuner` feeds it Tune's
trial events and the trials' Stage-I events (:mod:`calib.run.events`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

from calib.artifacts.waits import WAITED, WAITING
from calib.metrics import METRICS, higher_is_better

__all__ = ["DEGENERATE_LINES", "WAIT_REPORT_SECONDS", "ProgressDisplay", "format_duration"]

DEGENERATE_LINES = 20
"""A run prints a warning line for each of its first this-many degenerate fits, then only counts them."""

WAIT_REPORT_SECONDS = 60.0
"""In a log, how often the progress line is repeated while some trial waits on another trial's Stage I."""


def format_duration(seconds: float) -> str:
    """``"42s"``, ``"3m05s"`` or ``"2h07m"``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _format_value(objective: str, value: float) -> str:
    """A metric value as a user reads it: fractions in percent, NLL and Brier as they are."""
    metric = objective.split("_", 1)[1]
    return f"{value:.2%}" if METRICS[metric].bounds == (0.0, 1.0) else f"{value:.4g}"


class ProgressDisplay:
    """Counts a run's trials and prints its progress to ``stream``.

    Args:
        study: the study name, the prefix of every line.
        total: the number of trials this run schedules.
        objective: the validation metric (``val_ece``) whose best value is shown.
        stream: where to print (default ``sys.stdout``).
        interactive: rewrite one line in place; default: whether ``stream`` is a terminal.
        clock: seconds, monotonic (tests pass a fake clock).
        replicates: how many rows each Optuna trial runs (a replicated search); above 1 the best is the value
            Optuna was told (:meth:`trial_told`: their aggregate), not one row's.
    """

    def __init__(self, study: str, total: int, objective: str, *, stream: TextIO | None = None,
                 interactive: bool | None = None, clock: Callable[[], float] = time.monotonic,
                 replicates: int = 1) -> None:
        self.study, self.total, self.objective = study, total, objective
        self.replicates = replicates
        self.stream = stream if stream is not None else sys.stdout
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.clock = clock
        self.sign = 1.0 if higher_is_better(objective.split("_", 1)[1]) else -1.0
        self.started_at = clock()
        self.done = self.failed = self.pruned = self.degenerate = 0
        self.running: dict[str, int] = {}
        self.waiting: dict[str, float] = {}
        """Tune trials waiting on another trial's Stage I, and since when (``clock``)."""
        self._last_printed = clock()
        self.best: tuple[float, str] | None = None
        self._last_draw = -math.inf
        self._line_open = False
        self.interrupted: str | None = None
        """The signal that is stopping the run: trials that end after it were stopped, not failed."""

    # events -------------------------------------------------------------------------------------
    def trial_started(self, key: str, size: int = 1) -> None:
        """A Tune trial ``key`` started; it runs ``size`` configs (a population, or 1)."""
        self.running[key] = size
        self._update()

    def _ended(self, key: str) -> None:
        """One config of Tune trial ``key`` ended."""
        if key in self.running:
            self.running[key] -= 1
            if self.running[key] <= 0:
                del self.running[key]
                self.waiting.pop(key, None)

    def trial_finished(self, key: str, calib_id: str, value: float | None) -> None:
        """A trial stored its row; ``value`` is its objective (None if it has none; a replicate's is not the
        objective: :meth:`trial_told` is)."""
        self._ended(key)
        self.done += 1
        if self.replicates == 1:
            self._better(value, calib_id)
        self._update()

    def trial_told(self, number: int, value: float) -> None:
        """Optuna was told ``value`` for its trial ``number``: a replicated search's objective (the aggregate
        of its replicates), the best the progress line shows."""
        if self._better(value, f"trial #{number}, {self.replicates} replicates"):
            self._update()

    def _better(self, value: float | None, what: str) -> bool:
        if value is not None and math.isfinite(value) and (self.best is None or self.sign * value > self.best[0]):
            self.best = (self.sign * value, what)
            return True
        return False

    def trial_pruned(self, key: str) -> None:
        """A scheduler stopped the trial early."""
        self._ended(key)
        self.pruned += 1
        self._update()

    def trial_failed(self, key: str, calib_id: str, error: str) -> None:
        """A trial ended as a ``failed`` row: one line with its short error."""
        self._ended(key)
        if self.interrupted:
            self._message(f"[{self.study}] trial {calib_id} stopped by {self.interrupted} ({error}); the next run "
                          f"of the command runs it")
            self._update()
            return
        self.failed += 1
        self._message(f"[{self.study}] trial {calib_id} failed: {error} (traceback: the store's `error` column)")
        self._update()

    def trial_retrying(self, key: str, calib_id: str, attempt: int, max_failures: int, error: str) -> None:
        """A failed trial is started again (``--max-failures``)."""
        self._message(f"[{self.study}] trial {calib_id} failed: {error}; retry {attempt} of {max_failures}")

    def degenerate_fit(self, text: str) -> None:
        """A trial whose calibrator's fit was degenerate: a warning line each, up to
        :data:`DEGENERATE_LINES`; the progress line counts them all."""
        self.degenerate += 1
        if self.degenerate <= DEGENERATE_LINES:
            self._message(f"[{self.study}] warning: {text}")
        elif self.degenerate == DEGENERATE_LINES + 1:
            self._message(f"[{self.study}] warning: more degenerate fits; the progress line counts them and the "
                          f"store's fit_degenerate_reason column says why for each")

    def stage1_event(self, key: str, kind: str, label: str, message: str) -> None:
        """What Tune trial ``key`` (its configs: ``label``) said of a Stage I (:mod:`calib.artifacts.waits`):
        a wait began (counted, with its duration, in the progress line until it ends), a wait ended, or a
        note; a non-empty ``message`` is a line of its own."""
        if message:
            self._message(f"[{self.study}] {label}: {message}")
        if kind == WAITING and key in self.running:
            self.waiting[key] = self.clock()
        elif kind == WAITED:
            self.waiting.pop(key, None)
        else:
            return
        self._update()

    def note(self, text: str) -> None:
        """Something the user must know about a trial (an artifact that was moved aside and rebuilt)."""
        self._message(f"[{self.study}] {text}")

    def tick(self) -> None:
        """Refresh the elapsed time, waits and ETA of the interactive line, at most once a second; in a log,
        repeat the progress line every :data:`WAIT_REPORT_SECONDS` while a trial waits."""
        if self.interactive and self.clock() - self._last_draw >= 1.0:
            self._draw()
        elif not self.interactive and self.waiting and self.clock() - self._last_printed >= WAIT_REPORT_SECONDS:
            self._update()

    def close(self) -> None:
        """End the interactive line so that what follows starts on a line of its own."""
        if self.interactive and self._line_open:
            self.stream.write("\n")
            self.stream.flush()
            self._line_open = False

    # rendering ----------------------------------------------------------------------------------
    def line(self) -> str:
        """The progress line: counts, best objective so far, elapsed time and ETA."""
        parts = [f"[{self.study}] {self.done}/{self.total} done", f"{sum(self.running.values())} running"]
        if self.waiting:
            longest = self.clock() - min(self.waiting.values())
            waiting = sum(self.running.get(key, 1) for key in self.waiting)  # configs, as "running" counts them
            parts.append(f"{waiting} waiting for another trial's Stage I ({format_duration(longest)})")
        parts.append(f"{self.failed} failed")
        if self.pruned:
            parts.append(f"{self.pruned} pruned")
        if self.degenerate:
            parts.append(f"{self.degenerate} degenerate fit{'s' if self.degenerate > 1 else ''}")
        if self.best is not None:
            parts.append(f"best {self.objective} {_format_value(self.objective, self.sign * self.best[0])} "
                         f"({self.best[1]})")
        elapsed = self.clock() - self.started_at
        parts.append(f"{format_duration(elapsed)} elapsed")
        ended = self.done + self.failed + self.pruned
        if 0 < ended < self.total:
            parts.append(f"ETA {format_duration(elapsed / ended * (self.total - ended))}")
        return " · ".join(parts)

    def _update(self) -> None:
        if self.interactive:
            self._draw()
        else:
            print(self.line(), file=self.stream, flush=True)
            self._last_printed = self.clock()

    def _draw(self) -> None:
        self.stream.write("\r\033[K" + self.line())
        self.stream.flush()
        self._line_open = True
        self._last_draw = self.clock()

    def _message(self, text: str) -> None:
        if self.interactive and self._line_open:
            self.stream.write("\r\033[K")
            self._line_open = False
        print(text, file=self.stream, flush=True)
