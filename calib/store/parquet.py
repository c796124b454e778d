"""Writing and reading the Parquet result store.

Layout (hive-partitioned by study; :mod:`calib.store.files`)::

    <store>/trials/study=<study>/<trial_id>.parquet       a trial's row, written by its worker
    <store>/history/study=<study>/<trial_id>.parquet      its rows per (stage, epoch)
    <store>/{trials,history}/study=<study>/part-*.parquet the rows of many finished trials (compacted)
    <store>/predictions/study=<study>/...                 kept probabilities (:mod:`calib.store.predictions`)

``<store>`` is a local directory or an object-store URI (``s3://bucket/prefix``, see
:mod:`calib.storage`). A trial's own files are its unit of durability: a local file is written to a
hidden temporary name in the same directory, flushed, and renamed into place, so a reader never sees a
partial file (pyarrow, pandas and DuckDB's ``**/*.parquet`` skip names starting with "." or "_"); an
object appears only once its upload completes. The history file is written before the trial file: a
trial exists in the store once its trial row does. A compaction (:mod:`calib.store.compaction`) later
moves the rows of finished trials into parts.

A trial's row is, for a moment, in two files while a compaction runs (its part is written before its
own file is deleted), and after a killed compaction until the next one. The readers here read each
trial once all the same: per trial they keep the rows of one file, the one holding its best row
(``ok`` over ``pruned`` over ``failed``; then a part over a trial's own file; then the first path).

Readers skip a corrupt or foreign file with a :class:`StoreWarning` naming it and never drop a valid
row (:mod:`calib.store.scan`). A trial whose file is skipped is not completed, so it re-runs and its
new file replaces the bad one. A trial whose status is ``ok`` is never rewritten; a ``failed`` one is
replaced by its re-run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from calib import storage
from calib.config import validate_study_name
from calib.store.files import StoreFile, study_folder, table_location, trial_file
from calib.store.predictions import encode_predictions
from calib.store.scan import part_index, scan_files, scan_listed, winners
from calib.store.schema import history_schema, trial_schema
from calib.trial_result import TrialResult

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
        "seed": cfg.seed, "stage2_seed": cfg.stage2_seed, "loss": cfg.loss.name, "stage1_id": result.stage1_id,
        "num_bins": cfg.num_bins,
        "label": cfg.label, "label_rank": cfg.label_rank, "ood_datasets": list(cfg.ood_datasets),
        "corruptions": list(cfg.corruptions),
        "status": result.status, "error": result.error, "stage1_cache_hit": result.stage1_cache_hit,
        "stage1_writer": result.stage1_writer,
        "started_at": result.started_at, "finished_at": result.finished_at, "device": result.device,
        "stage1_device": result.stage1_device, "stage1_resumed_from_epoch": result.stage1_resumed_from_epoch,
        "failed_stage": result.failed_stage, "failed_epoch": result.failed_epoch,
        "pruned_epoch": result.pruned_epoch, "population_size": result.population_size,
        "search_trial": cfg.search_trial,
        "cifar100_test_norm": cfg.cifar100_test_norm,
        "source_kind": cfg.source.kind, "source_path": cfg.source.path, "source_sha256": cfg.source.sha256,
        "source_head": cfg.source.head, "source_labels_path": cfg.source.labels_path,
        "source_labels_sha256": cfg.source.labels_sha256,
        "source_calibration_fraction": cfg.source.calibration_fraction,
        "dataset_options": json.dumps(cfg.dataset_options, sort_keys=True) if cfg.dataset_options else None,
        "plugins": list(result.plugins),
        "node_id": node_id, "config_json": json.dumps(cfg.to_dict(), sort_keys=True),
    }
    row.update(_flatten("stage1", cfg.stage1.to_dict()))
    row.update(_flatten("loss", dataclasses.asdict(cfg.loss.params)))
    row.update(_flatten("method", dataclasses.asdict(cfg.method.params)))
    row.update(result.metrics)
    row.update(result.details)
    row.update(result.timings)
    row.update(result.stage1_execution)
    row.update(result.environment)
    row.update(result.tracker_runs)
    row.update(result.fit_details)
    return row


def _table(rows: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{name: r.get(name) for name in schema.names} for r in rows], schema=schema)


def write_file(table: pa.Table, location: str, **options: Any) -> None:
    """Write ``table`` as the Parquet file ``location`` so that no reader sees it partial: locally
    through a hidden temporary file in the same folder, flushed and renamed; remotely in one PUT of
    the finished bytes."""
    if storage.is_remote(location):
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **options)
        fs, path = storage.filesystem(location)
        with fs.open_output_stream(path) as out:
            out.write(sink.getvalue())
        return
    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh, **options)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_result(store: str | os.PathLike, result: TrialResult, *, node_id: str | None = None,
                 known_new: bool = False, keep_predictions: str = "off") -> str:
    """Write ``result`` into ``store`` (its predictions, then history, then the trial row); returns the trial file.

    ``keep_predictions`` (:data:`calib.store.predictions.KEEP_CHOICES`): whether, and in which precision, the
    trial's validation and test probabilities are kept (:mod:`calib.store.predictions`); ``off``: not kept.

    A trial already stored as ``ok`` is left untouched: the file holding its row is returned. Checking
    costs one listing of the study's folder and reads the ``trial_id`` and ``status`` columns of its own
    file and the study's parts, never the other trials' files. ``known_new``: the caller has just
    checked that it is not stored (a population, :func:`calib.trial.run_trials`).
    """
    store = storage.normalize(store)
    study = result.config.study
    path = trial_file(store, "trials", study, result.trial_id)
    if not known_new and (stored := _stored_ok(store, study, result.trial_id)) is not None:
        return stored
    if keep_predictions != "off" and result.predictions:
        write_file(encode_predictions(result.trial_id, result.predictions, keep_predictions),
                   trial_file(store, "predictions", study, result.trial_id), compression="zstd")
    rows = [{"trial_id": result.trial_id, "method": result.config.method.name, "seed": result.config.seed, **h}
            for h in result.history]
    write_file(_table(rows, history_schema()), trial_file(store, "history", study, result.trial_id))
    write_file(_table([trial_row(result, node_id=node_id)], trial_schema()), path)
    return path


def _stored_ok(store: str, study: str, trial_id: str) -> str | None:
    """The file (URI or path) holding the ``ok`` row of ``trial_id``, or None.

    Looks at two things only: the study's parts (listed by their name prefix; their ok ids are read
    once per process, a part never changes) and the trial's own file.
    """
    fs, root = storage.filesystem(table_location(store, "trials"))
    folder = study_folder(store, "trials", study)
    while True:
        try:
            for name, size in storage.list_names(folder, "part-"):
                part = StoreFile(storage.filesystem(storage.join(folder, name))[1], study, "part", size)
                if trial_id in part_index(fs, root, part, trial_schema()).ok_ids:
                    return storage.join(folder, name)
        except FileNotFoundError:  # merged into a new part since the listing: look again
            continue
        own = trial_file(store, "trials", study, trial_id)
        _, own_path = storage.filesystem(own)
        if fs.get_file_info(own_path).type != pafs.FileType.File:
            return None
        scan = scan_files(fs, root, [StoreFile(own_path, study, "trial", 0, trial_id=trial_id)], trial_schema(),
                          ["trial_id"], pads.field("status") == "ok")
        if "" in scan.problems.values():  # moved into a part since the check
            continue
        _warn(store, "trials", scan.problems)
        return own if scan.table.num_rows else None


class StoreWarning(UserWarning):
    """A file in the store was skipped: corrupt, truncated, or not written by the store."""


def _warn(store: str, kind: str, problems: dict[str, str]) -> None:
    location = table_location(store, kind)
    prefix = location[: location.index("://") + 3] if storage.is_remote(location) else ""
    for path, reason in sorted(problems.items()):
        if reason:
            warnings.warn(f"skipped {prefix}{path}: {reason}", StoreWarning, stacklevel=4)


def _read(store: str | os.PathLike, kind: str, schema: pa.Schema, study: str | Iterable[str] | None,
          filters: Any, columns: list[str] | None) -> pd.DataFrame:
    """Read one table of the store, each trial once; foreign files are skipped with a :class:`StoreWarning`."""
    store = storage.normalize(store)
    fs, root = storage.filesystem(table_location(store, kind))
    full = schema.append(pa.field("study", pa.string()))
    wanted = full.names if columns is None else list(columns)
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return full.empty_table().select(wanted).to_pandas()
    studies = None if study is None else [study] if isinstance(study, str) else list(study)
    needed = ["trial_id", "status"] if kind == "trials" else ["trial_id"]
    scanned = [*wanted, *(c for c in needed if c not in wanted)]
    scan = scan_listed(fs, root, studies, schema, scanned, filters)
    _warn(store, kind, scan.problems)
    keep = winners(scan, by_status=kind == "trials").keep
    table = scan.table if keep is None else scan.table.filter(pa.array(keep))
    return table.select(wanted).to_pandas()


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
