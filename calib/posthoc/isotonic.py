"""Multi-class isotonic regression, two variants, docs/methods.md §5.

``"isotonic"``, one-vs-rest (Zadrozny & Elkan, KDD 2002): one isotonic (non-decreasing) regression
g_k per class, fitted by pool-adjacent-violators on the pairs (p_ik, 1[y_i = k]) with
p_i = softmax(z_i), then the row renormalised:

    p̂_k = g_k(p_k) / Σ_j g_j(p_j)          (a row whose every g_k is 0: uniform)

``"isotonic_irm"``, IRM (Zhang, Kailkhura, Han, ICML 2020, "Mix-n-Match"): one isotonic regression g on
all N·C pairs (p_ik, 1[y_i = k]) pooled over the classes, plus their accuracy-preserving term:

    p̂_k = (g(p_k) + ε p_k) / Σ_j (g(p_j) + ε p_j),   ε = 1e-9

g + ε·identity is strictly increasing, so the argmax of p̂ is that of p (up to float rounding when
two scores differ by less than ~1e-7 and g ties them); one-vs-rest can change it.

Both use scikit-learn's ``IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)``: g interpolates
linearly between the fitted points and is constant beyond the calibration scores. Source of IRM and ε:
``util_calibration.py`` (``mir_calibrate``) of zhang64-llnl/Mix-n-Match-Calibration. ``forward``
returns log p̂ (floored at :data:`~calib.posthoc.PROBABILITY_FLOOR`, so finite). A class without calibration
samples gets g_k ≡ 0 in one-vs-rest, so p̂_k = 0 for every input: a degenerate fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from sklearn.isotonic import IsotonicRegression

from calib.metrics import softmax64
from calib.posthoc._base import POSTHOC, PostHocCalibrator, absent_classes, check_logits_labels
from calib.posthoc._method import PostHocConfig, register_posthoc_method
from calib.posthoc._one_vs_rest import checked_softmax
from calib.posthoc.histogram_binning import log_of_normalised, zero_probability_note

__all__ = ["IRM_EPSILON", "IsotonicConfig", "IsotonicIRM", "IsotonicIRMConfig", "IsotonicOneVsRest"]

IRM_EPSILON = 1e-9
"""ε of IRM's accuracy-preserving term ε·p_k (Mix-n-Match ``mir_calibrate``)."""


def _isotonic() -> IsotonicRegression:
    return IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0)


@POSTHOC.register("isotonic")
class IsotonicOneVsRest(PostHocCalibrator):
    """One isotonic regression g_k per class on (p_ik, 1[y_i = k]); p̂ = g(p) renormalised.

    After :meth:`fit`, ``regressors[k]`` is class k's fitted ``sklearn.isotonic.IsotonicRegression``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.regressors: list[IsotonicRegression] = []

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> IsotonicOneVsRest:
        """Fit g_k on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        probs, targets = softmax64(z), y.numpy()
        self.regressors = [_isotonic().fit(probs[:, k], (targets == k).astype(np.float64))
                           for k in range(probs.shape[1])]
        absent = absent_classes(y, probs.shape[1])
        self._finish_fit([zero_probability_note(absent, probs.shape[1], "isotonic regression")] if absent else [])
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """log p̂, p̂_k = g_k(p_k) / Σ_j g_j(p_j)."""
        self.check_fitted()
        probs = checked_softmax(logits, len(self.regressors))
        mapped = np.stack([g.predict(probs[:, k]) for k, g in enumerate(self.regressors)], axis=1)
        return log_of_normalised(mapped).to(logits.device)


@POSTHOC.register("isotonic_irm")
class IsotonicIRM(PostHocCalibrator):
    """IRM: one isotonic regression g on all classes' (p_ik, 1[y_i = k]), plus ε·p_k; p̂ renormalised.

    After :meth:`fit`, ``regressor`` is the fitted ``sklearn.isotonic.IsotonicRegression``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.regressor: IsotonicRegression | None = None
        self.num_classes = 0

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> IsotonicIRM:
        """Fit g on the N·C pooled pairs of logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        probs = softmax64(z)
        one_hot = np.zeros_like(probs)
        one_hot[np.arange(len(probs)), y.numpy()] = 1.0
        self.regressor = _isotonic().fit(probs.ravel(), one_hot.ravel())
        self.num_classes = probs.shape[1]
        self._finish_fit()
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """log p̂, p̂_k ∝ g(p_k) + ε p_k (ε = 1e-9): the argmax of p is kept."""
        self.check_fitted()
        probs = checked_softmax(logits, self.num_classes)
        mapped = self.regressor.predict(probs.ravel()).reshape(probs.shape) + IRM_EPSILON * probs
        return log_of_normalised(mapped).to(logits.device)


@dataclass(frozen=True, kw_only=True)
class IsotonicConfig(PostHocConfig):
    """One-vs-rest isotonic regression as a method (docs/methods.md §5); no hyperparameters.

    Attributes:
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """


@dataclass(frozen=True, kw_only=True)
class IsotonicIRMConfig(PostHocConfig):
    """IRM (pooled, accuracy-preserving isotonic regression) as a method (docs/methods.md §5); no hyperparameters.

    Attributes:
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """


register_posthoc_method(
    "isotonic", IsotonicConfig, IsotonicOneVsRest,
    "one-vs-rest isotonic regression (Zadrozny & Elkan 2002), renormalised",
    label="IR", order=11,
)
register_posthoc_method(
    "isotonic_irm", IsotonicIRMConfig, IsotonicIRM,
    "IRM: isotonic regression pooled over classes, accuracy-preserving (Zhang et al. 2020)",
    label="IRM", order=12,
)
