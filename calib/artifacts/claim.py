"""Claims: which trial, anywhere in a cluster, trains a Stage I while the others wait for it.

A claim is a lease (:mod:`calib._lease`): a small JSON file created in one atomic step
(:func:`calib.storage.create_exclusive`: ``O_EXCL`` on a local or shared directory, a conditional PUT
with ``If-None-Match: *`` on S3)::

    local or shared root:  <artifact_root>/stage1/<stage1_id>.claim
    s3:// root:            <artifact_root>/stage1/<stage1_id>/claim.json

Its holder renews it every third of the lease (a conditional replace, so a holder whose claim was
taken over notices) and deletes it once the artifact is published. A trial that finds a claim waits
for the artifact; when it sees the claim unchanged for a whole lease by its own clock (nodes need not
agree on the time), or its holder is a dead process of this host, it takes the claim over with a
conditional replace that only one waiter wins, and trains (a retry of the dead holder's trial resumes
from its checkpoint). A waiter gives up after the wait timeout with :class:`Stage1WaitTimeout`.

A study that stops cleanly (SIGTERM, Ctrl-C, Slurm's warning before the time limit) asks its trials to hand
their Stage-I trainings over first (:class:`StopWatch`, installed by :mod:`calib.run.events`): at the end of
its current epoch a training writes its state (:mod:`calib.artifacts.handover`) and only then deletes its claim,
so the next run, on any node, takes the claim at once and continues from that epoch.

Settings (environment, forwarded to Ray workers by :func:`calib.run.runtime.init_ray`):
``CALIB_STAGE1_LEASE_SECONDS`` (default 60) and ``CALIB_STAGE1_WAIT_SECONDS`` (default 43200, 12 h:
longer than any one Stage-I training should take).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from calib import storage
from calib._lease import HeldLease, OtherHolder, holder_is_dead, lease_record, lease_seconds_of, try_take
from calib.artifacts.waits import NOTE, WAITED, WAITING, Stage1Event, tell

__all__ = ["LEASE_ENV", "WAIT_ENV", "Claim", "ClaimSettings", "Stage1WaitTimeout", "StopWatch", "acquire",
           "claim_location", "new_writer_id", "release_if_held_by", "watching_for_stop"]

LEASE_ENV = "CALIB_STAGE1_LEASE_SECONDS"
WAIT_ENV = "CALIB_STAGE1_WAIT_SECONDS"


class Stage1WaitTimeout(RuntimeError):
    """A trial waited longer than the wait timeout for another trial's Stage I."""


@dataclass(frozen=True)
class ClaimSettings:
    """``lease_seconds``: how long a claim lives without renewal; ``wait_seconds``: how long a trial waits
    for a Stage I another trial holds; ``poll_seconds``: how often a waiter looks."""

    lease_seconds: float = 60.0
    wait_seconds: float = 12 * 3600.0
    poll_seconds: float = 2.0

    @classmethod
    def from_env(cls) -> ClaimSettings:
        lease = float(os.environ.get(LEASE_ENV, cls.lease_seconds))
        wait = float(os.environ.get(WAIT_ENV, cls.wait_seconds))
        if not (lease > 0 and wait >= 0):
            raise ValueError(f"{LEASE_ENV} must be > 0 and {WAIT_ENV} >= 0 seconds, got {lease} and {wait}")
        return cls(lease_seconds=lease, wait_seconds=wait, poll_seconds=min(cls.poll_seconds, lease / 4))


