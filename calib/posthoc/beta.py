"""Beta calibration (Kull, Silva Filho, Flach, AISTATS 2017), one-vs-rest for C > 2, docs/methods.md §5.17.

Binary: a score s ∈ (0, 1) maps to

    μ(s; a, b, c) = 1 / (1 + 1 / (e^c · s^a / (1 − s)^b)) = σ(a ln s − b ln(1 − s) + c),   a, b >= 0,

the posterior of two beta-distributed class-conditional scores: the three-parameter family ("abm") that contains
the identity (a = b = 1, c = 0) and logistic (Platt) calibration on the log-odds (a = b). It is fitted as the
paper's Algorithm 1 and betacal's ``BetaCalibration(parameters="abm")`` do: maximum likelihood of a logistic
regression of y on the features (ln s, −ln(1 − s)); if the fitted a < 0, refit with a = 0 (the feature dropped),
else if b < 0, refit with b = 0, so that μ is non-decreasing (the refitted coefficient is not constrained again).
betacal calls scikit-learn's ``LogisticRegression(C=99999999999)`` (an L2 penalty of 1/(2C)·‖(a, b)‖², negligible,
and lbfgs to its tolerance 1e-4); calib maximises the likelihood itself by Newton-Raphson (:func:`fit_logistic`:
every class at once, the exact 3 × 3 Hessian, step halving), to float64 precision in about ten steps. (LBFGS to
calib's usual gradient tolerance 1e-6 left (a, b) up to 4e-4 off: a and b are nearly collinear where the scores
span a narrow range, so that direction of the likelihood is flat.) The features are computed from the logits
exactly (ln s = log softmax(z)_k, ln(1 − s) = log Σ_{j≠k} softmax(z)_j), so no score is clipped to [eps, 1 − eps]
as betacal's probability input must be.

For C > 2: one-vs-rest with renormalisation, as the beta-calibration authors ran it as the multiclass baseline
of Dirichlet calibration (Kull et al., NeurIPS 2019: ``OneVsRestCalibrator(BetaCalibration(parameters="abm"))`` in
their experiments code, dirichletcal/experiments_neurips): class k's μ_k on (p_ik, 1[y_i = k]), p̂_k ∝ μ_k(p_k).
The papers give no reason to refuse C > 2 (Dirichlet calibration is their natively multiclass successor, §5.7);
CalArena (arXiv 2605.30188) runs beta calibration on its binary tasks only, and probmetrics'
``get_calibrator("beta")`` accepts two classes only. At C = 2: one μ on p_1, p̂ = (1 − μ, μ). No hyperparameters.
The argmax can change (per-class maps; at C = 2 the decision threshold moves). ``forward`` returns calibrated
logits: (0, η) at C = 2 and log μ_k = log σ(η_k) for C > 2, η = a ln s − b ln(1 − s) + c, so p̂ never rounds to 0.

Degenerate fits: a class absent from the calibration set (no finite optimum: the parameters stop where the gradient
falls below tolerance, its probability pushed towards 0), fewer than 3 distinct scores of a class (a, b, c not
identifiable), a separated class (every sample right, in-sample NLL < 1e-4), an unconverged fit (max|∂L/∂θ| above
1e-6 after 100 Newton steps), and a refitted coefficient that is still negative (a decreasing map).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.special import expit
from torch.nn import functional as F

from calib.posthoc._base import (
    POSTHOC,
    PostHocCalibrator,
    absent_classes,
    check_logits,
    check_logits_labels,
    describe_classes,
)
from calib.posthoc._method import PostHocConfig, register_posthoc_method
from calib.posthoc._one_vs_rest import binary_problem_classes
from calib.posthoc.vector_scaling import GRAD_TOLERANCE, SEPARABLE_NLL

__all__ = ["BetaCalibration", "BetaCalibrationConfig", "beta_features", "fit_logistic"]

MAX_NEWTON_STEPS = 100
"""At most this many Newton steps per fit (a likelihood without a finite optimum never stops improving)."""

NEWTON_DECREMENT = 1e-20
"""A fit stops once g·H⁺g, twice the decrease of the mean NLL a Newton step predicts, falls below this."""


def beta_features(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ln s, ln(1 − s)), each (N, C) float64, of s = softmax(z), exact where s rounds to 0 or 1: ln(1 − s_k) is
    log1p(−s_k) for every class but a row's top one (s_k <= 1/2 there), log Σ_{j≠k} e^{z_j} − log Σ_j e^{z_j} for it."""
    z = logits.to(torch.float64)
    log_total = torch.logsumexp(z, dim=1, keepdim=True)
    log_s = z - log_total
    log_rest = torch.log1p(-log_s.exp())
    if z.shape[1] > 1:
        rows, top = torch.arange(len(z)), z.argmax(dim=1)
        others = z.clone()
        others[rows, top] = -torch.inf
        log_rest[rows, top] = torch.logsumexp(others, dim=1) - log_total[:, 0]
    return log_s, log_rest


