"""CalArena's win rates (Berta, Holzmüller, Bach, Jordan, "CalArena", arXiv 2605.30188): how often a method beats a
reference on the same predictions.

A method's win rate against a reference is the share of its (setup × replicate) pairs in which its test loss is
strictly lower than the reference's: a trial is paired with the reference trial of the same dataset, architecture,
seed (the replicate; for a predictions-file study the index of its random calibration/test split), calibration-set
size and draw. Ties are no win (CalArena's ``compute_winrates`` counts strict improvements). The references are the
uncalibrated model (the row of :data:`UNCALIBRATED_CANDIDATES`, paired on dataset, architecture and seed: it has no
calibration set) and temperature scaling (the rows of
:data:`~calib.report.significance.CONTROL_CANDIDATES` and the post-hoc study's "TS · <size>" rows), each for the
NLL and the Brier score (:data:`WIN_METRICS`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from calib.methods.vanilla import FORMER_UNCALIBRATED_LABELS, UNCALIBRATED_LABEL
from calib.report.significance import CONTROL_CANDIDATES

__all__ = ["PAIR_KEYS", "UNCALIBRATED_CANDIDATES", "WIN_METRICS", "WinRate", "win_rates"]

UNCALIBRATED_CANDIDATES = (UNCALIBRATED_LABEL, *FORMER_UNCALIBRATED_LABELS)
"""The row of the uncalibrated model (every study labels it ``Vanilla``), and its names in stores written before."""

WIN_METRICS = {"test_nll": "NLL", "test_brier": "Brier"}
"""The losses CalArena's win rates compare (column -> header)."""

PAIR_KEYS = ("dataset", "arch", "seed", "method_calibration_size", "method_calibration_draw")
"""What a trial and its reference share. A null calibration size is the whole validation split, a null draw 0."""

WinRate = tuple[float, int]
"""(share of pairs won, number of pairs)."""


def _keys(trials: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """The pairing columns of ``trials``, nulls made comparable (size −1: all of the split; draw 0)."""
    keys = pd.DataFrame(index=trials.index)
    for column in columns:
        values = trials[column] if column in trials else pd.Series(np.nan, index=trials.index)
        if column == "method_calibration_size":
            values = values.astype(float).fillna(-1.0)
        elif column == "method_calibration_draw":
            values = values.astype(float).fillna(0.0)
        keys[column] = values.astype(object) if column in ("dataset", "arch") else values.astype(float)
    return keys


def _references(labels: Sequence[str]) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    """Reference name -> (its labels, the keys its trials pair on)."""
    out = {}
    uncalibrated = next((label for label in UNCALIBRATED_CANDIDATES if label in labels), None)
    if uncalibrated is not None:
        out[uncalibrated] = ([uncalibrated], PAIR_KEYS[:3])
    ts = [label for label in labels if label in CONTROL_CANDIDATES or label.startswith("TS · ")]
    if ts:
        out["TS"] = (ts, PAIR_KEYS)
    return out


def win_rates(trials: pd.DataFrame, order: Sequence[str]) -> dict[tuple[str, str], dict[str, WinRate]]:
    """(metric column, reference) -> {label: (share of its pairs with a strictly lower value, pairs)} for the labels
    of ``order`` that have a pair with a finite value on both sides; the reference's own rows are not compared
    with it. ``trials``: store rows with ``label``, the :data:`PAIR_KEYS` (the calibration-set columns may be
    absent: all of the split) and the :data:`WIN_METRICS` columns. A (metric, reference) without any pair is
    left out.

    >>> frame = pd.DataFrame({"label": ["Uncalibrated", "TS", "HB"] * 2, "dataset": "d", "arch": "a",
    ...                       "seed": [1, 1, 1, 2, 2, 2], "test_nll": [0.9, 0.5, 0.6, 0.8, 0.5, 0.4]})
    >>> rates = win_rates(frame, ["Uncalibrated", "TS", "HB"])
    >>> rates[("test_nll", "Uncalibrated")], rates[("test_nll", "TS")]
    ({'TS': (1.0, 2), 'HB': (1.0, 2)}, {'Uncalibrated': (0.0, 2), 'HB': (0.5, 2)})
    """
    out: dict[tuple[str, str], dict[str, WinRate]] = {}
    labels = list(dict.fromkeys(str(label) for label in trials["label"]))
    for reference, (reference_labels, keys) in _references(labels).items():
        is_reference = trials["label"].isin(reference_labels)
        pairing = _keys(trials, keys)
        for metric in WIN_METRICS:
            if metric not in trials:
                continue
            values = pairing.assign(value=trials[metric].astype(float))
            reference_values = values[is_reference].dropna(subset=["value"]).groupby(list(keys))["value"].mean()
            others = values[~is_reference].assign(label=trials.loc[~is_reference, "label"].astype(str))
            paired = others.dropna(subset=["value"]).join(reference_values.rename("reference"), on=list(keys),
                                                          how="inner")
            if paired.empty:
                continue
            won = (paired["value"] < paired["reference"]).groupby(paired["label"])
            rates = won.mean()
            counts = won.size()
            out[(metric, reference)] = {label: (float(rates[label]), int(counts[label]))
                                        for label in order if label in rates.index}
    return out
