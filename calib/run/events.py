"""Stage-I waits and takeovers, from the trials to their study's driver while they happen.

A trial that waits on another trial's Stage I says so (:mod:`calib.artifacts.waits`), on a worker whose
output only reaches Ray's logs on its node. Each driver keeps a mailbox, a Ray actor without resources named
after the driver's Ray job (:func:`mailbox_name`: the job id, which the driver's trials share); a trial
forwards its events there (:func:`forwarding`) and the driver reads them from Ray Tune's loop without
waiting (:class:`EventFeed`) and prints them (:class:`calib.run.display.ProgressDisplay`). The same
on local Ray, ``ray up`` clusters and Slurm jobs.

The mailbox also carries a clean stop the other way: the trials' claims on the Stage Is they train are noted in
it (:class:`_MailboxStopWatch`, a :class:`calib.artifacts.claim.StopWatch`), and a stopping driver asks them to
hand their trainings over (:func:`hand_over_stage1`) before Ray Tune ends the trials, then deletes the claims of
those that could not (:func:`release_stopped_claims`): the next run never waits out a claim of this one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from calib.artifacts.checks import ArtifactWarning
from calib.artifacts.claim import release_if_held_by, watching_for_stop
from calib.artifacts.waits import Stage1Event, listening
from calib.run.mailbox import Mailbox

__all__ = ["HANDOVER_WAIT_ENV", "EventFeed", "forwarding", "hand_over_stage1", "mailbox_name",
           "release_stopped_claims", "trials_label"]

HANDOVER_WAIT_ENV = "CALIB_STAGE1_HANDOVER_WAIT_SECONDS"
"""How long a stopping driver waits for its trials to hand their Stage-I trainings over (default 15 s: inside a
scheduler's ``KillWait``); a training whose epoch has not ended by then keeps its last handover state."""

POLL_SECONDS = 0.5
"""How often the driver asks its mailbox for news."""


def mailbox_name(job_id: str) -> str:
    """The mailbox of the driver whose Ray job is ``job_id``."""
    return f"calib-events-{job_id}"


class _MailboxStopWatch:
    """A trial's :class:`calib.artifacts.claim.StopWatch`: its claims noted in the driver's mailbox, the driver's
    clean stop read from it (looked up at the first claim: a trial that trains no Stage I costs nothing)."""

    def __init__(self, job_id: str) -> None:
        self._job_id, self._mailbox = job_id, None

    def _actor(self) -> Any:
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
        import ray

        if self._mailbox is None:
            self._mailbox = ray.get_actor(mailbox_name(self._job_id))
        return self._mailbox

    def stopping(self) -> bool:
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
        import ray

        return bool(ray.get(self._actor().stopping.remote(), timeout=10))

    def holding(self, holder: str, location: str) -> None:
        self._actor().hold.remote(holder, location)

    def let_go(self, holder: str) -> None:
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
        import ray

        ray.get(self._actor().let_go.remote(holder), timeout=10)


def _driver_mailbox() -> Any:
    """The mailbox of this driver's Ray job, or None (no Ray, no mailbox: a run without a progress display)."""
    ray = sys.modules.get("ray")  # not imported: no Ray run in this process, and no import's seconds to pay
    if ray is None:
        return None
    try:
        return ray.get_actor(mailbox_name(ray.get_runtime_context().get_job_id())) if ray.is_initialized() else None
    except Exception:
        return None


def hand_over_stage1(wait_seconds: float | None = None) -> str | None:
    """A stopping driver: ask its trials to hand their Stage-I trainings over at the end of their current epoch
    and let their claims go; wait until they have, at most ``wait_seconds`` (default ``$``:data:`HANDOVER_WAIT_ENV`,
    15). The line to print, or None when no trial of the run held a claim. Never raises."""
    mailbox = _driver_mailbox()
    if mailbox is None:
        return None
    ray = sys.modules["ray"]
    wait = float(os.environ.get(HANDOVER_WAIT_ENV, 15)) if wait_seconds is None else wait_seconds
    try:
        held = ray.get(mailbox.stop.remote(), timeout=5)
        if not held:
            return None
        deadline = time.monotonic() + wait
        left = held
        while left and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            left = ray.get(mailbox.held.remote(), timeout=5)
    except Exception:  # Ray's head is going down too: the claims expire after their lease
        return None
    handed = len(held) - len(left)
    line = f"{handed} of {len(held)} Stage-I training{'s' if len(held) > 1 else ''} handed over"
    if left:
        line += (f"; {len(left)} did not reach the end of an epoch within {wait:g} s ({HANDOVER_WAIT_ENV}): "
                 f"the next run continues {'them' if len(left) > 1 else 'it'} from the last handover state")
    return line


def release_stopped_claims() -> int:
    """A stopped driver, once Ray Tune has ended its trials: delete the claims they still held (if still
    theirs), so that the next run takes them at once. How many; never raises."""
    mailbox = _driver_mailbox()
    if mailbox is None:
        return 0
    ray = sys.modules["ray"]
    released = 0
    try:
        for holder, location in ray.get(mailbox.held.remote(), timeout=5).items():
            with contextlib.suppress(Exception):
                released += release_if_held_by(location, holder)
    except Exception:  # Ray going down: the claims expire after their lease
        pass
    return released


class EventFeed:
    """The driver's end: its mailbox (created once per driver, it lives as long as the driver), read
    without blocking the caller."""

    def __init__(self) -> None:
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
        import ray

        name = mailbox_name(ray.get_runtime_context().get_job_id())
        self._actor = ray.remote(num_cpus=0)(Mailbox).options(name=name, get_if_exists=True).remote()
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

    with listening(send), watching_for_stop(_MailboxStopWatch(job_id)):
        yield
