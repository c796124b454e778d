"""ODIR's fit (:func:`fit_odir`) and its λ and μ chosen as Kull et al. (NeurIPS 2019) choose them: 5-fold
cross-validation on the calibration set (:func:`select_odir_weights`).

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

Cost. Every fold of every pair is one L-BFGS fit, and the weakly penalised fits of many classes are slow. So the
grid is walked as a path, as glmnet walks its λ path: for each μ, from the strongest λ down, each fold's fit
warm-started from the better (lower objective) of that fold's solutions at the previous λ of this μ and at this λ of
the previous μ. A walk stops once ``patience`` (3) consecutive λ have a cross-validated loss more than
``tolerance`` (0.1%) above the best of that walk, and the μ loop stops once ``patience`` consecutive μ end above the
best so far by as much. Where the loss along the grid rises once past its minimum (the common case) this picks the
pair the full grid picks (``patience=None`` walks all of it; the tests compare the two). Each fit is Jacobi-scaled
(:func:`fit_odir`) and starts from an :class:`ODIRPoint`: the NLL's value, gradient and Hessian diagonal where the
fold's earlier fit ended, which no penalty changes, so that a start costs no (N, C) × (C, C) matrix product (the
same iterates to the bit). On DenseNet-BC-100's CIFAR-100 log-probabilities (down to −84, 5,000 samples) the whole
cross-validation takes 2,900 L-BFGS-B iterations, about 42,000 unscaled and warm-started from the previous λ only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.optimize
from sklearn.model_selection import KFold
from threadpoolctl import threadpool_limits

from calib.posthoc._lbfgs import GRAD_TOLERANCE, LBFGSResult, penalty_scale

__all__ = ["CV_FOLDS", "CV_GRAD_TOLERANCE", "CV_MAX_ITER", "CV_PATIENCE", "CV_SEED", "CV_TOLERANCE", "JACOBI_FLOOR",
           "ODIR_RESCALE_ITERATIONS", "ODIR_STOP_MARGIN", "ODIRFitResult", "ODIRPoint", "ODIRSelection",
           "fit_odir", "nll_curvature", "odir_grid", "select_odir_weights"]

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

ODIR_STOP_MARGIN = 0.1
""":func:`fit_odir`'s scaled L-BFGS-B runs on to this fraction of its gradient tolerance (the fit counts as converged
below the tolerance itself)."""

ODIR_RESCALE_ITERATIONS = 25
""":func:`fit_odir` re-estimates its scaling after this many iterations, then after twice as many, and so on."""

JACOBI_FLOOR = 1e-6
"""The curvature :func:`fit_odir`'s scaling assumes is at least this fraction of its bound (p(1 − p) <= 1/4)."""

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


@dataclass(frozen=True, eq=False)
class ODIRPoint:
    """Where a :func:`fit_odir` fit ended on ``features`` x (its labels): θ = (W, b) and the terms of the objective
    there that do not depend on λ and μ: the mean NLL, its gradient ∂NLL/∂θ and the diagonal of its Hessian
    (:func:`nll_curvature`). A later fit on the same x that starts here, at another λ or μ, adds the penalty's
    terms instead of recomputing these (three or four (N, C) × (C, C) matrix products a start): the same numbers."""

    weight: np.ndarray
    bias: np.ndarray
    features: np.ndarray
    nll: float
    nll_grad: np.ndarray
    nll_curvature: tuple[np.ndarray, np.ndarray]


@dataclass
class ODIRFitResult(LBFGSResult):
    """How a :func:`fit_odir` fit ended (:class:`LBFGSResult`) and its end as a warm start (``end``)."""

    end: ODIRPoint | None = None


