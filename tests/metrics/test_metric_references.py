"""Each of calib's metrics against its reference on the over-confident test predictions of tests/reference_cases.py
at K = 2, 10 and 100 classes (docs/how-to/reference-checks.md has the table).

A reference is a PyPI package where one computes calib's definition (netcal 1.4, Kumar et al.'s
uncertainty-calibration 0.1.4, relplot 1.0.3, scikit-learn, probmetrics 1.3.0), else the definition restated as a
loop in metric_references.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from metric_references import (
    reference_aece,
    reference_areas,
    reference_cwece,
    reference_ece_sweep,
    reference_over_under_ece,
)
from reference_cases import CLASS_COUNTS
from scipy.special import softmax
from sklearn.metrics import accuracy_score, brier_score_loss, log_loss

from calib.datasets.synthetic_logits import overconfident_logits
from calib.metrics import (
    accuracy,
    adaptive_calibration_error,
    area_under_generalized_risk_coverage,
    area_under_risk_coverage,
    brier_score,
    calibration_refinement,
    classwise_ece,
    debiased_l2_calibration_error,
    ece_sweep,
    expected_calibration_error,
    ks_calibration_error,
    maximum_calibration_error,
    negative_log_likelihood,
    overconfidence_ece,
    smooth_ece,
    underconfidence_ece,
)

TEST_SIZE = 10_000
"""The issue's test-set size."""

TOLERANCE = 1e-12
"""|metric − reference|, absolute (the issue's trial: about 1e-9; measured here: at most 4e-15)."""

KS_TOLERANCE = 1e-7
"""|KS − probmetrics'|: probmetrics casts to float32 before its cumulative sums (measured: at most 9e-9)."""

SPLIT_TOLERANCE = 1e-8
"""|calibration or refinement error − probmetrics'|: the two temperature fits stop at different points (calib's LBFGS
at |dNLL/d log T| < 1e-6, probmetrics' 30 bisection steps on log(1/T) ∈ [−16, 16]), and probmetrics clips log p at
log(float32 tiny) (measured: at most 1.1e-10, K = 100)."""


@pytest.fixture(scope="module", params=CLASS_COUNTS, ids=lambda k: f"K{k}")
def predictions(request):
    """softmax(z) of one draw of over-confident logits per K (seed 1000 + K) and the labels."""
    logits, labels = overconfident_logits(TEST_SIZE, request.param, seed=1000 + request.param)
    return softmax(logits, axis=1), labels


def top_label(probs, labels):
    """(confidence, correctness) of the top-label prediction."""
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)


def test_accuracy_against_sklearn(predictions):
    probs, labels = predictions
    assert accuracy(probs, labels) == pytest.approx(accuracy_score(labels, probs.argmax(axis=1)), abs=TOLERANCE)


@pytest.mark.parametrize("metric", ["ECE", "MCE"])
def test_binned_ece_against_netcal(predictions, metric):
    # netcal 1.4 ECE / MCE with 15 equal-width bins on the top-label confidence (it clips confidences to
    # [eps, 1 − eps]). Given K = 2 columns it measures class 1's calibration instead, so it gets the top-label
    # (confidence, correctness) pairs directly, its binary form.
    import netcal.metrics

    probs, labels = predictions
    reference_metric = getattr(netcal.metrics, metric)(bins=15)
    reference = reference_metric.measure(*top_label(probs, labels)) if probs.shape[1] == 2 else \
        reference_metric.measure(probs, labels)
    function = expected_calibration_error if metric == "ECE" else maximum_calibration_error
    assert function(probs, labels, num_bins=15) == pytest.approx(reference, abs=TOLERANCE)


def test_adaptive_ece_against_focal_loop(predictions):
    # FOCAL-R AdaptiveECELoss (Mukhoti et al. 2020), restated as a loop over its interpolated equal-mass bins.
    probs, labels = predictions
    assert adaptive_calibration_error(probs, labels, num_bins=15) == pytest.approx(
        reference_aece(probs, labels, 15), abs=TOLERANCE)


def test_classwise_ece_against_focal_loop(predictions):
    # FOCAL-R ClasswiseECELoss (Kull et al. 2019's classwise-ECE), restated as a loop over classes and bins.
    probs, labels = predictions
    assert classwise_ece(probs, labels, num_bins=15) == pytest.approx(reference_cwece(probs, labels, 15), abs=TOLERANCE)


def test_over_and_under_confidence_ece_against_the_definition(predictions):
    # FeDLaS Table 4's O-ECE and U-ECE (docs/methods.md §6.4), restated as a loop over the ECE's bins.
    probs, labels = predictions
    over, under = reference_over_under_ece(probs, labels, 15)
    assert overconfidence_ece(probs, labels, num_bins=15) == pytest.approx(over, abs=TOLERANCE)
    assert underconfidence_ece(probs, labels, num_bins=15) == pytest.approx(under, abs=TOLERANCE)


def test_smooth_ece_against_relplot(predictions):
    # Błasiok & Nakkiran 2024, their package relplot 1.0.3: smECE of the top-label confidences and correctness.
    import relplot

    probs, labels = predictions
    assert smooth_ece(probs, labels) == pytest.approx(float(relplot.smECE(*top_label(probs, labels))), abs=TOLERANCE)


