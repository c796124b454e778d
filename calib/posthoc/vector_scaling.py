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
from the identity (w = 1 or W = I, b = 0) and run in float64 until max|∂L/∂u| < 1e-6, where u are the
parameters with each penalised entry multiplied by sqrt(1 + κ), κ its penalty's curvature (2λ/(C(C−1))
or 2μ/C): vector scaling by Newton's method with the exact Hessian
(:func:`~calib.posthoc._affine_fit.fit_per_class_affine`), matrix scaling by Jacobi-scaled L-BFGS-B with
the exact gradient (:func:`fit_odir`, Dirichlet calibration's too). :func:`fit_lbfgs` (torch LBFGS,
re-exported here) is TS's and class-wise TS's.
Neither preserves the argmax: per-class scales and intercepts can reorder the classes.

Official code: dirichletcal/dirichlet_python (``calib/multinomial.py``: ``MultinomialRegression`` with
``reg_norm=True`` is this ODIR normalisation), dirichletcal/experiments_dnn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from threadpoolctl import threadpool_limits
from torch.nn import functional as F

from calib._config import check_values, checked_field, number, or_null
from calib.posthoc._affine_fit import fit_per_class_affine
from calib.posthoc._base import POSTHOC, PostHocCalibrator, absent_classes, check_logits_labels, describe_classes
from calib.posthoc._lbfgs import GRAD_TOLERANCE, LBFGSResult, fit_lbfgs
from calib.posthoc._method import PostHocConfig, register_posthoc_method
from calib.posthoc.odir_cv import CV_FOLDS, ODIRSelection, fit_odir, select_odir_weights

__all__ = [
    "GRAD_TOLERANCE",
    "SEPARABLE_NLL",
    "LBFGSResult",
    "MatrixScaling",
    "MatrixScalingConfig",
    "VectorScaling",
    "VectorScalingConfig",
    "affine_fit_problems",
    "fit_lbfgs",
    "fit_odir",
    "odir_penalty",
]

SEPARABLE_NLL = 1e-4
"""A per-class map whose in-sample NLL falls below this with every calibration sample right has separated the
calibration set: a degenerate fit (:func:`affine_fit_problems`)."""


def odir_penalty(weight: torch.Tensor, bias: torch.Tensor, off_diagonal_weight: float,
                 intercept_weight: float) -> torch.Tensor:
    """ODIR: λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² for W (C, C) and b (C,) (Kull et al. 2019, §3)."""
    num_classes = bias.shape[0]
    off_diagonal = weight - torch.diag_embed(weight.diagonal())
    penalty = intercept_weight * bias.square().sum() / num_classes
    if num_classes > 1:
        penalty = penalty + off_diagonal_weight * off_diagonal.square().sum() / (num_classes * (num_classes - 1))
    return penalty


_BY_CROSS_VALIDATION = or_null(number(at_least=0), "chosen by 5-fold cross-validation")
"""λ or μ of matrix scaling's and Dirichlet calibration's ODIR."""


@dataclass(frozen=True, kw_only=True)
class VectorScalingConfig(PostHocConfig):
    """Vector scaling as a method, fitted on the cached validation logits (docs/methods.md §5).

    Attributes:
        intercept_weight: μ >= 0 of ODIR's intercept term μ/C Σ_j b_j² (0, the default: plain NLL as
            Guo et al. and Kull et al.'s VecS).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    intercept_weight: float = checked_field(0.0, number(at_least=0))


@dataclass(frozen=True, kw_only=True)
class MatrixScalingConfig(PostHocConfig):
    """Matrix scaling with ODIR as a method, fitted on the cached validation logits (docs/methods.md §5.6).

    By default λ and μ are chosen as Kull et al. choose them, by 5-fold cross-validation over their grid on the
    calibration set (:func:`~calib.posthoc.odir_cv.select_odir_weights`); the values used are stored in the
    trial's row (``fitted_off_diagonal_weight``, ``fitted_intercept_weight``). A number fixes one.

    Attributes:
        off_diagonal_weight: λ >= 0 of λ/(C(C−1)) Σ_{i≠j} W_ij², or null (default): by cross-validation.
        intercept_weight: μ >= 0 of μ/C Σ_j b_j², or null (default): by cross-validation.
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    off_diagonal_weight: float | None = checked_field(None, _BY_CROSS_VALIDATION)
    intercept_weight: float | None = checked_field(None, _BY_CROSS_VALIDATION)


