"""Re-scoring kept predictions: any registered metric, at any number of bins, without training.

``python -m calib.store rescore --store S --metric ece --bins 10`` computes the metric on the kept val and test
probabilities (:mod:`calib.store.predictions`) of every ``ok`` trial that has them, into the ``rescored`` table::

    <store>/rescored/study=<study>/<32 hex>.parquet    the values one rescore run added (written whole)

keyed by (``trial_id``, ``split``, ``metric``, ``num_bins``): a value already there is not computed again, so a
rerun adds nothing. ``column`` names the value as the report shows it (:func:`rescored_column`). Kept in float32 or
float16, each value comes with ``bound``, the most rounding can have moved it (:mod:`calib.store.rounding`).
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from calib import storage
from calib._config import ConfigError
from calib.metrics import METRICS
from calib.store.compaction import stored_studies
from calib.store.files import study_folder, table_location
from calib.store.parquet import read_trials, write_file
from calib.store.predictions import SplitPredictions, read_predictions, stored_prediction_ids
from calib.store.rounding import rounding_bound

__all__ = ["RESCORED_COLUMNS", "RescoreReport", "check_metric", "read_rescored", "rescore", "rescored_column",
           "rescored_schema", "rescored_values"]

RESCORED_COLUMNS = [
    ("trial_id", pa.string(), "the trial"),
    ("split", pa.string(), "val or test"),
    ("metric", pa.string(), "registered metric name (calib.metrics.METRICS)"),
    ("num_bins", pa.int64(), "bins of a binned metric; null for a metric without bins"),
    ("column", pa.string(), "the report's column: <split>_<metric>_bins<M> (binned), <split>_<metric> (not)"),
    ("value", pa.float64(), "the metric on the kept predictions"),
    ("precision", pa.string(), "the kept predictions' dtype: float64, float32 or float16"),
    ("bound", pa.float64(),
     "the most rounding the kept predictions can have moved the value (0 for float64; null: no stated bound)"),
    ("computed_at", pa.timestamp("ms", tz="UTC"), "when this rescore ran"),
]
_BATCH = 256


def rescored_schema() -> pa.Schema:
    return pa.schema([pa.field(n, t, metadata={"description": d}) for n, t, d in RESCORED_COLUMNS])


def rescored_column(split: str, metric: str, num_bins: int | None) -> str:
    """``test_ece_bins10`` for a binned metric, ``test_smece`` for one without bins."""
    return f"{split}_{metric}" + ("" if num_bins is None else f"_bins{num_bins}")


def check_metric(metric: str, bins: int | None) -> int | None:
    """The bins ``metric`` is computed with (None: it has none; a binned metric defaults to 15); a
    :class:`ConfigError` naming the allowed metrics for an unknown one, or for ``bins`` of a metric without."""
    if metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r} for rescore; allowed: {', '.join(METRICS)}")
    if not METRICS[metric].binned:
        if bins is not None:
            binned = [m for m, spec in METRICS.items() if spec.binned]
            raise ConfigError(f"metric {metric!r} has no bins, so --bins does not apply; metrics with bins: "
                              f"{', '.join(binned)}")
        return None
    if bins is not None and bins < 1:
        raise ConfigError(f"--bins must be an integer >= 1, got {bins}")
    return 15 if bins is None else bins


def read_rescored(store: str | os.PathLike, *, study: str | list[str] | None = None) -> pd.DataFrame:
    """The ``rescored`` table (with ``study``), each (study, trial, split, metric, bins) once."""
    store = storage.normalize(store)
    fs, root = storage.filesystem(table_location(store, "rescored"))
    schema = rescored_schema().append(pa.field("study", pa.string()))
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return schema.empty_table().to_pandas()
    partitioning = pads.partitioning(pa.schema([pa.field("study", pa.string())]), flavor="hive")
    dataset = pads.dataset(root, filesystem=fs, format="parquet", partitioning=partitioning, schema=schema,
                           exclude_invalid_files=False)
    studies = None if study is None else [study] if isinstance(study, str) else list(study)
    table = dataset.to_table(filter=None if studies is None else pads.field("study").isin(studies))
    frame = table.to_pandas()
    keys = ["study", "trial_id", "split", "metric", "num_bins"]
    return frame.drop_duplicates(subset=keys, keep="first").reset_index(drop=True)


@dataclass
class RescoreReport:
    """What one rescore of ``study`` did."""

    study: str
    column: str
    computed: int = 0
    present: int = 0
    without_predictions: int = 0
    largest_bound: float | None = None

    def line(self) -> str:
        bound = "" if self.largest_bound in (None, 0.0) else f"; largest rounding bound {self.largest_bound:.3g}"
        return (f"[{self.study}] rescored {self.column}: {self.computed} values computed, {self.present} already "
                f"there, {self.without_predictions} ok trials without kept predictions{bound}")


def _compute(metric: str, bins: int | None, split: str, trial_id: str, kept: SplitPredictions,
             now: dt.datetime) -> dict:
    spec = METRICS[metric]
    value = spec(kept.probs, kept.labels, num_bins=bins or 15)
    return {"trial_id": trial_id, "split": split, "metric": metric, "num_bins": bins,
            "column": rescored_column(split, metric, bins), "value": float(value), "precision": kept.precision,
            "bound": rounding_bound(metric, kept.stored, kept.probs, kept.labels, kept.precision, bins or 15),
            "computed_at": now}


def rescore(store: str | os.PathLike, metric: str, bins: int | None = None, *, studies: list[str] | None = None,
            splits: tuple[str, ...] = ("test",)) -> list[RescoreReport]:
    """Compute ``metric`` (at ``bins``) on the kept predictions of every ``ok`` trial of ``studies`` (default: all)
    that lacks it, into the ``rescored`` table; one report per study."""
    store = storage.normalize(store)
    num_bins = check_metric(metric, bins)
    reports = []
    for study in studies or stored_studies(store):
        ok = set(read_trials(store, study=study, filters=pads.field("status") == "ok", columns=["trial_id"])
                 ["trial_id"])
        kept = ok & stored_prediction_ids(store, study)
        done = read_rescored(store, study=study)
        done = done[(done["metric"] == metric) & (done["num_bins"].astype("Int64") == num_bins)
                    if num_bins is not None else (done["metric"] == metric) & done["num_bins"].isna()]
        have = set(zip(done["trial_id"], done["split"], strict=True))
        report = RescoreReport(study, ", ".join(rescored_column(s, metric, num_bins) for s in splits),
                               without_predictions=len(ok - kept))
        todo = sorted(t for t in kept if any((t, s) not in have for s in splits))
        report.present = sum((t, s) in have for t in kept for s in splits)
        now = dt.datetime.now(dt.timezone.utc)
        rows = []
        for start in range(0, len(todo), _BATCH):
            for trial_id, by_split in read_predictions(store, study, todo[start:start + _BATCH], splits).items():
                rows += [_compute(metric, num_bins, s, trial_id, by_split[s], now)
                         for s in splits if s in by_split and (trial_id, s) not in have]
        if rows:
            write_file(pa.Table.from_pylist(rows, schema=rescored_schema()),
                       storage.join(study_folder(store, "rescored", study), f"{uuid.uuid4().hex}.parquet"))
        report.computed = len(rows)
        bounds = [r["bound"] for r in rows if r["bound"] is not None]
        report.largest_bound = max(bounds) if bounds else None
        reports.append(report)
    return reports


def rescored_values(store: str | os.PathLike) -> pd.DataFrame:
    """The rescored values as columns: one row per (study, trial_id), one column per :func:`rescored_column`."""
    frame = read_rescored(store)
    if frame.empty:
        return pd.DataFrame(columns=["study", "trial_id"])
    wide = frame.pivot_table(index=["study", "trial_id"], columns="column", values="value", aggfunc="first")
    return wide.reset_index().rename_axis(columns=None)

