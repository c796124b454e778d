"""Spline calibration (Gupta, Rahimi, Ajanthan, Mensink, Sminchisescu, Hartley, ICLR 2021), docs/methods.md §5.

Top-label recalibration. On the calibration set, with top scores s_i = max_k softmax(z_i)_k sorted
ascending and c_i = 1[argmax_k z_ik = y_i]:

    A(t_i) = (1/N) Σ_{j<=i} c_j,   S(t_i) = (1/N) Σ_{j<=i} s_j,   t_i = (i − 1)/(N − 1) ∈ [0, 1]

(the cumulative accuracy and score against the fraction t of samples). A natural cubic spline σ with
K equally spaced knots on [0, 1] (K = 6) is least-squares fitted to A − S; its derivative estimates the
local accuracy minus score, so the calibrated confidence at s_i is

    a_i = σ'(t_i) + s_i.

A new top score s maps to the piecewise-linear interpolation of the points (s_i, a_i) (constant beyond
the first and last; tied s_i are averaged), clipped to [0, 1]: ĉ = clip(a(s), 0, 1).

The method calibrates the top-label confidence only; the distribution calib returns keeps the predicted
class and carries exactly that confidence (:func:`top_label_distribution`): the top class gets
max(ĉ, 1/C) (a distribution over C classes cannot give its top class less), and the others share the
rest in proportion to their softmax probabilities, none above the top class ("water-filling": a class
that would exceed it is capped there and its excess goes to the others, in the same proportion).

Source: the official code kartikgupta-at-anu/spline-calibration, ``recalibrate.py``
(``get_recalibration_function``: natural run-out, 6 knots, percentile = linspace(0, 1, N),
``interpolated_function`` constant off the range, clipping to [0, 1]) and ``utilities/spline.py``.
``forward`` returns log p̂ (floored at :data:`~calib.posthoc.PROBABILITY_FLOOR`, so finite).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calib._config import check_values, checked_field, integer
from calib.metrics import softmax64
from calib.posthoc._base import POSTHOC, PostHocCalibrator, check_logits, check_logits_labels, log_probabilities
from calib.posthoc._method import PostHocConfig, register_posthoc_method

__all__ = ["SplineCalibration", "SplineConfig", "natural_spline_bases", "top_label_distribution"]

TIE_MARGIN = 1e-9
"""The other classes stay below the top class by this relative margin, so that ties never move the argmax."""


def top_label_distribution(probs: np.ndarray, confidence: np.ndarray) -> np.ndarray:
    """A distribution (N, C) that keeps each row's predicted class k̂ = argmax p and gives it ``confidence``.

    The top class gets c = max(confidence, c_min), c_min = 1/(C − (C − 1)·δ) ~= 1/C (δ = :data:`TIE_MARGIN`; a
    row's top class cannot get less than 1/C). The others share 1 − c in proportion to their probabilities p_j,
    none above the cap c·(1 − δ) ("water-filling"): with the others' p sorted in decreasing order, the first m
    get the cap and the rest t·p_j, m the fewest capped classes for which t = (1 − c − m·cap) / Σ_{rest} p_j keeps
    the largest uncapped share at or below the cap. Where capping every other class with p_j > 0 still leaves
    mass, the classes with p_j = 0 share it equally. The top class so exceeds every other by c·δ at least.
    """
    n, num_classes = probs.shape
    rows, top = np.arange(n), probs.argmax(axis=1)
    top_share = np.maximum(confidence, 1.0 / (num_classes - (num_classes - 1) * TIE_MARGIN))
    cap, rest = top_share * (1.0 - TIE_MARGIN), 1.0 - top_share
    others = probs.copy()
    others[rows, top] = -1.0  # sorts after every other class
    order = np.argsort(-others, axis=1, kind="stable")[:, : num_classes - 1]
    sorted_p = np.take_along_axis(probs, order, axis=1)  # the others' p, decreasing
    tail = np.cumsum(sorted_p[:, ::-1], axis=1)[:, ::-1]  # tail[:, m]: Σ of sorted_p[:, m:]
    position = np.arange(num_classes - 1)[None, :]
    nonzero = (sorted_p > 0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):  # tail 0 past the last p_j > 0: not a candidate
        scale = (rest[:, None] - position * cap[:, None]) / tail  # t if the first `position` classes are capped
        valid = (position < nonzero[:, None]) & (scale * sorted_p <= cap[:, None])
    found = valid.any(axis=1)
    capped = np.where(found, valid.argmax(axis=1), nonzero)
    t = np.where(found, scale[rows, np.minimum(capped, num_classes - 2)], 0.0)
    shares = np.where(position < capped[:, None], cap[:, None], t[:, None] * sorted_p)
    empty = ~found[:, None] & (position >= capped[:, None])  # p_j = 0 classes when every other one is capped
    spread = (rest - shares.sum(axis=1)) / np.maximum(empty.sum(axis=1), 1)
    shares = np.where(empty, spread[:, None], shares)
    out = np.empty_like(probs)
    np.put_along_axis(out, order, shares, axis=1)
    out[rows, top] = top_share
    return out


def natural_spline_bases(x: np.ndarray, num_knots: int) -> tuple[np.ndarray, np.ndarray]:
    """Value and derivative bases (len(x), K) of natural cubic splines with K >= 2 knots equally spaced on [0, 1].

    A natural cubic spline with knot values v (K,) has value V @ v and derivative D @ v at x. With
    spacing h, its knot second derivatives m solve m_{j−1} + 4 m_j + m_{j+1} = 6 (v_{j−1} − 2 v_j +
    v_{j+1}) / h² inside and m_0 = m_{K−1} = 0; on [x_j, x_j + h], with t = x − x_j and u = h − t,

        σ(x) = m_j u³/(6h) + m_{j+1} t³/(6h) + (v_j − m_j h²/6) u/h + (v_{j+1} − m_{j+1} h²/6) t/h.

    Points outside [0, 1] use the end segments' cubics.
    """
    h = 1.0 / (num_knots - 1)
    # second derivatives m = curvature @ v (rows 0 and K−1 zero: the natural run-out)
    curvature = np.zeros((num_knots, num_knots))
    if num_knots > 2:
        interior = num_knots - 2
        tridiagonal = 4.0 * np.eye(interior) + np.eye(interior, k=1) + np.eye(interior, k=-1)
        second_difference = np.zeros((interior, num_knots))
        rows = np.arange(interior)
        second_difference[rows, rows] = second_difference[rows, rows + 2] = 6.0 / h**2
        second_difference[rows, rows + 1] = -12.0 / h**2
        curvature[1:-1] = np.linalg.solve(tridiagonal, second_difference)
    segment = np.clip(np.floor(x / h).astype(np.int64), 0, num_knots - 2)
    t = x - segment * h
    u = h - t
    rows = np.arange(len(x))
    on_m, on_v = np.zeros((len(x), num_knots)), np.zeros((len(x), num_knots))
    on_m[rows, segment] = u**3 / (6 * h) - h * u / 6
    on_m[rows, segment + 1] = t**3 / (6 * h) - h * t / 6
    on_v[rows, segment] = u / h
    on_v[rows, segment + 1] = t / h
    slope_m, slope_v = np.zeros((len(x), num_knots)), np.zeros((len(x), num_knots))
    slope_m[rows, segment] = -(u**2) / (2 * h) + h / 6
    slope_m[rows, segment + 1] = t**2 / (2 * h) - h / 6
    slope_v[rows, segment] = -1.0 / h
    slope_v[rows, segment + 1] = 1.0 / h
    return on_m @ curvature + on_v, slope_m @ curvature + slope_v


@dataclass(frozen=True, kw_only=True)
class SplineConfig(PostHocConfig):
    """Spline calibration as a method, fitted on the cached validation logits (docs/methods.md §5).

    Attributes:
        num_knots: knots of the natural cubic spline, >= 2 (6, the official code).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    num_knots: int = checked_field(6, integer(at_least=2))


@POSTHOC.register("spline")
class SplineCalibration(PostHocCalibrator):
    """Top-label spline recalibration: ĉ = clip(σ'(t) + s, 0, 1), σ fitted to cumulative accuracy − score.

    Args:
        num_knots: knots K >= 2 of the natural cubic spline, equally spaced on [0, 1] (6, the official code).

    After :meth:`fit`, ``knot_values`` (K,) holds σ at the knots, and ``score_points`` (ascending,
    distinct calibration top scores) and ``calibrated_points`` their calibrated confidences a (before
    clipping); a new top score is interpolated between them.
    """

    def __init__(self, num_knots: int = SplineConfig.num_knots) -> None:
        super().__init__()
        check_values(SplineConfig, locals())
        self.num_knots = num_knots
        self.num_classes = 0
        self.knot_values = np.zeros(num_knots)
        self.score_points = np.zeros(0)
        self.calibrated_points = np.zeros(0)

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> SplineCalibration:
        """Fit σ on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        probs = softmax64(z)
        top_scores = probs.max(axis=1)
        correct = (probs.argmax(axis=1) == y.numpy()).astype(np.float64)
        order = np.argsort(top_scores, kind="stable")
        scores, correct = top_scores[order], correct[order]
        n = len(scores)
        fraction = np.linspace(0.0, 1.0, n)
        target = (np.cumsum(correct) - np.cumsum(scores)) / n
        values, slopes = natural_spline_bases(fraction, self.num_knots)
        self.knot_values = np.linalg.lstsq(values, target, rcond=None)[0]
        calibrated = slopes @ self.knot_values + scores
        self.score_points, tie_group = np.unique(scores, return_inverse=True)
        self.calibrated_points = np.bincount(tie_group, calibrated) / np.bincount(tie_group)
        self.num_classes = probs.shape[1]
        self._finish_fit()
        return self

    def calibrated_confidence(self, top_scores: np.ndarray) -> np.ndarray:
        """ĉ = clip(a(s), 0, 1): the interpolated calibrated confidence of top scores s."""
        self.check_fitted()
        return np.clip(np.interp(top_scores, self.score_points, self.calibrated_points), 0.0, 1.0)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """log p̂ of :func:`top_label_distribution`: the predicted class kept, with confidence max(ĉ, 1/C)."""
        self.check_fitted()
        z = check_logits(logits, fitted_classes=self.num_classes)
        probs = softmax64(z.cpu())
        confidence = self.calibrated_confidence(probs.max(axis=1))
        return log_probabilities(top_label_distribution(probs, confidence)).to(logits.device)


register_posthoc_method(
    "spline", SplineConfig, SplineCalibration,
    "top-label spline recalibration (Gupta et al. 2021)",
    label="Spline", order=16,
)
