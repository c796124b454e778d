"""The driver's mailbox (:mod:`calib.run.events`): a Ray actor without resources that holds its trials' Stage-I
events and claims.

Its own module, importing nothing but the standard library: Ray imports an actor's module in the worker process
it starts for it, and this one's worker should not spend seconds of CPU importing torch for a list and a dict
(``calib.run`` loads its modules lazily for the same reason).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Mailbox"]


class Mailbox:
    """Events in the order they came, until the driver takes them."""

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._held: dict[str, str] = {}  # holder -> claim location, of the Stage Is this run's trials train
        self._stopping = False

    def put(self, event: dict[str, Any]) -> None:
        self._events.append(event)

    def take(self) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events

    def hold(self, holder: str, location: str) -> None:
        self._held[holder] = location

    def let_go(self, holder: str) -> None:
        self._held.pop(holder, None)

    def held(self) -> dict[str, str]:
        return dict(self._held)

    def stop(self) -> dict[str, str]:
        self._stopping = True
        return dict(self._held)

    def stopping(self) -> bool:
        return self._stopping
