"""What the one-vs-rest calibrators share (docs/methods.md §5.8, §5.15–5.17): the checked softmax scores of new
logits, which binary problems a fit solves, and the renormalised output.

A binary calibrator g maps the score s of a class to a probability. Applied one-vs-rest to C classes (Zadrozny &
Elkan, KDD 2002), class k gets its own g_k fitted on the pairs (p_ik, 1[y_i = k]) and the row is renormalised,

    p̂_k = g_k(p_k) / Σ_j g_j(p_j)          (a row whose every g_k is 0: uniform);

at C = 2 the problem is binary: one g on class 1's score, p̂ = (1 − g(p_1), g(p_1)), as probmetrics'
``MulticlassOneVsRestCalibrator`` (CalArena, arXiv 2605.30188) and the binary papers do.
"""

from __future__ import annotations

import numpy as np
import torch

from calib.metrics import softmax64
from calib.posthoc._base import check_logits, log_probabilities
from calib.posthoc.histogram_binning import log_of_normalised

__all__ = ["binary_problem_classes", "checked_softmax", "one_vs_rest_log_probs"]


def checked_softmax(logits: torch.Tensor, num_classes: int) -> np.ndarray:
    """softmax(z) (N, C) in float64 of new logits, after checking them and that C is the fit's ``num_classes``."""
    z = check_logits(logits, fitted_classes=num_classes)
    return softmax64(z.cpu())


def binary_problem_classes(num_classes: int) -> list[int]:
    """The classes whose binary calibrator a one-vs-rest fit solves: [1] for C = 2 (one binary problem on class
    1's score), else every class."""
    return [1] if num_classes == 2 else list(range(num_classes))


def one_vs_rest_log_probs(binary_probs: np.ndarray, num_classes: int) -> torch.Tensor:
    """log p̂ (N, C), floored at :data:`~calib.posthoc.PROBABILITY_FLOOR`, from the binary calibrators' outputs
    g_k(p_k) (N, m) in [0, 1] of :func:`binary_problem_classes`: (1 − g, g) at C = 2, else the renormalised row."""
    if num_classes == 2:
        positive = binary_probs[:, 0]
        return log_probabilities(np.stack([1.0 - positive, positive], axis=1))
    return log_of_normalised(binary_probs)
