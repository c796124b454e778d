"""What a trial says while it depends on another trial's Stage I: that it waits, how the wait ended (the
artifact published, the claim taken over), and the other steps a user should see (a training continued
from a handover, a copy adopted).

:func:`tell` passes each :class:`Stage1Event` to the listeners installed with :func:`listening`: a trial
of a Ray Tune run forwards them to its study's driver, which prints them as they happen
(:mod:`calib.run.events`). It also prints the message on stderr (the worker's log). With no listener
(a trial run in process) the message is an :class:`~calib.artifacts.checks.ArtifactWarning` as well,
which a trial reports when it ends.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from calib.artifacts.checks import say

__all__ = ["NOTE", "WAITED", "WAITING", "Stage1Event", "listening", "tell"]

WAITING = "waiting"
"""The trial starts waiting for a Stage I that another trial trains (or checks)."""
WAITED = "waited"
"""The wait ended: the artifact was published, the claim taken over, or the trial gave up (no message)."""
NOTE = "note"
"""Anything else the user should see: a training continued from a handover, a copy published or adopted."""


@dataclass(frozen=True)
class Stage1Event:
    """One thing a trial says about a Stage I: its ``kind`` (:data:`WAITING`, :data:`WAITED`, :data:`NOTE`),
    the ``stage1_id``, the ``message`` for the user (empty: nothing to print), and for :data:`WAITED` the
    ``seconds`` the trial waited."""

    kind: str
    stage1_id: str
    message: str
    seconds: float | None = None


_listeners: list[Callable[[Stage1Event], None]] = []
_lock = threading.Lock()


@contextlib.contextmanager
def listening(listener: Callable[[Stage1Event], None]) -> Iterator[None]:
    """Pass every event told in this process (any thread) to ``listener`` while inside."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


def tell(event: Stage1Event) -> None:
    """Pass ``event`` to the listeners and print its message on stderr; with no listener, :func:`say` it."""
    with _lock:
        listeners = list(_listeners)
    if not listeners:
        if event.message:
            say(event.message)
        return
    if event.message:
        print(f"calib: {event.message}", file=sys.stderr, flush=True)
    for listener in listeners:
        try:
            listener(event)
        except Exception as err:  # the user misses a line; the trial goes on
            print(f"calib: could not pass on {event.kind} of Stage I {event.stage1_id} "
                  f"({type(err).__name__}: {err})", file=sys.stderr, flush=True)