class _ODIRObjective:
    """L(θ) = NLL(W x + b) + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² on float64 features x (N, C), labels y; an
    evaluation is (L, ∂L/∂θ, softmax(W x + b) − onehot(y), NLL, ∂NLL/∂θ)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, off_diagonal_weight: float, intercept_weight: float) -> None:
        self.x, self.y = x, y
        self.num_samples, self.num_classes = x.shape
        self.off_mask = 1.0 - np.eye(self.num_classes)
        self.off_penalty = off_diagonal_weight / max(self.num_classes * (self.num_classes - 1), 1)
        self.bias_penalty = intercept_weight / self.num_classes
        self.rows, self.size = np.arange(self.num_samples), self.num_classes * self.num_classes

    def split(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return theta[:self.size].reshape(self.num_classes, self.num_classes), theta[self.size:]

    def penalised(self, theta: np.ndarray, nll: float, nll_grad: np.ndarray) -> tuple[float, np.ndarray]:
        """(L, ∂L/∂θ) from the NLL's terms: the penalty's added."""
        weight, bias = self.split(theta)
        off = weight * self.off_mask
        loss = nll + self.off_penalty * float(np.sum(off * off)) + self.bias_penalty * float(bias @ bias)
        penalty_grad = np.concatenate([(2 * self.off_penalty * off).ravel(), 2 * self.bias_penalty * bias])
        return loss, nll_grad + penalty_grad

    def nll_and_exps(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """NLL at θ, exp(W x + b − its row maxima) (N, C) in one buffer and its row sums: one matrix product."""
        weight, bias = self.split(theta)
        buffer = self.x @ weight.T
        buffer += bias
        buffer -= buffer.max(axis=1, keepdims=True)
        picked = buffer[self.rows, self.y]
        np.exp(buffer, out=buffer)
        total = buffer.sum(axis=1)
        return float(np.mean(np.log(total) - picked)), buffer, total

    def nll_grad_residual(self, buffer: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """∂NLL/∂θ and softmax(W x + b) − onehot(y) from :meth:`nll_and_exps`'s buffer (in place): the second."""
        buffer /= total[:, None]
        buffer[self.rows, self.y] -= 1.0
        return np.concatenate([((buffer.T @ self.x) / self.num_samples).ravel(),
                               buffer.sum(axis=0) / self.num_samples]), buffer

    def evaluate(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, float, np.ndarray]:
        nll, buffer, total = self.nll_and_exps(theta)
        nll_grad, residual = self.nll_grad_residual(buffer, total)
        return *self.penalised(theta, nll, nll_grad), residual, nll, nll_grad

    def probs(self, residual: np.ndarray) -> np.ndarray:
        probs = residual.copy()
        probs[self.rows, self.y] += 1.0
        return probs


def fit_odir(
    x: np.ndarray,
    y: np.ndarray,
    off_diagonal_weight: float,
    intercept_weight: float,
    *,
    init: Sequence[tuple[np.ndarray, np.ndarray] | ODIRPoint] = (),
    grad_tolerance: float = GRAD_TOLERANCE,
    max_iter: int = 15_000,
) -> tuple[np.ndarray, np.ndarray, ODIRFitResult]:
    """(W, b, how it ended) minimising NLL(W x + b) + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² on float64 features
    x (N, C) and labels y (N,).

    scipy's L-BFGS-B (history 30) with the exact gradient, from W = I, b = 0 or, given candidate warm starts
    ``init`` (pairs (W, b), or the ``end`` (:class:`ODIRPoint`) of an earlier fit on the same x, whose NLL terms are
    reused), from the one with the lowest objective, until max|∂L/∂u| < ``grad_tolerance`` (at most
    ``max_iter`` iterations), u the parameters with the off-diagonal entries divided by sqrt(1 + 2λ/(C(C−1))) and b
    by sqrt(1 + 2μ/C) (the test of :func:`~calib.posthoc.vector_scaling.fit_lbfgs`). The gradient is written out
    (∂NLL/∂W = Gᵀx, ∂NLL/∂b = Σ_i G_i with G = (softmax(W x + b) − onehot(y))/N), so one of the thousands of fits of
    a cross-validation costs two matrix products, not an autograd graph.

    Conditioning: L-BFGS-B runs on v = θ/s, θ = (W, b), s = 1/sqrt(h) with h the Hessian's diagonal where the round
    starts (:func:`_jacobi_scale`), re-estimated after :data:`ODIR_RESCALE_ITERATIONS` iterations, then after twice
    as many, and so on (L-BFGS-B restarting from where it got to). A change of variables: the same objective and
    optimum, reached in 5–10x fewer iterations on log-probabilities spanning tens of nats, whose columns' scales
    differ by orders of magnitude. As its steps reach the tolerance by another path than unscaled steps, the
    fit runs on to :data:`ODIR_STOP_MARGIN` times the tolerance (at least as close to the optimum as the unscaled
    fit: the reference checks' parameter gaps are 10–20x smaller, docs/how-to/reference-checks.md).
    """
    objective = _ODIRObjective(x, y, off_diagonal_weight, intercept_weight)
    num_classes = objective.num_classes
    test_scale = np.concatenate([(np.eye(num_classes) + penalty_scale(2 * objective.off_penalty)
                                  * objective.off_mask).ravel(),
                                 np.full(num_classes, penalty_scale(2 * objective.bias_penalty))])
    squares, mean_squares = x * x, np.mean(x * x, axis=0)  # the Jacobi scaling's, once a fit
    theta, start, start_curvature = _best_start(objective, init, squares)

    def curvature_at(evaluation: tuple) -> tuple[np.ndarray, np.ndarray]:
        if evaluation is start:  # a round that did not move (its residual is not kept)
            return start_curvature
        return nll_curvature(squares, objective.probs(evaluation[2]))

    stop_at = ODIR_STOP_MARGIN * grad_tolerance
    evaluation, curvature, steps, rounds = start, start_curvature, 0, 0
    while not np.abs(evaluation[1] * test_scale).max() < stop_at and steps < max_iter:
        iterations = min(ODIR_RESCALE_ITERATIONS * 2**rounds, max_iter - steps)
        previous_loss = evaluation[0]
        scale = _jacobi_scale(curvature, mean_squares, objective.off_mask, objective.off_penalty,
                              objective.bias_penalty)
        theta, evaluation, done = _scaled_round(objective, theta, scale, evaluation, iterations, test_scale, stop_at)
        steps, rounds, curvature = steps + done, rounds + 1, None
        if done < iterations and not evaluation[0] < previous_loss:
            break  # no progress (the line search at float precision): rescaling will not help
        curvature = curvature_at(evaluation)
    loss, grad, _, nll, nll_grad = evaluation
    grad_max_abs = float(np.abs(grad * test_scale).max())
    weight, bias = (part.copy() for part in objective.split(theta))
    end = ODIRPoint(weight, bias, x, nll, nll_grad, curvature_at(evaluation) if curvature is None else curvature)
    return weight, bias, ODIRFitResult(loss, grad_max_abs, steps, grad_max_abs < grad_tolerance, end)