def fit_logistic(features: np.ndarray, targets: np.ndarray, start: np.ndarray, free: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Maximum likelihood of m logistic regressions at once: θ_k minimising
    L_k = mean_i [log(1 + e^{η_ki}) − t_ki η_ki], η_ki = θ_k · x_ki, for features x (m, d, N), targets t (m, N) in
    [0, 1], from ``start`` (m, d), the entries where ``free`` (m, d) is False held at their start.

    Newton-Raphson: the step −H⁺g (the pseudo-inverse: no step along a flat direction), halved until L_k does not
    rise by more than its float64 rounding. A problem stops once the step's predicted decrease g·H⁺g is below
    :data:`NEWTON_DECREMENT`, or below its square root while max|g| no longer shrinks (float64's floor), once 30
    halvings do not help, or after :data:`MAX_NEWTON_STEPS` steps. Returns θ (m, d) and max|∂L_k/∂θ_k| (m,) there."""
    n = features.shape[2]
    theta = start.astype(np.float64).copy()
    best_gradient = np.full(len(theta), np.inf)

    def losses(eta: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """L_k and the rounding error its sum may carry (64 ulp of the mean absolute term)."""
        softplus = np.logaddexp(0.0, eta)
        return np.mean(softplus - t * eta, axis=1), 64 * np.finfo(np.float64).eps * np.mean(
            softplus + np.abs(t * eta), axis=1)

    def gradient(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        eta = np.einsum("kdn,kd->kn", features[rows], theta[rows])
        grad = np.einsum("kdn,kn->kd", features[rows], expit(eta) - targets[rows]) / n
        return np.where(free[rows], grad, 0.0), eta

    active = np.arange(len(theta))
    for _ in range(MAX_NEWTON_STEPS):
        if not len(active):
            break
        grad, eta = gradient(active)
        shrinking = np.abs(grad).max(axis=1) < best_gradient[active]
        best_gradient[active] = np.minimum(best_gradient[active], np.abs(grad).max(axis=1))
        x, probs = features[active], expit(eta)
        hessian = (x * (probs * (1 - probs))[:, None, :]) @ x.transpose(0, 2, 1) / n
        fixed = ~free[active]
        hessian = np.where(fixed[:, :, None] | fixed[:, None, :], 0.0, hessian)
        step = np.where(free[active], -np.einsum("kde,ke->kd", np.linalg.pinv(hessian, hermitian=True), grad), 0.0)
        decrement = -np.sum(grad * step, axis=1)
        keep = (decrement >= NEWTON_DECREMENT) & (shrinking | (decrement >= np.sqrt(NEWTON_DECREMENT)))
        active, step, eta, x = active[keep], step[keep], eta[keep], x[keep]
        t = targets[active]
        current, rounding = losses(eta, t)
        direction = np.einsum("kdn,kd->kn", x, step)  # the change of η along the step
        size, trying = np.ones(len(active)), np.ones(len(active), dtype=bool)
        for _ in range(30):  # step halving, problem by problem
            candidate_loss, _ = losses(eta[trying] + size[trying, None] * direction[trying], t[trying])
            done = np.flatnonzero(trying)[candidate_loss <= current[trying] + rounding[trying]]
            theta[active[done]] += size[done, None] * step[done]
            trying[done] = False
            if not trying.any():
                break
            size[trying] /= 2
        active = active[~trying]  # no halving lowered L_k: as low as float64 resolves
    return theta, np.abs(gradient(np.arange(len(theta)))[0]).max(axis=1)


@POSTHOC.register("beta")
class BetaCalibration(PostHocCalibrator):
    """One-vs-rest beta calibration: p̂_k ∝ σ(a_k ln p_k − b_k ln(1 − p_k) + c_k) (C = 2: one map on class 1).

    After :meth:`fit`: ``a``, ``b``, ``c`` (float64 buffers, one entry per binary problem of ``classes``),
    ``dropped`` ("a", "b" or "" per problem: the coefficient the paper's refit fixed at 0) and ``gradient`` (per
    problem, max|∂L/∂θ| at the fitted parameters).
    """

    def __init__(self, *, grad_tolerance: float = GRAD_TOLERANCE) -> None:
        super().__init__()
        if not grad_tolerance > 0:
            raise ValueError(f"`grad_tolerance` must be > 0, got grad_tolerance={grad_tolerance}.")
        self.grad_tolerance = grad_tolerance
        self.num_classes = 0
        self.classes: list[int] = []
        self.dropped: list[str] = []
        self.gradient = np.zeros(0)
        for name in ("a", "b", "c"):
            self.register_buffer(name, torch.zeros(0, dtype=torch.float64))

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> BetaCalibration:
        """Fit (a_k, b_k, c_k) on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        self.num_classes = z.shape[1]
        self.classes = binary_problem_classes(self.num_classes)
        log_s, log_rest = (feature[:, self.classes].numpy() for feature in beta_features(z))
        features = np.stack([log_s.T, -log_rest.T, np.ones_like(log_s.T)], axis=1)  # (m, 3, N): θ = (a, b, c)
        targets = (y.numpy()[None, :] == np.array(self.classes)[:, None]).astype(np.float64)
        every = np.ones((len(self.classes), 3), dtype=bool)
        identity = np.tile([1.0, 1.0, 0.0], (len(self.classes), 1))
        theta, self.gradient = fit_logistic(features, targets, identity, every)
        drop_a = theta[:, 0] < 0
        drop_b = ~drop_a & (theta[:, 1] < 0)
        if drop_a.any() or drop_b.any():  # Algorithm 1: refit without the negative coefficient
            free = np.stack([~drop_a, ~drop_b, np.ones_like(drop_a)], axis=1)
            theta, self.gradient = fit_logistic(features, targets, np.where(free, identity, 0.0), free)
        self.dropped = ["a" if da else "b" if db else "" for da, db in zip(drop_a, drop_b, strict=True)]
        self.a, self.b, self.c = torch.from_numpy(theta.T.copy())
        self._finish_fit(self._problems(y, torch.from_numpy(log_s), torch.from_numpy(log_rest),
                                        torch.from_numpy(targets.T)))
        return self

    def _problems(self, labels: torch.Tensor, log_s: torch.Tensor, log_rest: torch.Tensor, targets: torch.Tensor
                  ) -> list[str]:
        """The degenerate-fit reasons of the fitted (a, b, c) on the calibration labels, features and targets (N, m)."""
        def named(problems: list[int]) -> str:
            return describe_classes([self.classes[j] for j in problems], self.num_classes)

        positives, n = targets.sum(dim=0), len(targets)
        reasons = []
        one_sided = [j for j in range(len(self.classes)) if positives[j] in (0, n)]
        absent = absent_classes(labels, self.num_classes)
        if absent:
            maps = "the map" if self.num_classes == 2 else "their maps"
            reasons.append(f"{describe_classes(absent, self.num_classes)} absent from the calibration set: the "
                           f"likelihood has no finite optimum, so {maps} stopped where the gradient fell below "
                           f"tolerance, their probabilities pushed towards 0")
        flat = [j for j in range(len(self.classes)) if len(torch.unique(log_s[:, j])) < 3]
        if flat:
            reasons.append(f"{named(flat)}: fewer than 3 distinct calibration scores, so a, b and c are not "
                           f"identifiable")
        eta = self.a * log_s - self.b * log_rest + self.c
        nll = F.binary_cross_entropy_with_logits(eta, targets, reduction="none").mean(dim=0)
        right = ((eta > 0) == (targets > 0.5)).all(dim=0)
        separated = [j for j in range(len(self.classes)) if right[j] and nll[j] < SEPARABLE_NLL
                     and j not in one_sided]
        if separated:
            reasons.append(f"{named(separated)}: the calibration samples are separated (every one right, in-sample "
                           f"NLL < {SEPARABLE_NLL:g}), so the likelihood has no finite optimum")
        unconverged = [j for j in range(len(self.classes)) if not self.gradient[j] < self.grad_tolerance
                       and j not in one_sided + separated]
        if unconverged:
            worst = max(self.gradient[j] for j in unconverged)
            reasons.append(f"{named(unconverged)}: the fit stopped above the gradient tolerance "
                           f"{self.grad_tolerance:g} (max|∂L/∂θ| up to {worst:.3g})")
        decreasing = [j for j in range(len(self.classes)) if self.a[j] < 0 or self.b[j] < 0]
        if decreasing:
            reasons.append(f"{named(decreasing)}: the coefficient left after the refit is negative, a decreasing map")
        return reasons

    def fit_details(self) -> dict[str, Any]:
        """The base fit columns and the fitted (a_k, b_k, c_k), one per binary problem: class 1's at C = 2, else
        class k's at position k."""
        return {**super().fit_details(), "fitted_beta_a": self.a.tolist(), "fitted_beta_b": self.b.tolist(),
                "fitted_beta_c": self.c.tolist()}

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """Calibrated logits: (0, η) at C = 2, log σ(η_k) for C > 2, η = a ln p − b ln(1 − p) + c."""
        self.check_fitted()
        z = check_logits(logits, fitted_classes=self.num_classes)
        log_s, log_rest = (feature[:, self.classes] for feature in beta_features(z.cpu()))
        eta = self.a * log_s - self.b * log_rest + self.c
        calibrated = torch.cat([torch.zeros_like(eta), eta], dim=1) if self.num_classes == 2 else F.logsigmoid(eta)
        return calibrated.to(logits.device)


@dataclass(frozen=True, kw_only=True)
class BetaCalibrationConfig(PostHocConfig):
    """Beta calibration (the three-parameter "abm" family), one-vs-rest, as a method (docs/methods.md §5.17); no
    hyperparameters.

    Attributes:
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """


register_posthoc_method(
    "beta", BetaCalibrationConfig, BetaCalibration,
    "beta calibration (Kull et al. 2017), three parameters per class, one-vs-rest, renormalised",
    label="Beta", order=19,
)
