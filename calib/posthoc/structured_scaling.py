"""Structured matrix scaling (SMS) and structured vector scaling (SVS) (Berta, Holzmüller, Jordan, Bach, "Structured
Matrix Scaling for Multi-Class Calibration", AISTATS 2026, arXiv 2511.03685), docs/methods.md §5.14.

Preprocessing ("ts-mix"): temperature scaling fitted by NLL on the calibration set, then Laplace smoothing, a mixture
with the uniform distribution whose weight ε = 1/(n + 1) shrinks with the n calibration samples:

    q = (1 − ε)·softmax(z / T) + ε/K,   x = log q                       (K classes)

Map (a = 1 after the temperature; SVS: M = 0):

    SMS   calibrated logits = (I + diag(v) + M) x + b      M ∈ R^{K×K} zero on the diagonal   (K² + K parameters)
    SVS   calibrated logits = (1 + v) ⊙ x + b                                                  (2K parameters)

Objective: the mean NLL plus a ridge penalty on each group of deviations from the preprocessed map, its strength
growing with the group's size and falling with n:

    L = NLL + c_b ‖b‖² + c_v ‖v‖² + c_M ‖M‖²_F
    c_b = λ_b K^ρ / n^τ,   c_v = λ_v K^ρ / n^τ,   c_M = λ_M (K(K−1))^ρ / n^τ

Defaults λ_b = λ_v = λ_M = 1, ρ = τ = 1: fixed, not chosen per data set. They are the paper's published defaults
(probmetrics 1.3 ``SMSCalibrator()`` / ``SVSCalibrator()``, ``get_calibrator("sms")``, which CalArena and the paper's
benchmarks run as they are); the paper chose them once, offline, by a search over ρ ∈ {−1, −½, 0, ½, 1},
τ ∈ {½, 1, 3/2, 2} and λ ∈ [0.01, 100] on half of its TabRepo multi-class data sets, where tuned values did no better
than these on the other half (eugeneberta/LogisticCalibrationBenchmark ``hyperparameter_search.ipynb``). Only the
ridge penalty is implemented (the paper's default and the only one of its BFGS solver; its SAGA solver also offers
lasso, group lasso and MCP).

Fit: every deviation starts at 0 (the preprocessed map) and runs in float64 to max|∂L/∂u| < 1e-6, u each group
multiplied by sqrt(1 + 2c), its penalty's curvature, so a strong penalty stays well conditioned, with the loss and
its derivatives written out (calib/posthoc/_affine_fit.py): SVS by Newton's method with the exact Hessian
(:func:`~calib.posthoc._affine_fit.fit_per_class_affine`), SMS by Jacobi-scaled L-BFGS-B
(:func:`~calib.posthoc._affine_fit.fit_full_affine`). Every parameter is penalised, so the optimum is finite and
unique. Neither
map keeps the argmax in general (per-class scales, cross terms and intercepts reorder classes); the preprocessing
alone does.

K = 2: the paper and CalArena use SMS and SVS for multi-class problems only (for binary ones probmetrics'
``LogisticCalibrator`` switches to quadratic or affine scaling, and CalArena's binary list has neither SMS nor SVS),
but the model is well defined at K = 2 and probmetrics' ``SMSCalibrator`` fits it there too: calib fits the same
model at every K >= 2.

Differences from probmetrics 1.3: x in float64 (probmetrics rounds q to float32 before the log and clips log q at
log of the smallest normal float32, which q >= ε/K never reaches here); T is calib's converged NLL temperature,
held in [0.05, 20] (probmetrics: 30 bisection steps on log(1/T) in [−16, 16]); the fit runs to a 1e-6 gradient in
float64 (probmetrics: torchmin BFGS or, above 1,000 parameters, L-BFGS, gradient tolerance 1e-5, in float32).

Degenerate (``degenerate_reason``, a ``DegenerateFitWarning``): a degenerate temperature (held at a bound,
:class:`~calib.posthoc.TemperatureScaling`), a class without calibration samples (its parameters are held by the
penalty alone), an unconverged fit.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from calib._config import check_values, checked_field, number
from calib.posthoc._affine_fit import fit_full_affine, fit_per_class_affine
from calib.posthoc._base import (
    POSTHOC,
    PostHocCalibrator,
    absent_classes,
    check_logits_labels,
    describe_classes,
)
from calib.posthoc._lbfgs import GRAD_TOLERANCE, LBFGSResult
from calib.posthoc._method import PostHocConfig, register_posthoc_method
from calib.posthoc.temperature_scaling import fit_first_temperature

__all__ = [
    "StructuredMatrixScaling",
    "StructuredMatrixScalingConfig",
    "StructuredVectorScaling",
    "StructuredVectorScalingConfig",
    "penalty_coefficients",
    "smoothed_log_probabilities",
]

DEFAULT_STRENGTH = 1.0
"""λ_b = λ_v = λ_M (probmetrics 1.3 ``SMSCalibrator`` / ``SVSCalibrator`` defaults)."""

DEFAULT_EXPONENT = 1.0
"""ρ = τ (the same)."""


def smoothed_log_probabilities(logits: torch.Tensor, temperature: float, mixture_weight: float) -> torch.Tensor:
    """x = log((1 − ε)·softmax(z / T) + ε/K) of float64 logits z (N, K), computed in the log domain (finite for
    every ε > 0)."""
    num_classes = logits.shape[1]
    tempered = F.log_softmax(logits / temperature, dim=1) + math.log1p(-mixture_weight)
    return torch.logaddexp(tempered, torch.tensor(math.log(mixture_weight / num_classes), dtype=logits.dtype))


def penalty_coefficients(num_classes: int, num_samples: int, *, intercept_strength: float, diagonal_strength: float,
                         off_diagonal_strength: float, class_exponent: float,
                         sample_exponent: float) -> tuple[float, float, float]:
    """(c_b, c_v, c_M) = (λ_b K^ρ, λ_v K^ρ, λ_M (K(K−1))^ρ) / n^τ.

    >>> penalty_coefficients(100, 5000, intercept_strength=1, diagonal_strength=1, off_diagonal_strength=1,
    ...                      class_exponent=1, sample_exponent=1)
    (0.02, 0.02, 1.98)
    """
    samples = num_samples**sample_exponent
    return (intercept_strength * num_classes**class_exponent / samples,
            diagonal_strength * num_classes**class_exponent / samples,
            off_diagonal_strength * (num_classes * (num_classes - 1)) ** class_exponent / samples)


@dataclass(frozen=True, kw_only=True)
class StructuredVectorScalingConfig(PostHocConfig):
    """SVS as a method, fitted on the cached validation logits (docs/methods.md §5.14).

    The defaults are the paper's, fixed (probmetrics 1.3 ``get_calibrator("svs")``, what CalArena runs); the
    ridge coefficients the fit used are stored in the trial's row (``fitted_intercept_penalty``,
    ``fitted_diagonal_penalty``), with the preprocessing's T and ε (``fitted_temperature``, ``fitted_mixture_weight``).

    Attributes:
        intercept_strength: λ_b >= 0 (1) of c_b = λ_b K^ρ / n^τ.
        diagonal_strength: λ_v >= 0 (1) of c_v = λ_v K^ρ / n^τ.
        class_exponent: ρ (1), a finite number.
        sample_exponent: τ (1), a finite number.
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    intercept_strength: float = checked_field(DEFAULT_STRENGTH, number(at_least=0))
    diagonal_strength: float = checked_field(DEFAULT_STRENGTH, number(at_least=0))
    class_exponent: float = checked_field(DEFAULT_EXPONENT, number())
    sample_exponent: float = checked_field(DEFAULT_EXPONENT, number())


