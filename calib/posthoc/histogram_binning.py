"""Histogram binning in two readings, docs/methods.md §5.9.

``"histogram_binning_equal_width"`` (the tables' HB: Guo et al., ICML 2017 §4.1, and netcal 1.4's
``HistogramBinning``): B equal-width bins ((j−1)/B, j/B] of a score (B = 15; a score of 0 is in the first bin),
θ_b the fraction of positives of bin b, an empty bin's θ_b its midpoint (j − ½)/B. K = 2: one binary binning of
the class-1 score, p̂ = (1 − θ(p_1), θ(p_1)); K > 2: one binning per class on p_k against 1[y = k], renormalised,
and a class without calibration samples gets q_k = 0 (netcal fits no model for it).

``"histogram_binning_equal_mass"`` (the tables' HB-EM: Zadrozny & Elkan, ICML 2001; ``"histogram_binning"`` before
the rename, a name still accepted and kept in its trials' ids), one-vs-rest with equal-mass bins at every K: for each
class k the calibration scores p_ik = softmax(z_i)_k are sorted and cut into B bins of about N/B samples each (B = 15
by default); a cut never separates equal scores (the tie group goes to the upper bin,
so there can be fewer, unequal bins). Bin b's value is its fraction of positives

    θ_kb = |{i ∈ b : y_i = k}| / |b|,

a new score p_k gets the value of the bin whose interval holds it (cuts halfway between neighbouring
calibration scores, first and last bins open-ended).

Both renormalise a row (K > 2 for equal width):

    q_k = θ_k,b(p_k),   p̂_k = q_k / Σ_j q_j   (a row whose every q_k is 0: uniform).

``forward`` returns log p̂ (clamped to the smallest positive float64, so finite). The argmax can change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calib._config import check_values, checked_field, integer
from calib.metrics import softmax64
from calib.metrics._binning import equal_width_bin_indices, equal_width_edges
from calib.posthoc._base import (
    POSTHOC,
    PROBABILITY_FLOOR,
    PostHocCalibrator,
    absent_classes,
    check_logits,
    check_logits_labels,
    describe_classes,
    log_probabilities,
)
from calib.posthoc._method import PostHocConfig, register_posthoc_method

__all__ = [
    "HistogramBinningEqualMass",
    "HistogramBinningEqualMassConfig",
    "HistogramBinningEqualWidth",
    "HistogramBinningEqualWidthConfig",
    "equal_mass_bin_starts",
    "log_of_normalised",
    "midpoint_cuts",
]


def equal_mass_bin_starts(sorted_scores: np.ndarray, num_bins: int) -> np.ndarray:
    """First index of each equal-mass bin of ascending ``sorted_scores`` (N >= 1); starts[0] = 0.

    The nominal starts ⌊jN/B⌋, j = 1..B−1, each move down to the first index of their tie group, so
    equal scores share a bin; repeated or zero starts are dropped (fewer bins when N < B or with ties).

    >>> equal_mass_bin_starts(np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]), 3).tolist()
    [0, 2, 4]
    >>> equal_mass_bin_starts(np.array([0.1, 0.2, 0.2, 0.2, 0.5, 0.6]), 3).tolist()
    [0, 1, 4]
    """
    n = len(sorted_scores)
    nominal = (np.arange(1, num_bins, dtype=np.int64) * n) // num_bins
    tie_start = np.searchsorted(sorted_scores, sorted_scores[nominal], side="left")
    return np.unique(np.concatenate([[0], tie_start]))


def midpoint_cuts(sorted_scores: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cut points between consecutive bins: halfway between a bin's last and the next bin's first score.

    A score x lies in bin ``searchsorted(cuts, x, side="right")``; where rounding puts the midpoint on
    the lower score, the cut is the upper score, so every calibration score stays in its own bin.
    """
    upper = sorted_scores[starts[1:]]
    lower = sorted_scores[starts[1:] - 1]
    mid = lower + (upper - lower) / 2
    return np.where(mid > lower, mid, upper)


