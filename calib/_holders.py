"""The process that holds a lease (a Stage-I claim, a store compaction): the identity written into the
lease, and whether that process is gone."""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["holder_identity", "holder_is_dead"]


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
