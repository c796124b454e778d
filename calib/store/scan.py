"""Scanning store files into one Arrow table, leaving out the files that are foreign to the store.

A file is foreign when it is not Parquet (truncated, empty, another format), has no ``trial_id``
column or a column whose type does not read losslessly as the store's (``seed`` as string,
``trial_id`` as int), or is a trial's own file whose rows' ``trial_id`` is not its name. A file with a
subset of the store's columns, of compatible types, is read (the others are null). Errors reaching
the store (permissions, network) are raised, not skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from calib.store.files import StoreFile, list_table

__all__ = ["FINAL_STATUSES", "PartIndex", "Scan", "Winners", "access_error", "compatible", "part_index",
           "remember_part", "scan_files", "scan_listed", "winners"]

_CHECK_THREADS = 16
FINAL_STATUSES = ("ok", "pruned")
"""Statuses a trial keeps for good: its rows are moved into parts. A ``failed`` trial keeps its own
file until its re-run replaces it."""
_STATUS_RANK = {"ok": 0, "pruned": 1, "failed": 2}


@dataclass
class Scan:
    """The rows of the readable ``files`` (``file_of_row[i]``: the index in ``files`` of row ``i``'s
    file), the distinct schemas of the files read, and, by path, why each foreign file was left out."""

    table: pa.Table
    files: list[StoreFile]
    file_of_row: np.ndarray
    problems: dict[str, str]
    schemas: list[pa.Schema]


def compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a column of type ``actual`` reads losslessly as the store's ``expected`` type."""
    if actual.equals(expected) or pa.types.is_null(actual):
        return True
    if pa.types.is_dictionary(actual):
        return compatible(actual.value_type, expected)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual) and not actual.equals(pa.uint64())
    if pa.types.is_floating(expected):
        return pa.types.is_floating(actual) or pa.types.is_integer(actual)
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual) or str(actual) == "string_view"
    if pa.types.is_timestamp(expected):
        return pa.types.is_timestamp(actual)
    if pa.types.is_binary(expected):
        return pa.types.is_binary(actual) or pa.types.is_large_binary(actual)
    if pa.types.is_list(expected):
        listy = pa.types.is_list(actual) or pa.types.is_large_list(actual) or pa.types.is_fixed_size_list(actual)
        return listy and compatible(actual.value_type, expected.value_type)
    return False


def schema_problem(actual: pa.Schema, store: pa.Schema) -> str | None:
    """Why a file with schema ``actual`` is foreign to the store (None: it is not)."""
    names = set(store.names)
    if not names.intersection(actual.names):
        return f"it has none of the store's columns (it has {', '.join(actual.names[:5]) or 'none'})"
    if "trial_id" not in actual.names:
        return "it has no 'trial_id' column"
    for field in actual:
        if field.name in names and not compatible(field.type, store.field(field.name).type):
            return f"column {field.name!r} is {field.type}, the store has {store.field(field.name).type}"
    return None


def access_error(exc: BaseException) -> bool:
    """Whether ``exc`` is about reaching the store (permissions, network) rather than a file's content."""
    return isinstance(exc, (PermissionError, ConnectionError, TimeoutError)) or (
        isinstance(exc, OSError) and "AWS Error" in str(exc))


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _dataset(fs: pafs.FileSystem, root: str, files: list[StoreFile], schema: pa.Schema) -> pads.Dataset:
    partitioning = pads.partitioning(pa.schema([pa.field("study", pa.string())]), flavor="hive")
    return pads.dataset([f.path for f in files], filesystem=fs, format="parquet", partitioning=partitioning,
                        partition_base_dir=root, schema=schema)


