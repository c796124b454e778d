"""Selective prediction: AURC and AUGRC, areas under the (generalized) risk–coverage curve.

Both rank the samples by their max-softmax confidence and count top-1 errors (0/1 loss) among the
k most confident ones, for every coverage k/N (docs/methods.md §6.9). Ties in confidence are
handled by averaging over the orders of the tied samples, so the value never depends on the order
of the samples in the input.
"""

from __future__ import annotations

import numpy as np

from calib.metrics._binning import top_label
from calib.metrics._validation import ArrayLike, check_probs_labels

__all__ = ["area_under_generalized_risk_coverage", "area_under_risk_coverage"]


def _expected_cumulative_errors(confidences: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """E_k for k = 1..N: the errors among the k most confident samples, tie groups averaged.

    Samples are sorted by decreasing confidence. Within a group of g samples with the same
    confidence, of which e are errors and preceded by a samples (with E_a errors) that are strictly
    more confident, E_{a+j} = E_a + j·e/g for j = 1..g: the mean over every order of the tied
    samples (a linear interpolation between the group's ends). Without ties E_k is the plain count.
    """
    order = np.argsort(-confidences, kind="stable")
    sorted_conf = confidences[order]
    cumulative = np.cumsum(1.0 - correct[order])
    n = sorted_conf.size
    # group id of each sorted position; the last position of each group; its first position
    group = np.concatenate(([0], np.cumsum(sorted_conf[1:] != sorted_conf[:-1])))
    ends = np.flatnonzero(np.append(sorted_conf[1:] != sorted_conf[:-1], True))
    starts = np.concatenate(([0], ends[:-1] + 1))
    errors_at_end = cumulative[ends]
    errors_before = np.concatenate(([0.0], errors_at_end[:-1]))
    sizes = ends - starts + 1
    k = np.arange(1, n + 1)
    within = k - starts[group]  # j = 1..g inside the group
    return errors_before[group] + within * (errors_at_end[group] - errors_before[group]) / sizes[group]


def _aurc_compute(confidences: np.ndarray, correct: np.ndarray) -> float:
    errors = _expected_cumulative_errors(confidences, correct)
    return float(np.mean(errors / np.arange(1, errors.size + 1)))


def _augrc_compute(confidences: np.ndarray, correct: np.ndarray) -> float:
    errors = _expected_cumulative_errors(confidences, correct)
    return float(np.mean(errors) / errors.size)


def area_under_risk_coverage(probs: ArrayLike, labels: ArrayLike) -> float:
    """AURC: the area under the risk–coverage curve of the max-softmax confidence, in [0, 1].

    AURC = (1/N) · Σ_{k=1..N} E_k / k

    where N is the number of samples, sorted by decreasing confidence ``conf_i = max_c p_{i,c}``,
    and E_k the number of top-1 errors (arg-max class ≠ label) among the k most confident: E_k / k
    is the selective risk at coverage k/N. Ties: for a group of g samples with equal confidence,
    e of them errors, after a strictly more confident samples with E_a errors,
    E_{a+j} = E_a + j·e/g (j = 1..g), the mean over every order of the tied samples; the value
    never depends on the input order. Without ties it is the plain count.

    This is the mean of the N selective risks (Geifman & El-Yaniv's definition). torch-uncertainty's
    ``AURC`` integrates the same N points with the trapezoidal rule on [1/N, 1] and divides by
    1 − 1/N, i.e. (Σ_k E_k/k − (E_1/1 + E_N/N)/2) / (N − 1); the two differ by O(1/N). It also
    breaks ties by ``argsort`` order and returns NaN for N = 1 (here: 0 or 1).
    References: Geifman and El-Yaniv, "Selective Classification for Deep Neural Networks", NeurIPS
    2017 (the risk–coverage curve); Geifman, Uziel and El-Yaniv, "Bias-Reduced Uncertainty
    Estimation for Deep Neural Classifiers", ICLR 2019 (its area as a metric).

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).

    Returns:
        AURC, a fraction in [0, 1]: 0 when every prediction is right, 1 when every one is wrong;
        the error rate when all confidences are equal. Lower is better.

    >>> probs = [[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]]
    >>> area_under_risk_coverage(probs, [0, 1, 0, 1])  # risks 0/1, 1/2, 1/3, 2/4
    0.3333333333333333
    """
    p, y = check_probs_labels(probs, labels)
    return _aurc_compute(*top_label(p, y))


def area_under_generalized_risk_coverage(probs: ArrayLike, labels: ArrayLike) -> float:
    """AUGRC: the area under the generalized risk–coverage curve of the max-softmax confidence.

    AUGRC = (1/N) · Σ_{k=1..N} E_k / N

    with N, E_k and the tie convention of :func:`area_under_risk_coverage`: E_k / N is the
    generalized risk at coverage k/N, the probability that a sample is both accepted (among the k
    most confident) and wrongly classified. Unlike the selective risk it does not put a large weight
    on the few most confident samples. Same sum as torch-uncertainty's ``AUGRC`` up to its
    trapezoidal rule on [1/N, 1] and the division by 1 − 1/N.
    Reference: Traub et al., "Overcoming Common Flaws in the Evaluation of Selective Classification
    Systems", NeurIPS 2024.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).

    Returns:
        AUGRC in [0, (N + 1) / (2N)] ⊂ [0, 1]: 0 when every prediction is right, (N + 1) / (2N)
        when every one is wrong; error rate · (N + 1) / (2N) when all confidences are equal.
        Lower is better.

    >>> probs = [[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]]
    >>> area_under_generalized_risk_coverage(probs, [0, 1, 0, 1])  # (0 + 1 + 1 + 2) / 4 / 4
    0.25
    """
    p, y = check_probs_labels(probs, labels)
    return _augrc_compute(*top_label(p, y))