def _best_start(objective: _ODIRObjective, init: Sequence[tuple[np.ndarray, np.ndarray] | ODIRPoint],
                squares: np.ndarray) -> tuple[np.ndarray, tuple, tuple[np.ndarray, np.ndarray]]:
    """(θ, its evaluation, the NLL's Hessian diagonal there) of the candidate start with the lowest objective (W = I,
    b = 0 without any): the candidates compared by their loss alone, the gradient only at the one chosen; an
    :class:`ODIRPoint` of the same features costs no matrix product."""
    candidates = []
    for start in init or [(np.eye(objective.num_classes), np.zeros(objective.num_classes))]:
        weight, bias = (start.weight, start.bias) if isinstance(start, ODIRPoint) else start
        theta = np.concatenate([np.asarray(weight, dtype=np.float64).ravel(), np.asarray(bias, dtype=np.float64)])
        if isinstance(start, ODIRPoint) and start.features is objective.x:
            loss, grad = objective.penalised(theta, start.nll, start.nll_grad)
            candidates.append((loss, theta, start))
        else:
            nll, buffer, total = objective.nll_and_exps(theta)
            candidates.append((objective.penalised(theta, nll, np.zeros_like(theta))[0], theta,
                               (nll, buffer, total)))
    loss, theta, known = min(candidates, key=lambda candidate: candidate[0])
    if isinstance(known, ODIRPoint):
        loss, grad = objective.penalised(theta, known.nll, known.nll_grad)
        return theta, (loss, grad, None, known.nll, known.nll_grad), known.nll_curvature
    nll, buffer, total = known
    nll_grad, residual = objective.nll_grad_residual(buffer, total)
    evaluation = (*objective.penalised(theta, nll, nll_grad), residual, nll, nll_grad)
    return theta, evaluation, nll_curvature(squares, objective.probs(residual))


