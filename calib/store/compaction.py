"""Compaction: the rows of finished trials, moved from their own files into few large parts.

A worker writes one file per trial and table (:mod:`calib.store.parquet`): durable at once, but a store
of 100,000 trials would be 200,000 small files that every reader opens. A compaction of a study:

1. lists the study's files of both tables and reads their ``trial_id`` (and ``status``) columns;
2. picks, per trial, the file whose rows count (the readers' rule, :func:`calib.store.scan.winning_rows`);
3. writes the rows of the finished trials (``ok``, ``pruned``) still in their own files, and the rows of
   the parts it merges, into new parts, predictions and history first; each part appears whole (a rename,
   one upload);
4. deletes the trials' own files whose rows are now in a part, and the merged parts.

Parts merge by size tiers: the new part joins the parts of its tier or below once there are
:data:`FANOUT` of them (tier k holds up to ``1000 · FANOUT^k`` trials), so a row is rewritten
O(log n) times over a study's life and a study keeps a few parts per tier. A part grows to about
:data:`PART_TRIALS` trials (a ``predictions`` part also stops at :data:`PREDICTIONS_PART_BYTES`).
``full=True`` merges every part below that size.

Any crash leaves a readable store and nothing to repair by hand: between 3 and 4 a trial's rows are in
two files, which readers read once, and the next compaction deletes the spare copy (a trial's own file
whose rows a part holds is deleted; a part holding rows that another file wins is merged). A plain
``pandas.read_parquet`` sees such a trial twice until then.

One compaction per study at a time: a lease at ``<store>/compaction/study=<study>.json``, created
atomically (:func:`calib.storage.create_exclusive`) and renewed before each step that writes or deletes
(so a compaction whose lease was taken over stops before it changes the store). A lease is taken over
when its holder is a dead process of this host, or its last renewal is older than the lease by the wall
clock (``CALIB_COMPACTION_LEASE_SECONDS``, default 600). Two compactions that overlap anyway (a holder
stalled longer than a lease) write the same rows twice; readers still read them once and the next
compaction merges the copies.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from calib import storage
from calib._config import ConfigError
from calib._lease import HeldLease, OtherHolder, lease_record, lease_seconds_of, try_take
from calib.config import validate_study_name
from calib.store.files import TABLES, StoreFile, file_location, list_table, new_part_name, study_folder, table_location
from calib.store.predictions import predictions_schema
from calib.store.scan import _STATUS_RANK as _RANK
from calib.store.scan import FINAL_STATUSES, PartIndex, Scan, part_index, remember_part, scan_files, winners
from calib.store.schema import history_schema, trial_schema

__all__ = ["FANOUT", "LEASE_ENV", "PART_TRIALS", "CompactionLost", "CompactionReport", "compact", "compact_study",
           "stored_studies"]

FANOUT = 4
PART_TRIALS = 100_000
"""A part stops growing once it holds this many trials (merging two sources may reach about twice)."""
_TIER_BASE = 1_000
PREDICTIONS_PART_BYTES = 1 << 30
"""A ``predictions`` part also stops growing at this many bytes (a trial's probabilities take up to megabytes)."""
_ROW_GROUP_ROWS = {"trials": 16_384, "history": 262_144, "predictions": 16}
_INDEX_COLUMNS = {"trials": ["trial_id", "status"], "history": ["trial_id"], "predictions": ["trial_id"]}
_SCHEMAS = {"trials": trial_schema, "history": history_schema, "predictions": predictions_schema}


def _full(table: str, trials: int, size: int) -> bool:
    """Whether a part of ``table`` holding ``trials`` trials in ``size`` bytes has stopped growing."""
    return trials >= PART_TRIALS or (table == "predictions" and size >= PREDICTIONS_PART_BYTES)
LEASE_ENV = "CALIB_COMPACTION_LEASE_SECONDS"
_STALE_PART = re.compile(r"\.part-[0-9a-f]{32}\.parquet\.[0-9a-f]{32}\.tmp")


class CompactionLost(RuntimeError):
    """This compaction's lease was taken over: it stopped before changing the store any further."""


@dataclass
class CompactionReport:
    """What one compaction of ``study`` did, counted over both tables (``skipped``: why it did nothing,
    e.g. another process compacts it); ``files_left``: parts and trials' own files left per table."""

    study: str
    trials_moved: int = 0
    parts_written: int = 0
    parts_merged: int = 0
    files_deleted: int = 0
    seconds: float = 0.0
    skipped: str | None = None
    files_left: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        if self.skipped:
            return f"[{self.study}] compaction skipped: {self.skipped}"
        left = self.files_left
        return (f"[{self.study}] compaction: {self.trials_moved} finished trials moved into parts, "
                f"{self.parts_merged} parts merged, {self.files_deleted} files deleted; its trials folder now holds "
                f"{left.get('parts', 0)} parts and {left.get('trial files', 0)} trials' own files "
                f"({self.seconds:.1f} s)")


# ---------------------------------------------------------------------------------------------------
# The lease


def _lease_seconds() -> float:
    value = os.environ.get(LEASE_ENV, "600")
    try:
        lease = float(value)
    except ValueError:
        lease = -1.0
    if not lease > 0:
        raise ConfigError(f"{LEASE_ENV} must be a number of seconds > 0, got {value!r}.")
    return lease


class _Lease:
    """The compaction lease this process holds; renewed before each step that changes the store."""

    def __init__(self, held: HeldLease, lease: float) -> None:
        self._held, self.location, self.lease = held, held.location, lease

    @staticmethod
    def body(lease: float) -> bytes:
        return lease_record(lease, renewed_at=time.time())

    def renew(self) -> None:
        if not self._held.renew(self.body(self.lease)):
            raise CompactionLost(f"the compaction lease {self.location} was taken over by another process")

    def release(self) -> None:
        self._held.release()


def _take_lease(store: str, study: str, lease: float) -> _Lease | None:
    """The study's compaction lease, or None while another live holder renews it (a lease is taken over
    whose last renewal is older than the lease by the wall clock)."""
    location = storage.join(store, "compaction", f"study={study}.json")

    def expired(other: OtherHolder) -> bool:
        return time.time() - float(other.record.get("renewed_at") or 0) > lease_seconds_of(other.record, lease)

    for _attempt in range(3):
        taken = try_take(location, lambda _other: _Lease.body(lease), expired)
        if isinstance(taken, HeldLease):
            return _Lease(taken, lease)
        if taken is not None:  # a live holder renews it
            return None
    return None


# ---------------------------------------------------------------------------------------------------
# The plan


@dataclass
class _Plan:
    """What a compaction does to one table: the sources of its new parts (in order), the rows of those
    sources to leave out (``drop``: file index -> trial ids whose rows another file holds), what it deletes."""

    table: str
    sources: list[StoreFile]
    drop: dict[int, pa.Array]
    deletes: list[StoreFile]
    moved: int
    merged: int
    scan: Scan


def _tier(trials: int) -> int:
    return max(0, math.floor(math.log(max(trials, 1) / _TIER_BASE, FANOUT))) if trials else -1


def _tiered(new_trials: int, small: list[tuple[StoreFile, int]]) -> list[StoreFile]:
    """The small parts a new part of ``new_trials`` trials absorbs: those of its tier or below, once
    there are :data:`FANOUT` with it (repeated as the merged part climbs tiers)."""
    chosen: list[StoreFile] = []
    pool = sorted(small, key=lambda item: item[1])
    total = new_trials
    while total > 0:
        same = [item for item in pool if _tier(item[1]) <= _tier(total)]
        if len(same) + 1 < FANOUT:
            break
        chosen += [part for part, _ in same]
        total += sum(trials for _, trials in same)
        pool = [item for item in pool if item not in same]
    return chosen


def _plan(scan: Scan, table: str, final: set[str] | None, full: bool) -> tuple[_Plan, set[str]]:
    """The plan for one table's ``scan``; ``final``: the trials whose rows belong in parts (None for the
    trials table: computed here from the winning rows' status, and returned).

    A part that loses a trial's rows to another file, or shares a trial with another part, is merged
    (rewritten without the rows that lose), so a trial is in one part after the compaction, whichever
    crash left it in two.
    """
    pairs = winners(scan, by_status=table == "trials").pairs
    ids = pairs["trial_id"].to_numpy(zero_copy_only=False)
    files = pairs["file"].to_numpy()
    wins = pairs["wins"].to_numpy(zero_copy_only=False)
    if final is None:
        final = set(ids[wins & np.isin(pairs["rank"].to_numpy(), [_RANK[s] for s in FINAL_STATUSES])])
    in_parts = np.isin(files, [i for i, f in enumerate(scan.files) if f.kind == "part"])
    unique, counts = np.unique(ids[in_parts], return_counts=True)
    shared = in_parts & np.isin(ids, unique[counts > 1])
    forced_files = set(files[shared].tolist()) | set(files[~wins].tolist())
    winning_pairs = set(zip(ids[wins].tolist(), files[wins].tolist(), strict=True))
    trials_in = dict(zip(*np.unique(files[wins], return_counts=True), strict=True))
    drop = {int(f): pa.array(ids[~wins & (files == f)]) for f in set(files[~wins].tolist())}

    moves, deletes, forced, small = [], [], [], []
    for index, file in enumerate(scan.files):
        if file.path in scan.problems:
            continue  # foreign: left alone (readers warn about it)
        if file.kind == "trial":
            if file.trial_id in final:
                if (file.trial_id, index) in winning_pairs:
                    moves.append(file)
                deletes.append(file)  # its rows are in a part, or will be once the new parts exist
        elif index in forced_files:
            forced.append(file)
        elif not _full(table, trials_in.get(index, 0), file.size):
            small.append((file, int(trials_in.get(index, 0))))
    if full:
        merged = forced + [part for part, _ in small] if moves or forced or len(small) > 1 else []
    else:
        new_trials = len(moves) + sum(int(trials_in.get(scan.files.index(part), 0)) for part in forced)
        merged = forced + _tiered(new_trials, small)
    sources = sorted(merged, key=lambda f: f.path) + moves
    return _Plan(table, sources, drop, deletes + merged, len(moves), len(merged), scan), final


# ---------------------------------------------------------------------------------------------------
# Writing parts


class _PartWriter:
    """Writes batches into parts of about :data:`PART_TRIALS` trials under ``folder``; each part appears
    whole when it is published (a rename next to it, or one upload from a local temporary file)."""

    def __init__(self, store: str, folder: str, schema: pa.Schema, row_group: int, index_columns: list[str],
                 on_step: Callable[[str], None]) -> None:
        self.store, self.folder, self.schema, self.row_group, self.on_step = store, folder, schema, row_group, on_step
        self.index_columns = index_columns
        self.written: list[str] = []
        self._writer: pq.ParquetWriter | None = None
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._index: list[pa.Table] = []  # the part's trials, remembered once it is published
        self.trials = 0
        self.bytes = 0

    def _open(self) -> None:
        self._name = new_part_name()
        if storage.is_remote(self.store):
            handle, local = tempfile.mkstemp(suffix=".parquet", prefix="calib-part-")
            os.close(handle)
            self._local = Path(local)
        else:
            Path(self.folder).mkdir(parents=True, exist_ok=True)
            self._local = Path(self.folder) / f".{self._name}.{uuid.uuid4().hex}.tmp"
        self._writer = pq.ParquetWriter(self._local, self.schema, compression="zstd")
        self.trials = 0
        self.bytes = 0
        self._index = []

    def add(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._open()
        self._buffer.append(batch)
        self._buffered += batch.num_rows
        self.bytes += batch.nbytes
        index = pa.Table.from_batches([batch]).select(self.index_columns)
        if self.index_columns == ["trial_id"]:  # history, predictions: rows per epoch or split, one per trial
            index = index.group_by(["trial_id"]).aggregate([])
        self._index.append(index)
        self.trials += index.num_rows
        if self._buffered >= self.row_group:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self._writer.write_table(pa.Table.from_batches(self._buffer, schema=self.schema),
                                     row_group_size=self.row_group)
        self._buffer, self._buffered = [], 0

    def close_part(self) -> None:
        """Publish the part being written, if any."""
        if self._writer is None:
            return
        self._flush()
        self._writer.close()
        self._writer = None
        target = storage.join(self.folder, self._name)
        self.on_step(f"publish {target}")
        size = self._local.stat().st_size
        try:
            if storage.is_remote(self.store):
                storage.upload(self._local, target)
            else:
                with open(self._local, "rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(self._local, target)
        finally:
            self._local.unlink(missing_ok=True)
        fs, path = storage.filesystem(target)
        remember_part(fs, path, size, PartIndex(pa.concat_tables(self._index), self.schema))
        self.written.append(target)

    def abandon(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._local.unlink(missing_ok=True)


def _write_parts(store: str, study: str, plan: _Plan, on_step: Callable[[str], None]) -> list[str]:
    """Write the winning rows of ``plan.sources`` into new parts; their locations."""
    if not plan.sources:
        return []
    store_schema = _SCHEMAS[plan.table]()
    try:
        schema = pa.unify_schemas([store_schema, *plan.scan.schemas], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ConfigError(f"The {plan.table} files of study {study!r} have columns of conflicting types, so they "
                          f"cannot share a part: {err}") from None
    schema = pa.schema([f for f in schema if f.name != "study"])
    fs, _ = storage.filesystem(table_location(store, plan.table))
    index = {f.path: i for i, f in enumerate(plan.scan.files)}
    dataset = pads.dataset([f.path for f in plan.sources], filesystem=fs, format="parquet", schema=schema)
    writer = _PartWriter(store, study_folder(store, plan.table, study), schema, _ROW_GROUP_ROWS[plan.table],
                         _INDEX_COLUMNS[plan.table], on_step)
    current = None
    try:
        for tagged in dataset.scanner(batch_readahead=4).scan_batches():
            source = index[tagged.fragment.path]
            if source != current:
                if _full(plan.table, writer.trials, writer.bytes):
                    writer.close_part()
                current = source
            batch = tagged.record_batch
            if source in plan.drop:
                batch = batch.filter(pc.invert(pc.is_in(batch.column("trial_id"), value_set=plan.drop[source])))
            if batch.num_rows:
                writer.add(batch)
        writer.close_part()
    except BaseException:
        writer.abandon()
        raise
    return writer.written


# ---------------------------------------------------------------------------------------------------
# Compacting


def _no_step(step: str) -> None:
    pass


def _remove_stale_temporaries(store: str, study: str) -> None:
    """Delete the temporary part files of killed compactions (local stores; the caller holds the lease)."""
    if storage.is_remote(store):
        return
    for table in TABLES:
        folder = Path(study_folder(store, table, study))
        if folder.is_dir():
            for path in folder.iterdir():
                if _STALE_PART.fullmatch(path.name):
                    path.unlink(missing_ok=True)


def _index_scan(store: str, study: str, table: str, final: set[str] | None) -> Scan:
    """One row per trial and file of the study's ``table`` (``trial_id``, and ``status`` for ``trials``;
    a trial's own history file: one row per epoch): the parts' from their :class:`PartIndex`, read once
    per process, the trials' own files' read now (in ``history``, only those of the ``final`` trials:
    the others stay where they are). Foreign files are problems."""
    fs, root = storage.filesystem(table_location(store, table))
    schema = _SCHEMAS[table]()
    files = list_table(fs, root, [study])
    problems = {f.path: f.problem for f in files if f.kind is None}
    files = [f for f in files if f.kind == "part" or (f.kind == "trial" and (final is None or f.trial_id in final))]
    own = [i for i, f in enumerate(files) if f.kind == "trial"]
    scan = scan_files(fs, root, [files[i] for i in own], schema, _INDEX_COLUMNS[table])
    pieces = [scan.table.select(_INDEX_COLUMNS[table])]
    owners = [np.array(own, dtype=np.int64)[scan.file_of_row] if own else np.zeros(0, np.int64)]
    schemas = list(scan.schemas)
    for i, file in enumerate(files):
        if file.kind == "part":
            index = part_index(fs, root, file, schema)
            if index.problem is not None:
                problems[file.path] = index.problem
                continue
            pieces.append(index.rows.select(_INDEX_COLUMNS[table]))
            owners.append(np.full(index.rows.num_rows, i, dtype=np.int64))
            schemas += [index.schema] if index.schema is not None and not any(
                index.schema.equals(k) for k in schemas) else []
    return Scan(pa.concat_tables(pieces), files, np.concatenate(owners), {**problems, **scan.problems}, schemas)


def compact_study(store: str | os.PathLike, study: str, *, full: bool = False,
                  on_step: Callable[[str], None] = _no_step, lease: Any = None) -> CompactionReport:
    """Compact one study of ``store`` (module docstring); the caller holds its lease (``lease``, renewed
    before each change), or knows that nothing else compacts it. ``on_step(description)`` is called
    before each step that changes the store (tests inject faults there)."""
    store = storage.normalize(store)
    validate_study_name(study)
    start = time.perf_counter()
    report = CompactionReport(study)
    renew = lease.renew if lease is not None else (lambda: None)
    plans: dict[str, _Plan] = {}
    final: set[str] | None = None
    for table in TABLES:  # trials first: which trials are finished decides what moves in history
        plans[table], final = _plan(_index_scan(store, study, table, final), table, final, full)
    renew()
    _remove_stale_temporaries(store, study)
    for table in ("predictions", "history", "trials"):  # a trial's other parts exist before its trials part
        if plans[table].sources:
            on_step(f"write {table} parts")
        written = _write_parts(store, study, plans[table], on_step)
        report.parts_written += len(written)
    for table in ("trials", "history", "predictions"):
        plan = plans[table]
        if plan.deletes:
            renew()
            on_step(f"delete {table} sources")
            storage.delete_many([file_location(store, f.path) for f in plan.deletes])
        report.files_deleted += len(plan.deletes)
        report.parts_merged += plan.merged
    report.trials_moved = plans["trials"].moved
    report.files_left = _count_files(store, study)
    report.seconds = time.perf_counter() - start
    return report


def _count_files(store: str, study: str) -> dict[str, int]:
    """Parts and trials' own files in the study's ``trials`` folder."""
    fs, root = storage.filesystem(table_location(store, "trials"))
    files = list_table(fs, root, [study])
    return {"parts": sum(f.kind == "part" for f in files), "trial files": sum(f.kind == "trial" for f in files)}


def stored_studies(store: str | os.PathLike) -> list[str]:
    """The studies with a folder in either table of ``store``, sorted."""
    store = storage.normalize(store)
    studies = set()
    for table in TABLES:
        fs, root = storage.filesystem(table_location(store, table))
        for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
            if info.type == pafs.FileType.Directory and info.base_name.startswith("study="):
                studies.add(info.base_name.removeprefix("study="))
    return sorted(studies)


def compact(store: str | os.PathLike, studies: Sequence[str] | None = None, *, full: bool = False,
            wait_seconds: float = 0.0, on_step: Callable[[str], None] = _no_step) -> list[CompactionReport]:
    """Compact ``studies`` of ``store`` (default: every study in it), each under its lease; a study
    whose lease another process holds is waited for up to ``wait_seconds``, then skipped."""
    store = storage.normalize(store)
    lease_seconds = _lease_seconds()
    reports = []
    for study in (stored_studies(store) if studies is None else studies):
        validate_study_name(study)
        deadline = time.monotonic() + wait_seconds
        while (lease := _take_lease(store, study, lease_seconds)) is None and time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        if lease is None:
            reports.append(CompactionReport(study, skipped="another process is compacting it"))
            continue
        try:
            reports.append(compact_study(store, study, full=full, on_step=on_step, lease=lease))
        finally:
            try:
                lease.release()
            except Exception:  # unreachable store: the lease expires by itself
                pass
    return reports
