"""Writing and reading the Parquet result store.

Layout (hive-partitioned by study)::

    <store>/trials/study=<study>/<trial_id>.parquet    one row: the trial
    <store>/history/study=<study>/<trial_id>.parquet   one row per (stage, epoch)

``<store>`` is a local directory or an object-store URI (``s3://bucket/prefix``, see
:mod:`calib.storage`). A local file is written to a hidden temporary name in the same directory,
flushed, and renamed into place, so a reader never sees a partial file (pyarrow and pandas skip names
starting with "." or "_"); an object appears only once its upload completes.

Readers skip a corrupt or foreign file with a :class:`StoreWarning` naming it and never drop a valid
row: a file not named ``study=<study>/<16 hex digits>.parquet``, one that is not Parquet (truncated,
empty, another format), one with no ``trial_id`` column or a column whose type does not read losslessly
as the store's (``seed`` as string, ``trial_id`` as int), and one whose rows' ``trial_id`` is not its file
name. A file with a subset of the store's columns, of compatible types, is read (the others are null).
A trial whose file is skipped is not completed, so it re-runs and its new file replaces the bad one.
The history file is written before the trial file: a trial exists in the store once its trial file
does. A trial whose status is ``ok`` is never rewritten; a ``failed`` one is replaced by its re-run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import uuid
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from calib import storage
from calib.config import validate_study_name
from calib.store.schema import history_schema, trial_schema
from calib.trial import TrialResult

__all__ = [
    "StoreWarning",
    "completed_trial_ids",
    "read_finished",
    "read_history",
    "read_trials",
    "trial_row",
    "validate_study_name",
    "write_result",
]

def _flatten(section: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{section}_{k}": (list(v) if isinstance(v, tuple) else v) for k, v in values.items()}


def trial_row(result: TrialResult, *, node_id: str | None = None) -> dict[str, Any]:
    """The ``trials`` row of ``result``: identity, every hyperparameter, metrics, timings, provenance."""
    cfg = result.config
    row: dict[str, Any] = {
        "trial_id": result.trial_id, "method": cfg.method.name, "dataset": cfg.dataset, "arch": cfg.arch,
        "seed": cfg.seed, "loss": cfg.loss.name, "stage1_id": result.stage1_id, "num_bins": cfg.num_bins,
        "label": cfg.label, "label_rank": cfg.label_rank, "ood_datasets": list(cfg.ood_datasets),
        "corruptions": list(cfg.corruptions),
        "status": result.status, "error": result.error, "stage1_cache_hit": result.stage1_cache_hit,
        "stage1_writer": result.stage1_writer,
        "started_at": result.started_at, "finished_at": result.finished_at, "device": result.device,
        "stage1_device": result.stage1_device, "stage1_resumed_from_epoch": result.stage1_resumed_from_epoch,
        "failed_stage": result.failed_stage, "failed_epoch": result.failed_epoch,
        "pruned_epoch": result.pruned_epoch, "population_size": result.population_size,
        "cifar100_test_norm": cfg.cifar100_test_norm,
        "source_kind": cfg.source.kind, "source_path": cfg.source.path, "source_sha256": cfg.source.sha256,
        "source_head": cfg.source.head,
        "dataset_options": json.dumps(cfg.dataset_options, sort_keys=True) if cfg.dataset_options else None,
        "plugins": list(result.plugins),
        "node_id": node_id, "config_json": json.dumps(cfg.to_dict(), sort_keys=True),
    }
    row.update(_flatten("stage1", dataclasses.asdict(cfg.stage1)))
    row.update(_flatten("loss", dataclasses.asdict(cfg.loss.params)))
    row.update(_flatten("method", dataclasses.asdict(cfg.method.params)))
    row.update(result.metrics)
    row.update(result.details)
    row.update(result.timings)
    row.update(result.stage1_execution)
    row.update(result.environment)
    row.update(result.tracker_runs)
    return row


def _table(rows: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{name: r.get(name) for name in schema.names} for r in rows], schema=schema)


def _atomic_write(table: pa.Table, location: str) -> None:
    if storage.is_remote(location):
        fs, path = storage.filesystem(location)
        with fs.open_output_stream(path) as out:
            pq.write_table(table, out)
        return
    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _trial_path(store: str, kind: str, study: str, trial_id: str) -> str:
    return storage.join(store, kind, f"study={validate_study_name(study)}", f"{trial_id}.parquet")


def write_result(store: str | os.PathLike, result: TrialResult, *, node_id: str | None = None,
                 known_new: bool = False) -> str:
    """Write ``result`` into ``store`` (history first, then the trial row); returns the trial file.

    A trial already stored as ``ok`` is left untouched: the existing file is returned. ``known_new``:
    the caller has just checked that it is not (a population, :func:`calib.trial.run_trials`), so the
    store is not read again for it.
    """
    store = storage.normalize(store)
    study = result.config.study
    path = _trial_path(store, "trials", study, result.trial_id)
    if not known_new and result.trial_id in completed_trial_ids(store, study, trial_ids=[result.trial_id]):
        return path
    rows = [{"trial_id": result.trial_id, "method": result.config.method.name, "seed": result.config.seed, **h}
            for h in result.history]
    _atomic_write(_table(rows, history_schema()), _trial_path(store, "history", study, result.trial_id))
    _atomic_write(_table([trial_row(result, node_id=node_id)], trial_schema()), path)
    return path


class StoreWarning(UserWarning):
    """A file in the store was skipped: corrupt, truncated, or not written by the store."""


_FILE_NAME = re.compile(r"study=[^/]+/[0-9a-f]{16}\.parquet")
_CHECK_THREADS = 16


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a column of type ``actual`` reads losslessly as the store's ``expected`` type."""
    if actual.equals(expected) or pa.types.is_null(actual):
        return True
    if pa.types.is_dictionary(actual):
        return _compatible(actual.value_type, expected)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual) and not actual.equals(pa.uint64())
    if pa.types.is_floating(expected):
        return pa.types.is_floating(actual) or pa.types.is_integer(actual)
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual) or str(actual) == "string_view"
    if pa.types.is_timestamp(expected):
        return pa.types.is_timestamp(actual)
    if pa.types.is_list(expected):
        listy = pa.types.is_list(actual) or pa.types.is_large_list(actual) or pa.types.is_fixed_size_list(actual)
        return listy and _compatible(actual.value_type, expected.value_type)
    return False