def test_ece_sweep_against_the_algorithm(predictions):
    # Roelofs et al. 2022 §4: the equal-mass ECE at the largest B before the first B whose bin accuracies are not
    # monotone, restated in the loop style of their caltrain code with a stable sort (theirs is not stable).
    probs, labels = predictions
    assert ece_sweep(probs, labels) == pytest.approx(reference_ece_sweep(probs, labels)[0], abs=TOLERANCE)


def test_debiased_l2_against_kumar(predictions):
    # Kumar et al. 2019, their package uncertainty-calibration 0.1.4: the debiased top-label L2 error, 15 bins.
    import calibration

    probs, labels = predictions
    expected = calibration.lower_bound_scaling_top_ce(probs, labels, p=2, debias=True, num_bins=15)
    assert debiased_l2_calibration_error(probs, labels, num_bins=15) == pytest.approx(expected, abs=TOLERANCE)


def test_nll_against_sklearn(predictions):
    # scikit-learn's log_loss clips probabilities to [eps, 1 − eps]; none of the true-class ones is below eps here.
    probs, labels = predictions
    assert probs[np.arange(len(labels)), labels].min() > np.finfo(np.float64).eps
    expected = log_loss(labels, probs, labels=np.arange(probs.shape[1]))
    assert negative_log_likelihood(probs, labels) == pytest.approx(expected, abs=TOLERANCE)


def test_brier_against_sklearn(predictions):
    # Brier 1950: Σ_k (p_k − 1[y = k])², averaged over samples (scikit-learn's multiclass brier_score_loss).
    probs, labels = predictions
    expected = brier_score_loss(labels, probs, labels=np.arange(probs.shape[1]), scale_by_half=False)
    assert brier_score(probs, labels) == pytest.approx(expected, abs=TOLERANCE)


def test_risk_coverage_areas_against_the_definition(predictions):
    # Geifman & El-Yaniv 2017 (AURC) and Traub et al. 2024 (AUGRC): the mean selective / generalized risk over the
    # coverages k/N, restated by thresholding at each confidence.
    probs, labels = predictions
    risk, generalized = reference_areas(probs, labels)
    assert area_under_risk_coverage(probs, labels) == pytest.approx(risk, abs=TOLERANCE)
    assert area_under_generalized_risk_coverage(probs, labels) == pytest.approx(generalized, abs=TOLERANCE)


def test_ks_against_probmetrics(predictions):
    # probmetrics 1.3.0 KolmogorovSmirnovCalibrationMetric in its binary form on (confidence, correct): the max over the
    # sorted confidences of |cumulative (confidence − correctness)| / N (Gupta et al. 2021). It takes the sum after
    # every sample, calib after every distinct confidence: the same where no confidences tie. Here the only ties are
    # saturated confidences above 1 − 1e-12 (K = 2), at the end of the order, where the maximum is not.
    import torch
    from probmetrics.distributions import CategoricalDirac, CategoricalProbs
    from probmetrics.metrics import KolmogorovSmirnovCalibrationMetric

    probs, labels = predictions
    confidence, correct = top_label(probs, labels)
    unsaturated = confidence[confidence < 1 - 1e-12]
    assert len(np.unique(unsaturated)) == len(unsaturated)
    reference = KolmogorovSmirnovCalibrationMetric().compute_all(
        CategoricalDirac(torch.from_numpy(correct.astype(np.int64)), n_classes=2),
        CategoricalProbs(torch.from_numpy(np.stack([1 - confidence, confidence], axis=1))))["kolmogorov-smirnov"]
    assert ks_calibration_error(probs, labels) == pytest.approx(float(reference), abs=KS_TOLERANCE)


def test_calibration_refinement_against_probmetrics(predictions):
    # probmetrics 1.3.0 MetricsWithCalibration(LogLoss, BrierLoss) with its temperature scaling ("temp-scaling", no
    # mixture), CVSplitter(5) and random_state 0: StratifiedKFold(5, shuffle=True, random_state=0), calib's folds.
    import torch
    from probmetrics.calibrators import get_calibrator
    from probmetrics.distributions import CategoricalDirac, CategoricalProbs
    from probmetrics.metrics import BrierLoss, CombinedMetrics, LogLoss, MetricsWithCalibration
    from probmetrics.splitters import CVSplitter

    probs, labels = predictions
    metric = MetricsWithCalibration(CombinedMetrics([LogLoss(), BrierLoss()]), get_calibrator("temp-scaling"),
                                    val_splitter=CVSplitter(n_cv=5), cal_name="ts", random_state=0)
    reference = metric.compute_all(CategoricalDirac(torch.from_numpy(labels), n_classes=probs.shape[1]),
                                   CategoricalProbs(torch.from_numpy(probs)))
    split = calibration_refinement(probs, labels)
    for ours, theirs in (("nll_calibration", "calib-err_logloss"), ("nll_refinement", "refinement_logloss"),
                         ("brier_calibration", "calib-err_brier"), ("brier_refinement", "refinement_brier")):
        assert split[ours] == pytest.approx(float(reference[f"{theirs}_ts_cv-5"]), abs=SPLIT_TOLERANCE), ours