@POSTHOC.register("vector_scaling")
class VectorScaling(PostHocCalibrator):
    """Vector scaling: calibrated logits w ⊙ z + b (Guo et al. 2017, §4.2).

    Fits w (C,) and b (C,) from w = 1, b = 0 by minimising NLL + μ/C Σ_j b_j² (μ = ``intercept_weight``,
    0: plain NLL, the default) with Newton's method (:func:`~calib.posthoc._affine_fit.fit_per_class_affine`:
    the exact Hessian, 5–10 steps; the gradient test on b times 1/sqrt(1 + 2μ/C)). With μ = 0
    a class absent from the calibration set has no finite optimum (b_k → −∞); the fit stops once the
    gradient is below tolerance, where the mean p_k is below 1e-6, and is flagged degenerate
    (:func:`affine_fit_problems`, as an unconverged fit or a separated calibration set).

    After :meth:`fit`: ``weight`` and ``bias`` (float64 buffers, shape (C,)), ``fit_result``
    (:class:`LBFGSResult`).
    """

    def __init__(self, *, intercept_weight: float = VectorScalingConfig.intercept_weight,
                 grad_tolerance: float = GRAD_TOLERANCE) -> None:
        super().__init__()
        check_values(VectorScalingConfig, locals())
        number(above=0).check("grad_tolerance", grad_tolerance)
        self.intercept_weight, self.grad_tolerance = intercept_weight, grad_tolerance
        self.register_buffer("weight", torch.ones(0, dtype=torch.float64))
        self.register_buffer("bias", torch.zeros(0, dtype=torch.float64))
        self.fit_result: LBFGSResult | None = None

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> VectorScaling:
        """Fit w and b on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        num_classes = z.shape[1]
        weight, bias, self.fit_result = fit_per_class_affine(
            z.numpy(), y.numpy(), weight_penalty=0.0, bias_penalty=self.intercept_weight / num_classes,
            grad_tolerance=self.grad_tolerance)
        self.weight, self.bias = torch.from_numpy(weight), torch.from_numpy(bias)
        absent = absent_classes(y, num_classes)
        note = None
        if absent:
            held = ("has no finite optimum (b_k → −∞): the fit stops where the gradient falls below tolerance"
                    if self.intercept_weight == 0 else f"is held by the μ = {self.intercept_weight:g} penalty alone")
            note = (f"{describe_classes(absent, num_classes)} absent from the calibration set: their intercept b_k "
                    f"{held}")
        with torch.no_grad():
            self._finish_fit(affine_fit_problems(z * self.weight + self.bias, y, self.fit_result, absent=note))
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """w ⊙ z + b."""
        z = self.fitted_logits(logits, self.weight.shape[0])
        return (z * self.weight.to(z.device) + self.bias.to(z.device)).to(logits.dtype)


def affine_fit_problems(fitted_logits: torch.Tensor, y: torch.Tensor, result: LBFGSResult, *,
                        absent: str | None) -> list[str]:
    """Why a gradient fit of a per-class map (CTS, VS, MS, Dir) is degenerate: ``absent`` (what a class without
    calibration samples gets, None if every class has some), an unconverged fit, or a separated calibration set
    (every sample right under the fitted map with an in-sample NLL below :data:`SEPARABLE_NLL`: the likelihood
    then has no finite optimum, and the parameters stopped where the gradient fell below tolerance)."""
    reasons = [absent] if absent else []
    if not result.converged:
        reasons.append(f"the fit did not converge (max|∂L/∂u| = {result.grad_max_abs:.3g} after "
                       f"{result.steps} steps)")
    nll = float(F.cross_entropy(fitted_logits, y))
    if nll < SEPARABLE_NLL and bool((fitted_logits.argmax(1) == y).all()):
        reasons.append(f"the fitted map separates the calibration set (every sample right, NLL {nll:.2g} < "
                       f"{SEPARABLE_NLL:g}): the likelihood has no finite optimum and the parameters stopped where "
                       f"the gradient fell below tolerance")
    return reasons


@POSTHOC.register("matrix_scaling")
class MatrixScaling(PostHocCalibrator):
    """Matrix scaling with ODIR: calibrated logits W x + b of the features x = z (Kull et al. 2019, "MS-ODIR").

    Fits W (C, C) from the identity and b (C,) from 0 by minimising
    NLL + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² (:func:`odir_penalty`, :func:`fit_odir`). λ and μ that are
    None are chosen as the paper does, by 5-fold cross-validation over its grid on the calibration set
    (:func:`~calib.posthoc.odir_cv.select_odir_weights`); the fit then uses the chosen values on the whole set.
    Subclasses change the features (:class:`~calib.posthoc.dirichlet.DirichletCalibration`: x = log p).

    Args:
        off_diagonal_weight: λ >= 0, or None (default): by cross-validation.
        intercept_weight: μ >= 0, or None (default): by cross-validation.
        grad_tolerance: the fit ends once max|∂L/∂u| is below it (1e-6).

    After :meth:`fit`: ``weight`` (C, C) and ``bias`` (C,) (float64 buffers), ``fit_result``, the λ and μ used
    (``fitted_off_diagonal_weight``, ``fitted_intercept_weight``) and ``selection`` (the
    :class:`~calib.posthoc.odir_cv.ODIRSelection`, None when both were given).
    """

    name = "matrix scaling"

    def __init__(
        self,
        *,
        off_diagonal_weight: float | None = MatrixScalingConfig.off_diagonal_weight,
        intercept_weight: float | None = MatrixScalingConfig.intercept_weight,
        grad_tolerance: float = GRAD_TOLERANCE,
    ) -> None:
        super().__init__()
        check_values(MatrixScalingConfig, locals())
        number(above=0).check("grad_tolerance", grad_tolerance)
        self.off_diagonal_weight, self.intercept_weight = off_diagonal_weight, intercept_weight
        self.grad_tolerance = grad_tolerance
        self.register_buffer("weight", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("bias", torch.zeros(0, dtype=torch.float64))
        self.fit_result: LBFGSResult | None = None
        self.fitted_off_diagonal_weight = math.nan
        self.fitted_intercept_weight = math.nan
        self.selection: ODIRSelection | None = None

    def features(self, z: torch.Tensor) -> torch.Tensor:
        """The inputs x of the affine map, from float64 logits z: x = z."""
        return z

    def fit_details(self) -> dict[str, Any]:
        """The base fit columns and the λ, μ used (with the cross-validated NLL where CV chose them)."""
        return {**super().fit_details(), "fitted_off_diagonal_weight": self.fitted_off_diagonal_weight,
                "fitted_intercept_weight": self.fitted_intercept_weight,
                "cv_nll": self.selection.cv_nll if self.selection is not None else None}

    def absent_class_note(self, absent: list[int], num_classes: int) -> str:
        """What a class without calibration samples gets (a degenerate fit's reason)."""
        return (f"{describe_classes(absent, num_classes)} absent from the calibration set: their rows of W and "
                f"their b_k are fitted only to push their probabilities down, held by the ODIR penalty alone")

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> MatrixScaling:
        """Fit W and b on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        x, num_classes = self.features(z), z.shape[1]
        off_diagonal_weight, intercept_weight = self.off_diagonal_weight, self.intercept_weight
        self.selection = None
        # one BLAS thread: L-BFGS-B's small linear algebra slows down ~50x when OpenBLAS threads compete for cores
        with threadpool_limits(limits=1, user_api="blas"):
            if off_diagonal_weight is None or intercept_weight is None:
                self.selection = select_odir_weights(x.numpy(), y.numpy(), fit_odir,
                                                     off_diagonal_weight=off_diagonal_weight,
                                                     intercept_weight=intercept_weight)
                off_diagonal_weight, intercept_weight = (self.selection.off_diagonal_weight,
                                                         self.selection.intercept_weight)
            weight, bias, self.fit_result = fit_odir(x.numpy(), y.numpy(), off_diagonal_weight, intercept_weight,
                                                     grad_tolerance=self.grad_tolerance)
        self.weight, self.bias = torch.from_numpy(weight), torch.from_numpy(bias)
        self.fitted_off_diagonal_weight, self.fitted_intercept_weight = off_diagonal_weight, intercept_weight
        absent = absent_classes(y, num_classes)
        reasons = affine_fit_problems(x @ self.weight.T + self.bias, y, self.fit_result,
                                      absent=self.absent_class_note(absent, num_classes) if absent else None)
        if self.selection is not None and self.selection.folds < CV_FOLDS:
            reasons.append(f"only {len(y)} calibration samples: {self.selection.folds}-fold instead of "
                           f"{CV_FOLDS}-fold cross-validation chose λ and μ")
        self._finish_fit(reasons)
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """W x + b."""
        x = self.features(self.fitted_logits(logits, self.bias.shape[0]))
        return (x @ self.weight.to(x.device).T + self.bias.to(x.device)).to(logits.dtype)


register_posthoc_method(
    "vector_scaling", VectorScalingConfig, VectorScaling,
    "vector scaling (per-class scale and intercept) fitted on the validation logits",
    label="VS", order=6,
)
register_posthoc_method(
    "matrix_scaling", MatrixScalingConfig, MatrixScaling,
    "matrix scaling with ODIR (off-diagonal and intercept regularisation) fitted on the validation logits",
    label="MS-ODIR", order=7,
)
