"""Writing and reading the Parquet result store.

Layout (hive-partitioned by study)::

    <store>/trials/study=<study>/<trial_id>.parquet    one row: the trial
    <store>/history/study=<study>/<trial_id>.parquet   one row per (stage, epoch)

``<store>`` is a local directory or an object-store URI (``s3://bucket/prefix``, see
:mod:`calib.storage`). A local file is written to a hidden temporary name in the same directory,
flushed, and renamed into place, so a reader never sees a partial file (pyarrow and pandas skip names
starting with "." or "_"); an object appears only once its upload completes.
The history file is written before the trial file: a trial exists in the store once its trial file
does. A trial whose status is ``ok`` is never rewritten; a ``failed`` one is replaced by its re-run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
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
from calib.store.schema import history_schema, trial_schema
from calib.trial import TrialResult

__all__ = [
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
        "started_at": result.started_at, "finished_at": result.finished_at, "device": result.device,
        "stage1_device": result.stage1_device, "cifar100_test_norm": cfg.cifar100_test_norm,
        "node_id": node_id, "config_json": json.dumps(cfg.to_dict(), sort_keys=True),
    }
    row.update(_flatten("stage1", dataclasses.asdict(cfg.stage1)))
    row.update(_flatten("loss", dataclasses.asdict(cfg.loss.params)))
    row.update(_flatten("method", dataclasses.asdict(cfg.method.params)))
    row.update(result.metrics)
    row.update(result.details)
    row.update(result.timings)
    row.update(result.environment)
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


def write_result(store: str | os.PathLike, result: TrialResult, *, node_id: str | None = None) -> str:
    """Write ``result`` into ``store`` (history first, then the trial row); returns the trial file.

    A trial already stored as ``ok`` is left untouched: the existing file is returned.
    """
    store = storage.normalize(store)
    study = result.config.study
    path = _trial_path(store, "trials", study, result.trial_id)
    if result.trial_id in completed_trial_ids(store, study, trial_ids=[result.trial_id]):
        return path
    rows = [{"trial_id": result.trial_id, "method": result.config.method.name, "seed": result.config.seed, **h}
            for h in result.history]
    _atomic_write(_table(rows, history_schema()), _trial_path(store, "history", study, result.trial_id))
    _atomic_write(_table([trial_row(result, node_id=node_id)], trial_schema()), path)
    return path


def _read(store: str | os.PathLike, kind: str, schema: pa.Schema, study: str | Iterable[str] | None,
          filters: Any, columns: list[str] | None) -> pd.DataFrame:
    fs, root = storage.filesystem(storage.join(storage.normalize(store), kind))
    full = schema.append(pa.field("study", pa.string()))
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return full.empty_table().to_pandas() if columns is None else full.empty_table().select(columns).to_pandas()
    dataset = pads.dataset(root, filesystem=fs, format="parquet", partitioning="hive", schema=full)
    expression = pads.field("study").isin([study] if isinstance(study, str) else list(study)) \
        if study is not None else None
    if filters is not None:
        expression = filters if expression is None else expression & filters
    return dataset.to_table(columns=columns, filter=expression).to_pandas()


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
