"""Vector scaling (Guo et al., ICML 2017) and matrix scaling with ODIR (Kull et al., NeurIPS 2019), docs/methods.md §5.

Affine maps of the logits z ∈ R^C, fitted on the calibration set:

    vector scaling   calibrated logits = w ⊙ z + b       w, b ∈ R^C          (2C parameters)
    matrix scaling   calibrated logits = W z + b         W ∈ R^{C×C}, b ∈ R^C (C² + C parameters)

Both minimise the mean NLL plus a penalty; matrix scaling uses Kull et al.'s Off-Diagonal and
Intercept Regularisation (ODIR), which leaves the diagonal of W free:

    L(W, b) = NLL(W, b) + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j²

Vector scaling is plain NLL by default (Guo et al.; Kull et al.'s VecS, ``tune_cal_guo.py``, and
dirichletcal's ``VectorScaling(reg_mu_list=[None])`` are unregularised); ``intercept_weight`` μ adds
ODIR's intercept term μ/C Σ_j b_j² (its off-diagonal term is void for a diagonal map). Both start
from the identity (w = 1 or W = I, b = 0) and run full-batch float64 LBFGS with the strong-Wolfe line
search until max|∂L/∂u| < 1e-6 (:func:`fit_lbfgs`, also used by Dirichlet calibration and class-wise
TS), where u are the parameters with each penalised entry divided by sqrt(1 + κ), κ its penalty's
curvature (2λ/(C(C−1)) or 2μ/C): the same optimum, but a strong penalty stays well conditioned.
Neither preserves the argmax: per-class scales and intercepts can reorder the classes.

Official code: dirichletcal/dirichlet_python (``calib/multinomial.py``: ``MultinomialRegression`` with
``reg_norm=True`` is this ODIR normalisation), dirichletcal/experiments_dnn.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from calib._config import check
from calib.posthoc._base import POSTHOC, PostHocCalibrator, check_logits_labels
from calib.posthoc._method import PostHocConfig, register_posthoc_method

__all__ = [
    "DEFAULT_INTERCEPT_WEIGHT",
    "DEFAULT_OFF_DIAGONAL_WEIGHT",
    "GRAD_TOLERANCE",
    "LBFGSResult",
    "MatrixScaling",
    "MatrixScalingConfig",
    "VectorScaling",
    "VectorScalingConfig",
    "fit_lbfgs",
    "odir_penalty",
]

GRAD_TOLERANCE = 1e-6
"""The LBFGS fits end once max|∂L/∂u| < GRAD_TOLERANCE over the fitted parameters u (a ``RuntimeWarning``
if never reached)."""

MAX_LBFGS_STEPS = 100
"""At most this many ``LBFGS.step`` calls of up to :data:`LBFGS_MAX_ITER` iterations each."""

LBFGS_MAX_ITER = 100
"""LBFGS iterations per ``step``."""

DEFAULT_OFF_DIAGONAL_WEIGHT = 1000.0
"""Default ODIR λ. Kull et al. pick λ and μ by 5-fold cross-validation (``tune_cal_odir.py``: per-entry
coefficients λ/(C(C−1)) ∈ {0.25, 0.5, 1}·10^{−5…6}, 10^{−2…6} for 100 classes, μ/C ∈ 10^{−5…6}); the
values CV chose for their CIFAR-10/100 nets (dirichletcal/experiments_dnn, results notebook, Dir-ODIR and
MS-ODIR) have per-entry off-diagonal coefficients 0.1 … 5000. λ = 1000 gives 11 for C = 10, 0.1 for C = 100."""

DEFAULT_INTERCEPT_WEIGHT = 0.1
"""Default ODIR μ: per-entry intercept coefficient μ/C = 0.01 for C = 10, the median of the intercept
coefficients CV chose for Kull et al.'s Dir-ODIR on CIFAR (1e-5 … 1e6, same notebook)."""


@dataclass
class LBFGSResult:
    """How an LBFGS fit ended: the objective, max|∂L/∂u| there, ``step`` calls, whether it converged."""

    loss: float
    grad_max_abs: float
    steps: int
    converged: bool


