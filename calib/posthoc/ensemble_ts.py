"""Ensemble temperature scaling (Zhang, Kailkhura, Han, "Mix-n-Match", ICML 2020), docs/methods.md §5.

A convex mixture of the temperature-scaled, the uncalibrated and the uniform prediction:

    p = w1 · softmax(z / T) + w2 · softmax(z) + w3 · 1/C,    w ∈ Δ² (w >= 0, w1 + w2 + w3 = 1)

fitted in two stages with the same loss ("mse", the official default, or "ce"):

1. T = argmin over T ∈ [0.05, 5] of the loss of softmax(z / T), from T = 1 (scipy L-BFGS-B, tol 1e-12);
2. w = argmin over the simplex of the loss of the mixture, from w = (1, 0, 0) (scipy SLSQP, bounds
   [0, 1], equality Σw = 1, tol 1e-12).

The losses are those of the official ``util_calibration.py``: "mse" = mean over samples and classes
of (p − onehot(y))² (in stage 2 of p / Σw), "ce" = mean −log p_y. Gradients are exact (torch autograd,
float64) where the official code lets scipy difference them, and log p is exact where it clips p to
[1e-20, 1 − 1e-20]. ``forward`` returns log p (so its softmax is p). Every component orders the
classes as z does, so the argmax is unchanged (all classes tie only if w1 = w2 = 0). A stage-1 T at either
bound is a degenerate fit (flagged, ``degenerate_reason``): the loss wants a T beyond it.

Official code: zhang64-llnl/Mix-n-Match-Calibration (``ets_calibrate``, which fits both stages with "mse").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.optimize
import torch
from threadpoolctl import threadpool_limits
from torch.nn import functional as F

from calib._config import check_values
from calib.posthoc._base import POSTHOC, PostHocCalibrator, check_logits_labels
from calib.posthoc._method import PostHocConfig, register_posthoc_method

__all__ = ["TEMPERATURE_BOUNDS", "EnsembleTemperatureScaling", "EnsembleTemperatureScalingConfig", "ets_loss"]

TEMPERATURE_BOUNDS = (0.05, 5.0)
"""The official code's bounds on T in stage 1."""


def ets_loss(probs: torch.Tensor, log_probs: torch.Tensor, labels: torch.Tensor,
             loss: Literal["mse", "ce"]) -> torch.Tensor:
    """Mix-n-Match's losses: "mse" mean_{i,k} (p_ik − 1[y_i = k])², "ce" mean_i −log p_{i,y_i}."""
    if loss == "mse":
        return (probs - F.one_hot(labels, probs.shape[1]).to(probs.dtype)).square().mean()
    return -log_probs.gather(1, labels.unsqueeze(1)).mean()


