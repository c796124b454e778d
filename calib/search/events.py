"""Stage-I waits and takeovers, from the trials to their study's driver while they happen.

A trial that waits on another trial's Stage I says so (:mod:`calib.artifacts.waits`), on a worker whose
output only reaches Ray's logs on its node. Each driver keeps a mailbox, a Ray actor without resources named
after the driver's Ray job (:func:`mailbox_name`: the job id, which the driver's trials share); a trial
forwards its events there (:func:`forwarding`) and the driver reads them from Ray Tune's loop without
waiting (:class:`EventFeed`) and prints them (:class:`calib.search.display.ProgressDisplay`). The same
on local Ray, ``ray up`` clusters and Slurm jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from calib.artifacts.checks import ArtifactWarning
from calib.artifacts.waits import Stage1Event, listening

__all__ = ["EventFeed", "forwarding", "mailbox_name", "trials_label"]

POLL_SECONDS = 0.5
"""How often the driver asks its mailbox for news."""


def mailbox_name(job_id: str) -> str:
    """The mailbox of the driver whose Ray job is ``job_id``."""
    return f"calib-events-{job_id}"


class _Mailbox:
    """Events in the order they came, until the driver takes them."""

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []

    def put(self, event: dict[str, Any]) -> None:
        self._events.append(event)

    def take(self) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events


class EventFeed:
    """The driver's end: its mailbox (created once per driver, it lives as long as the driver), read
    without blocking the caller."""

    def __init__(self) -> None:
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
        import ray

        name = mailbox_name(ray.get_runtime_context().get_job_id())
        self._actor = ray.remote(num_cpus=0)(_Mailbox).options(name=name, get_if_exists=True).remote()
        self._pending: Any = None
        self._asked_at = -math.inf

    def poll(self) -> list[dict[str, Any]]:
        """What arrived since the last call, as far as the mailbox has answered (never waits, never raises);
        it is asked at most every :data:`POLL_SECONDS`. Once the mailbox is gone (Ray stopping), nothing."""
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
        import ray

        if self._actor is None:
            return []
        try:
            if self._pending is None:
                if time.monotonic() - self._asked_at >= POLL_SECONDS:
                    self._pending, self._asked_at = self._actor.take.remote(), time.monotonic()
                return []
            ready, _ = ray.wait([self._pending], timeout=0)
            if not ready:
                return []
            pending, self._pending = self._pending, None
            return ray.get(pending)
        except Exception:  # the mailbox died with its node (a job ending): the run's own end says the rest
            self._actor = self._pending = None
            return []

    def drain(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Everything still in the mailbox (the last events of a run), waiting at most ``timeout`` seconds;
        never raises."""
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
        import ray

        if self._actor is None:
            return []
        try:
            refs = [r for r in (self._pending, self._actor.take.remote()) if r is not None]
            self._pending = None
            return [event for events in ray.get(refs, timeout=timeout) for event in events]
        except Exception:  # Ray is going down (a stopped run): those lines are lost, nothing else
            self._actor = None
            return []


def trials_label(trial_ids: Sequence[str]) -> str:
    """``trial <id>``, or ``3 trials (<id>, ...)`` for a population of trials sharing one Stage I."""
    if len(trial_ids) == 1:
        return f"trial {trial_ids[0]}"
    return f"{len(trial_ids)} trials ({trial_ids[0]}, ...)"


@contextlib.contextmanager
def forwarding(label: str) -> Iterator[None]:
    """Inside a Ray Tune trial: send the Stage-I events of this process to the driver's mailbox while inside,
    each with the Tune trial id (``trial``) and ``label``. Elsewhere (no Tune trial, a driver without a
    mailbox) nothing is sent: the events stay warnings, which the trial reports when it ends."""
    try:
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
        import ray
        from ray import tune

        key = tune.get_context().get_trial_id()
        job_id = ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
    except Exception:  # not a Tune trial
        key = job_id = None
    if key is None or job_id is None:
        yield
        return
    mailbox: list[Any] = []  # looked up at the first event: a trial that never waits costs nothing

    def send(event: Stage1Event) -> None:
        if not mailbox:
            try:
                mailbox.append(ray.get_actor(mailbox_name(job_id)))
            except ValueError:  # a driver without one (no progress display)
                mailbox.append(None)
        if mailbox[0] is not None:
            mailbox[0].put.remote({"trial": key, "label": label, **dataclasses.asdict(event)})
        elif event.message:
            warnings.warn(event.message, ArtifactWarning, stacklevel=2)

    with listening(send):
        yield
