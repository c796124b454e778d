"""Centred isotonic regression, CIR (Oron & Flournoy, Statistics in Biopharmaceutical Research 2017), one-vs-rest
for C > 2, docs/methods.md §5.16.

Binary: isotonic regression (pool-adjacent-violators, tied scores pooled first) of the labels y on the scores s
fits a step function whose level sets are blocks of consecutive calibration scores. CIR keeps each block's value
v but replaces the block by one point at the mean of its scores (each score counted as often as it occurs),

    (s̄_B, v_B),   s̄_B = Σ_{i ∈ B} s_i / |B|,

and interpolates linearly between these points, so the fitted g is strictly increasing between them (IR's flat
stretches become slopes) and agrees with IR at every block centre s̄_B. Blocks at v = 0 or v = 1 are not
collapsed (the paper's boundary exception): both their end scores are points. The first and last blocks also keep
their outer end score, so g spans the calibration scores' range [s_(1), s_(N)], and is constant beyond it
(cir-model's convention, which probmetrics' ``CenteredIsotonicRegressionCalibrator`` clips new scores to).

One-vs-rest: class k's g_k on the pairs (p_ik, 1[y_i = k]) with p = softmax(z), the row renormalised
(C = 2: one g on p_1, p̂ = (1 − g, g)); probmetrics' ``get_calibrator("cir")``
= ``MulticlassOneVsRestCalibrator(CenteredIsotonicRegressionCalibrator())``, what CalArena (arXiv 2605.30188) runs.
No hyperparameters. The argmax can change (per-class maps; at C = 2 the decision threshold moves). ``forward``
returns log p̂ (floored, finite). A class without calibration samples gets g_k ≡ 0, p̂_k = 0: a degenerate fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from sklearn.isotonic import isotonic_regression

from calib.metrics import softmax64
from calib.posthoc._base import POSTHOC, PostHocCalibrator, absent_classes, check_logits_labels
from calib.posthoc._method import PostHocConfig, register_posthoc_method
from calib.posthoc._one_vs_rest import binary_problem_classes, checked_softmax, one_vs_rest_log_probs
from calib.posthoc.histogram_binning import zero_probability_note

__all__ = ["CenteredIsotonicRegression", "CenteredIsotonicRegressionConfig", "centred_isotonic_points"]


def centred_isotonic_points(scores: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CIR's interpolation points (x ascending, g(x)) of calibration scores s (N,) and targets in [0, 1] (N,)."""
    order = np.argsort(scores, kind="stable")
    distinct, starts, counts = np.unique(scores[order], return_index=True, return_counts=True)
    score_sums = np.add.reduceat(scores[order], starts)
    target_means = np.add.reduceat(targets[order].astype(np.float64), starts) / counts
    fitted = isotonic_regression(target_means, sample_weight=counts.astype(np.float64))  # IR of the tied groups
    block_starts = np.flatnonzero(np.concatenate([[True], fitted[1:] != fitted[:-1]]))
    block_ends = np.append(block_starts[1:], len(distinct)) - 1
    values = fitted[block_starts]
    lows, highs = distinct[block_starts], distinct[block_ends]  # a block's mean, kept inside its range by rounding
    centres = np.clip(np.add.reduceat(score_sums, block_starts) / np.add.reduceat(counts, block_starts), lows, highs)
    last = len(values) - 1
    xs, gs = [], []
    for b, (value, centre) in enumerate(zip(values, centres, strict=True)):
        if value in (0.0, 1.0):  # not collapsed: the block's two end scores
            block_x = [lows[b], highs[b]]
        else:
            block_x = ([lows[b]] if b == 0 else []) + [centre] + ([highs[b]] if b == last and b > 0 else [])
        xs.extend(block_x)
        gs.extend([value] * len(block_x))
    x, g = np.asarray(xs), np.asarray(gs)
    keep = np.concatenate([[True], x[1:] > x[:-1]])  # a block of one distinct score gives it twice
    return x[keep], g[keep]


@POSTHOC.register("cir")
class CenteredIsotonicRegression(PostHocCalibrator):
    """One-vs-rest CIR: class k's g_k interpolates its centred IR points; p̂ = g(p) renormalised (C = 2: one g on
    class 1's score).

    After :meth:`fit`, ``points[j]`` = (x, g(x)) are the interpolation points of class ``classes[j]``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.num_classes = 0
        self.classes: list[int] = []
        self.points: list[tuple[np.ndarray, np.ndarray]] = []

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> CenteredIsotonicRegression:
        """Fit each class's CIR on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        probs, targets = softmax64(z), y.numpy()
        self.num_classes = probs.shape[1]
        self.classes = binary_problem_classes(self.num_classes)
        self.points = [centred_isotonic_points(probs[:, k], targets == k) for k in self.classes]
        absent = absent_classes(y, self.num_classes)
        self._finish_fit([zero_probability_note(absent, self.num_classes, "centred isotonic regression")]
                         if absent else [])
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """log p̂, p̂_k = g_k(p_k) / Σ_j g_j(p_j) (C = 2: (1 − g(p_1), g(p_1)))."""
        self.check_fitted()
        probs = checked_softmax(logits, self.num_classes)
        mapped = np.stack([np.interp(probs[:, k], x, g) for k, (x, g) in zip(self.classes, self.points, strict=True)],
                          axis=1)
        return one_vs_rest_log_probs(mapped, self.num_classes).to(logits.device)


@dataclass(frozen=True, kw_only=True)
class CenteredIsotonicRegressionConfig(PostHocConfig):
    """Centred isotonic regression, one-vs-rest, as a method (docs/methods.md §5.16); no hyperparameters.

    Attributes:
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """


register_posthoc_method(
    "cir", CenteredIsotonicRegressionConfig, CenteredIsotonicRegression,
    "centred isotonic regression (Oron & Flournoy 2017), one-vs-rest, renormalised",
    label="CIR", order=18,
)