def fit_lbfgs(
    parameters: list[nn.Parameter],
    objective: Callable[[], torch.Tensor],
    *,
    what: str,
    grad_tolerance: float = GRAD_TOLERANCE,
    max_iter: int = LBFGS_MAX_ITER,
    max_steps: int = MAX_LBFGS_STEPS,
) -> LBFGSResult:
    """Minimise ``objective()`` over ``parameters`` in place with full-batch float64 LBFGS.

    ``torch.optim.LBFGS`` (lr 1, strong-Wolfe line search, ``max_iter`` iterations and 25·``max_iter``
    evaluations per step, history 100) is stepped again until max|∂L/∂u| < ``grad_tolerance`` (at most
    ``max_steps`` steps); a step that makes no progress restarts LBFGS once with fresh memory. If the
    tolerance is never reached the parameters stay where LBFGS ended and a ``RuntimeWarning`` names
    ``what``; a non-finite objective is a ``FloatingPointError``.
    """

    def closure() -> torch.Tensor:
        for parameter in parameters:
            parameter.grad = None
        loss = objective()
        loss.backward()
        return loss

    def evaluate() -> tuple[float, float]:
        loss = float(closure().detach())
        if not math.isfinite(loss):
            raise FloatingPointError(f"The {what} fit reached a non-finite objective ({loss}).")
        return loss, max(float(parameter.grad.abs().max()) for parameter in parameters)

    def new_lbfgs() -> torch.optim.LBFGS:
        return torch.optim.LBFGS(parameters, lr=1, max_iter=max_iter, max_eval=25 * max_iter,
                                 tolerance_grad=grad_tolerance, tolerance_change=1e-15, history_size=100,
                                 line_search_fn="strong_wolfe")

    loss, grad = evaluate()
    lbfgs, restarted, steps = new_lbfgs(), False, 0
    while not grad < grad_tolerance and steps < max_steps:
        steps += 1
        before = [parameter.detach().clone() for parameter in parameters]
        lbfgs.step(closure)
        new_loss, grad = evaluate()
        moved = any(not torch.equal(old, parameter.detach()) for old, parameter in zip(before, parameters, strict=True))
        if not moved or not new_loss < loss:  # no progress: restart once with fresh memory, then give up
            if restarted:
                loss = new_loss
                break
            lbfgs, restarted = new_lbfgs(), True
        else:
            restarted = False
        loss = new_loss
    converged = grad < grad_tolerance
    if not converged:
        warnings.warn(f"The {what} LBFGS fit stopped at max|∂L/∂u|={grad:.3g} after {steps} steps of up to "
                      f"{max_iter} iterations (tolerance {grad_tolerance:g}); objective {loss:.10g}.",
                      RuntimeWarning, stacklevel=3)
    return LBFGSResult(loss, grad, steps, converged)


def odir_penalty(weight: torch.Tensor, bias: torch.Tensor, off_diagonal_weight: float,
                 intercept_weight: float) -> torch.Tensor:
    """ODIR: λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² for W (C, C) and b (C,) (Kull et al. 2019, §3)."""
    num_classes = bias.shape[0]
    off_diagonal = weight - torch.diag_embed(weight.diagonal())
    penalty = intercept_weight * bias.square().sum() / num_classes
    if num_classes > 1:
        penalty = penalty + off_diagonal_weight * off_diagonal.square().sum() / (num_classes * (num_classes - 1))
    return penalty


def _preconditioner(curvature: float) -> float:
    """1/sqrt(1 + κ): LBFGS fits u with θ = u/sqrt(1 + κ) for a parameter θ under an L2 penalty of curvature κ,
    so that a strong penalty (large λ or μ) does not make the problem ill-conditioned."""
    return 1.0 / math.sqrt(1.0 + curvature)


def _check_weights(**weights: float) -> None:
    for name, value in weights.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"`{name}` must be a finite number >= 0, got {name}={value!r}.")


def _check_num_classes(logits: torch.Tensor, num_classes: int, name: str) -> None:
    if logits.ndim != 2 or logits.shape[1] != num_classes:
        raise ValueError(f"{name} was fitted on C={num_classes} classes; `logits` must have shape (N, {num_classes}), "
                         f"got {tuple(logits.shape)}.")