def _schema_problem(actual: pa.Schema, store: pa.Schema) -> str | None:
    """Why a file with schema ``actual`` is foreign to the store (None: it is not).

    A file is foreign when it has no ``trial_id`` column or a column whose type does not read losslessly
    as the store's; columns the store lacks are ignored and store columns the file lacks read as null.
    """
    names = set(store.names)
    if not names.intersection(actual.names):
        return f"it has none of the store's columns (it has {', '.join(actual.names[:5]) or 'none'})"
    if "trial_id" not in actual.names:
        return "it has no 'trial_id' column"
    for field in actual:
        if field.name in names and not _compatible(field.type, store.field(field.name).type):
            return f"column {field.name!r} is {field.type}, the store has {store.field(field.name).type}"
    return None


def _name_problem(root: str, path: str) -> str | None:
    """Why ``path`` is not named like a store file (``<root>/study=<study>/<trial_id>.parquet``)."""
    if _FILE_NAME.fullmatch(path.removeprefix(root.rstrip("/") + "/")):
        return None
    if not path.endswith(".parquet"):
        return "not a Parquet file of the store (expected study=<study>/<16 hex digits>.parquet)"
    return "not named like a store file (expected study=<study>/<16 hex digits>.parquet)"


def _access_error(exc: BaseException) -> bool:
    """Whether ``exc`` is about reaching the store (permissions, network) rather than a file's content."""
    return isinstance(exc, (PermissionError, ConnectionError, TimeoutError)) or (
        isinstance(exc, OSError) and "AWS Error" in str(exc))


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _checked_scan(dataset: pads.Dataset, store: pa.Schema, columns: list[str], expression: Any,
                  ) -> tuple[pa.Table, dict[str, str]]:
    """Scan ``dataset``; rows of files that are foreign to the store are left out and returned as problems.

    Costs no extra I/O: a fragment's footer is cached by the scan that opened it. A file is foreign if its
    schema is (:func:`_schema_problem`) or its rows' ``trial_id`` is not its file name.
    ``columns`` must include ``trial_id``.
    """
    scanner = dataset.scanner(columns=columns, filter=expression)
    batches: list[pa.RecordBatch] = []
    paths: list[str] = []
    problems: dict[str, str] = {}
    seen: list[tuple[pa.Schema, str | None]] = []  # verdicts by schema: the files of a store share one

    def judge(schema: pa.Schema) -> str | None:
        for known, verdict in seen:
            if known.equals(schema):
                return verdict
        seen.append((schema, _schema_problem(schema, store)))
        return seen[-1][1]

    for tagged in scanner.scan_batches():
        path = tagged.fragment.path
        if (not paths or paths[-1] != path) and (verdict := judge(tagged.fragment.physical_schema)) is not None:
            problems[path] = verdict
        batches.append(tagged.record_batch)
        paths.append(path)
    keep = [p not in problems for p in paths]
    counts = np.array([b.num_rows for b in batches], dtype=np.int64)
    stems = np.repeat(np.array([PurePosixPath(p).stem for p in paths], dtype=object), counts)
    table = pa.Table.from_batches(batches, schema=scanner.projected_schema)
    matches = pc.fill_null(pc.equal(table["trial_id"], pa.array(stems, pa.string())), False)
    if not pc.all(matches).as_py():
        rows = np.flatnonzero(~matches.to_numpy(zero_copy_only=False))
        found = np.searchsorted(np.cumsum(counts), rows, side="right")
        for batch, row in zip(*np.unique(found, return_index=True), strict=True):
            value = table["trial_id"][int(rows[row])].as_py()
            problems.setdefault(paths[batch], f"its rows' trial_id ({value!r}) is not its file name")
            keep[batch] = False
    if not all(keep):
        kept = [b for b, k in zip(batches, keep, strict=True) if k]
        table = pa.Table.from_batches(kept, schema=scanner.projected_schema)
    return table, problems


