"""The Optuna study of a search, persisted next to its trials: Optuna's journal storage in the store.

Local store: one journal file, ``<store>/optuna/<study>.journal`` (Optuna's ``JournalFileBackend``),
which ``optuna-dashboard <file>``, ``optuna.load_study`` and ``optuna.visualization`` open as it is.
Object store (``s3://``): the same journal records, one JSON-lines object per append under
``<store>/optuna/<study>/`` (:class:`ObjectStoreJournalBackend`, through :mod:`calib.storage`);
:func:`optuna_storage` opens it for Optuna, and :func:`export_journal` writes it to one local file for
``optuna-dashboard``. Only the search's driver appends, so the objects need no lock. Imports Optuna: import it where a
search runs, not at package import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend, JournalFileOpenLock

from calib import storage
from calib.config import validate_study_name

__all__ = ["ObjectStoreJournalBackend", "export_journal", "journal_location", "optuna_storage"]


def journal_location(store: str | os.PathLike, study: str) -> str:
    """Where the journal of ``study`` lives: a file in a local store, a folder of objects in a remote one."""
    store = storage.normalize(store)
    name = validate_study_name(study)
    if storage.is_remote(store):
        return storage.join(store, "optuna", name)
    return storage.join(store, "optuna", f"{name}.journal")


class ObjectStoreJournalBackend(BaseJournalBackend):
    """Optuna's ``BaseJournalBackend`` on an object store: each :meth:`append_logs` is one new object
    ``<location>/<sequence number, 10 digits>.jsonl``; :meth:`read_logs` reads them in order (the
    objects it has read once are kept in memory). One writer per study: object stores have no
    append and pyarrow no conditional PUT, so two drivers on one study would overwrite each other
    (calib runs one driver per search)."""

    def __init__(self, location: str) -> None:
        self.location = location.rstrip("/")
        self._logs: list[dict[str, Any]] = []
        self._objects: list[str] = []

    def _refresh(self) -> None:
        """Read the objects after the last one read, probing by name (no listing)."""
        while True:
            name = f"{len(self._objects):010d}.jsonl"
            try:
                text = storage.read_bytes(storage.join(self.location, name)).decode()
            except FileNotFoundError:
                return
            self._logs.extend(json.loads(line) for line in text.splitlines() if line)
            self._objects.append(name)

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        self._refresh()
        return self._logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._refresh()
        name = f"{len(self._objects):010d}.jsonl"
        body = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
        fs, path = storage.filesystem(storage.join(self.location, name))
        with fs.open_output_stream(path) as out:
            out.write(body)
        self._logs.extend(logs)
        self._objects.append(name)


def optuna_storage(store: str | os.PathLike, study: str) -> JournalStorage:
    """An Optuna ``JournalStorage`` over the journal of ``study`` in ``store`` (created when missing)."""
    location = journal_location(store, study)
    if storage.is_remote(location):
        return JournalStorage(ObjectStoreJournalBackend(location))
    Path(location).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(location, lock_obj=JournalFileOpenLock(location)))


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