def _checked_scan(fs: pafs.FileSystem, root: str, files: list[StoreFile], store: pa.Schema, full: pa.Schema,
                  columns: list[str], expression: Any) -> Scan:
    """Scan ``files``; the rows of foreign ones are left out (costs no extra I/O: a fragment's footer is
    cached by the scan that opened it). ``columns`` must include ``trial_id``."""
    scanner = _dataset(fs, root, files, full).scanner(columns=columns, filter=expression)
    index = {f.path: i for i, f in enumerate(files)}
    batches: list[pa.RecordBatch] = []
    owners: list[int] = []
    problems: dict[str, str] = {}
    seen: list[tuple[pa.Schema, str | None]] = []  # verdicts by schema: the files of a store share a few

    def judge(schema: pa.Schema) -> str | None:
        for known, verdict in seen:
            if known.equals(schema):
                return verdict
        seen.append((schema, schema_problem(schema, store)))
        return seen[-1][1]

    for tagged in scanner.scan_batches():
        owner = index[tagged.fragment.path]
        if (not owners or owners[-1] != owner) and (verdict := judge(tagged.fragment.physical_schema)) is not None:
            problems[files[owner].path] = verdict
        batches.append(tagged.record_batch)
        owners.append(owner)
    counts = np.array([b.num_rows for b in batches], dtype=np.int64)
    file_of_row = np.repeat(np.array(owners, dtype=np.int64), counts)
    table = pa.Table.from_batches(batches, schema=scanner.projected_schema)
    # A trial's own file holds that trial's rows only.
    named = np.array([files[o].trial_id or "" for o in owners], dtype=object)
    expected = pa.array(np.repeat(named, counts), pa.string())
    mismatch = pc.and_(pc.not_equal(expected, ""), pc.fill_null(pc.not_equal(table["trial_id"], expected), True))
    for row in np.flatnonzero(mismatch.to_numpy(zero_copy_only=False)):
        owner = files[file_of_row[row]]
        problems.setdefault(owner.path, f"its rows' trial_id ({table['trial_id'][int(row)].as_py()!r}) is not "
                                        f"its file name")
    if problems:
        keep = np.array([files[o].path not in problems for o in file_of_row], dtype=bool)
        table, file_of_row = table.filter(pa.array(keep)), file_of_row[keep]
    return Scan(table, files, file_of_row, problems, [schema for schema, verdict in seen if verdict is None])


def _footer_problem(fs: pafs.FileSystem, path: str, store: pa.Schema) -> str | None:
    """Why the file at ``path`` cannot be read into the store, from its footer (None: it can)."""
    try:
        with fs.open_input_file(path) as source:
            schema = pq.ParquetFile(source).schema_arrow
    except FileNotFoundError:
        return ""  # gone since the listing (a compacted or replaced file): nothing to read, nothing to report
    except Exception as exc:
        if access_error(exc):
            raise
        return f"corrupt or not a Parquet file ({_reason(exc)})"
    return schema_problem(schema, store)


def scan_files(fs: pafs.FileSystem, root: str, files: list[StoreFile], store: pa.Schema, columns: list[str],
               expression: Any = None) -> Scan:
    """Scan ``files`` (store files of the table at ``root``, schema ``store``) for ``columns`` (which
    must include ``trial_id``; ``study`` is the hive partition), rows matching ``expression``.

    The fast path scans all files as one dataset. If that fails (a corrupt file, a column of another
    type), every file has its footer checked, the bad ones are left out and the rest are scanned
    again, file by file if that fails too. A bad column or filter is the caller's error: raised.
    A file that disappears between the listing and the scan (a compaction deleted it, its rows now in
    a part) is left out without a problem: ``problems`` maps its path to "".
    """
    full = store.append(pa.field("study", pa.string()))
    _dataset(fs, root, [], full).scanner(columns=columns, filter=expression)  # raises on a bad column or filter
    try:
        return _checked_scan(fs, root, files, store, full, columns, expression)
    except Exception as exc:
        if access_error(exc):
            raise
    with ThreadPoolExecutor(max_workers=_CHECK_THREADS) as pool:
        verdicts = list(pool.map(lambda f: _footer_problem(fs, f.path, store), files))
    problems = {f.path: v for f, v in zip(files, verdicts, strict=True) if v is not None}
    readable = [f for f in files if f.path not in problems]
    try:
        scan = _checked_scan(fs, root, readable, store, full, columns, expression)
    except Exception as exc:
        if access_error(exc):
            raise
        scan = _scan_each(fs, root, readable, store, full, columns, expression)
    scan.problems = {**problems, **scan.problems}
    return scan