@POSTHOC.register("vector_scaling")
class VectorScaling(PostHocCalibrator):
    """Vector scaling: calibrated logits w ⊙ z + b (Guo et al. 2017, §4.2).

    Fits w (C,) and b (C,) from w = 1, b = 0 by minimising NLL + μ/C Σ_j b_j² (μ = ``intercept_weight``,
    0: plain NLL, the default) with :func:`fit_lbfgs` (b preconditioned by 1/sqrt(1 + 2μ/C)). With μ = 0
    a class absent from the calibration set has no finite optimum (b_k → −∞); the fit stops once the
    gradient is below tolerance, where the mean p_k is below 1e-6.

    After :meth:`fit`: ``weight`` and ``bias`` (float64 buffers, shape (C,)), ``fit_result``
    (:class:`LBFGSResult`).
    """

    def __init__(self, *, intercept_weight: float = 0.0, grad_tolerance: float = GRAD_TOLERANCE) -> None:
        super().__init__()
        _check_weights(intercept_weight=intercept_weight)
        if not grad_tolerance > 0:
            raise ValueError(f"`grad_tolerance` must be > 0, got grad_tolerance={grad_tolerance}.")
        self.intercept_weight, self.grad_tolerance = intercept_weight, grad_tolerance
        self.register_buffer("weight", torch.ones(0, dtype=torch.float64))
        self.register_buffer("bias", torch.zeros(0, dtype=torch.float64))
        self.fit_result: LBFGSResult | None = None

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> VectorScaling:
        """Fit w and b on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        num_classes = z.shape[1]
        bias_scale = _preconditioner(2 * self.intercept_weight / num_classes)
        weight = nn.Parameter(torch.ones(num_classes, dtype=torch.float64))
        scaled_bias = nn.Parameter(torch.zeros(num_classes, dtype=torch.float64))

        def objective() -> torch.Tensor:
            bias = bias_scale * scaled_bias
            return F.cross_entropy(z * weight + bias, y) + self.intercept_weight * bias.square().sum() / num_classes

        self.fit_result = fit_lbfgs([weight, scaled_bias], objective, what="vector scaling",
                                    grad_tolerance=self.grad_tolerance)
        self.weight, self.bias = weight.detach().clone(), bias_scale * scaled_bias.detach()
        self.is_fitted = True
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """w ⊙ z + b."""
        self.check_fitted()
        _check_num_classes(logits, self.weight.shape[0], "VectorScaling")
        z = logits.to(torch.float64)
        return (z * self.weight.to(z.device) + self.bias.to(z.device)).to(logits.dtype)


@POSTHOC.register("matrix_scaling")
class MatrixScaling(PostHocCalibrator):
    """Matrix scaling with ODIR: calibrated logits W x + b of the features x = z (Kull et al. 2019, "MS-ODIR").

    Fits W (C, C) from the identity and b (C,) from 0 by minimising
    NLL + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² (:func:`odir_penalty`) with :func:`fit_lbfgs`, the
    off-diagonal entries preconditioned by 1/sqrt(1 + 2λ/(C(C−1))) and b by 1/sqrt(1 + 2μ/C).
    Subclasses change the features (:class:`~calib.posthoc.dirichlet.DirichletCalibration`: x = log p).

    Args:
        off_diagonal_weight: λ >= 0 (:data:`DEFAULT_OFF_DIAGONAL_WEIGHT`; the paper picks it by CV).
        intercept_weight: μ >= 0 (:data:`DEFAULT_INTERCEPT_WEIGHT`; the paper picks it by CV).
        grad_tolerance: the fit ends once max|∂L/∂u| is below it (1e-6).

    After :meth:`fit`: ``weight`` (C, C) and ``bias`` (C,) (float64 buffers), ``fit_result``.
    """

    name = "matrix scaling"

    def __init__(
        self,
        *,
        off_diagonal_weight: float = DEFAULT_OFF_DIAGONAL_WEIGHT,
        intercept_weight: float = DEFAULT_INTERCEPT_WEIGHT,
        grad_tolerance: float = GRAD_TOLERANCE,
    ) -> None:
        super().__init__()
        _check_weights(off_diagonal_weight=off_diagonal_weight, intercept_weight=intercept_weight)
        if not grad_tolerance > 0:
            raise ValueError(f"`grad_tolerance` must be > 0, got grad_tolerance={grad_tolerance}.")
        self.off_diagonal_weight, self.intercept_weight = off_diagonal_weight, intercept_weight
        self.grad_tolerance = grad_tolerance
        self.register_buffer("weight", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("bias", torch.zeros(0, dtype=torch.float64))
        self.fit_result: LBFGSResult | None = None

    def features(self, z: torch.Tensor) -> torch.Tensor:
        """The inputs x of the affine map, from float64 logits z: x = z."""
        return z

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> MatrixScaling:
        """Fit W and b on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        x, num_classes = self.features(z), z.shape[1]
        off_diagonal_mask = 1 - torch.eye(num_classes, dtype=torch.float64)
        off_scale = _preconditioner(2 * self.off_diagonal_weight / max(num_classes * (num_classes - 1), 1))
        bias_scale = _preconditioner(2 * self.intercept_weight / num_classes)
        diagonal = nn.Parameter(torch.ones(num_classes, dtype=torch.float64))
        scaled_off_diagonal = nn.Parameter(torch.zeros(num_classes, num_classes, dtype=torch.float64))
        scaled_bias = nn.Parameter(torch.zeros(num_classes, dtype=torch.float64))

        def weight_and_bias() -> tuple[torch.Tensor, torch.Tensor]:
            weight = torch.diag_embed(diagonal) + off_scale * scaled_off_diagonal * off_diagonal_mask
            return weight, bias_scale * scaled_bias

        def objective() -> torch.Tensor:
            weight, bias = weight_and_bias()
            return F.cross_entropy(x @ weight.T + bias, y) + odir_penalty(
                weight, bias, self.off_diagonal_weight, self.intercept_weight)

        self.fit_result = fit_lbfgs([diagonal, scaled_off_diagonal, scaled_bias], objective, what=self.name,
                                    grad_tolerance=self.grad_tolerance)
        with torch.no_grad():
            self.weight, self.bias = (tensor.detach().clone() for tensor in weight_and_bias())
        self.is_fitted = True
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """W x + b."""
        self.check_fitted()
        _check_num_classes(logits, self.bias.shape[0], type(self).__name__)
        x = self.features(logits.to(torch.float64))
        return (x @ self.weight.to(x.device).T + self.bias.to(x.device)).to(logits.dtype)