def _footer_problem(fs: pafs.FileSystem, path: str, store: pa.Schema) -> str | None:
    """Why the file at ``path`` cannot be read into the store, from its footer (None: it can)."""
    try:
        with fs.open_input_file(path) as source:
            schema = pq.ParquetFile(source).schema_arrow
    except FileNotFoundError:
        return ""  # gone since the listing (a replaced file): nothing to read, nothing to report
    except Exception as exc:
        if _access_error(exc):
            raise
        return f"corrupt or not a Parquet file ({_reason(exc)})"
    return _schema_problem(schema, store)


def _read(store: str | os.PathLike, kind: str, schema: pa.Schema, study: str | Iterable[str] | None,
          filters: Any, columns: list[str] | None) -> pd.DataFrame:
    """Read one table of the store; files that are corrupt or foreign are skipped with a :class:`StoreWarning`.

    The fast path scans the directory as one dataset. Files not named like the store's are left out
    without being opened; if the scan fails (a corrupt file, a column of another type) every file it
    covers has its footer checked, the bad ones are skipped and the rest are scanned again, file by
    file if that fails too. Errors reaching the store (permissions, network) are raised, not skipped.
    """
    location = storage.join(storage.normalize(store), kind)
    fs, root = storage.filesystem(location)
    full = schema.append(pa.field("study", pa.string()))
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return full.empty_table().to_pandas() if columns is None else full.empty_table().select(columns).to_pandas()
    dataset = pads.dataset(root, filesystem=fs, format="parquet", partitioning="hive", schema=full)
    expression = pads.field("study").isin([study] if isinstance(study, str) else list(study)) \
        if study is not None else None
    if filters is not None:
        expression = filters if expression is None else expression & filters
    wanted = full.names if columns is None else list(columns)
    scanned = wanted if "trial_id" in wanted else [*wanted, "trial_id"]

    def subset(paths: list[str]) -> pads.Dataset:
        partitioning = pads.partitioning(pa.schema([pa.field("study", pa.string())]), flavor="hive")
        return pads.dataset(paths, filesystem=fs, format="parquet", partitioning=partitioning,
                            partition_base_dir=root, schema=full)

    dataset.scanner(columns=scanned, filter=expression)  # a bad column or filter is the caller's error: raise it
    paths = [f.path for f in dataset.get_fragments(filter=expression)]
    skipped = {p: r for p in paths if (r := _name_problem(root, p)) is not None}
    if skipped:
        paths = [p for p in paths if p not in skipped]
        dataset = subset(paths)
    try:
        table, foreign = _checked_scan(dataset, schema, scanned, expression)
    except Exception as exc:
        if _access_error(exc):
            raise
        with ThreadPoolExecutor(max_workers=_CHECK_THREADS) as pool:
            verdicts = list(pool.map(lambda p: _footer_problem(fs, p, schema), paths))
        skipped.update((p, v) for p, v in zip(paths, verdicts, strict=True) if v is not None)
        paths = [p for p, v in zip(paths, verdicts, strict=True) if v is None]
        try:
            table, foreign = _checked_scan(subset(paths), schema, scanned, expression)
        except Exception as exc:
            if _access_error(exc):
                raise
            table, foreign = _scan_each(subset, paths, schema, scanned, expression, skipped)
    skipped.update(foreign)
    prefix = location[: location.index("://") + 3] if storage.is_remote(location) else ""
    for path, reason in sorted(skipped.items()):
        if reason:
            warnings.warn(f"skipped {prefix}{path}: {reason}", StoreWarning, stacklevel=3)
    return table.select(wanted).to_pandas()