def log_of_normalised(probs: np.ndarray) -> torch.Tensor:
    """log(q / Σ_k q) of non-negative scores q (N, C), rows of zeros uniform, floored at
    :data:`~calib.posthoc.PROBABILITY_FLOOR` (float64, finite)."""
    total = probs.sum(axis=1, keepdims=True)
    normalised = np.where(total > 0, probs / np.where(total > 0, total, 1.0), 1.0 / probs.shape[1])
    return log_probabilities(normalised)


def zero_probability_note(absent: list[int], num_classes: int, method: str) -> str:
    """The degenerate-fit reason of a one-vs-rest calibrator (IR, HB, HB-EM) whose class has no calibration
    samples."""
    return (f"{describe_classes(absent, num_classes)} absent from the calibration set: {method} maps their scores "
            f"to 0, so they get probability 0 (floored at {PROBABILITY_FLOOR:.3g}) for every input")


@dataclass(frozen=True, kw_only=True)
class _HistogramBinningConfig(PostHocConfig):
    """What both readings take: ``num_bins``, an integer >= 1 (15)."""

    num_bins: int = checked_field(15, integer(at_least=1))


@dataclass(frozen=True, kw_only=True)
class HistogramBinningEqualMassConfig(_HistogramBinningConfig):
    """Equal-mass histogram binning (the tables' HB-EM) as a method, fitted on the cached validation logits
    (docs/methods.md §5.9).

    Attributes:
        num_bins: equal-mass bins per class, >= 1 (15).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """


@dataclass(frozen=True, kw_only=True)
class HistogramBinningEqualWidthConfig(_HistogramBinningConfig):
    """Equal-width histogram binning (the tables' HB) as a method, fitted on the cached validation logits
    (docs/methods.md §5.9).

    Attributes:
        num_bins: equal-width bins of [0, 1], >= 1 (15, the bins of Guo et al.'s ECE; netcal's default is 10).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """


