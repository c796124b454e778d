"""Calibration and OOD metrics on explicit probabilities, returned as fractions (not percent).

Every calibration metric takes ``probs`` (N, C) that sum to 1 and integer ``labels`` (N,); convert
logits with :func:`softmax64` first (float64, docs/methods.md §6.1). Binned metrics take
``num_bins=15`` and follow the FOCAL-R conventions (bins ``(lower, upper]``), except the debiased
L2 error, which bins as Kumar et al.'s package does; SmoothECE (a kernel) and ECE-sweep (which
chooses its own number of bins) take none. :data:`METRICS` lists each metric with its direction;
:func:`compute_all` evaluates them all. AURC and AUGRC rank the samples by confidence (selective
prediction); :func:`clopper_pearson` gives exact binomial intervals, e.g. for the accuracy of each
reliability-diagram bin. The KS calibration error has no bins; :func:`calibration_refinement` splits the NLL and the
Brier score into calibration and refinement errors with a recalibrator cross-fitted on the evaluated set.
"""

from calib.metrics._compute import METRICS, MetricSpec, compute_all, higher_is_better
from calib.metrics.accuracy import accuracy
from calib.metrics.adaptive_ece import adaptive_calibration_error
from calib.metrics.aurc import area_under_generalized_risk_coverage, area_under_risk_coverage
from calib.metrics.brier import brier_score
from calib.metrics.calibration_refinement import (
    brier_calibration_error,
    brier_refinement_error,
    calibration_refinement,
    nll_calibration_error,
    nll_refinement_error,
)
from calib.metrics.classwise_ece import classwise_ece
from calib.metrics.debiased_ece import debiased_l2_calibration_error
from calib.metrics.decomposed_ece import overconfidence_ece, underconfidence_ece
from calib.metrics.ece import expected_calibration_error
from calib.metrics.ece_sweep import ece_sweep
from calib.metrics.ks_ce import ks_calibration_error
from calib.metrics.mce import maximum_calibration_error
from calib.metrics.nll import negative_log_likelihood
from calib.metrics.ood import ood_auroc, ood_fpr_at_95_tpr
from calib.metrics.reliability import clopper_pearson, reliability_bins
from calib.metrics.smooth_ece import smooth_ece
from calib.metrics.softmax import softmax64

__all__ = [
    "METRICS",
    "MetricSpec",
    "accuracy",
    "adaptive_calibration_error",
    "area_under_generalized_risk_coverage",
    "area_under_risk_coverage",
    "brier_calibration_error",
    "brier_refinement_error",
    "brier_score",
    "calibration_refinement",
    "classwise_ece",
    "clopper_pearson",
    "compute_all",
    "debiased_l2_calibration_error",
    "ece_sweep",
    "expected_calibration_error",
    "higher_is_better",
    "ks_calibration_error",
    "maximum_calibration_error",
    "negative_log_likelihood",
    "nll_calibration_error",
    "nll_refinement_error",
    "ood_auroc",
    "ood_fpr_at_95_tpr",
    "overconfidence_ece",
    "reliability_bins",
    "smooth_ece",
    "softmax64",
    "underconfidence_ece",
]
