"""The metric table (name -> MetricSpec) and ``compute_all``, which evaluates every metric at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from calib._config import did_you_mean
from calib._registry import UnknownNameError
from calib.metrics._binning import top_label
from calib.metrics._validation import ArrayLike, check_num_bins, check_probs_labels
from calib.metrics.accuracy import _accuracy_compute, accuracy
from calib.metrics.adaptive_ece import _aece_compute, adaptive_calibration_error
from calib.metrics.aurc import (
    _augrc_compute,
    _aurc_compute,
    area_under_generalized_risk_coverage,
    area_under_risk_coverage,
)
from calib.metrics.brier import _brier_compute, brier_score
from calib.metrics.calibration_refinement import (
    CROSS_FIT_FOLDS,
    CROSS_FIT_SEED,
    DEFAULT_RECALIBRATOR,
    _split_compute,
    brier_calibration_error,
    brier_refinement_error,
    nll_calibration_error,
    nll_refinement_error,
)
from calib.metrics.classwise_ece import _cwece_compute, classwise_ece
from calib.metrics.debiased_ece import _l2ce_debiased_compute, debiased_l2_calibration_error
from calib.metrics.decomposed_ece import _oece_compute, _uece_compute, overconfidence_ece, underconfidence_ece
from calib.metrics.ece import _ece_compute, expected_calibration_error
from calib.metrics.ece_sweep import _ece_sweep_compute, ece_sweep
from calib.metrics.ks_ce import _ks_compute, ks_calibration_error
from calib.metrics.mce import _mce_compute, maximum_calibration_error
from calib.metrics.nll import NLL_MAX, _nll_compute, negative_log_likelihood
from calib.metrics.smooth_ece import _smece_compute, smooth_ece

__all__ = ["METRICS", "MetricSpec", "compute_all", "higher_is_better"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its function, its direction, a one-line description and its range.

    Attributes:
        fn: the public metric function, ``fn(probs, labels)`` or, when ``binned``,
            ``fn(probs, labels, num_bins=...)``.
        higher_is_better: True for accuracy, False for the errors; ``calib.search`` reads it to
            choose ``mode="max"`` or ``"min"``.
        description: one line for tables and ``--help``.
        binned: whether ``fn`` takes ``num_bins``.
        bounds: (lowest, highest) value the metric can take.
        zero_is_best: an error that is 0 at best but whose estimate can fall below 0 (a calibration error
            measured against a cross-fitted recalibrator that did worse): compared by its distance to 0.
    """

    fn: Callable[..., float]
    higher_is_better: bool
    description: str
    binned: bool = False
    bounds: tuple[float, float] = (0.0, 1.0)
    zero_is_best: bool = False

    def __call__(self, probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15) -> float:
        """Evaluate the metric; ``num_bins`` is checked always and used only when ``binned``."""
        num_bins = check_num_bins(num_bins)
        if self.binned:
            return self.fn(probs, labels, num_bins=num_bins)
        return self.fn(probs, labels)