@dataclass(frozen=True, kw_only=True)
class VectorScalingConfig(PostHocConfig):
    """Vector scaling as a method, fitted on the cached validation logits (docs/methods.md §5).

    Attributes:
        intercept_weight: μ >= 0 of ODIR's intercept term μ/C Σ_j b_j² (0, the default: plain NLL as
            Guo et al. and Kull et al.'s VecS).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    intercept_weight: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.intercept_weight >= 0, "intercept_weight", self.intercept_weight, "be >= 0")


@dataclass(frozen=True, kw_only=True)
class MatrixScalingConfig(PostHocConfig):
    """Matrix scaling with ODIR as a method, fitted on the cached validation logits (docs/methods.md §5).

    Kull et al. choose λ and μ by 5-fold CV over a grid; the defaults are typical chosen values
    (:data:`DEFAULT_OFF_DIAGONAL_WEIGHT`, :data:`DEFAULT_INTERCEPT_WEIGHT`); search them for the paper's recipe.

    Attributes:
        off_diagonal_weight: λ >= 0 of λ/(C(C−1)) Σ_{i≠j} W_ij² (1000).
        intercept_weight: μ >= 0 of μ/C Σ_j b_j² (0.1).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    off_diagonal_weight: float = DEFAULT_OFF_DIAGONAL_WEIGHT
    intercept_weight: float = DEFAULT_INTERCEPT_WEIGHT

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.off_diagonal_weight >= 0, "off_diagonal_weight", self.off_diagonal_weight, "be >= 0")
        check(self.intercept_weight >= 0, "intercept_weight", self.intercept_weight, "be >= 0")


register_posthoc_method(
    "vector_scaling", VectorScalingConfig,
    lambda params, seed: VectorScaling(intercept_weight=params.intercept_weight),
    "vector scaling (per-class scale and intercept) fitted on the validation logits",
)
register_posthoc_method(
    "matrix_scaling", MatrixScalingConfig,
    lambda params, seed: MatrixScaling(off_diagonal_weight=params.off_diagonal_weight,
                                       intercept_weight=params.intercept_weight),
    "matrix scaling with ODIR (off-diagonal and intercept regularisation) fitted on the validation logits",
)
