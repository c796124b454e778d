"""Class-wise temperature scaling (after Frenkel & Goldberger, "Network calibration by class-based
temperature scaling", EUSIPCO 2021), docs/methods.md §5.

One temperature per class:

    calibrated logits_k = z_k / T_k,   T_k = exp(τ_k) > 0,   k = 1 … C

Objective: the mean NLL, minimised over τ from the temperature-scaling solution (τ_k = log T_TS for
every k, T_TS the NLL-optimal single temperature of :class:`TemperatureScaling`) by full-batch float64
LBFGS with the strong-Wolfe line search until max|∂NLL/∂τ| < 1e-6 (:func:`fit_lbfgs`). Frenkel &
Goldberger instead minimise the validation ECE by a greedy per-class grid search (T_k ∈ {0.1, …, 10},
accepting a change only if the accuracy does not drop); this file uses their model with the NLL
objective. Dividing classes by different temperatures can change the argmax.

Degenerate fits (``degenerate_reason``, a ``DegenerateFitWarning``): a class without calibration samples (its
T_k is fitted only to push p_k down, with no finite optimum where its logits all have one sign), an unconverged
or separated fit (:func:`~calib.posthoc.vector_scaling.affine_fit_problems`), and any T_k that ends outside
TS's :data:`~calib.posthoc.temperature_scaling.TEMPERATURE_RANGE`, which is then held at the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from calib.posthoc._base import (
    POSTHOC,
    PostHocCalibrator,
    absent_classes,
    check_logits_labels,
    describe_classes,
)
from calib.posthoc._method import PostHocConfig, register_posthoc_method
from calib.posthoc.temperature_scaling import TEMPERATURE_RANGE, fit_first_temperature
from calib.posthoc.vector_scaling import GRAD_TOLERANCE, LBFGSResult, affine_fit_problems, fit_lbfgs

__all__ = ["ClasswiseTemperatureScaling", "ClasswiseTemperatureScalingConfig"]


@POSTHOC.register("classwise_ts")
class ClasswiseTemperatureScaling(PostHocCalibrator):
    """Divide logit k by its own fitted temperature T_k > 0 (NLL, from the TS solution).

    After :meth:`fit`: ``temperatures`` (float64 buffer, shape (C,)), ``initial_temperature`` (T_TS)
    and ``fit_result`` (:class:`~calib.posthoc.vector_scaling.LBFGSResult`).
    """

    def __init__(self, *, grad_tolerance: float = GRAD_TOLERANCE) -> None:
        super().__init__()
        if not grad_tolerance > 0:
            raise ValueError(f"`grad_tolerance` must be > 0, got grad_tolerance={grad_tolerance}.")
        self.grad_tolerance = grad_tolerance
        self.register_buffer("temperatures", torch.ones(0, dtype=torch.float64))
        self.initial_temperature = math.nan
        self.fit_result: LBFGSResult | None = None

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> ClasswiseTemperatureScaling:
        """Fit T_1 … T_C on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        # a degenerate TS start shows in this fit's own checks
        self.initial_temperature = fit_first_temperature(z, y).temperature.item()
        log_temperatures = nn.Parameter(torch.full((z.shape[1],), math.log(self.initial_temperature),
                                                   dtype=torch.float64))

        def objective() -> torch.Tensor:
            return F.cross_entropy(z / log_temperatures.exp(), y)

        self.fit_result = fit_lbfgs([log_temperatures], objective, what="class-wise temperature scaling",
                                    grad_tolerance=self.grad_tolerance, warn=False)
        temperatures = log_temperatures.detach().exp()
        if not (torch.isfinite(temperatures).all() and (temperatures > 0).all()):
            raise FloatingPointError(f"The class-wise temperature fit ended at T={temperatures.tolist()}; "
                                     f"every T_k must be finite and > 0.")
        num_classes = z.shape[1]
        absent = absent_classes(y, num_classes)
        note = (f"{describe_classes(absent, num_classes)} absent from the calibration set: their temperatures are "
                f"fitted only to push their probabilities down") if absent else None
        reasons = affine_fit_problems(z / temperatures, y, self.fit_result, absent=note)
        low, high = TEMPERATURE_RANGE
        outside = [k for k in range(num_classes) if not low <= float(temperatures[k]) <= high]
        if outside:
            reasons.append(f"the temperatures of {describe_classes(outside, num_classes)} ended outside "
                           f"[{low:g}, {high:g}] (from {float(temperatures.min()):.3g} to "
                           f"{float(temperatures.max()):.3g}); they are held at the bounds")
        self.temperatures = temperatures.clamp(low, high)
        self._finish_fit(reasons)
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """z_k / T_k."""
        z = self.fitted_logits(logits, self.temperatures.shape[0])
        return (z / self.temperatures.to(logits.device)).to(logits.dtype)


@dataclass(frozen=True, kw_only=True)
class ClasswiseTemperatureScalingConfig(PostHocConfig):
    """Class-wise temperature scaling as a method, fitted on the cached validation logits (docs/methods.md §5).

    No hyperparameters: NLL from the TS solution, LBFGS to convergence (see
    :class:`ClasswiseTemperatureScaling`).

    Attributes:
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """


register_posthoc_method(
    "classwise_ts", ClasswiseTemperatureScalingConfig, ClasswiseTemperatureScaling,
    "class-wise temperature scaling (one temperature per class, NLL) fitted on the validation logits",
    label="CTS", order=3,
)
