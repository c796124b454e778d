"""ODIR's λ and μ chosen as Kull et al. (NeurIPS 2019) choose them: 5-fold cross-validation on the calibration set.

The protocol of the paper's code (dirichletcal/experiments_dnn: ``tune_cal_odir.py``, ``tune_dirichlet_nn_slim.py``
and the results notebook's ``get_best_validation``), docs/methods.md §5.6:

- **folds**: scikit-learn's ``KFold(n_splits=5, shuffle=True, random_state=15)`` over the calibration set;
- **grid**: their Keras code adds λ_e Σ_{i≠j} W_ij² + μ_e Σ_j b_j² to the mean NLL, with
  λ_e ∈ {1, 0.25, 0.5}·10^e and μ_e ∈ 10^e for e = −5 … 6 (e = −2 … 6 for their 100-class data sets, so here for
  C >= 100): 36 × 12 pairs (27 × 9 from 100 classes). In calib's normalisation (:func:`odir_penalty`) that is
  λ = λ_e·C(C−1) and μ = μ_e·C;
- **rule**: the pair with the lowest held-out log-loss averaged over the folds.

calib then fits once more, on the whole calibration set, with the chosen pair; the paper's tables instead average
the test scores of the five fold models.

Cost. Every fold of every pair is one LBFGS fit, and the weakly penalised fits of many classes are slow (C = 100:
minutes each from the identity). So the grid is walked as a path, as glmnet walks its λ path: for each μ, from the
strongest λ down, each fold's fit warm-started from that fold's solution at the previous λ (the first λ of a μ from
the previous μ's). A walk stops once ``patience`` (3) consecutive λ have a cross-validated loss more than
``tolerance`` (0.1%) above the best of that walk, and the μ loop stops once ``patience`` consecutive μ end above the
best so far by as much. Where the loss along the grid rises once past its minimum (the common case) this picks the
pair the full grid picks (``patience=None`` walks all of it; the tests compare the two).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.model_selection import KFold
from threadpoolctl import threadpool_limits

__all__ = ["CV_FOLDS", "CV_GRAD_TOLERANCE", "CV_MAX_ITER", "CV_PATIENCE", "CV_SEED", "CV_TOLERANCE", "ODIRSelection",
           "odir_grid", "select_odir_weights"]

CV_FOLDS = 5
"""Folds of the cross-validation (fewer, one sample each, on a calibration set of fewer samples)."""

CV_SEED = 15
"""``random_state`` of the shuffled ``KFold`` (the paper's code)."""

CV_PATIENCE = 3
"""A walk along λ (or the loop over μ) stops after this many consecutive grid values above its best."""

CV_TOLERANCE = 1e-3
"""A cross-validated loss counts as above the best when it exceeds it by more than this fraction."""

CV_GRAD_TOLERANCE = 1e-5
"""The cross-validation fits end once max|∂L/∂u| < this (the final fit on the whole set: 1e-6) ..."""

CV_MAX_ITER = 1000
"""... or after this many L-BFGS iterations (the paper's Keras fits: at most 500 epochs with early stopping); the
held-out loss of a fit that stopped short counts as it is, and ``unconverged_fits`` counts them."""

Fit = Callable[..., tuple[np.ndarray, np.ndarray, Any]]


@dataclass(frozen=True)
class ODIRSelection:
    """The chosen λ (``off_diagonal_weight``) and μ (``intercept_weight``), their mean held-out NLL over the folds
    (``cv_nll``), the number of folds, the grid pairs evaluated of ``grid_size``, and how many fold fits stopped
    short of the tolerance (``unconverged_fits``)."""

    off_diagonal_weight: float
    intercept_weight: float
    cv_nll: float
    folds: int
    evaluated: int
    grid_size: int
    unconverged_fits: int


def odir_grid(num_classes: int) -> tuple[list[float], list[float]]:
    """The paper's (λ values, μ values) in calib's normalisation, strongest first.

    >>> lambdas, mus = odir_grid(10)
    >>> len(lambdas), len(mus), lambdas[0] == 1e6 * 90, mus[-1] == 1e-5 * 10
    (36, 12, True, True)
    >>> [len(values) for values in odir_grid(100)]
    [27, 9]
    """
    first = -2 if num_classes >= 100 else -5
    exponents = range(6, first - 1, -1)
    per_entry_lambdas = sorted({factor * 10.0**e for e in exponents for factor in (1.0, 0.5, 0.25)}, reverse=True)
    pairs = num_classes * (num_classes - 1)
    return [value * pairs for value in per_entry_lambdas], [10.0**e * num_classes for e in exponents]


def _above(loss: float, best: float) -> bool:
    return loss > best + CV_TOLERANCE * abs(best)


def _held_out_nll(x: np.ndarray, y: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> float:
    logits = x @ weight.T + bias
    shifted = logits - logits.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(y)), y]))


@threadpool_limits.wrap(limits=1, user_api="blas")  # small linear algebra: competing BLAS threads cost ~50x
def select_odir_weights(
    x: np.ndarray,
    y: np.ndarray,
    fit: Fit,
    *,
    off_diagonal_weight: float | None = None,
    intercept_weight: float | None = None,
    patience: int | None = CV_PATIENCE,
) -> ODIRSelection:
    """λ and μ by the paper's 5-fold cross-validation on features x (N, C) and labels y (N,).

    ``fit(x, y, λ, μ, init=..., grad_tolerance=..., max_iter=...)`` returns (W, b, result with ``converged``)
    (:func:`~calib.posthoc.vector_scaling.fit_odir`). A λ or μ that is given is held at its value; the other is
    chosen over its grid. ``patience`` None evaluates every pair of the grid.
    """
    lambdas, mus = odir_grid(x.shape[1])
    lambdas = lambdas if off_diagonal_weight is None else [off_diagonal_weight]
    mus = mus if intercept_weight is None else [intercept_weight]
    folds = min(CV_FOLDS, len(y))
    splits = list(KFold(n_splits=folds, shuffle=True, random_state=CV_SEED).split(np.arange(len(y))))
    scores: dict[tuple[float, float], float] = {}
    unconverged = 0
    mu_start: list[Any] = [None] * folds
    best_overall, mus_above = math.inf, 0
    for intercept in mus:
        starts, best_walk, lambdas_above = list(mu_start), math.inf, 0
        for position, off_diagonal in enumerate(lambdas):
            losses = []
            for fold, (train, held) in enumerate(splits):
                weight, bias, result = fit(x[train], y[train], off_diagonal, intercept, init=starts[fold],
                                           grad_tolerance=CV_GRAD_TOLERANCE, max_iter=CV_MAX_ITER)
                unconverged += not result.converged
                starts[fold] = (weight, bias)
                losses.append(_held_out_nll(x[held], y[held], weight, bias))
            if position == 0:
                mu_start = list(starts)
            loss = scores[(off_diagonal, intercept)] = float(np.mean(losses))
            best_walk = min(best_walk, loss)
            lambdas_above = lambdas_above + 1 if _above(loss, best_walk) else 0
            if patience is not None and lambdas_above >= patience:
                break
        mus_above = mus_above + 1 if _above(best_walk, best_overall) else 0
        best_overall = min(best_overall, best_walk)
        if patience is not None and mus_above >= patience:
            break
    (off_diagonal, intercept), cv_nll = min(scores.items(), key=lambda item: item[1])
    return ODIRSelection(off_diagonal, intercept, cv_nll, folds, len(scores), len(lambdas) * len(mus), unconverged)
