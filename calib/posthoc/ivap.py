"""Inductive Venn-Abers predictors, IVAP (Vovk & Petej, UAI 2014; Vovk, Petej, Fedorova, NeurIPS 2015), one-vs-rest
for C > 2 (Manokhin, COPA 2017), docs/methods.md §5.15.

Binary (a score s and a label y ∈ {0, 1}): for a test score s, let g⁰ and g¹ be the isotonic regressions fitted on
the calibration pairs (s_i, y_i) together with (s, 0), respectively (s, 1); the Venn-Abers prediction is the
interval [p0, p1] = [g⁰(s), g¹(s)] (p0 <= p1), one end of which is the isotonic fit that includes the test
object's true label, whence validity (Vovk & Petej, Theorem 1). It is merged into one probability by the log-loss
minimax rule (Vovk et al. 2015, §4):

    p = p1 / (1 − p0 + p1)      (p0 <= p <= p1)

p0 and p1 are computed for every possible position of s among the calibration scores at once, from the cumulative
sum diagram (CSD) of the sorted calibration labels: with distinct scores c_1 < … < c_m, W_j the number of
calibration scores <= c_j, Y_j the positives among them (W_0 = Y_0 = 0), and P_j = (W_j, Y_j),

    p1 = min_{b > i} max_{a <= i} (Y_b − Y_a + 1) / (W_b − W_a + 1),   i = #{c_j < s}   (p1 = 1 when i = m),
    p0 = max_{a < i} min_{b >= i} (Y_b − Y_a) / (W_b − W_a + 1),       i = #{c_j <= s}  (p0 = 0 when i = 0),

the min-max form of isotonic regression with the test object in the pool. Each is the slope of the lower common
tangent ("bridge") of the convex hulls of {P_a : a < j} and {P_b + δ : b >= j} (δ = (1, 1) for p1, (1, 0) for p0),
found by walking both hulls (the greatest-convex-minorant construction of Vovk et al. 2015, §2).

One-vs-rest: class k's IVAP on the pairs (p_ik, 1[y_i = k]) with p = softmax(z), the C merged probabilities
renormalised; at C = 2 one IVAP on p_1, p̂ = (1 − p, p). This is ``venn_abers.VennAbersCalibrator`` with
``va_type="one_vs_all"``, what probmetrics' ``get_calibrator("ivap")`` (CalArena, arXiv 2605.30188) runs; its
``precision`` (rounding the scores) stays at its default, None. The argmax can change: per-class maps reorder
classes, and at C = 2 the decision threshold moves. ``forward`` returns log p̂ (floored, finite). A class without
calibration samples has p0 ≡ 0 (p1 ≡ 1 for one in every sample): a degenerate fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calib.metrics import softmax64
from calib.posthoc._base import POSTHOC, PostHocCalibrator, absent_classes, check_logits_labels, describe_classes
from calib.posthoc._method import PostHocConfig, register_posthoc_method
from calib.posthoc._one_vs_rest import binary_problem_classes, checked_softmax, one_vs_rest_log_probs

__all__ = ["InductiveVennAbers", "InductiveVennAbersConfig", "VennAbersGrid", "merge_interval", "venn_abers_grid"]


@dataclass(frozen=True)
class VennAbersGrid:
    """One binary IVAP: the distinct calibration scores c (m,) and p0, p1 (m + 1,) for each position of a test
    score: p0[#{c_j <= s}] and p1[#{c_j < s}]."""

    scores: np.ndarray
    p0: np.ndarray
    p1: np.ndarray

    def interval(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(p0, p1) of test scores s."""
        return (self.p0[np.searchsorted(self.scores, scores, side="right")],
                self.p1[np.searchsorted(self.scores, scores, side="left")])


def merge_interval(p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
    """p = p1 / (1 − p0 + p1), the log-loss merge of the interval [p0, p1] (Vovk et al. 2015, §4)."""
    return p1 / (1.0 - p0 + p1)


def _hull_links(x: list[int], y: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(prev, next) of the points P_j = (x_j, y_j), x strictly increasing: prev[j] is the vertex before P_j on the
    lower convex hull of P_0 … P_j, next[j] the vertex after P_j on that of P_j … P_m (−1: none). The hull of a
    prefix (suffix) is the chain j, prev[j], prev[prev[j]], … (j, next[j], …)."""

    def turns_left(a: int, b: int, c: int) -> bool:  # P_a → P_b → P_c, integer arithmetic: exact
        return (x[b] - x[a]) * (y[c] - y[a]) - (y[b] - y[a]) * (x[c] - x[a]) > 0

    n = len(x)
    prev, nxt = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    stack: list[int] = []
    for j in range(n):
        while len(stack) >= 2 and not turns_left(stack[-2], stack[-1], j):
            stack.pop()
        if stack:
            prev[j] = stack[-1]
        stack.append(j)
    stack = []
    for j in range(n - 1, -1, -1):
        while len(stack) >= 2 and not turns_left(j, stack[-1], stack[-2]):
            stack.pop()
        if stack:
            nxt[j] = stack[-1]
        stack.append(j)
    return prev, nxt


def _bridge_slopes(x: np.ndarray, y: np.ndarray, prev: np.ndarray, nxt: np.ndarray, shift: tuple[int, int]
                   ) -> np.ndarray:
    """For each split j = 1 … m: the slope of the lower common tangent of the hulls of {P_a : a < j} and
    {P_b + shift : b >= j}. All splits walk at once: R along the right hull while the slope from L does not rise,
    L back along the left hull while the slope to R does not fall, until neither moves (both only move outwards)."""
    dx, dy = shift
    left, right = np.arange(len(x) - 1), np.arange(1, len(x))
    live = np.arange(len(left))
    while len(live):
        lo, hi = left[live], right[live]
        ahead = nxt[hi]
        cand = np.maximum(ahead, 0)  # slope(L, ahead) <= slope(L, R), cross-multiplied (positive run)
        move_right = (ahead >= 0) & ((y[cand] + dy - y[lo]) * (x[hi] + dx - x[lo])
                                     <= (y[hi] + dy - y[lo]) * (x[cand] + dx - x[lo]))
        hi = np.where(move_right, ahead, hi)
        behind = prev[lo]
        cand = np.maximum(behind, 0)  # slope(behind, R) >= slope(L, R)
        move_left = (behind >= 0) & ((y[hi] + dy - y[cand]) * (x[hi] + dx - x[lo])
                                     >= (y[hi] + dy - y[lo]) * (x[hi] + dx - x[cand]))
        lo = np.where(move_left, behind, lo)
        left[live], right[live] = lo, hi
        live = live[move_right | move_left]
    return (y[right] + dy - y[left]) / (x[right] + dx - x[left])


def venn_abers_grid(scores: np.ndarray, targets: np.ndarray) -> VennAbersGrid:
    """The binary IVAP of calibration scores s (N,) and 0/1 targets (N,): p0 and p1 for every test position."""
    order = np.argsort(scores, kind="stable")
    distinct, starts, counts = np.unique(scores[order], return_index=True, return_counts=True)
    positives = np.add.reduceat(targets[order].astype(np.int64), starts)
    x = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    y = np.concatenate([[0], np.cumsum(positives)]).astype(np.int64)
    prev, nxt = _hull_links(x.tolist(), y.tolist())
    p1 = np.append(_bridge_slopes(x, y, prev, nxt, (1, 1)), 1.0)
    p0 = np.concatenate([[0.0], _bridge_slopes(x, y, prev, nxt, (1, 0))])
    return VennAbersGrid(distinct, p0, p1)


@POSTHOC.register("ivap")
class InductiveVennAbers(PostHocCalibrator):
    """One-vs-rest inductive Venn-Abers: class k's p̂_k = p1/(1 − p0 + p1) of its IVAP, renormalised (C = 2: one
    IVAP on class 1's score).

    After :meth:`fit`, ``grids[j]`` is the :class:`VennAbersGrid` of class ``classes[j]``; :meth:`intervals` gives
    the (p0, p1) of new logits.
    """

    def __init__(self) -> None:
        super().__init__()
        self.num_classes = 0
        self.classes: list[int] = []
        self.grids: list[VennAbersGrid] = []

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> InductiveVennAbers:
        """Fit each class's IVAP on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        probs, targets = softmax64(z), y.numpy()
        self.num_classes = probs.shape[1]
        self.classes = binary_problem_classes(self.num_classes)
        self.grids = [venn_abers_grid(probs[:, k], targets == k) for k in self.classes]
        absent = absent_classes(y, self.num_classes)
        self._finish_fit([f"{describe_classes(absent, self.num_classes)} absent from the calibration set: "
                          f"Venn-Abers gives such a class p0 = 0 (p1 = 1 to a class in every sample), so its p̂ "
                          f"rests on the test object's own hypothetical label"] if absent else [])
        return self

    def intervals(self, logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(p0, p1), each (N, m), of the binary problems ``classes`` for new logits."""
        self.check_fitted()
        probs = checked_softmax(logits, self.num_classes)
        ends = [grid.interval(probs[:, k]) for k, grid in zip(self.classes, self.grids, strict=True)]
        return np.stack([p0 for p0, _ in ends], axis=1), np.stack([p1 for _, p1 in ends], axis=1)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """log p̂: the merged p1/(1 − p0 + p1) of each class, renormalised (C = 2: (1 − p, p))."""
        p0, p1 = self.intervals(logits)
        return one_vs_rest_log_probs(merge_interval(p0, p1), self.num_classes).to(logits.device)


@dataclass(frozen=True, kw_only=True)
class InductiveVennAbersConfig(PostHocConfig):
    """Inductive Venn-Abers, one-vs-rest, as a method (docs/methods.md §5.15); no hyperparameters.

    Attributes:
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """


register_posthoc_method(
    "ivap", InductiveVennAbersConfig, InductiveVennAbers,
    "inductive Venn-Abers predictors (Vovk & Petej 2014), one-vs-rest, renormalised",
    label="IVAP", order=17,
)
