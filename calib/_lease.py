"""Leases: a small JSON file that one process at a time holds (a Stage-I claim, a store compaction).

A lease is created in one atomic step (:func:`calib.storage.create_exclusive`: ``O_EXCL`` on a local or
shared directory, a conditional PUT with ``If-None-Match: *`` on S3), renewed and released only while it
still holds its holder's last write (:func:`calib.storage.replace_if`, :func:`calib.storage.delete_if`),
and taken over with a conditional replace of the record a taker read, so of several takers one wins.
The record names its holder (:func:`holder_identity`): a holder that is a dead process of this host
loses its lease at once; when a live one's lease runs out is the caller's rule (:func:`try_take`).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from calib import storage

__all__ = ["HeldLease", "OtherHolder", "holder_identity", "holder_is_dead", "lease_record", "lease_seconds_of",
           "try_take"]


def _pid_namespace() -> int | None:
    """The inode of this process's PID namespace: two processes with one host name may still not share
    their PIDs (containers)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def holder_identity() -> dict[str, Any]:
    """``host``, ``pid`` and ``pid_namespace`` of this process, as a lease records them."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pid_namespace": _pid_namespace()}


def holder_is_dead(record: dict[str, Any]) -> bool:
    """Whether the lease ``record``'s holder is a process of this host that no longer runs (no need to
    wait a lease). A holder on another host, or in another PID namespace, is never known dead."""
    if (record.get("host") != socket.gethostname() or record.get("pid_namespace") != _pid_namespace()
            or not isinstance(record.get("pid"), int)):
        return False
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def lease_record(lease_seconds: float, **fields: Any) -> bytes:
    """A lease file's contents: ``fields``, this process's identity and the lease it asks for."""
    return json.dumps({**fields, **holder_identity(), "lease_seconds": lease_seconds}).encode()


def lease_seconds_of(record: dict[str, Any], own: float) -> float:
    """How long the holder of ``record`` may go without renewing: its own lease if longer than ``own``."""
    return max(own, float(record.get("lease_seconds") or 0))


@dataclass(frozen=True)
class OtherHolder:
    """A lease another process holds: its ``record`` (``{}`` if unreadable) and the version ``token`` read."""

    record: dict[str, Any]
    token: str


class HeldLease:
    """A lease this process holds at ``location``; ``took_over``: the holder it was taken from, if any."""

    def __init__(self, location: str, token: str, took_over: OtherHolder | None = None) -> None:
        self.location, self.token, self.took_over = location, token, took_over

    def renew(self, body: bytes) -> bool:
        """Rewrite the lease with ``body`` if it is still this holder's; False if it was taken over."""
        token = storage.replace_if(self.location, body, self.token)
        if token is None:
            return False
        self.token = token
        return True

    def release(self) -> None:
        """Delete the lease if it is still this holder's."""
        storage.delete_if(self.location, self.token)


def _parse(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def try_take(location: str, body: Callable[[OtherHolder | None], bytes],
             expired: Callable[[OtherHolder], bool]) -> HeldLease | OtherHolder | None:
    """One attempt at the lease at ``location``.

    Creates it with ``body(None)`` if there is none; else reads the other holder's record, and takes it over
    with ``body(other)`` if its holder is a dead process of this host or ``expired(other)`` (the caller's
    rule), provided the file still holds what was read. Returns the :class:`HeldLease` taken, the
    :class:`OtherHolder` that keeps it, or None when the file changed between two steps (try again).
    """
    token = storage.create_exclusive(location, body(None))
    if token is not None:
        return HeldLease(location, token)
    current = storage.read_versioned(location)
    if current is None:  # released or taken over between the two calls
        return None
    other = OtherHolder(_parse(current[0]), current[1])
    if not (holder_is_dead(other.record) or expired(other)):
        return other
    token = storage.replace_if(location, body(other), other.token)
    return None if token is None else HeldLease(location, token, took_over=other)