@dataclass(frozen=True, kw_only=True)
class StructuredMatrixScalingConfig(StructuredVectorScalingConfig):
    """SMS as a method, fitted on the cached validation logits (docs/methods.md §5.14): SVS's fields and checks, and
    ``off_diagonal_strength`` λ_M >= 0 (1) of c_M = λ_M (K(K−1))^ρ / n^τ (stored as ``fitted_off_diagonal_penalty``).
    """

    off_diagonal_strength: float = checked_field(DEFAULT_STRENGTH, number(at_least=0))


class _StructuredScaling(PostHocCalibrator):
    """The preprocessing, penalties, fit and store columns SMS and SVS share; subclasses say how the deviations
    (``weight_deviation``: M + diag(v), or v; ``bias``: b) map x and which groups they penalise."""

    name = "structured scaling"
    has_off_diagonal = False
    """Whether the map has the off-diagonal entries M (SMS) and so a c_M to store."""

    def __init__(self, *, intercept_strength: float, diagonal_strength: float, off_diagonal_strength: float,
                 class_exponent: float, sample_exponent: float, grad_tolerance: float) -> None:
        super().__init__()
        check_values(StructuredMatrixScalingConfig, locals())
        number(above=0).check("grad_tolerance", grad_tolerance)
        self.strengths = {"intercept_strength": intercept_strength, "diagonal_strength": diagonal_strength,
                          "off_diagonal_strength": off_diagonal_strength, "class_exponent": class_exponent,
                          "sample_exponent": sample_exponent}
        self.grad_tolerance = grad_tolerance
        self.register_buffer("weight_deviation", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("bias", torch.zeros(0, dtype=torch.float64))
        self.temperature = self.mixture_weight = math.nan
        self.coefficients = (math.nan, math.nan, math.nan)
        self.fit_result: LBFGSResult | None = None

    @abc.abstractmethod
    def fit_deviations(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, LBFGSResult]:
        """(weight deviations, b, how the fit ended) minimising L on float64 features x (N, K) and labels y, from 0."""

    @abc.abstractmethod
    def apply_map(self, x: torch.Tensor, weight_deviation: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The calibrated logits of features x under the deviations."""

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> _StructuredScaling:
        """Fit T, then the deviations, on logits z (N, K >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        num_samples, num_classes = z.shape
        preprocessing = fit_first_temperature(z, y)  # a degenerate temperature is among this fit's own reasons
        self.temperature, self.mixture_weight = preprocessing.temperature.item(), 1.0 / (num_samples + 1)
        x = smoothed_log_probabilities(z, self.temperature, self.mixture_weight)
        self.coefficients = penalty_coefficients(num_classes, num_samples, **self.strengths)
        weight_deviation, bias, self.fit_result = self.fit_deviations(x.numpy(), y.numpy())
        self.weight_deviation, self.bias = torch.from_numpy(weight_deviation), torch.from_numpy(bias)
        reasons = []
        if preprocessing.degenerate:
            reasons.append(f"the temperature-scaling preprocessing: {preprocessing.degenerate_reason}")
        absent = absent_classes(y, num_classes)
        if absent:
            reasons.append(f"{describe_classes(absent, num_classes)} absent from the calibration set: their "
                           f"parameters are fitted only to push their probabilities down, held by the ridge "
                           f"penalty alone")
        if not self.fit_result.converged:
            reasons.append(f"the fit did not converge (max|∂L/∂u| = {self.fit_result.grad_max_abs:.3g} after "
                           f"{self.fit_result.steps} steps)")
        self._finish_fit(reasons)
        return self

    def fit_details(self) -> dict[str, Any]:
        """The base fit columns, the preprocessing's T and ε, and the ridge coefficients c_b, c_v, c_M used."""
        intercept, diagonal, off_diagonal = self.coefficients
        return {**super().fit_details(), "fitted_temperature": self.temperature,
                "fitted_mixture_weight": self.mixture_weight, "fitted_intercept_penalty": intercept,
                "fitted_diagonal_penalty": diagonal,
                "fitted_off_diagonal_penalty": off_diagonal if self.has_off_diagonal else None}

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """The calibrated logits of the smoothed, tempered log-probabilities x."""
        z = self.fitted_logits(logits, self.bias.shape[0])
        x = smoothed_log_probabilities(z, self.temperature, self.mixture_weight)
        return self.apply_map(x, self.weight_deviation.to(x.device), self.bias.to(x.device)).to(logits.dtype)


@POSTHOC.register("svs")
class StructuredVectorScaling(_StructuredScaling):
    """SVS: calibrated logits (1 + v) ⊙ x + b of the ts-mix log-probabilities x, NLL + c_b ‖b‖² + c_v ‖v‖².

    Args:
        intercept_strength: λ_b >= 0 (1).
        diagonal_strength: λ_v >= 0 (1).
        class_exponent: ρ (1), the power of K in c_b and c_v.
        sample_exponent: τ (1), the power of n they are divided by.
        grad_tolerance: the fit ends once max|∂L/∂u| is below it (1e-6).

    After :meth:`fit`: ``weight_deviation`` v (K,) and ``bias`` b (K,) (float64 buffers), ``temperature`` T,
    ``mixture_weight`` ε, ``coefficients`` (c_b, c_v, c_M) and ``fit_result``.
    """

    name = "structured vector scaling"

    def __init__(self, *, intercept_strength: float = StructuredVectorScalingConfig.intercept_strength,
                 diagonal_strength: float = StructuredVectorScalingConfig.diagonal_strength,
                 class_exponent: float = StructuredVectorScalingConfig.class_exponent,
                 sample_exponent: float = StructuredVectorScalingConfig.sample_exponent,
                 grad_tolerance: float = GRAD_TOLERANCE) -> None:
        super().__init__(intercept_strength=intercept_strength, diagonal_strength=diagonal_strength,
                         off_diagonal_strength=0.0, class_exponent=class_exponent, sample_exponent=sample_exponent,
                         grad_tolerance=grad_tolerance)

    def fit_deviations(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, LBFGSResult]:
        """v and b by Newton's method (:func:`~calib.posthoc._affine_fit.fit_per_class_affine` on w = 1 + v)."""
        intercept_penalty, diagonal_penalty, _ = self.coefficients
        weight, bias, result = fit_per_class_affine(x, y, weight_penalty=diagonal_penalty,
                                                    bias_penalty=intercept_penalty, grad_tolerance=self.grad_tolerance)
        return weight - 1.0, bias, result

    def apply_map(self, x: torch.Tensor, weight_deviation: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """(1 + v) ⊙ x + b."""
        return x + x * weight_deviation + bias


@POSTHOC.register("sms")
class StructuredMatrixScaling(_StructuredScaling):
    """SMS: calibrated logits (I + diag(v) + M) x + b of the ts-mix log-probabilities x,
    NLL + c_b ‖b‖² + c_v ‖v‖² + c_M ‖M‖²_F.

    Args:
        intercept_strength: λ_b >= 0 (1).
        diagonal_strength: λ_v >= 0 (1).
        off_diagonal_strength: λ_M >= 0 (1).
        class_exponent: ρ (1): c_b, c_v grow as K^ρ, c_M as (K(K−1))^ρ.
        sample_exponent: τ (1), the power of n they are divided by.
        grad_tolerance: the fit ends once max|∂L/∂u| is below it (1e-6).

    After :meth:`fit`: ``weight_deviation`` diag(v) + M (K, K) and ``bias`` b (K,) (float64 buffers),
    ``temperature`` T, ``mixture_weight`` ε, ``coefficients`` (c_b, c_v, c_M) and ``fit_result``.
    """

    name = "structured matrix scaling"
    has_off_diagonal = True

    def __init__(self, *, intercept_strength: float = StructuredMatrixScalingConfig.intercept_strength,
                 diagonal_strength: float = StructuredMatrixScalingConfig.diagonal_strength,
                 off_diagonal_strength: float = StructuredMatrixScalingConfig.off_diagonal_strength,
                 class_exponent: float = StructuredMatrixScalingConfig.class_exponent,
                 sample_exponent: float = StructuredMatrixScalingConfig.sample_exponent,
                 grad_tolerance: float = GRAD_TOLERANCE) -> None:
        super().__init__(intercept_strength=intercept_strength, diagonal_strength=diagonal_strength,
                         off_diagonal_strength=off_diagonal_strength, class_exponent=class_exponent,
                         sample_exponent=sample_exponent, grad_tolerance=grad_tolerance)

    def fit_deviations(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, LBFGSResult]:
        """diag(v) + M and b by Jacobi-scaled L-BFGS-B (:func:`~calib.posthoc._affine_fit.fit_full_affine`): c_v on
        the diagonal, c_M off it."""
        intercept_penalty, diagonal_penalty, off_diagonal_penalty = self.coefficients
        num_classes = x.shape[1]
        weight_penalty = np.full((num_classes, num_classes), off_diagonal_penalty)
        np.fill_diagonal(weight_penalty, diagonal_penalty)
        return fit_full_affine(x, y, weight_penalty=weight_penalty, bias_penalty=intercept_penalty,
                               grad_tolerance=self.grad_tolerance)

    def apply_map(self, x: torch.Tensor, weight_deviation: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x + (diag(v) + M) x + b, row-wise."""
        return torch.addmm(x + bias, x, weight_deviation.T)


register_posthoc_method(
    "svs", StructuredVectorScalingConfig, StructuredVectorScaling,
    "structured vector scaling (ridge-penalised per-class scale and intercept after TS) fitted on the validation "
    "logits",
    label="SVS", order=10,
)
register_posthoc_method(
    "sms", StructuredMatrixScalingConfig, StructuredMatrixScaling,
    "structured matrix scaling (ridge-penalised affine map of the log-probabilities after TS) fitted on the "
    "validation logits",
    label="SMS", order=9,
)
