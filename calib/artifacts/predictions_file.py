"""Reading one file of a model's predictions and labels, and the benchmarks' calibration/test splits of it.

What public calibration benchmarks publish, and what most users have, is one set of held-out predictions: netcal's
example records, the logits of Guo et al. (2017) and Kull et al. (2019), CalArena's files. calib reads

- ``.npz`` with netcal's keys ``predictions`` (N, K) and ``ground_truth`` (N,), or with ``logits`` or ``probs``
  (N, K) and ``labels`` (N,);
- a pair of ``.npy`` files, written ``PREDICTIONS.npy,LABELS.npy``: the predictions (N, K) and the labels (N,);
- ``.parquet`` with a labels column (``labels``, ``label`` or ``ground_truth``) and either one list column of K
  values per row (``logits``, ``probs`` or ``predictions``) or K numeric columns, one per class in file order.

A binary model's predictions may be one value per sample (shape (N,) or (N, 1)): class 1's probability or logit,
read as the two classes (1 − p, p) or (0, z). Under ``logits`` the values are logits, under ``probs`` probabilities;
under ``predictions``, the ``.npy`` pair and class columns they are probabilities when every value lies in [0, 1]
and every row sums to 1 (within :data:`ROW_SUM_TOLERANCE`), else logits. Probabilities are renormalised and
calibrated as their logarithm (floored at the smallest positive float64, so finite), which differs from the model's
logits by a constant per row.

Every problem raises :class:`PredictionsFileError` naming the file and what is wrong: keys or columns missing or
ambiguous, shapes that disagree, labels outside 0..K−1 or not integers, NaN or inf, probabilities whose rows do not
sum to 1, fewer than 2 classes, a class too rare to stratify.

:func:`calibration_test_split` draws split r of the benchmarks' protocol: a stratified random split into a
calibration and a test part (scikit-learn's ``train_test_split`` with ``stratify=labels, random_state=r``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = ["PREDICTIONS_SUFFIXES", "ROW_SUM_TOLERANCE", "Predictions", "PredictionsFileError",
           "calibration_test_split", "read_predictions", "split_pair"]

PREDICTIONS_SUFFIXES = (".npz", ".npy", ".parquet")

ROW_SUM_TOLERANCE = 1e-3
"""How far from 1 a row of probabilities may sum (float32 and rounded outputs); it is then renormalised."""

_LABEL_NAMES = ("labels", "label", "ground_truth")
_VALUE_NAMES = {"logits": "logits", "probs": "probabilities", "predictions": None}  # None: detected


class PredictionsFileError(ValueError):
    """A predictions file cannot be read or breaks the format; the message names the file and the problem."""


@dataclass
class Predictions:
    """A checked predictions file: ``scores`` (N, K) float64 to calibrate (the logits, or the log of the
    probabilities), ``labels`` (N,) int64 in [0, K), and ``kind``, what the file held."""

    scores: np.ndarray
    labels: np.ndarray
    kind: Literal["logits", "probabilities"]
    source: str
    """Where the values came from, e.g. ``"keys predictions, ground_truth"``."""

    @property
    def num_classes(self) -> int:
        return int(self.scores.shape[1])

    def describe(self) -> str:
        """One line: samples, classes, what the values are and what calib does with them."""
        then = "calibrated as their log" if self.kind == "probabilities" else "calibrated as they are"
        accuracy = float((self.scores.argmax(axis=1) == self.labels).mean())
        return (f"{len(self.labels)} samples, {self.num_classes} classes, {self.kind} ({self.source}; {then}), "
                f"accuracy {100 * accuracy:.2f}%")


def split_pair(text: str) -> tuple[str, str | None]:
    """``"preds.npy,labels.npy"`` → ``("preds.npy", "labels.npy")``; any other file → ``(text, None)``."""
    head, sep, tail = text.partition(",")
    return (head, tail) if sep else (text, None)


def read_predictions(path: str | os.PathLike, labels_path: str | os.PathLike | None = None) -> Predictions:
    """Read and check the predictions file at ``path`` (module docstring); ``labels_path``: the labels ``.npy`` of
    a ``.npy`` pair. Raises :class:`PredictionsFileError` on any problem."""
    path = Path(path)
    name = f"{path}" + (f",{labels_path}" if labels_path is not None else "")
    reader = _Reader(name)
    for file in (path, *([] if labels_path is None else [Path(labels_path)])):
        if not file.is_file():
            raise reader.error(f"{file} does not exist" if not file.exists() else f"{file} is not a regular file")
    suffix = path.suffix.lower()
    if suffix == ".npy" or labels_path is not None:
        if suffix != ".npy" or labels_path is None or Path(labels_path).suffix.lower() != ".npy":
            raise reader.error("a .npy pair is written PREDICTIONS.npy,LABELS.npy (two .npy files)")
        values, labels, source, kind = reader.npy(path), reader.npy(Path(labels_path)), "a .npy pair", None
    elif suffix == ".npz":
        values, labels, source, kind = reader.npz(path)
    elif suffix == ".parquet":
        values, labels, source, kind = reader.parquet(path)
    else:
        raise reader.error(f"unsupported file type {path.suffix or '(no suffix)'!r}; expected .npz, a .npy pair "
                           "(PREDICTIONS.npy,LABELS.npy) or .parquet")
    return reader.checked(values, labels, source, kind)


def calibration_test_split(labels: np.ndarray, split: int, calibration_fraction: float
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Split ``split`` (>= 0, its seed) of the samples: (calibration indices, test indices), each sorted, stratified
    by ``labels``. A class with a single sample cannot be stratified: ``PredictionsFileError``."""
    # lazy: scikit-learn takes a second or more to import
    from sklearn.model_selection import train_test_split

    counts = np.bincount(labels)
    rare = np.flatnonzero(counts == 1)
    if len(rare):
        raise PredictionsFileError(f"class {int(rare[0])} has a single sample ({len(rare)} such class(es)): a "
                                   f"stratified calibration/test split needs at least 2 samples of every class present")
    calibration, test = train_test_split(np.arange(len(labels)), train_size=calibration_fraction, stratify=labels,
                                         random_state=split)
    return np.sort(calibration), np.sort(test)