def _scan_each(fs: pafs.FileSystem, root: str, files: list[StoreFile], store: pa.Schema, full: pa.Schema,
               columns: list[str], expression: Any) -> Scan:
    """Scan each of ``files`` on its own; those that fail become problems."""

    def one(file: StoreFile) -> Scan | str:
        try:
            return _checked_scan(fs, root, [file], store, full, columns, expression)
        except FileNotFoundError:
            return ""
        except Exception as exc:
            if access_error(exc):
                raise
            return f"unreadable ({_reason(exc)})"

    tables, owners, problems, schemas = [], [], {}, []
    with ThreadPoolExecutor(max_workers=_CHECK_THREADS) as pool:
        for index, (file, outcome) in enumerate(zip(files, pool.map(one, files), strict=True)):
            if isinstance(outcome, str):
                problems[file.path] = outcome
            else:
                tables.append(outcome.table)
                owners.append(np.full(outcome.table.num_rows, index, dtype=np.int64))
                problems.update(outcome.problems)
                schemas += [s for s in outcome.schemas if not any(s.equals(k) for k in schemas)]
    empty = _dataset(fs, root, [], full).scanner(columns=columns).projected_schema.empty_table()
    return Scan(pa.concat_tables([empty, *tables]), files, np.concatenate([np.zeros(0, np.int64), *owners]),
                problems, schemas)


class PartIndex:
    """What a part holds: one row per trial (``trial_id``, and ``status`` in a ``trials`` part), its
    schema, and ``problem`` (why it is foreign; None when it is not)."""

    def __init__(self, rows: pa.Table, schema: pa.Schema | None, problem: str | None = None) -> None:
        self.rows, self.schema, self.problem = rows, schema, problem
        self._ok: frozenset[str] | None = None

    @property
    def ok_ids(self) -> frozenset[str]:
        """The trials stored as ``ok`` in the part."""
        if self._ok is None:
            ok = self.rows.filter(pc.equal(self.rows["status"], "ok")) if "status" in self.rows.column_names \
                else self.rows
            self._ok = frozenset(ok["trial_id"].to_pylist())
        return self._ok


_PART_INDEX: dict[tuple[str, str, int], PartIndex] = {}
_PART_INDEX_KEPT = 1024


def _index_key(fs: pafs.FileSystem, path: str, size: int) -> tuple[str, str, int]:
    return fs.type_name, path, size


def remember_part(fs: pafs.FileSystem, path: str, size: int, index: PartIndex) -> None:
    """Keep ``index`` for the part at ``path`` (a part is never changed, only deleted: its path and size
    identify its contents), at most :data:`_PART_INDEX_KEPT` parts per process."""
    if len(_PART_INDEX) >= _PART_INDEX_KEPT:
        _PART_INDEX.pop(next(iter(_PART_INDEX)))
    _PART_INDEX[_index_key(fs, path, size)] = index


def part_index(fs: pafs.FileSystem, root: str, part: StoreFile, store: pa.Schema) -> PartIndex:
    """The :class:`PartIndex` of ``part`` (of the table at ``root``, whose schema is ``store``), read once
    per process. ``FileNotFoundError`` if it is gone."""
    key = _index_key(fs, part.path, part.size)
    if key not in _PART_INDEX:
        columns = ["trial_id", "status"] if "status" in store.names else ["trial_id"]
        scan = scan_files(fs, root, [part], store, columns)
        if "" in scan.problems.values():
            raise FileNotFoundError(part.path)
        rows = scan.table.select(columns)
        rows = rows.group_by(columns).aggregate([]) if columns == ["trial_id"] else rows
        remember_part(fs, part.path, part.size, PartIndex(rows, scan.schemas[0] if scan.schemas else None,
                                                          scan.problems.get(part.path)))
    return _PART_INDEX[key]


_SETTLE_ATTEMPTS = 20