@dataclass(frozen=True, kw_only=True)
class EnsembleTemperatureScalingConfig(PostHocConfig):
    """Ensemble temperature scaling as a method, fitted on the cached validation logits (docs/methods.md §5).

    Attributes:
        objective: "mse" (default, the official code's) or "ce": the loss of both stages (T, then w).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    objective: Literal["mse", "ce"] = "mse"


@POSTHOC.register("ensemble_ts")
class EnsembleTemperatureScaling(PostHocCalibrator):
    """p = w1 softmax(z/T) + w2 softmax(z) + w3/C: T by the loss, then w on the simplex by the same loss.

    Args:
        objective: the loss, "mse" (default, the official ``ets_calibrate``) or "ce".

    After :meth:`fit`: ``temperature`` (0-dim) and ``weights`` (w1, w2, w3) (float64 buffers).
    """

    def __init__(self, objective: Literal["mse", "ce"] = EnsembleTemperatureScalingConfig.objective) -> None:
        super().__init__()
        check_values(EnsembleTemperatureScalingConfig, locals())
        self.objective = objective
        self.register_buffer("temperature", torch.tensor(1.0, dtype=torch.float64))
        self.register_buffer("weights", torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))

    def _fit_temperature(self, z: torch.Tensor, y: torch.Tensor) -> float:
        def loss_and_grad(x: np.ndarray) -> tuple[float, np.ndarray]:
            temperature = torch.tensor(float(x[0]), dtype=torch.float64, requires_grad=True)
            scaled = z / temperature
            value = ets_loss(scaled.softmax(1), F.log_softmax(scaled, 1), y, self.objective)
            value.backward()
            return float(value.detach()), np.array([float(temperature.grad)])

        result = scipy.optimize.minimize(loss_and_grad, np.array([1.0]), jac=True, method="L-BFGS-B",
                                         bounds=[TEMPERATURE_BOUNDS], tol=1e-12)
        return float(np.clip(result.x[0], *TEMPERATURE_BOUNDS))

    def _fit_weights(self, z: torch.Tensor, y: torch.Tensor, temperature: float) -> np.ndarray:
        components = torch.stack([(z / temperature).softmax(1), z.softmax(1),
                                  torch.full_like(z, 1.0 / z.shape[1])])

        def loss_and_grad(x: np.ndarray) -> tuple[float, np.ndarray]:
            weights = torch.tensor(x, dtype=torch.float64, requires_grad=True)
            mixture = (weights[:, None, None] * components).sum(0)
            if self.objective == "mse":
                mixture = mixture / weights.sum()  # the official mse_w renormalises the rows
            log_mixture = mixture.clamp_min(torch.finfo(torch.float64).tiny).log()
            value = ets_loss(mixture, log_mixture, y, self.objective)
            value.backward()
            return float(value.detach()), weights.grad.numpy().copy()

        constraint = {"type": "eq", "fun": lambda x: float(np.sum(x)) - 1.0, "jac": lambda x: np.ones(3)}
        result = scipy.optimize.minimize(loss_and_grad, np.array([1.0, 0.0, 0.0]), jac=True, method="SLSQP",
                                         bounds=[(0.0, 1.0)] * 3, constraints=constraint, tol=1e-12)
        weights = np.clip(result.x, 0.0, 1.0)
        return weights / weights.sum()

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> EnsembleTemperatureScaling:
        """Fit T, then (w1, w2, w3), on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        with threadpool_limits(limits=1, user_api="blas"):  # scipy's small linear algebra: no competing threads
            temperature = self._fit_temperature(z, y)
            weights = self._fit_weights(z, y, temperature)
        if not (math.isfinite(temperature) and np.isfinite(weights).all()):
            raise FloatingPointError(f"The ensemble TS fit ended at T={temperature}, w={weights.tolist()}.")
        self.temperature.fill_(temperature)
        self.weights = torch.from_numpy(weights)
        reasons = []
        if temperature in TEMPERATURE_BOUNDS:
            reasons.append(f"the stage-1 temperature sits at the bound T = {temperature:g} of "
                           f"[{TEMPERATURE_BOUNDS[0]:g}, {TEMPERATURE_BOUNDS[1]:g}]: the loss-optimal T lies beyond it")
        self._finish_fit(reasons)
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """log p = log(w1 softmax(z/T) + w2 softmax(z) + w3/C), by logsumexp (−inf terms for zero weights)."""
        self.check_fitted()
        z = logits.to(torch.float64)
        weights = self.weights.to(z.device)
        terms = torch.stack([
            weights[0].log() + F.log_softmax(z / self.temperature.to(z.device), 1),
            weights[1].log() + F.log_softmax(z, 1),
            (weights[2] / z.shape[1]).log().expand_as(z),
        ])
        return torch.logsumexp(terms, dim=0).to(logits.dtype)


register_posthoc_method(
    "ensemble_ts", EnsembleTemperatureScalingConfig, EnsembleTemperatureScaling,
    "ensemble temperature scaling (Mix-n-Match: TS, uncalibrated and uniform mixed) fitted on the validation logits",
    label="ETS", order=5,
)