METRICS: dict[str, MetricSpec] = {
    "accuracy": MetricSpec(accuracy, True, "Top-1 accuracy (fraction)."),
    "ece": MetricSpec(
        expected_calibration_error,
        False,
        "Expected calibration error, equal-width bins (lower, upper] (Guo et al. 2017).",
        binned=True,
    ),
    "aece": MetricSpec(
        adaptive_calibration_error,
        False,
        "Adaptive ECE, FOCAL-R equal-mass bins (Nguyen & O'Connor 2015; Mukhoti et al. 2020).",
        binned=True,
    ),
    "mce": MetricSpec(
        maximum_calibration_error,
        False,
        "Maximum calibration error over equal-width bins, empty bins 0 (Naeini et al. 2015).",
        binned=True,
    ),
    "oece": MetricSpec(
        overconfidence_ece, False, "Over-confidence part of the ECE (conf > acc bins).", binned=True
    ),
    "uece": MetricSpec(
        underconfidence_ece, False, "Under-confidence part of the ECE (acc > conf bins).", binned=True
    ),
    "cwece": MetricSpec(
        classwise_ece,
        False,
        "Classwise ECE, FOCAL-R ClasswiseECELoss, C = probs.shape[1] (Kull et al. 2019).",
        binned=True,
    ),
    "nll": MetricSpec(
        negative_log_likelihood,
        False,
        "Mean negative log-likelihood in nats, exact; p_y = 0 counts as the smallest float64 (744.44).",
        bounds=(0.0, NLL_MAX),
    ),
    "brier": MetricSpec(
        brier_score,
        False,
        "Brier score, sum over classes, mean over samples (Brier 1950); C times sklearn's MSE.",
        bounds=(0.0, 2.0),
    ),
    "aurc": MetricSpec(
        area_under_risk_coverage,
        False,
        "Area under the risk-coverage curve of the max-softmax confidence, 0/1 loss (Geifman & El-Yaniv 2017).",
    ),
    "augrc": MetricSpec(
        area_under_generalized_risk_coverage,
        False,
        "Area under the generalized risk-coverage curve, 0/1 loss (Traub et al. 2024).",
    ),
    "smece": MetricSpec(
        smooth_ece,
        False,
        "SmoothECE, reflected Gaussian kernel, bandwidth at its fixed point, via relplot (Blasiok & Nakkiran 2024).",
    ),
    "ece_sweep": MetricSpec(
        ece_sweep,
        False,
        "ECE-sweep: equal-mass ECE at the most bins with monotone accuracy (Roelofs et al. 2022).",
    ),
    "l2ce_debiased": MetricSpec(
        debiased_l2_calibration_error,
        False,
        "Debiased top-label L2 calibration error, equal-mass bins (Kumar et al. 2019).",
        binned=True,
    ),
    "ks_ce": MetricSpec(
        ks_calibration_error,
        False,
        "KS calibration error: max gap of cumulative top-label confidence and accuracy (Gupta et al. 2021).",
    ),
    "nll_calibration": MetricSpec(
        nll_calibration_error,
        False,
        "NLL calibration error NLL(f) − NLL(g∘f) in nats, g temperature scaling cross-fitted in 5 folds "
        "(Berta et al. 2025).",
        bounds=(-NLL_MAX, NLL_MAX),
        zero_is_best=True,
    ),
    "nll_refinement": MetricSpec(
        nll_refinement_error,
        False,
        "NLL refinement error NLL(g∘f) in nats, g temperature scaling cross-fitted in 5 folds (Berta et al. 2025).",
        bounds=(0.0, NLL_MAX),
    ),
    "brier_calibration": MetricSpec(
        brier_calibration_error,
        False,
        "Brier calibration error Brier(f) − Brier(g∘f), g temperature scaling cross-fitted in 5 folds.",
        bounds=(-2.0, 2.0),
        zero_is_best=True,
    ),
    "brier_refinement": MetricSpec(
        brier_refinement_error,
        False,
        "Brier refinement error Brier(g∘f), g temperature scaling cross-fitted in 5 folds (Berta et al. 2025).",
        bounds=(0.0, 2.0),
    ),
}
"""Every metric by its stable name (the Parquet column name); values are fractions, not percent."""


def higher_is_better(name: str) -> bool:
    """Whether a larger value of metric ``name`` is better; an unknown name is a ``KeyError``.

    >>> higher_is_better("accuracy"), higher_is_better("ece")
    (True, False)
    """
    if name not in METRICS:
        hint = did_you_mean(str(name), METRICS, n=3)
        raise UnknownNameError(f"Unknown metric {name!r}.{hint} Valid metric names: {', '.join(METRICS)}.")
    return METRICS[name].higher_is_better


def compute_all(probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15,
                recalibrator: str = DEFAULT_RECALIBRATOR) -> dict[str, float]:
    """Every metric in :data:`METRICS`, validating the inputs once; values as in each function.

    Calibration errors, accuracy, AURC and AUGRC are fractions in [0, 1], NLL is in nats and Brier
    in [0, 2]; the calibration / refinement split of NLL and Brier comes from one cross-fit of
    ``recalibrator`` (:func:`~calib.metrics.calibration_refinement`, 5 folds, seed 0).

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).
        num_bins: number of bins for the binned metrics, >= 1.
        recalibrator: the registered post-hoc calibrator g of the calibration / refinement split
            (temperature scaling).

    Returns:
        ``{name: value}`` in the order of :data:`METRICS`.

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> result = compute_all(probs, [0, 1, 0, 1], num_bins=4)
    >>> result["accuracy"], result["ece"], result["oece"], result["uece"]
    (0.5, 0.28125, 0.25, 0.03125)
    """
    num_bins = check_num_bins(num_bins)
    p, y = check_probs_labels(probs, labels)
    confidences, correct = top_label(p, y)
    return {
        "accuracy": _accuracy_compute(p, y),
        "ece": _ece_compute(confidences, correct, num_bins),
        "aece": _aece_compute(confidences, correct, num_bins),
        "mce": _mce_compute(confidences, correct, num_bins),
        "oece": _oece_compute(confidences, correct, num_bins),
        "uece": _uece_compute(confidences, correct, num_bins),
        "cwece": _cwece_compute(p, y, num_bins),
        "nll": _nll_compute(p, y),
        "brier": _brier_compute(p, y),
        "aurc": _aurc_compute(confidences, correct),
        "augrc": _augrc_compute(confidences, correct),
        "smece": _smece_compute(confidences, correct),
        "ece_sweep": _ece_sweep_compute(confidences, correct),
        "l2ce_debiased": _l2ce_debiased_compute(confidences, correct, num_bins),
        "ks_ce": _ks_compute(confidences, correct),
        **_split_compute(p, y, recalibrator, CROSS_FIT_FOLDS, CROSS_FIT_SEED),
    }
