"""The calibration / refinement split of NLL and Brier (Berta et al. 2025): hand-computed cases, the cross-fit
restated with calib's calibrators on scikit-learn's folds, the recalibrator option and the failure paths. The check
against probmetrics is in test_metric_references.py."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from metric_cases import overconfident_probs
from sklearn.model_selection import KFold, StratifiedKFold

from calib.metrics import brier_score, calibration_refinement, negative_log_likelihood
from calib.metrics.calibration_refinement import (
    brier_calibration_error,
    brier_refinement_error,
    nll_calibration_error,
    nll_refinement_error,
)
from calib.posthoc import DegenerateFitWarning
from calib.posthoc.histogram_binning import HistogramBinningEqualMass
from calib.posthoc.temperature_scaling import TemperatureScaling


def restated(probs, labels, make, splits):
    """Out-of-fold g∘f: ``make()`` fitted on log p of each split's fit part, applied to its held-out part."""
    logits = torch.from_numpy(np.log(probs))
    out = np.empty_like(probs)
    for fit, held_out in splits:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateFitWarning)
            g = make().fit(logits[fit], torch.from_numpy(labels[fit]))
        out[held_out] = g.probs(logits[held_out]).numpy()
    return out


def test_uniform_predictions_have_no_calibration_error():
    # softmax(log p / T) of a uniform row is uniform for every T (temperature scaling holds T = 1 there), so g∘f = f:
    # calibration 0, refinement = the loss: NLL log 2, Brier 2 · 0.5² = 0.5.
    probs, labels = np.full((10, 2), 0.5), np.array([0, 1] * 5)
    split = calibration_refinement(probs, labels)
    assert split == pytest.approx({"nll_calibration": 0.0, "nll_refinement": math.log(2), "brier_calibration": 0.0,
                                   "brier_refinement": 0.5}, abs=1e-15)


def test_cross_fit_is_stratified_kfold_with_temperature_scaling():
    probs, labels = overconfident_probs(1000, 10, 3)
    splits = StratifiedKFold(5, shuffle=True, random_state=0).split(np.zeros(1000), labels)
    splits = list(splits)
    # the metric fits temperature scaling by its bounded search (no torch optimizer): the NLL optimum of the LBFGS fit
    recalibrated = restated(probs, labels, lambda: TemperatureScaling(optimizer="brent"), splits)
    split = calibration_refinement(probs, labels)
    by_lbfgs = negative_log_likelihood(restated(probs, labels, TemperatureScaling, splits), labels)
    assert split["nll_refinement"] == pytest.approx(by_lbfgs, abs=1e-8)
    nll, brier = negative_log_likelihood(recalibrated, labels), brier_score(recalibrated, labels)
    assert split["nll_refinement"] == pytest.approx(nll, abs=1e-12)
    assert split["nll_calibration"] == pytest.approx(negative_log_likelihood(probs, labels) - nll, abs=1e-12)
    assert split["brier_refinement"] == pytest.approx(brier, abs=1e-12)
    assert split["brier_calibration"] == pytest.approx(brier_score(probs, labels) - brier, abs=1e-12)
    assert split["nll_calibration"] > 0.1  # over-confident predictions: temperature scaling recovers a lot
    assert nll_calibration_error(probs, labels) == split["nll_calibration"]
    assert nll_refinement_error(probs, labels) == split["nll_refinement"]
    assert brier_calibration_error(probs, labels) == split["brier_calibration"]
    assert brier_refinement_error(probs, labels) == split["brier_refinement"]


def test_another_recalibrator_folds_and_seed():
    probs, labels = overconfident_probs(600, 4, 5)
    splits = StratifiedKFold(3, shuffle=True, random_state=7).split(np.zeros(600), labels)
    recalibrated = restated(probs, labels, lambda: HistogramBinningEqualMass(num_bins=15), splits)
    split = calibration_refinement(probs, labels, recalibrator="histogram_binning", folds=3, seed=7)
    assert split["nll_refinement"] == pytest.approx(negative_log_likelihood(recalibrated, labels), abs=1e-12)
    assert split != calibration_refinement(probs, labels, recalibrator="histogram_binning", folds=3, seed=8)


def test_unstratifiable_labels_use_plain_folds():
    # 6 samples, 3 classes of 3, 2 and 1: no class has 5 samples, so scikit-learn cannot stratify; shuffled KFold.
    probs = np.array([[0.9, 0.05, 0.05], [0.7, 0.15, 0.15], [0.1, 0.65, 0.25], [0.3, 0.25, 0.45],
                      [0.1, 0.05, 0.85], [0.5, 0.35, 0.15]])
    labels = np.array([0, 1, 1, 0, 2, 0])
    recalibrated = restated(probs, labels, lambda: TemperatureScaling(optimizer="brent"),
                            KFold(5, shuffle=True, random_state=0).split(probs))
    split = calibration_refinement(probs, labels)
    assert split["nll_refinement"] == pytest.approx(negative_log_likelihood(recalibrated, labels), abs=1e-12)


def test_fewer_samples_than_folds_is_nan():
    split = calibration_refinement([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5], [0.2, 0.8]], [0, 1, 1, 0])
    assert all(math.isnan(v) for v in split.values())
    assert not math.isnan(calibration_refinement([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5], [0.2, 0.8]], [0, 1, 1, 0],
                                                 folds=2)["nll_refinement"])


def test_errors():
    probs, labels = np.full((10, 2), 0.5), np.array([0, 1] * 5)
    with pytest.raises(KeyError, match=r"Unknown post-hoc calibrator 'isotonik'\. Did you mean 'isotonic'"):
        calibration_refinement(probs, labels, recalibrator="isotonik")
    with pytest.raises(ValueError, match=r"^`folds` must be an integer >= 2, got folds=1\.$"):
        calibration_refinement(probs, labels, folds=1)
    with pytest.raises(ValueError, match=r"^`folds` must be an integer >= 2, got folds=True\.$"):
        calibration_refinement(probs, labels, folds=True)
    with pytest.raises(ValueError, match=r"^`seed` must be an integer >= 0, got seed=-1\.$"):
        calibration_refinement(probs, labels, seed=-1)
    with pytest.raises(ValueError, match=r"`probs` rows must sum to 1"):
        calibration_refinement([[0.6, 0.6]] * 5, [0] * 5)
