"""Independent references for calib's metrics, each an explicit loop in the style of the code or paper named in its
docstring; shared by the metric tests and tests/metrics/test_metric_references.py."""

from __future__ import annotations

import itertools

import numpy as np


def reference_ece(probs: np.ndarray, labels: np.ndarray, num_bins: int) -> float:
    """Independent ECE: an explicit loop over bins with the FOCAL-R `gt(lower) & le(upper)` test."""
    confidences = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    total = 0.0
    for b in range(num_bins):
        in_bin = (confidences > edges[b]) & (confidences <= edges[b + 1])
        if b == 0:
            in_bin |= confidences == 0.0
        if in_bin.sum() == 0:
            continue
        proportion = in_bin.sum() / len(confidences)
        total += proportion * abs(correct[in_bin].mean() - confidences[in_bin].mean())
    return total


def reference_mce(probs: np.ndarray, labels: np.ndarray, num_bins: int) -> float:
    """Independent MCE: group samples by ceil(conf * M) - 1 in a dict, then take the largest gap."""
    groups: dict[int, list[tuple[float, bool]]] = {}
    for row, label in zip(probs, labels, strict=True):
        conf = float(row.max())
        b = min(max(int(np.ceil(conf * num_bins)) - 1, 0), num_bins - 1)
        groups.setdefault(b, []).append((conf, int(row.argmax()) == int(label)))
    gaps = [abs(np.mean([c for c, _ in g]) - np.mean([ok for _, ok in g])) for g in groups.values()]
    return max(gaps)


def reference_aece(probs: np.ndarray, labels: np.ndarray, num_bins: int) -> float:
    """Independent AECE in the FOCAL-R loop style: edges via np.histogram, `gt(lower) & le(upper)`."""
    confidences = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    n = len(confidences)
    positions = np.linspace(0, n, num_bins + 1)
    _, boundaries = np.histogram(confidences, np.interp(positions, np.arange(n), np.sort(confidences)))
    total = 0.0
    for lower, upper in itertools.pairwise(boundaries):
        in_bin = (confidences > lower) & (confidences <= upper)
        if in_bin.any():
            total += in_bin.mean() * abs(correct[in_bin].mean() - confidences[in_bin].mean())
    return total


def reference_cwece(probs: np.ndarray, labels: np.ndarray, num_bins: int) -> float:
    """Independent classwise ECE: FOCAL-R loop over classes and bins, `gt(lower) & le(upper)`."""
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    per_class = []
    for k in range(probs.shape[1]):
        p_k, is_k = probs[:, k], labels == k
        total = 0.0
        for lower, upper in itertools.pairwise(edges):
            in_bin = (p_k > lower) & (p_k <= upper)
            if lower == 0.0:
                in_bin |= p_k == 0.0
            if in_bin.any():
                total += in_bin.mean() * abs(is_k[in_bin].mean() - p_k[in_bin].mean())
        per_class.append(total)
    return float(np.mean(per_class))


def reference_ece_sweep(probs: np.ndarray, labels: np.ndarray, p: float = 1.0) -> tuple[float, int]:
    """(ECE-sweep, B*) in the loop style of google-research caltrain ``em_monotonic_sweep`` and
    ``_calc_ece_postbin`` (bin masks, np.mean per bin), with the integer bin rule r·B // N and a stable sort."""
    confidences = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(float)
    n = len(confidences)
    order = np.argsort(confidences, kind="stable")

    def bins_for(num_bins: int) -> np.ndarray:
        bins = np.zeros(n, dtype=int)
        bins[order] = np.minimum(num_bins - 1, np.arange(n) * num_bins // n)
        return bins

    def ece_and_monotone(num_bins: int, bins: np.ndarray) -> tuple[float, bool]:
        total, monotone, last_accuracy = 0.0, True, -1000.0
        for b in range(num_bins):
            in_bin = bins == b
            if in_bin.any():
                accuracy = np.mean(correct[in_bin])
                monotone &= bool(accuracy >= last_accuracy)
                last_accuracy = accuracy
                total += in_bin.sum() * abs(accuracy - np.mean(confidences[in_bin])) ** p
        return (total / n) ** (1.0 / p), monotone

    chosen = np.zeros(n, dtype=int)
    for num_bins in range(2, n):
        bins = bins_for(num_bins)
        if not ece_and_monotone(num_bins, bins)[1]:
            break
        chosen = bins
    num_bins = int(chosen.max()) + 1
    return ece_and_monotone(num_bins, chosen)[0], num_bins


def reference_areas(probs: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Independent (AURC, AUGRC): for each coverage k, threshold at the k-th largest confidence t and
    count the errors strictly above t plus the tied group's share (k − #above)·errors(= t)/#(= t)."""
    confidences = probs.max(axis=1)
    wrong = probs.argmax(axis=1) != labels
    n = len(labels)
    thresholds = sorted(confidences.tolist(), reverse=True)
    risk_sum = generalized_sum = 0.0
    for k in range(1, n + 1):
        t = thresholds[k - 1]
        above = confidences > t
        tied = confidences == t
        errors = wrong[above].sum() + (k - above.sum()) * wrong[tied].sum() / tied.sum()
        risk_sum += errors / k
        generalized_sum += errors / n
    return risk_sum / n, generalized_sum / n


def reference_over_under_ece(probs: np.ndarray, labels: np.ndarray, num_bins: int) -> tuple[float, float]:
    """(O-ECE, U-ECE) as defined for FeDLaS Table 4 (docs/methods.md §6.4): over the ECE's equal-width bins
    (lower, upper], Σ_b (|B_b|/N)·max(conf − acc, 0) and Σ_b (|B_b|/N)·max(acc − conf, 0), in a loop over bins."""
    confidences = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    over = under = 0.0
    for b in range(num_bins):
        in_bin = (confidences > edges[b]) & (confidences <= edges[b + 1])
        if b == 0:
            in_bin |= confidences == 0.0
        if in_bin.any():
            gap = confidences[in_bin].mean() - correct[in_bin].mean()
            over += in_bin.mean() * max(gap, 0.0)
            under += in_bin.mean() * max(-gap, 0.0)
    return over, under
