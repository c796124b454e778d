"""Per-sample predictions: each trial's validation and test probabilities, kept beside its row.

A third table of the store, written and compacted as ``history`` is (:mod:`calib.store.files`)::

    <store>/predictions/study=<study>/<trial_id>.parquet       a trial's predictions, written by its worker
    <store>/predictions/study=<study>/part-<32 hex>.parquet    those of many finished trials (compacted)

One row per (trial, split): ``probs`` the (N, C) probabilities, row-major little-endian bytes in the row's
``precision`` (``float64``: the very values its metrics were computed from; ``float32`` or ``float16`` on
request, :mod:`calib.store.rounding` bounds what that rounding does to each metric), ``labels`` the N true
classes, and ``indices`` the samples of the split a ``val`` row covers when the method held part of the
validation split out (null: all of them). A trial's predictions file is written before its history and
its row, atomically (:func:`calib.store.parquet.write_file`); a compaction moves it into a part with the
trial's history. Reading one trial's predictions opens its own file, or the row groups of the one part
holding it (each part's ``trial_id`` column is read once per process), never the other trials' probabilities.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from calib import storage
from calib.registries import DATASETS
from calib.store.files import list_table, table_location, trial_file

__all__ = ["BYTES_PER_VALUE", "KEEP_CHOICES", "PREDICTION_COLUMNS", "Keep", "SplitPredictions", "encode_predictions",
           "kept_predictions_note",
           "predictions_bytes", "predictions_schema", "read_predictions", "stored_prediction_ids"]

Keep = Literal["on", "float32", "float16", "off"]
KEEP_CHOICES: tuple[str, ...] = ("on", "float32", "float16", "off")
"""``--keep-predictions``: ``on`` keeps the probabilities in float64, the precision the metrics were computed
from; ``float32`` / ``float16`` round them (half / a quarter of the size); ``off`` keeps none."""
_DTYPE = {"on": "float64", "float32": "float32", "float16": "float16"}
BYTES_PER_VALUE = {"float64": 8, "float32": 4, "float16": 2}

PREDICTION_COLUMNS = [
    ("trial_id", pa.string(), "the trial"),
    ("split", pa.string(), "val or test"),
    ("precision", pa.string(), "dtype of probs: float64 (as the metrics were computed), float32 or float16"),
    ("num_samples", pa.int64(), "N, the samples of the split the row covers"),
    ("num_classes", pa.int64(), "C, the classes"),
    ("probs", pa.binary(), "the (N, C) probabilities, row-major, little-endian, in precision"),
    ("labels", pa.list_(pa.int32()), "the N true classes"),
    ("indices", pa.list_(pa.int64()),
     "val: the samples of the validation split the row covers, when the method held the others out (else null)"),
]


@functools.cache
def predictions_schema() -> pa.Schema:
    return pa.schema([pa.field(n, t, metadata={"description": d}) for n, t, d in PREDICTION_COLUMNS])


@dataclass(frozen=True)
class SplitPredictions:
    """One split of one trial: ``probs`` (N, C) as float64 (a float16 row renormalised to sum to 1, as the
    metrics require), ``labels`` (N,), ``indices`` (None: the whole split), ``precision`` as stored."""

    probs: np.ndarray
    labels: np.ndarray
    precision: str
    indices: np.ndarray | None = None
    stored: np.ndarray | None = None
    """The probabilities as stored (before renormalisation), for the rounding bounds."""


def encode_predictions(trial_id: str, predictions: dict[str, dict[str, Any]], keep: str) -> pa.Table:
    """The ``predictions`` rows of one trial: ``predictions`` maps a split to ``probs``, ``labels``, ``indices``."""
    if keep not in _DTYPE:
        raise ValueError(f"keep must be one of {', '.join(_DTYPE)} to write predictions, got {keep!r}")
    dtype = np.dtype(_DTYPE[keep]).newbyteorder("<")
    rows = []
    for split, values in predictions.items():
        probs = np.asarray(values["probs"], dtype=np.float64)
        indices = values.get("indices")
        rows.append({"trial_id": trial_id, "split": split, "precision": _DTYPE[keep], "num_samples": probs.shape[0],
                     "num_classes": probs.shape[1], "probs": np.ascontiguousarray(probs.astype(dtype)).tobytes(),
                     "labels": np.asarray(values["labels"]).astype(np.int32).tolist(),
                     "indices": None if indices is None else np.asarray(indices).astype(np.int64).tolist()})
    return pa.Table.from_pylist(rows, schema=predictions_schema())


def _decode(row: dict[str, Any]) -> SplitPredictions:
    dtype = np.dtype(row["precision"]).newbyteorder("<")
    stored = np.frombuffer(row["probs"], dtype=dtype).reshape(row["num_samples"], row["num_classes"])
    probs = stored.astype(np.float64)
    if row["precision"] != "float64":  # rounding moved the row sums off 1 by up to C·u
        probs = probs / probs.sum(axis=1, keepdims=True)
    indices = None if row["indices"] is None else np.asarray(row["indices"], dtype=np.int64)
    return SplitPredictions(probs, np.asarray(row["labels"], dtype=np.int64), row["precision"], indices,
                            stored.astype(np.float64))


_GROUPS: dict[tuple[str, str, int], dict[str, list[int]]] = {}


def _row_groups(fs: pafs.FileSystem, path: str, size: int) -> dict[str, list[int]]:
    """trial id -> the row groups of the part at ``path`` holding its rows; read once per process (a part
    never changes: its path and size identify it)."""
    key = (fs.type_name, path, size)
    if key not in _GROUPS:
        with fs.open_input_file(path) as source:
            part = pq.ParquetFile(source)
            groups: dict[str, list[int]] = {}
            for group in range(part.num_row_groups):
                for trial in set(part.read_row_group(group, columns=["trial_id"])["trial_id"].to_pylist()):
                    groups.setdefault(trial, []).append(group)
        if len(_GROUPS) >= 1024:
            _GROUPS.pop(next(iter(_GROUPS)))
        _GROUPS[key] = groups
    return _GROUPS[key]


def _read_rows(fs: pafs.FileSystem, path: str, groups: list[int] | None, wanted: set[str]) -> list[dict[str, Any]]:
    with fs.open_input_file(path) as source:
        part = pq.ParquetFile(source)
        table = part.read() if groups is None else part.read_row_groups(groups)
    return [row for row in table.to_pylist() if row["trial_id"] in wanted]


def read_predictions(store: str, study: str, trial_ids: Iterable[str],
                     splits: tuple[str, ...] = ("val", "test")) -> dict[str, dict[str, SplitPredictions]]:
    """The kept predictions of ``trial_ids`` of ``study``: trial id -> split -> :class:`SplitPredictions`
    (trials without kept predictions are absent). Reads the trials' own files and, for trials in parts, only
    the row groups holding them."""
    store = storage.normalize(store)
    wanted = set(trial_ids)
    fs, root = storage.filesystem(table_location(store, "predictions"))
    if not wanted or fs.get_file_info(root).type == pafs.FileType.NotFound:
        return {}
    for _attempt in range(20):  # a compaction may delete a listed file, its rows then in a part listed anew
        found: dict[str, dict[str, SplitPredictions]] = {}
        try:
            for file in list_table(fs, root, [study]):
                todo = wanted - set(found)
                if file.kind == "trial" and file.trial_id in todo:
                    rows = _read_rows(fs, file.path, None, {file.trial_id})
                elif file.kind == "part" and todo:
                    index = _row_groups(fs, file.path, file.size)
                    groups = sorted({g for t in todo if t in index for g in index[t]})
                    rows = _read_rows(fs, file.path, groups, todo) if groups else []
                else:
                    continue
                for row in rows:
                    if row["split"] in splits:
                        found.setdefault(row["trial_id"], {})[row["split"]] = _decode(row)
        except FileNotFoundError:
            continue
        return found
    raise RuntimeError(f"the predictions of study {study!r} under {root} kept changing while they were read")


def stored_prediction_ids(store: str, study: str) -> set[str]:
    """The trials of ``study`` with kept predictions (reads only the ``trial_id`` of the parts, and file names)."""
    store = storage.normalize(store)
    fs, root = storage.filesystem(table_location(store, "predictions"))
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return set()
    ids: set[str] = set()
    for file in list_table(fs, root, [study]):
        if file.kind == "trial":
            ids.add(file.trial_id)
        elif file.kind == "part":
            try:
                ids |= set(_row_groups(fs, file.path, file.size))
            except FileNotFoundError:  # merged since the listing: its trials are in the new part
                return stored_prediction_ids(store, study)
    return ids


def predictions_file(store: str, study: str, trial_id: str) -> str:
    return trial_file(store, "predictions", study, trial_id)


def predictions_bytes(samples: int, classes: int, keep: str) -> int:
    """Bytes of ``samples`` × ``classes`` probabilities and the labels at ``keep`` (before compression)."""
    if keep == "off":
        return 0
    return samples * (classes * BYTES_PER_VALUE[_DTYPE[keep]] + 4)


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.3g} MB" if count >= 1e5 else f"{count / 1e3:.3g} kB"


def kept_predictions_note(configs: Iterable[dict[str, Any]], keep: str) -> str:
    """The settings line's part on kept predictions: ``predictions kept (float64) ≈ 12 MB, 80 kB a trial``, or what
    ``--keep-predictions on`` would take. Sizes are uncompressed val + test probabilities and labels; a dataset
    whose split sizes only its files tell (a predictions or features file, ImageFolder) is counted as unknown."""
    total, trials, unknown = 0, 0, 0
    for config in configs:
        kind = config.get("source", {}).get("kind", "train")
        info = DATASETS.get(config["dataset"]) if config["dataset"] in DATASETS and kind in ("train", "checkpoint") \
            else None
        if info is None or None in (info.num_classes, info.val_images, info.test_images):
            unknown += 1
            continue
        trials += 1
        total += predictions_bytes(info.val_images + info.test_images, info.num_classes,
                                   "on" if keep == "off" else keep)
    sized = f"≈ {_megabytes(total)}, {_megabytes(total // trials)} a trial" if trials else "size unknown"
    if unknown and trials:
        sized += f" (+ {unknown} trials of unknown size)"
    if keep == "off":
        return f"predictions not kept (--keep-predictions on would take {sized})"
    return f"predictions kept ({_DTYPE[keep]}) {sized}"
