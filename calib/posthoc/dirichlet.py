"""Dirichlet calibration with ODIR (Kull et al., NeurIPS 2019, "Dir-ODIR"), docs/methods.md §5.

Matrix scaling of the log-probabilities instead of the logits:

    calibrated logits = W log p + b,   log p = log softmax(z)   (so p̂ = softmax(W log p + b))

fitted by minimising the mean NLL plus Off-Diagonal and Intercept Regularisation,

    L(W, b) = NLL(W, b) + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j²,

from W = I, b = 0 (where p̂ = p) by full-batch float64 LBFGS with the strong-Wolfe line search until
max|∂L/∂u| < 1e-6 (:func:`~calib.posthoc.vector_scaling.fit_lbfgs`; u: the parameters with the penalised
entries preconditioned, as in :class:`~calib.posthoc.vector_scaling.MatrixScaling`). λ and μ are chosen as the
paper chooses them, by 5-fold cross-validation over its grid on the calibration set
(:mod:`calib.posthoc.odir_cv`), unless given (``off_diagonal_weight``, ``intercept_weight``). It can change the
argmax.

log p is computed exactly (log-softmax in float64), so it needs no clipping; dirichletcal clips p at
the smallest float64 before the log, the paper's Keras code at machine epsilon (log p >= −36). There is
no reference-row reparametrisation (dirichletcal's ``ref_row``): ODIR penalises W and b themselves.

Official code: dirichletcal/dirichlet_python (``FullDirichletCalibrator``, ``calib/multinomial.py``),
dirichletcal/experiments_dnn (``Dirichlet_NN``, ``tune_cal_odir.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib.posthoc._base import POSTHOC, describe_classes
from calib.posthoc._method import register_posthoc_method
from calib.posthoc.vector_scaling import (
    MatrixScaling,
    MatrixScalingConfig,
)

__all__ = ["DirichletCalibration", "DirichletConfig"]


@POSTHOC.register("dirichlet")
class DirichletCalibration(MatrixScaling):
    """Dirichlet calibration: calibrated logits W log p + b with p = softmax(z), fitted with ODIR.

    Args:
        off_diagonal_weight: λ >= 0, or None (default): the paper's 5-fold cross-validation.
        intercept_weight: μ >= 0, or None (default): the paper's 5-fold cross-validation.
        grad_tolerance: the fit ends once max|∂L/∂u| is below it (1e-6).

    After :meth:`fit`: ``weight`` W (C, C), ``bias`` b (C,) (float64 buffers), ``fit_result``, the λ and μ used
    and ``selection`` (as :class:`~calib.posthoc.vector_scaling.MatrixScaling`).
    """

    name = "Dirichlet calibration"

    def absent_class_note(self, absent: list[int], num_classes: int) -> str:
        """A class without samples: its unpenalised W_kk has no finite optimum (log p_k <= 0 always)."""
        return (f"{describe_classes(absent, num_classes)} absent from the calibration set: their diagonal weight "
                f"W_kk has no finite optimum (W_kk → ∞ pushes p_k down, as log p_k <= 0): the fit stops where the "
                f"gradient falls below tolerance")

    def features(self, z: torch.Tensor) -> torch.Tensor:
        """x = log p = log softmax(z), exact in float64."""
        return F.log_softmax(z, dim=1)


@dataclass(frozen=True, kw_only=True)
class DirichletConfig(MatrixScalingConfig):
    """Dirichlet calibration (Dir-ODIR) as a method, fitted on the cached validation logits (docs/methods.md §5.7).

    The fields, defaults and checks of matrix scaling's ODIR: ``off_diagonal_weight`` λ and ``intercept_weight``
    μ, each null (default: the paper's 5-fold cross-validation over its grid, ``tune_cal_odir.py``) or a number.
    """


register_posthoc_method(
    "dirichlet", DirichletConfig, DirichletCalibration,
    "Dirichlet calibration (matrix scaling of log p) with ODIR, fitted on the validation logits",
    label="Dir-ODIR", order=8,
)