def new_writer_id() -> str:
    """``<host>-<pid>-<8 hex>``: the id of one attempt at training a Stage I (its claim and its files)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def claim_location(artifact_root: str, stage1_id: str) -> str:
    """Where the claim on ``stage1_id`` lives under ``artifact_root`` (see the module docstring)."""
    if storage.is_remote(artifact_root):
        return storage.join(artifact_root, "stage1", stage1_id, "claim.json")
    return storage.join(artifact_root, "stage1", f"{stage1_id}.claim")


class StopWatch(Protocol):
    """How a trial's claims learn that its study is stopping cleanly, and how the study learns which claims its
    trials still hold (:mod:`calib.run.events`: the driver's mailbox)."""

    def stopping(self) -> bool: ...

    def holding(self, holder: str, location: str) -> None: ...

    def let_go(self, holder: str) -> None: ...


_watches: list[StopWatch] = []


@contextlib.contextmanager
def watching_for_stop(watch: StopWatch) -> Iterator[None]:
    """Inside: the claims this process takes hand over and let go when ``watch`` says the study is stopping."""
    _watches.append(watch)
    try:
        yield
    finally:
        _watches.remove(watch)


def release_if_held_by(location: str, holder: str) -> bool:
    """Delete the claim at ``location`` if ``holder`` still holds it: a stopped study's driver, for a trial of its
    own that Ray Tune ended before it could let go. False when it is gone or another holder's."""
    found = storage.read_versioned(location)
    if found is None:
        return False
    data, token = found
    try:
        record = json.loads(data)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("holder") == holder and storage.delete_if(location, token)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _body(stage1_id: str, holder: str, settings: ClaimSettings, renewals: int, took_over: str | None) -> bytes:
    return lease_record(settings.lease_seconds, stage1_id=stage1_id, holder=holder, renewals=renewals,
                        renewed_at=_now(), took_over_from=took_over)


def _holder_of(other: OtherHolder) -> str:
    return str(other.record.get("holder", "an unknown holder"))


class Claim:
    """A held claim, renewed in a background thread until :meth:`release`. ``lost`` is set when the
    claim was taken over (this holder renewed too late): its training may still finish, and publishing
    first-writer-wins keeps the artifact whole. ``stop_requested`` is set when the study stops cleanly (a
    :class:`StopWatch` says so): the training then hands over at its next epoch's end (:meth:`hand_over`)."""

    def __init__(self, lease: HeldLease, stage1_id: str, holder: str, settings: ClaimSettings,
                 tell: Callable[[Stage1Event], None] = tell) -> None:
        self.location, self.stage1_id, self.holder = lease.location, stage1_id, holder
        self.took_over = None if lease.took_over is None else _holder_of(lease.took_over)
        self.lost = threading.Event()
        self._lease, self._settings, self._renewals, self._tell = lease, settings, 0, tell
        self.stop_requested = threading.Event()
        self._released = False
        self._watch = _watches[-1] if _watches else None
        if self._watch is not None:
            try:
                self._watch.holding(holder, lease.location)
            except Exception:  # no driver to tell (its mailbox gone): the claim expires as it always could
                self._watch = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name=f"claim-{stage1_id}", daemon=True)
        self._thread.start()

    def _say(self, message: str) -> None:
        self._tell(Stage1Event(NOTE, self.stage1_id, message))

    def _stopping(self) -> bool:
        try:
            return self._watch is not None and self._watch.stopping()
        except Exception:  # the driver's mailbox is gone (Ray stopping): nothing to hand over to
            return False

    def _renew_loop(self) -> None:
        renewed = time.monotonic()
        tick = self._settings.poll_seconds if self._watch is not None else self._settings.lease_seconds / 3
        while not self._stop.wait(tick):
            if not self.stop_requested.is_set() and self._stopping():
                self.stop_requested.set()
            if time.monotonic() - renewed < self._settings.lease_seconds / 3:
                continue
            try:
                if not self.renew():
                    self._say(f"Stage I {self.stage1_id}: another trial took over this trial's claim "
                              f"({self.holder}); the first of the two to publish wins")
                    return
                renewed = time.monotonic()
            except Exception as err:  # a network blip: try again at the next tick, within the lease
                self._say(f"Stage I {self.stage1_id}: renewing the claim of {self.holder} failed "
                          f"({type(err).__name__}: {err})")
                if time.monotonic() - renewed >= self._settings.lease_seconds:
                    self.lost.set()
                    self._say(f"Stage I {self.stage1_id}: no renewal for a whole lease: another trial may take "
                              f"the claim over; the first of the two to publish wins")
                    return

    def renew(self) -> bool:
        """Rewrite the claim if it is still this holder's (what the background thread does every third of
        the lease); False, and ``lost`` set, if it was taken over."""
        self._renewals += 1
        if not self._lease.renew(_body(self.stage1_id, self.holder, self._settings, self._renewals, self.took_over)):
            self.lost.set()
            return False
        return True

    def release(self) -> None:
        """Stop renewing and delete the claim, if it is still this holder's (once: a second call does nothing). A
        claim that cannot be deleted (the store unreachable) is left to expire: waiters take it over after a
        lease."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        try:
            if not self.lost.is_set():
                self._lease.release()
        except Exception as err:
            self._say(f"Stage I {self.stage1_id}: could not delete the claim {self.location} "
                      f"({type(err).__name__}: {err}); it expires after its lease")
        finally:
            if self._watch is not None:
                with contextlib.suppress(Exception):
                    self._watch.let_go(self.holder)

    def hand_over(self, epoch: int) -> None:
        """The study is stopping and the training state after ``epoch`` (0-based) is written: let the claim go,
        so the next run takes it at once and continues from there."""
        self.release()
        self._say(f"Stage I {self.stage1_id}: the study is stopping; its training is handed over after epoch "
                  f"{epoch + 1} and its claim released ({self.holder}), so the next run continues it at once")

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(artifact_root: str, stage1_id: str, published: Callable[[], bool], holder: str,
            settings: ClaimSettings, tell: Callable[[Stage1Event], None] = tell) -> Claim | None:
    """The claim on ``stage1_id`` for ``holder``, or None once ``published()`` says the artifact exists.

    Waits while another live holder renews its claim, takes a claim over whose lease ran out, and raises
    :class:`Stage1WaitTimeout` after ``wait_seconds``. ``tell`` hears that the wait started (once) and how
    it ended (:mod:`calib.artifacts.waits`), and the claim's own news (:class:`Claim`).
    """
    location = claim_location(artifact_root, stage1_id)
    start = time.monotonic()
    seen_token, seen_since = None, start  # the other holder's last write, and since when this trial sees it

    def body(other: OtherHolder | None) -> bytes:
        return _body(stage1_id, holder, settings, 0, None if other is None else _holder_of(other))

    def expired(other: OtherHolder) -> bool:  # unchanged for a whole lease by this trial's own clock
        nonlocal seen_token, seen_since
        now = time.monotonic()
        if other.token != seen_token:
            seen_token, seen_since = other.token, now
        return now - seen_since >= lease_seconds_of(other.record, settings.lease_seconds)

    announced = False
    while True:
        if published():
            if announced:
                waited = time.monotonic() - start
                tell(Stage1Event(WAITED, stage1_id, f"Stage I {stage1_id} was published after this trial waited "
                                                    f"{waited:.0f} s; it uses it", waited))
            return None
        taken = try_take(location, body, expired)
        now = time.monotonic()
        if taken is None:  # released or taken over meanwhile: look again
            continue
        if isinstance(taken, HeldLease):
            if taken.took_over is not None:
                other = taken.took_over
                why = ("is a process of this host that is gone" if holder_is_dead(other.record) else
                       f"stopped renewing its claim {lease_seconds_of(other.record, settings.lease_seconds):g} s ago")
                waited = f" after waiting {now - start:.0f} s" if announced else ""
                tell(Stage1Event(WAITED, stage1_id, f"Stage I {stage1_id}: its holder {_holder_of(other)} {why}; "
                                                    f"this trial ({holder}) takes it over{waited}", now - start))
            elif announced:  # released without a publication (its trial failed): this trial trains it
                tell(Stage1Event(WAITED, stage1_id, f"Stage I {stage1_id}: its holder gave it up after this trial "
                                                    f"waited {now - start:.0f} s; this trial ({holder}) trains it",
                                 now - start))
            return Claim(taken, stage1_id, holder, settings, tell=tell)
        other_holder = _holder_of(taken)
        lease = lease_seconds_of(taken.record, settings.lease_seconds)
        renewed_at = taken.record.get("renewed_at", "?")
        if not announced:
            tell(Stage1Event(WAITING, stage1_id, f"Stage I {stage1_id} is being trained by {other_holder} (claim "
                                                 f"renewed at {renewed_at}); waiting for it to be published, at "
                                                 f"most {settings.wait_seconds:g} s ({WAIT_ENV}); taken over if its "
                                                 f"claim is not renewed for {lease:g} s"))
            announced = True
        if now - start >= settings.wait_seconds:
            tell(Stage1Event(WAITED, stage1_id, "", now - start))  # the trial fails with the error below
            raise Stage1WaitTimeout(
                f"gave up after {settings.wait_seconds:g} s waiting for Stage I {stage1_id}, claimed by "
                f"{other_holder} (claim {location}, last renewed at {renewed_at}): raise {WAIT_ENV}, or delete the "
                f"claim if that trial is gone")
        time.sleep(settings.poll_seconds)