def scan_listed(fs: pafs.FileSystem, root: str, studies: list[str] | None, schema: pa.Schema,
                  columns: list[str], expression: Any, select: Callable[[StoreFile], bool] | None = None) -> Scan:
    """Scan the store files of ``studies`` (those ``select`` accepts); foreign files become problems.

    A file that a compaction deleted between the listing and the scan has its rows in a part written
    before the deletion: the folder is listed and scanned again until no listed file has vanished. A
    scan that fails (an object store may fail a read whose object is deleted meanwhile) is retried the
    same way when a listed file has gone, and raised otherwise.
    """
    for _attempt in range(_SETTLE_ATTEMPTS):
        listed = list_table(fs, root, studies)
        foreign = {f.path: f.problem for f in listed if f.kind is None and select is None}
        listed = [f for f in listed if f.kind is not None and (select is None or select(f))]
        try:
            scan = scan_files(fs, root, listed, schema, columns, expression)
        except OSError:
            if {f.path for f in listed} <= {f.path for f in list_table(fs, root, studies)}:
                raise
            continue
        if "" not in scan.problems.values():
            scan.problems = {**foreign, **scan.problems}
            return scan
    raise RuntimeError(f"the store under {root} kept changing while it was read ({_SETTLE_ATTEMPTS} attempts): "
                       f"is a compaction deleting files without writing their parts?")


@dataclass
class Winners:
    """Which file's rows count for each trial of a :class:`Scan`.

    ``pairs``: one row per (``trial_id``, ``file``) holding it, with ``wins``: whether that file's rows
    are the trial's. ``keep``: the scan's rows to keep (None: every row, the common case).
    """

    pairs: pa.Table
    keep: np.ndarray | None


def winners(scan: Scan, *, by_status: bool) -> Winners:
    """Per trial, the file whose rows count: the one holding its best row (``by_status``: ``ok`` over
    ``pruned`` over ``failed``, from the ``status`` column), then the first in ``scan.files`` (listed
    parts first, then by path: :func:`calib.store.files.list_table`)."""
    ids = scan.table["trial_id"]
    files = pa.array(scan.file_of_row, pa.int64())
    # Fast path: the runs of equal (trial_id, file) in scan order. A file's rows come in one run per trial
    # (a trial's own file holds one trial; a part is written trial by trial), so when no trial id starts
    # two runs every trial is in one file and every row counts, found without hashing or sorting.
    if len(ids) == 0:
        starts = np.zeros(0, dtype=np.int64)
    else:
        flat = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        changed = pc.or_(pc.not_equal(flat[1:], flat[:-1]), pc.not_equal(files[1:], files[:-1]))
        starts = np.concatenate([[0], np.flatnonzero(pc.fill_null(changed, True).to_numpy(zero_copy_only=False)) + 1])
    runs = pa.table({"trial_id": ids.take(starts), "file": files.take(starts)})
    if by_status:
        ranks = pc.fill_null(pc.index_in(scan.table["status"], value_set=pa.array(list(_STATUS_RANK))),
                             len(_STATUS_RANK)).cast(pa.int64())
        runs = runs.append_column("rank", ranks.take(starts))  # a trials table has one row per (trial, file)
    if pc.count_distinct(runs["trial_id"]).as_py() == runs.num_rows:
        return Winners(runs.append_column("wins", pa.array(np.ones(runs.num_rows, dtype=bool))), None)
    rows = pa.table({"trial_id": ids, "file": files, **({"rank": ranks} if by_status else {})})
    pairs = rows.group_by(["trial_id", "file"]).aggregate([("rank", "min")] if by_status else [])
    if by_status:
        pairs = pairs.rename_columns(["trial_id", "file", "rank"])
    keys = [("trial_id", "ascending"), *([("rank", "ascending")] if by_status else []), ("file", "ascending")]
    ordered = pairs.sort_by(keys)
    sorted_ids = ordered["trial_id"].to_numpy(zero_copy_only=False)
    first = np.ones(len(sorted_ids), dtype=bool)
    first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    ordered = ordered.append_column("wins", pa.array(first))
    winner = dict(zip(sorted_ids[first], ordered["file"].to_numpy()[first].tolist(), strict=True))
    keep = np.array([winner[i] == f for i, f in zip(ids.to_pylist(), scan.file_of_row.tolist(), strict=True)],
                    dtype=bool)
    return Winners(ordered, keep)
