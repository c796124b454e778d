"""The Optuna study of a search, persisted next to its trials: Optuna's journal storage in the store.

Local store: one journal file, ``<store>/optuna/<study>.journal`` (Optuna's ``JournalFileBackend``),
which ``optuna-dashboard <file>``, ``optuna.load_study`` and ``optuna.visualization`` open as it is.
Object store (``s3://``): the same journal records, one JSON-lines object per append under
``<store>/optuna/<study>/`` (:class:`ObjectStoreJournalBackend`, through :mod:`calib.storage`);
:func:`optuna_storage` opens it for Optuna, and :func:`export_journal` writes it to one local file for
``optuna-dashboard``. Only the search's driver appends, so the objects need no lock. Imports Optuna: import it where a
search runs, not at package import.

Snapshots: opening a journal replays every record in it (about 8 per trial a search asked: 100,000 trials
take seconds locally, and one GET per record on an object store). :class:`SnapshotJournalStorage` also
keeps Optuna's replayed state, pickled, next to the journal (``<study>.journal.snapshot``, or
``<study>/snapshot`` on an object store) together with where in the journal it was taken; opening
restores it and replays only the records after it. The journal stays the record: a snapshot that does not
match the journal's start and its record at that point, or was written by another Optuna version or
time zone, is ignored (and replaced by the next one written). :meth:`SnapshotJournalStorage.snapshot_if_due`
writes one when ``SNAPSHOT_EVERY`` records or more were replayed beyond the last (``run_search`` calls it
after telling the sampler the stored trials and when the search ends). The snapshot is a pickle, and
loading a pickle can run code (as loading Ray Tune's checkpoints under ``<store>/_ray`` can): whoever can
write the store must be trusted.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import pickle
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend, JournalFileOpenLock

from calib import storage
from calib.config import validate_study_name

__all__ = ["SNAPSHOT_EVERY", "ObjectStoreJournalBackend", "SnapshotJournalStorage", "export_journal",
           "journal_location", "optuna_storage", "snapshot_location"]

SNAPSHOT_EVERY = 10_000
"""Journal records replayed beyond the last snapshot (or in a journal without one) from which
:meth:`SnapshotJournalStorage.snapshot_if_due` writes a new snapshot (10,000: about 1,250 trials)."""

_SNAPSHOT_FORMAT = 1
_FINGERPRINT_BYTES = 4096


def journal_location(store: str | os.PathLike, study: str) -> str:
    """Where the journal of ``study`` lives: a file in a local store, a folder of objects in a remote one."""
    store = storage.normalize(store)
    name = validate_study_name(study)
    if storage.is_remote(store):
        return storage.join(store, "optuna", name)
    return storage.join(store, "optuna", f"{name}.journal")


def snapshot_location(store: str | os.PathLike, study: str) -> str:
    """Where the snapshot of the journal of ``study`` lives (next to the journal file, or in its folder)."""
    location = journal_location(store, study)
    return storage.join(location, "snapshot") if storage.is_remote(location) else f"{location}.snapshot"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Without Python's cyclic garbage collector: replaying or unpickling 100,000 trials creates millions of
    objects, and the collections they trigger cost more than the work (none of them is garbage)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class ObjectStoreJournalBackend(BaseJournalBackend):
    """Optuna's ``BaseJournalBackend`` on an object store: each :meth:`append_logs` is one new object
    ``<location>/<sequence number, 10 digits>.jsonl``; :meth:`read_logs` reads them in order (the
    objects it has read once are kept in memory). One writer per study: object stores have no
    append and pyarrow no conditional PUT, so two drivers on one study would overwrite each other
    (calib runs one driver per search)."""

    def __init__(self, location: str) -> None:
        self.location = location.rstrip("/")
        self._logs: list[dict[str, Any]] = []  # the records from number self._first on
        self._first = 0
        self._objects = 0  # objects read (or written): the next one is named after this count

    def _name(self, number: int) -> str:
        return storage.join(self.location, f"{number:010d}.jsonl")

    def _refresh(self) -> None:
        """Read the objects after the last one read, probing by name (no listing)."""
        while True:
            try:
                text = storage.read_bytes(self._name(self._objects)).decode()
            except FileNotFoundError:
                return
            self._logs.extend(json.loads(line) for line in text.splitlines() if line)
            self._objects += 1

    def skip_to(self, objects: int, logs: int) -> None:
        """Start reading after the first ``objects`` objects, which hold the first ``logs`` records (a snapshot
        holds them): :meth:`read_logs` then serves record numbers from ``logs`` on."""
        self._logs, self._first, self._objects = [], logs, objects

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        if log_number_from < self._first:  # records before a skip: read everything again
            self.skip_to(0, 0)
        self._refresh()
        return self._logs[log_number_from - self._first:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._refresh()
        body = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
        fs, path = storage.filesystem(self._name(self._objects))
        with fs.open_output_stream(path) as out:
            out.write(body)
        self._logs.extend(logs)
        self._objects += 1

    def position(self, logs: int) -> dict[str, Any] | None:
        """Where the first ``logs`` records end: the object count and digests of the first and last of those
        objects (None unless the records read so far end there)."""
        if logs != self._first + len(self._logs) or self._objects == 0:
            return None
        return {"objects": self._objects, "head": _digest(storage.read_bytes(self._name(0))),
                "tail": _digest(storage.read_bytes(self._name(self._objects - 1)))}

    def resume_at(self, position: dict[str, Any], logs: int) -> bool:
        """Skip the records a snapshot taken at ``position`` holds, if this journal still starts with them."""
        objects = int(position["objects"])
        try:
            if objects < 1 or _digest(storage.read_bytes(self._name(0))) != position["head"] or \
                    _digest(storage.read_bytes(self._name(objects - 1))) != position["tail"]:
                return False
        except FileNotFoundError:
            return False
        self.skip_to(objects, logs)
        return True


class _FileBackend(JournalFileBackend):
    """Optuna's journal file, plus where a snapshot's records end in it."""

    def _offset(self, logs: int) -> int | None:
        known = getattr(self, "_log_number_offset", {})
        if logs in known:
            return known[logs]
        count = offset = 0
        with open(self._file_path, "rb") as f:
            for line in f:
                if count == logs or not line.endswith(b"\n"):
                    break
                count, offset = count + 1, offset + len(line)
        return offset if count == logs else None

    def _fingerprint(self, offset: int) -> tuple[str, str]:
        with open(self._file_path, "rb") as f:
            head = f.read(min(offset, _FINGERPRINT_BYTES))
            f.seek(max(0, offset - _FINGERPRINT_BYTES))
            tail = f.read(offset - max(0, offset - _FINGERPRINT_BYTES))
        return _digest(head), _digest(tail)

    def position(self, logs: int) -> dict[str, Any] | None:
        offset = self._offset(logs) if logs > 0 else None
        if offset is None:
            return None
        head, tail = self._fingerprint(offset)
        return {"offset": offset, "head": head, "tail": tail}

    def resume_at(self, position: dict[str, Any], logs: int) -> bool:
        offset = int(position["offset"])
        if offset < 1 or os.path.getsize(self._file_path) < offset or \
                self._fingerprint(offset) != (position["head"], position["tail"]):
            return False
        known = getattr(self, "_log_number_offset", None)
        if isinstance(known, dict):  # Optuna's reader then seeks there instead of scanning the lines before
            known[logs] = offset
        return True


class _Backend(BaseJournalBackend):
    """What a :class:`SnapshotJournalStorage` reads and appends through: the journal's backend, which it can
    hold back (while a snapshot is restored) and whose appends it can collect (``SnapshotJournalStorage.batched``)."""

    def __init__(self, backend: _FileBackend | ObjectStoreJournalBackend) -> None:
        self.backend = backend
        self.hold = False
        self.pending: list[dict[str, Any]] | None = None
        self.committed = 0  # records in the backend when the collecting started

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        if self.hold:
            return []
        if self.pending is not None and log_number_from >= self.committed:
            return self.pending[log_number_from - self.committed:]
        return self.backend.read_logs(log_number_from)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        if self.pending is not None:
            self.pending.extend(logs)
        else:
            self.backend.append_logs(logs)


class SnapshotJournalStorage(JournalStorage):
    """Optuna's ``JournalStorage`` over a journal in the store, restored from its snapshot when one matches
    (module docstring). The state it holds is the one a full replay of the journal gives."""

    def __init__(self, backend: _FileBackend | ObjectStoreJournalBackend, snapshot: str | None) -> None:
        self._journal = _Backend(backend)
        self._snapshot = snapshot
        data = self._read_snapshot()
        self._journal.hold = data is not None
        with _gc_paused():
            super().__init__(self._journal)  # replays the whole journal unless held back for a snapshot
            self.restored_logs = 0
            """Journal records the snapshot held (0: none restored, the whole journal was replayed)."""
            if data is not None:
                self._journal.hold = False
                try:
                    self.restore_replay_result(data)
                except Exception as err:  # an unreadable snapshot: replay the journal
                    optuna.logging.get_logger(__name__).warning(f"Ignored the journal snapshot {snapshot}: {err!r}")
                self.restored_logs = self._replay_result.log_number_read
                self.get_all_studies()  # replays the records after the snapshot (all of them if none restored)
        self._snapshot_logs = self.restored_logs

    def _header(self) -> dict[str, Any]:
        return {"format": _SNAPSHOT_FORMAT, "optuna": optuna.__version__, "timezone": [time.timezone, *time.tzname]}

    def _read_snapshot(self) -> bytes | None:
        """The pickled state of a matching snapshot, with the journal positioned after its records, or None."""
        if self._snapshot is None:
            return None
        try:
            data = storage.read_bytes(self._snapshot)
        except FileNotFoundError:
            return None
        try:
            end = data.index(b"\n")
            header = json.loads(data[:end])
            expected = self._header()
            if any(header.get(key) != value for key, value in expected.items()) or \
                    header.get("bytes") != len(data) - end - 1:
                return None
            if not self._journal.backend.resume_at(header["position"], int(header["logs"])):
                return None
        except (ValueError, KeyError, TypeError, OSError):
            return None
        return data[end + 1:]

    @property
    def logs_since_snapshot(self) -> int:
        """Journal records this storage has replayed beyond its last snapshot (all of them without one)."""
        return self._replay_result.log_number_read - self._snapshot_logs

    def save_snapshot(self) -> bool:
        """Write the snapshot of the journal as read now; whether it was written (a journal whose last
        record is not complete gets none)."""
        if self._snapshot is None or self._journal.pending is not None:
            return False
        with self._thread_lock:
            self._sync_with_backend()
            logs = self._replay_result.log_number_read
            position = self._journal.backend.position(logs)
            if position is None:
                return False
            data = pickle.dumps(self._replay_result, protocol=pickle.HIGHEST_PROTOCOL)
        header = {**self._header(), "logs": logs, "position": position, "bytes": len(data)}
        storage.write_bytes(self._snapshot, json.dumps(header).encode() + b"\n" + data)
        self._snapshot_logs = logs
        return True

    def snapshot_if_due(self, every: int | None = None) -> bool:
        """:meth:`save_snapshot` when ``every`` (default :data:`SNAPSHOT_EVERY`) records or more were
        replayed beyond the last snapshot; whether one was written."""
        if self.logs_since_snapshot < (SNAPSHOT_EVERY if every is None else every):
            return False
        return self.save_snapshot()

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Collect the records appended inside and write them to the journal at the end, in one append (one
        lock and fsync, or one object, instead of one per record). Only calib's driver writes a search's
        journal, so no other writer's records can come in between."""
        if self._journal.pending is not None:
            yield
            return
        with self._thread_lock:
            self._sync_with_backend()
            self._journal.committed = self._replay_result.log_number_read
            self._journal.pending = []
        try:
            yield
        finally:
            with self._thread_lock:
                pending, self._journal.pending = self._journal.pending, None
                if pending:
                    self._journal.backend.append_logs(pending)
                    for _ in self._journal.backend.read_logs(self._journal.committed):  # the backend's own
                        pass                                                           # position moves past them


def optuna_storage(store: str | os.PathLike, study: str, *, snapshot: bool = True) -> SnapshotJournalStorage:
    """An Optuna ``JournalStorage`` over the journal of ``study`` in ``store`` (created when missing),
    restored from its snapshot when one matches (``snapshot=False``: replays the whole journal and never
    writes a snapshot)."""
    location = journal_location(store, study)
    where = snapshot_location(store, study) if snapshot else None
    if storage.is_remote(location):
        return SnapshotJournalStorage(ObjectStoreJournalBackend(location), where)
    Path(location).parent.mkdir(parents=True, exist_ok=True)
    return SnapshotJournalStorage(_FileBackend(location, lock_obj=JournalFileOpenLock(location)), where)


def export_journal(store: str | os.PathLike, study: str, target: Path) -> Path:
    """Write the journal of ``study`` to the local file ``target`` (for ``optuna-dashboard``)."""
    location = journal_location(store, study)
    if not storage.exists(location):
        raise FileNotFoundError(f"No Optuna journal for study {study!r} at {location}.")
    if storage.is_remote(location):
        logs = ObjectStoreJournalBackend(location).read_logs(0)
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
    else:
        text = Path(location).read_text()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target