def _scaled_round(objective: _ODIRObjective, theta: np.ndarray, scale: np.ndarray, evaluation: tuple,
                  iterations: int, test_scale: np.ndarray, stop_at: float) -> tuple[np.ndarray, tuple, int]:
    """L-BFGS-B on v = θ/s from θ (its evaluation given) for at most ``iterations`` iterations, stopped once
    max|∂L/∂θ ⊙ test_scale| < ``stop_at``: (θ, its evaluation, iterations)."""
    last = {"v": theta / scale, "evaluation": evaluation}

    def evaluate(v: np.ndarray) -> tuple:
        if not np.array_equal(v, last["v"]):
            last["v"], last["evaluation"] = v.copy(), objective.evaluate(scale * v)
        return last["evaluation"]

    def scaled_loss_and_grad(v: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = evaluate(v)[:2]
        return loss, scale * grad

    def stop_when_converged(intermediate_result: scipy.optimize.OptimizeResult) -> None:
        if np.abs(evaluate(intermediate_result.x)[1] * test_scale).max() < stop_at:
            raise StopIteration

    result = scipy.optimize.minimize(scaled_loss_and_grad, last["v"], jac=True, method="L-BFGS-B",
                                     callback=stop_when_converged,
                                     options={"maxcor": 30, "gtol": 0.0, "ftol": 0.0, "maxiter": iterations,
                                              "maxfun": 2 * iterations})
    return scale * result.x, evaluate(result.x), int(result.nit)


def nll_curvature(squares: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The NLL's Hessian diagonal at p = ``probs`` (N, C) from the features' squares x² (N, C):
    (mean_i p_ik(1 − p_ik) x_ij² for W_kj, mean_i p_ik(1 − p_ik) for b_k)."""
    spread = probs * (1.0 - probs) / squares.shape[0]
    return spread.T @ squares, spread.sum(axis=0)


def _jacobi_scale(curvature: tuple[np.ndarray, np.ndarray], mean_squares: np.ndarray, off_mask: np.ndarray,
                  off_penalty: float, bias_penalty: float) -> np.ndarray:
    """s = 1/sqrt(h) for θ = (W, b) of :func:`fit_odir`, h the Hessian's diagonal: the NLL's (``curvature``,
    :func:`nll_curvature`) plus the penalty's,
    h(W_kj) = mean_i p_ik(1 − p_ik) x_ij² + 2λ/(C(C−1))·[k ≠ j], h(b_k) = mean_i p_ik(1 − p_ik) + 2μ/C, the NLL
    terms at least :data:`JACOBI_FLOOR` times their bound mean_i x_ij²/4 (1/4): where p is near one-hot (a sharp
    model, a poor start) the curvature there says little about the curvature on the way.

    The softmax is invariant to W + 1vᵀ and b + c·1. Where no penalty fixes that (λ = 0 for W, μ = 0 for b) the
    NLL terms are averaged over the rows k, so that the scaled steps, like the gradient, keep the column sums of W
    (the sum of b) of the start: the fit ends at the optimum an unscaled fit from the same start reaches."""
    nll_weight, nll_bias = curvature
    if off_penalty == 0:
        nll_weight = np.broadcast_to(nll_weight.mean(axis=0), nll_weight.shape)
    if bias_penalty == 0:
        nll_bias = np.full_like(nll_bias, nll_bias.mean())
    weight_floor = JACOBI_FLOOR * mean_squares / 4
    curvature = np.concatenate([(np.maximum(nll_weight, weight_floor) + 2 * off_penalty * off_mask).ravel(),
                                np.maximum(nll_bias, JACOBI_FLOOR / 4) + 2 * bias_penalty])
    return 1.0 / np.sqrt(np.maximum(curvature, np.finfo(np.float64).tiny))


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
    (:func:`~calib.posthoc.vector_scaling.fit_odir`), starting from the best of the candidate pairs (W, b) in
    ``init``: the fold's solutions at the previous λ of this μ and at this λ of the previous μ. A λ or μ that is
    given is held at its value; the other is chosen over its grid. ``patience`` None evaluates every pair of the
    grid.
    """
    lambdas, mus = odir_grid(x.shape[1])
    lambdas = lambdas if off_diagonal_weight is None else [off_diagonal_weight]
    mus = mus if intercept_weight is None else [intercept_weight]
    folds = min(CV_FOLDS, len(y))
    splits = list(KFold(n_splits=folds, shuffle=True, random_state=CV_SEED).split(np.arange(len(y))))
    fold_data = [(x[train], y[train], x[held], y[held]) for train, held in splits]  # copied once, not every fit
    scores: dict[tuple[float, float], float] = {}
    unconverged = 0
    previous_mu: dict[int, list[Any]] = {}  # each fold's solution at each λ of the previous μ
    best_overall, mus_above = math.inf, 0
    for intercept in mus:
        starts, this_mu, best_walk, lambdas_above = [None] * folds, {}, math.inf, 0
        for position, off_diagonal in enumerate(lambdas):
            losses = []
            for fold, (x_train, y_train, x_held, y_held) in enumerate(fold_data):
                candidates = [start for start in (starts[fold], previous_mu.get(position, [None] * folds)[fold])
                              if start is not None]
                weight, bias, result = fit(x_train, y_train, off_diagonal, intercept, init=candidates,
                                           grad_tolerance=CV_GRAD_TOLERANCE, max_iter=CV_MAX_ITER)
                unconverged += not result.converged
                starts[fold] = getattr(result, "end", None) or (weight, bias)
                losses.append(_held_out_nll(x_held, y_held, weight, bias))
            this_mu[position] = list(starts)
            loss = scores[(off_diagonal, intercept)] = float(np.mean(losses))
            best_walk = min(best_walk, loss)
            lambdas_above = lambdas_above + 1 if _above(loss, best_walk) else 0
            if patience is not None and lambdas_above >= patience:
                break
        previous_mu = this_mu
        mus_above = mus_above + 1 if _above(best_walk, best_overall) else 0
        best_overall = min(best_overall, best_walk)
        if patience is not None and mus_above >= patience:
            break
    (off_diagonal, intercept), cv_nll = min(scores.items(), key=lambda item: item[1])
    return ODIRSelection(off_diagonal, intercept, cv_nll, folds, len(scores), len(lambdas) * len(mus), unconverged)
