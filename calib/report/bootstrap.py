"""A paired bootstrap over test samples: which rows differ from the control when a setup has too few seeds.

With fewer than :data:`MIN_SEEDS` seeds the paired t-test over seeds (:mod:`calib.report.significance`) cannot
speak (the ``paper`` preset runs one seed). Where the setup's trials kept their test predictions
(:mod:`calib.store.predictions`) and share one test set, the report resamples the test samples instead: B =
:data:`RESAMPLES` draws of N indices with replacement (``numpy.random.default_rng(SEED)``), the same draws for every
row of the setup. On each draw every row's metric is computed on the resampled samples (a row with two seeds: the mean
of its two trials'), and d_b = row − control. The two-sided p-value is
p = min(1, 2 · min(1 + #{d_b ≤ 0}, 1 + #{d_b ≥ 0}) / (B + 1)), Holm-adjusted over the rows of each column
(:func:`calib.report.significance.holm`); a rejected row is ▲ / ▼ by the sign of its difference on the full test set
and the metric's direction. This tests the test-set sampling only: the variation the seeds would show (a new
Stage I, a new fit) is not in it, which the table's legend says.

The metrics it resamples are those computed per sample or per bin of top-label confidences: accuracy, ECE, AECE,
MCE, O-ECE, U-ECE (any bins: ``test_ece_bins10``), NLL and Brier; other columns are left unmarked, and named.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from calib.metrics._binning import top_label
from calib.metrics.adaptive_ece import _aece_compute
from calib.metrics.decomposed_ece import _oece_compute, _uece_compute
from calib.metrics.ece import _ece_compute
from calib.metrics.mce import _mce_compute
from calib.metrics.nll import NLL_FLOOR
from calib.report.significance import holm
from calib.report.significance_tables import MARKS
from calib.report.tables import column_higher_is_better, comparison_values
from calib.store.predictions import SplitPredictions, read_predictions

__all__ = ["MIN_SEEDS", "RESAMPLES", "SEED", "bootstrap_markers", "paired_bootstrap"]

MIN_SEEDS = 3
"""Setups with fewer seeds than this get the bootstrap's markers instead of the t-test's."""
RESAMPLES = 1000
SEED = 0

_BINNED: dict[str, Callable[[np.ndarray, np.ndarray, int], float]] = {
    "ece": _ece_compute, "aece": _aece_compute, "mce": _mce_compute, "oece": _oece_compute, "uece": _uece_compute}
_COLUMN = re.compile(r"test_(?P<metric>[a-z0-9_]+?)(?:_bins(?P<bins>\d+))?")


def _scorer(column: str, num_bins: int) -> Callable[[dict[str, np.ndarray], np.ndarray], float] | None:
    """How to score ``column`` on resampled indices, from a trial's per-sample arrays; None: not resampled."""
    match = _COLUMN.fullmatch(column)
    if match is None:
        return None
    metric, bins = match["metric"], int(match["bins"] or num_bins)
    if metric in _BINNED:
        return lambda s, idx: _BINNED[metric](s["confidence"][idx], s["correct"][idx], bins)
    if metric in ("accuracy", "nll", "brier"):
        return lambda s, idx: float(s[metric][idx].mean())
    return None


def _per_sample(kept: SplitPredictions) -> dict[str, np.ndarray]:
    confidence, correct = top_label(kept.probs, kept.labels)
    rows = np.arange(kept.labels.size)
    diff = kept.probs.copy()
    diff[rows, kept.labels] -= 1.0
    return {"confidence": confidence, "correct": correct, "accuracy": correct,
            "nll": -np.log(np.maximum(kept.probs[rows, kept.labels], NLL_FLOOR)), "brier": np.sum(diff * diff, axis=1)}


def paired_bootstrap(samples: Mapping[str, list[dict[str, np.ndarray]]], control: str, column: str, *,
                     num_bins: int = 15, resamples: int = RESAMPLES, seed: int = SEED, alpha: float = 0.05
                     ) -> pd.DataFrame | None:
    """Each row (label -> its trials' per-sample arrays, one test set) against ``control`` on ``column``: the
    difference on the full test set, the bootstrap p, Holm's p and the verdict; None if ``column`` is not resampled."""
    score = _scorer(column, num_bins)
    if score is None:
        return None
    n = samples[control][0]["correct"].size
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    full = np.arange(n)

    def values(label: str, idx: np.ndarray) -> float:
        return float(np.mean([score(s, idx) for s in samples[label]]))

    reference = np.array([values(control, idx) for idx in draws])
    rows = []
    for label in (lab for lab in samples if lab != control):
        d = np.array([values(label, idx) for idx in draws]) - reference
        observed = values(label, full) - values(control, full)
        p = min(1.0, 2 * min(1 + np.sum(d <= 0), 1 + np.sum(d >= 0)) / (resamples + 1))
        rows.append({"label": label, "difference": observed, "p": p})
    table = pd.DataFrame(rows, columns=["label", "difference", "p"]).set_index("label")
    rejected, adjusted = holm(table["p"].to_numpy(), alpha) if len(table) else (np.zeros(0, bool), np.zeros(0))
    table["p_holm"] = adjusted
    signed = comparison_values(column, table["difference"].to_numpy())  # distance to 0 where that is what counts
    better = signed > 0 if column_higher_is_better(column) else signed < 0
    table["verdict"] = np.where(rejected, np.where(better, "better", "worse"), "")
    return table


def bootstrap_markers(store: str, study: str, group: pd.DataFrame, metrics: Mapping[str, str], control: str, *,
                      alpha: float) -> tuple[dict[tuple[str, str], str], list[str]] | None:
    """The markers and legend of one setup's table from the paired bootstrap, or None where it does not apply:
    :data:`MIN_SEEDS` seeds or more, a trial without kept test predictions, or test sets that differ."""
    if group["seed"].nunique() >= MIN_SEEDS:
        return None
    kept = read_predictions(store, study, group["trial_id"].tolist(), splits=("test",))
    if any(t not in kept or "test" not in kept[t] for t in group["trial_id"]):
        return None
    tests = {t: kept[t]["test"] for t in group["trial_id"]}
    first = next(iter(tests.values())).labels
    if any(k.labels.shape != first.shape or not np.array_equal(k.labels, first) for k in tests.values()):
        return None
    samples: dict[str, list[dict[str, np.ndarray]]] = {}
    for label, trial in zip(group["label"].astype(str), group["trial_id"], strict=True):
        samples.setdefault(label, []).append(_per_sample(tests[trial]))
    num_bins = int(group["num_bins"].iloc[0])
    verdicts, unmarked = {}, []
    for column, header in metrics.items():
        table = paired_bootstrap(samples, control, column, num_bins=num_bins, alpha=alpha)
        if table is None:
            unmarked.append(header)
            continue
        verdicts.update({(label, column): v for label, v in table["verdict"].items() if v})
    legend = [f"{MARKS['better']} / {MARKS['worse']}: significantly better / worse than {control} by a paired "
              f"bootstrap over the {first.size} test samples ({RESAMPLES} resamples, seed {SEED}, the same for every "
              f"row; Holm over the rows of each column, α = {alpha:g}); fewer than {MIN_SEEDS} seeds, so the "
              "seeds' own variation is not in the test."]
    if unmarked:
        legend.append(f"Not tested by the bootstrap: {', '.join(unmarked)}.")
    return verdicts, legend