def _scan_each(subset: Any, paths: list[str], store: pa.Schema, columns: list[str], expression: Any,
               skipped: dict[str, str]) -> tuple[pa.Table, dict[str, str]]:
    """Scan each file of ``paths`` on its own; those that fail are added to ``skipped``."""

    def one(path: str) -> tuple[pa.Table, dict[str, str]] | str:
        try:
            return _checked_scan(subset([path]), store, columns, expression)
        except Exception as exc:
            if _access_error(exc):
                raise
            return f"unreadable ({_reason(exc)})"

    tables, foreign = [], {}
    with ThreadPoolExecutor(max_workers=_CHECK_THREADS) as pool:
        for path, outcome in zip(paths, pool.map(one, paths), strict=True):
            if isinstance(outcome, str):
                skipped[path] = outcome
            else:
                tables.append(outcome[0])
                foreign.update(outcome[1])
    empty = subset([]).scanner(columns=columns).projected_schema.empty_table()
    return pa.concat_tables([empty, *tables]), foreign


def read_trials(
    store: str | os.PathLike,
    *,
    study: str | Iterable[str] | None = None,
    filters: Any = None,
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """The ``trials`` table as a DataFrame, optionally restricted to studies and a pyarrow filter.

    >>> import pyarrow.dataset as ds                                            # doctest: +SKIP
    >>> read_trials("results", study="sensitivity_gamma", filters=ds.field("status") == "ok")
    """
    return _read(store, "trials", trial_schema(), study, filters, columns)


def read_history(
    store: str | os.PathLike,
    *,
    study: str | Iterable[str] | None = None,
    filters: Any = None,
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """The ``history`` table (one row per trial, stage and epoch) as a DataFrame."""
    return _read(store, "history", history_schema(), study, filters, columns)


def read_finished(store: str | os.PathLike, study: str, trial_ids: Iterable[str]) -> pd.DataFrame:
    """The trials of ``study`` among ``trial_ids`` that finished with status ``ok`` (a study run's results)."""
    return read_trials(store, study=study,
                       filters=pads.field("trial_id").isin(list(trial_ids)) & (pads.field("status") == "ok"))


def completed_trial_ids(
    store: str | os.PathLike, study: str, *, trial_ids: Iterable[str] | None = None
) -> set[str]:
    """Ids of the trials of ``study`` stored with status ``ok`` (optionally among ``trial_ids``)."""
    filters = pads.field("status") == "ok"
    if trial_ids is not None:
        filters = filters & pads.field("trial_id").isin(list(trial_ids))
    df = read_trials(store, study=study, filters=filters, columns=["trial_id"])
    return set(df["trial_id"])