class _Reader:
    def __init__(self, name: str) -> None:
        self.name = name

    def error(self, message: str) -> PredictionsFileError:
        return PredictionsFileError(f"predictions file {self.name}: {message}")

    # -- formats -------------------------------------------------------------------------------------------

    def npy(self, path: Path) -> np.ndarray:
        try:
            return np.load(path, allow_pickle=False)
        except Exception as err:
            raise self.error(f"numpy.load(allow_pickle=False) cannot read {path.name} ({type(err).__name__}: "
                             f"{str(err)[:200]})") from err

    def npz(self, path: Path) -> tuple[Any, Any, str, str | None]:
        try:
            archive = np.load(path, allow_pickle=False)
        except Exception as err:
            raise self.error(f"numpy.load(allow_pickle=False) cannot read it ({type(err).__name__}: "
                             f"{str(err)[:200]})") from err
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise self.error("it holds a single array, not an .npz archive of named arrays")
        with archive:
            keys = list(archive.files)
            value_keys = [k for k in _VALUE_NAMES if k in keys]
            label_keys = [k for k in ("ground_truth", "labels") if k in keys]
            expected = ("expected netcal's keys `predictions` and `ground_truth`, or `logits` or `probs` with "
                        f"`labels`; the file has {', '.join(f'`{k}`' for k in keys) or 'no arrays'}")
            if len(value_keys) != 1 or len(label_keys) != 1 or len(keys) != 2:
                raise self.error(("keys missing or ambiguous: " if len(keys) <= 2 else "unexpected keys: ")
                                 + expected)
            try:
                values, labels = archive[value_keys[0]], archive[label_keys[0]]
            except ValueError as err:
                raise self.error(f"an array cannot be read ({str(err)[:200]}): object arrays are not read") from err
        return values, labels, f"keys {value_keys[0]}, {label_keys[0]}", _VALUE_NAMES[value_keys[0]]

    def parquet(self, path: Path) -> tuple[Any, Any, str, str | None]:
        # lazy: pyarrow only for a Parquet predictions file
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:
            raise self.error(f"pyarrow cannot read it ({type(err).__name__}: {str(err)[:200]})") from err
        columns = table.column_names
        label_columns = [c for c in _LABEL_NAMES if c in columns]
        if len(label_columns) != 1:
            raise self.error(f"expected one labels column named {', '.join(_LABEL_NAMES)} (found "
                             f"{', '.join(label_columns) or 'none'}); the file's columns: {', '.join(columns)}")
        labels = table.column(label_columns[0]).to_numpy(zero_copy_only=False)
        rest = [c for c in columns if c != label_columns[0]]
        lists = [c for c in rest if _is_list(table.schema.field(c).type)]
        if lists:
            if rest != lists or len(lists) != 1 or lists[0] not in _VALUE_NAMES:
                raise self.error(f"expected one list column named {', '.join(_VALUE_NAMES)} beside the labels, or "
                                 f"one numeric column per class; the file's columns: {', '.join(columns)}")
            cells = table.column(lists[0]).to_pylist()
            lengths = {len(c) if c is not None else 0 for c in cells}
            if len(lengths) != 1:
                raise self.error(f"the rows of column `{lists[0]}` hold different numbers of values "
                                 f"({', '.join(map(str, sorted(lengths)[:5]))}); expected K per row")
            values = np.array(cells, dtype=np.float64)
            return values, labels, f"columns {lists[0]}, {label_columns[0]}", _VALUE_NAMES[lists[0]]
        # lazy: pyarrow only for a Parquet predictions file
        import pyarrow as pa

        bad = [c for c in rest if not (pa.types.is_floating(table.schema.field(c).type)
                                       or pa.types.is_integer(table.schema.field(c).type))]
        if bad:
            raise self.error(f"column(s) {', '.join(bad)} are not numeric; expected a labels column and one numeric "
                             "column per class (or one list column of K values)")
        values = np.column_stack([table.column(c).to_numpy(zero_copy_only=False) for c in rest]) if rest \
            else np.empty((len(labels), 0))
        return values, labels, f"{len(rest)} class columns, labels column {label_columns[0]}", None

    # -- checks --------------------------------------------------------------------------------------------

    def checked(self, values: Any, labels: Any, source: str, kind: str | None) -> Predictions:
        values, labels = np.asarray(values), np.asarray(labels)
        if values.dtype.kind not in "iuf":
            raise self.error(f"the predictions must be numbers, got dtype {values.dtype}")
        values = values.astype(np.float64)
        if (values.ndim == 2 and values.shape[1] == 1) or values.ndim == 1:
            values = values.reshape(-1)  # binary: class 1's probability or logit
        elif values.ndim != 2:
            raise self.error(f"the predictions must have shape (N, K), or (N,) for a binary model, got "
                             f"{values.shape}")
        if labels.ndim != 1 or labels.shape[0] != values.shape[0]:
            raise self.error(f"the labels must have shape (N,) with N = {values.shape[0]} (one per row of the "
                             f"predictions), got {labels.shape}")
        if values.shape[0] == 0:
            raise self.error("it holds no samples")
        bad = int((~np.isfinite(values)).sum())
        if bad:
            raise self.error(f"{bad} prediction value(s) are NaN or inf; expected finite values")
        labels = self.integer_labels(labels)
        if values.ndim == 1:
            kind = kind or ("probabilities" if ((values >= 0) & (values <= 1)).all() else "logits")
            if kind == "probabilities":
                self.check_unit(values)
                values = np.column_stack([1 - values, values])
            else:
                values = np.column_stack([np.zeros_like(values), values])
        num_classes = values.shape[1]
        if num_classes < 2:
            raise self.error(f"the predictions have {num_classes} class(es); calibration needs at least 2")
        if labels.min() < 0 or labels.max() >= num_classes:
            raise self.error(f"labels must be in 0..{num_classes - 1} (K = {num_classes} prediction columns), got "
                             f"values in {labels.min()}..{labels.max()}")
        if len(np.unique(labels)) < 2:
            raise self.error(f"every label is {labels[0]}: the labels must hold at least 2 classes")
        kind = kind or self.detected(values)
        if kind == "probabilities":
            self.check_unit(values)
            sums = values.sum(axis=1)
            worst = int(np.abs(sums - 1).argmax())
            if abs(sums[worst] - 1) > ROW_SUM_TOLERANCE:
                raise self.error(f"probabilities whose rows do not sum to 1: row {worst} sums to {sums[worst]:.6g} "
                                 f"(tolerance {ROW_SUM_TOLERANCE:g}); store logits under `logits` if these are "
                                 "not probabilities")
            probs = values / sums[:, None]
            values = np.log(np.maximum(probs, np.finfo(np.float64).smallest_subnormal))
        return Predictions(values, labels, kind, source)

    def detected(self, values: np.ndarray) -> str:
        """Probabilities when every value is in [0, 1] and the rows sum to 1; logits when some value is outside."""
        if not ((values >= 0) & (values <= 1)).all():
            return "logits"
        return "probabilities"  # rows that do not sum to 1 are refused by the caller, naming the row

    def check_unit(self, values: np.ndarray) -> None:
        outside = (values < 0) | (values > 1)
        if outside.any():
            raise self.error(f"probabilities must be in [0, 1], got {values[outside].flat[0]:.6g} "
                             f"({int(outside.sum())} value(s) outside)")

    def integer_labels(self, labels: np.ndarray) -> np.ndarray:
        if labels.dtype.kind in "iu":
            return labels.astype(np.int64)
        if labels.dtype.kind == "f" and np.isfinite(labels).all() and (labels == np.round(labels)).all():
            return labels.astype(np.int64)
        raise self.error(f"labels must be integers (class indices), got dtype {labels.dtype}"
                         + (" with non-integer or non-finite values" if labels.dtype.kind == "f" else ""))


def _is_list(arrow_type: Any) -> bool:
    # lazy: pyarrow only for a Parquet predictions file
    import pyarrow as pa

    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(
        arrow_type)
