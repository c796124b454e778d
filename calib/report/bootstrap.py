"""A two-level paired bootstrap over seeds and test samples: the test of a setup with fewer than 3 seeds.

With fewer than 3 seeds the paired test over seeds (:mod:`calib.report.significance`) cannot speak (the ``paper``
preset runs one seed; a quick search confirms on two). Where every trial of the setup kept its test predictions
(:mod:`calib.store.predictions`) on one test set, :mod:`calib.report.policy` resamples both levels of variation
instead. Each of B = :data:`RESAMPLES` draws (``numpy.random.default_rng(SEED)``) picks S of the control's S seeds
with replacement and N of the N test samples with replacement, the same picks for every row of the setup. On a draw,
a row's value is the mean over the picked seeds of that seed's value on the picked samples (a seed's value: the mean
over its trials, its Stage-II seeds and calibration draws), and d_b = row − control. From the same draws:

- each row's 95% interval: the 2.5 and 97.5 percentiles of its values;
- the paired difference from the control and its interval: the percentiles of d_b;
- the two-sided p-value p = min(1, 2 · min(1 + #{d_b ≤ 0}, 1 + #{d_b ≥ 0}) / (B + 1)).

With one seed the seed level has nothing to resample and only the test samples' variation is in the test, which the
table's legend says. The metrics it resamples are those computed per sample or per bin of top-label confidences:
accuracy, ECE, AECE, MCE, O-ECE, U-ECE (any bins: ``test_ece_bins10``), NLL and Brier; other columns keep their
Student-t interval over seeds and are not tested.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from calib.metrics._binning import top_label
from calib.metrics.adaptive_ece import _aece_compute
from calib.metrics.decomposed_ece import _oece_compute, _uece_compute
from calib.metrics.ece import _ece_compute
from calib.metrics.mce import _mce_compute
from calib.metrics.nll import NLL_FLOOR
from calib.store.predictions import SplitPredictions, read_predictions

__all__ = ["RESAMPLES", "SEED", "SeedSamples", "per_sample", "resampled", "setup_samples", "two_level_bootstrap"]

RESAMPLES = 1000
SEED = 0

SeedSamples = Mapping[str, Mapping[int, Sequence[dict[str, np.ndarray]]]]
"""label -> seed -> the per-sample arrays (:func:`per_sample`) of that seed's trials."""

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


def resampled(column: str) -> bool:
    """Whether the bootstrap can score ``column`` (``test_ece``: yes; ``test_smece``, ``ood_auroc``: no)."""
    return _scorer(column, 15) is not None


def per_sample(kept: SplitPredictions) -> dict[str, np.ndarray]:
    """A trial's test predictions as the per-sample arrays the scorers read."""
    confidence, correct = top_label(kept.probs, kept.labels)
    rows = np.arange(kept.labels.size)
    diff = kept.probs.copy()
    diff[rows, kept.labels] -= 1.0
    return {"confidence": confidence, "correct": correct, "accuracy": correct,
            "nll": -np.log(np.maximum(kept.probs[rows, kept.labels], NLL_FLOOR)), "brier": np.sum(diff * diff, axis=1)}


def setup_samples(store: str, study: str, group: pd.DataFrame) -> tuple[dict[str, dict[int, list]], int] | None:
    """The per-sample arrays of one setup's trials (label -> seed -> one dict per trial) and the test set's size,
    or None when a trial kept no test predictions or the trials' test sets differ."""
    kept = read_predictions(store, study, group["trial_id"].tolist(), splits=("test",))
    if any(t not in kept or "test" not in kept[t] for t in group["trial_id"]):
        return None
    tests = {t: kept[t]["test"] for t in group["trial_id"]}
    first = next(iter(tests.values())).labels
    if any(k.labels.shape != first.shape or not np.array_equal(k.labels, first) for k in tests.values()):
        return None
    samples: dict[str, dict[int, list]] = {}
    for label, seed, trial in zip(group["label"].astype(str), group["seed"], group["trial_id"], strict=True):
        samples.setdefault(label, {}).setdefault(int(seed), []).append(per_sample(tests[trial]))
    return samples, int(first.size)


def two_level_bootstrap(samples: SeedSamples, control: str, column: str, *, num_bins: int = 15,
                        resamples: int = RESAMPLES, seed: int = SEED) -> pd.DataFrame | None:
    """Every label of ``samples`` on ``column`` from the same draws of seeds and test samples: ``mean`` (on the full
    test set, mean over seeds), ``low`` / ``high`` (its 95% percentile interval), and against ``control``:
    ``difference``, ``difference_low`` / ``difference_high`` and the two-sided ``p`` (NaN for the control, and
    for a label that lacks one of the control's seeds: ``reason`` says so). None if ``column`` is not resampled."""
    score = _scorer(column, num_bins)
    if score is None:
        return None
    seeds = sorted(samples[control])
    n = next(iter(samples[control].values()))[0]["correct"].size
    rng = np.random.default_rng(seed)
    seed_draws = rng.integers(0, len(seeds), size=(resamples, len(seeds)))
    sample_draws = rng.integers(0, n, size=(resamples, n))
    full = np.arange(n)

    def seed_value(trials: Sequence[dict[str, np.ndarray]], idx: np.ndarray) -> float:
        return float(np.mean([score(s, idx) for s in trials]))

    def draws_of(label: str) -> tuple[float, np.ndarray]:
        """The label's value on the full test set and on each draw (its per-seed values on the draw's samples,
        averaged over the draw's seeds)."""
        by_seed = samples[label]
        full_value = float(np.mean([seed_value(by_seed[s], full) for s in seeds]))
        values = np.array([[seed_value(by_seed[s], idx) for s in seeds] for idx in sample_draws])
        return full_value, np.take_along_axis(values, seed_draws, axis=1).mean(axis=1)

    control_full, control_draws = draws_of(control)
    rows = []
    for label, by_seed in samples.items():
        row = {"label": label, "mean": np.nan, "low": np.nan, "high": np.nan, "difference": np.nan,
               "difference_low": np.nan, "difference_high": np.nan, "p": np.nan, "reason": ""}
        if any(s not in by_seed for s in seeds):
            row["reason"] = f"not on every seed of {control}"
            rows.append(row)
            continue
        value, draws = (control_full, control_draws) if label == control else draws_of(label)
        row.update(mean=value, low=float(np.percentile(draws, 2.5)), high=float(np.percentile(draws, 97.5)))
        if label != control:
            d = draws - control_draws
            row.update(difference=value - control_full, difference_low=float(np.percentile(d, 2.5)),
                       difference_high=float(np.percentile(d, 97.5)),
                       p=min(1.0, 2 * min(1 + np.sum(d <= 0), 1 + np.sum(d >= 0)) / (resamples + 1)))
        rows.append(row)
    return pd.DataFrame(rows).set_index("label")