@POSTHOC.register("histogram_binning_equal_mass")
class HistogramBinningEqualMass(PostHocCalibrator):
    """One-vs-rest histogram binning with equal-mass bins (HB-EM): q_k = θ_k,b(p_k), the positive fraction of
    p_k's bin.

    Args:
        num_bins: bins per class B >= 1 (15); fewer where the calibration set has under B distinct
            scores for a class.

    After :meth:`fit`, ``cut_points[k]`` (ascending, one fewer than the bins) and ``bin_values[k]``
    (θ_kb) describe class k's step function and ``bin_counts[k]`` holds the samples per bin.
    """

    def __init__(self, num_bins: int = HistogramBinningEqualMassConfig.num_bins) -> None:
        super().__init__()
        check_values(HistogramBinningEqualMassConfig, locals())
        self.num_bins = num_bins
        self.cut_points: list[np.ndarray] = []
        self.bin_values: list[np.ndarray] = []
        self.bin_counts: list[np.ndarray] = []

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> HistogramBinningEqualMass:
        """Bin each class's softmax scores on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        probs, targets = softmax64(z), y.numpy()
        order = np.argsort(probs, axis=0, kind="stable")
        self.cut_points, self.bin_values, self.bin_counts = [], [], []
        for k in range(probs.shape[1]):
            scores = probs[order[:, k], k]
            positives = (targets[order[:, k]] == k).astype(np.float64)
            starts = equal_mass_bin_starts(scores, self.num_bins)
            counts = np.diff(np.append(starts, len(scores)))
            self.cut_points.append(midpoint_cuts(scores, starts))
            self.bin_values.append(np.add.reduceat(positives, starts) / counts)
            self.bin_counts.append(counts)
        absent = absent_classes(y, probs.shape[1])
        self._finish_fit([zero_probability_note(absent, probs.shape[1], "histogram binning")] if absent else [])
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """log p̂: the log of the renormalised bin values (N, C)."""
        self.check_fitted()
        z = check_logits(logits, fitted_classes=len(self.bin_values))
        probs = softmax64(z.cpu())
        binned = np.empty_like(probs)
        for k, (cuts, values) in enumerate(zip(self.cut_points, self.bin_values, strict=True)):
            binned[:, k] = values[np.searchsorted(cuts, probs[:, k], side="right")]
        return log_of_normalised(binned).to(logits.device)


POSTHOC.alias("histogram_binning", "histogram_binning_equal_mass", warn=True)


@POSTHOC.register("histogram_binning_equal_width")
class HistogramBinningEqualWidth(PostHocCalibrator):
    """Histogram binning with equal-width bins (HB; Guo et al. 2017, netcal 1.4): K = 2 bins the class-1 score,
    K > 2 one-vs-rest and renormalised.

    Args:
        num_bins: bins B >= 1 of [0, 1] (15), each ((j−1)/B, j/B] (the first also holds 0).

    After :meth:`fit`, ``binned_classes`` lists the classes with a binning ([1] at K = 2, every class above),
    ``bin_values[i]`` holds θ_b of class ``binned_classes[i]`` (an empty bin's midpoint; all 0 for a class
    without calibration samples) and ``bin_counts[i]`` its calibration samples per bin.
    """

    def __init__(self, num_bins: int = HistogramBinningEqualWidthConfig.num_bins) -> None:
        super().__init__()
        check_values(HistogramBinningEqualWidthConfig, locals())
        self.num_bins = num_bins
        self.num_classes = 0
        self.binned_classes: list[int] = []
        self.bin_values: list[np.ndarray] = []
        self.bin_counts: list[np.ndarray] = []

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> HistogramBinningEqualWidth:
        """Bin the softmax scores of logits z (N, C >= 2) against labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        probs, targets = softmax64(z), y.numpy()
        self.num_classes = probs.shape[1]
        self.binned_classes = [1] if self.num_classes == 2 else list(range(self.num_classes))
        edges = equal_width_edges(self.num_bins)
        midpoints = 0.5 * (edges[:-1] + edges[1:])
        absent = absent_classes(y, self.num_classes)
        self.bin_values, self.bin_counts = [], []
        for k in self.binned_classes:
            bins = equal_width_bin_indices(probs[:, k], self.num_bins)
            counts = np.bincount(bins, minlength=self.num_bins)
            positives = np.bincount(bins, weights=(targets == k).astype(np.float64), minlength=self.num_bins)
            values = np.where(counts > 0, positives / np.maximum(counts, 1), midpoints)
            self.bin_values.append(np.zeros(self.num_bins) if self.num_classes > 2 and k in absent else values)
            self.bin_counts.append(counts)
        reasons = []
        if absent and self.num_classes == 2:
            reasons = [f"class {absent[0]} absent from the calibration set: every non-empty bin gives it probability 0"]
        elif absent:
            reasons = [zero_probability_note(absent, self.num_classes, "histogram binning")]
        self._finish_fit(reasons)
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """log p̂: (1 − θ(p_1), θ(p_1)) at K = 2, the renormalised θ_k,b(p_k) above (N, C)."""
        self.check_fitted()
        z = check_logits(logits, fitted_classes=self.num_classes)
        probs = softmax64(z.cpu())
        binned = np.empty_like(probs)
        for k, values in zip(self.binned_classes, self.bin_values, strict=True):
            binned[:, k] = values[equal_width_bin_indices(probs[:, k], self.num_bins)]
        if self.num_classes == 2:
            return log_probabilities(np.stack([1.0 - binned[:, 1], binned[:, 1]], axis=1)).to(logits.device)
        return log_of_normalised(binned).to(logits.device)


register_posthoc_method(
    "histogram_binning_equal_mass", HistogramBinningEqualMassConfig, HistogramBinningEqualMass,
    "one-vs-rest histogram binning (equal-mass bins; Zadrozny & Elkan 2001), renormalised: row HB-EM",
    label="HB-EM", order=14, former_name="histogram_binning",
)
register_posthoc_method(
    "histogram_binning_equal_width", HistogramBinningEqualWidthConfig, HistogramBinningEqualWidth,
    "histogram binning with equal-width bins (Guo et al. 2017, netcal): binary at K = 2, one-vs-rest "
    "renormalised above: row HB",
    label="HB", order=13,
)
