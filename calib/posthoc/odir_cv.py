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
(:func:`fit_odir`). On DenseNet-BC-100's CIFAR-100 log-probabilities (down to −84, 5,000 samples) the whole
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
           "ODIR_RESCALE_ITERATIONS", "ODIR_STOP_MARGIN", "ODIRSelection", "fit_odir", "odir_grid",
           "select_odir_weights"]

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


def fit_odir(
    x: np.ndarray,
    y: np.ndarray,
    off_diagonal_weight: float,
    intercept_weight: float,
    *,
    init: Sequence[tuple[np.ndarray, np.ndarray]] = (),
    grad_tolerance: float = GRAD_TOLERANCE,
    max_iter: int = 15_000,
) -> tuple[np.ndarray, np.ndarray, LBFGSResult]:
    """(W, b, how it ended) minimising NLL(W x + b) + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² on float64 features
    x (N, C) and labels y (N,).

    scipy's L-BFGS-B (history 30) with the exact gradient, from W = I, b = 0 or, given candidate warm starts
    ``init`` (pairs (W, b)), from the one with the lowest objective, until max|∂L/∂u| < ``grad_tolerance`` (at most
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
    n, num_classes = x.shape
    off_mask = 1.0 - np.eye(num_classes)
    off_penalty = off_diagonal_weight / max(num_classes * (num_classes - 1), 1)
    bias_penalty = intercept_weight / num_classes
    test_scale = np.concatenate([(np.eye(num_classes) + penalty_scale(2 * off_penalty) * off_mask).ravel(),
                                 np.full(num_classes, penalty_scale(2 * bias_penalty))])
    rows, size = np.arange(n), num_classes * num_classes

    def loss_and_exps(theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """L at θ, exp(W x + b − its row maxima) (N, C) in one buffer and its row sums: one matrix product."""
        weight, bias = theta[:size].reshape(num_classes, num_classes), theta[size:]
        buffer = x @ weight.T
        buffer += bias
        buffer -= buffer.max(axis=1, keepdims=True)
        picked = buffer[rows, y]
        np.exp(buffer, out=buffer)
        total = buffer.sum(axis=1)
        off = weight * off_mask
        loss = float(np.mean(np.log(total) - picked)) + off_penalty * float(np.sum(off * off)) + bias_penalty * float(
            bias @ bias)
        return loss, buffer, total

    def grad_residual(theta: np.ndarray, buffer: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """∂L/∂θ and softmax(W x + b) − onehot(y) from :func:`loss_and_exps`'s buffer (in place): the second."""
        weight, bias = theta[:size].reshape(num_classes, num_classes), theta[size:]
        buffer /= total[:, None]
        buffer[rows, y] -= 1.0
        grad_weight = (buffer.T @ x) / n + 2 * off_penalty * (weight * off_mask)
        grad_bias = buffer.sum(axis=0) / n + 2 * bias_penalty * bias
        return np.concatenate([grad_weight.ravel(), grad_bias]), buffer

    def loss_grad_residual(theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """L, ∂L/∂θ and softmax(W x + b) − onehot(y) at θ, in place in one (N, C) buffer."""
        loss, buffer, total = loss_and_exps(theta)
        return loss, *grad_residual(theta, buffer, total)

    starts = [np.concatenate([np.asarray(weight, dtype=np.float64).ravel(), np.asarray(bias, dtype=np.float64)])
              for weight, bias in (init or [(np.eye(num_classes), np.zeros(num_classes))])]
    # the candidates compared by their loss alone; the gradient only at the one chosen
    (loss, buffer, total), start = min(((loss_and_exps(start), start) for start in starts),
                                       key=lambda pair: pair[0][0])
    grad, residual = grad_residual(start, buffer, total)
    squares, mean_squares = x * x, np.mean(x * x, axis=0)  # the Jacobi scaling's, once a fit
    stop_at = ODIR_STOP_MARGIN * grad_tolerance

    def scaled_round(theta: np.ndarray, scale: np.ndarray, evaluation: tuple[float, np.ndarray, np.ndarray],
                     iterations: int) -> tuple[np.ndarray, tuple[float, np.ndarray, np.ndarray], int]:
        """L-BFGS-B on v = θ/s from θ (its evaluation given) for at most ``iterations`` iterations."""
        last = {"v": theta / scale, "evaluation": evaluation}

        def evaluate(v: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
            if not np.array_equal(v, last["v"]):
                last["v"], last["evaluation"] = v.copy(), loss_grad_residual(scale * v)
            return last["evaluation"]

        def scaled_loss_and_grad(v: np.ndarray) -> tuple[float, np.ndarray]:
            loss, grad, _ = evaluate(v)
            return loss, scale * grad

        def stop_when_converged(intermediate_result: scipy.optimize.OptimizeResult) -> None:
            if np.abs(evaluate(intermediate_result.x)[1] * test_scale).max() < stop_at:
                raise StopIteration

        result = scipy.optimize.minimize(scaled_loss_and_grad, last["v"], jac=True, method="L-BFGS-B",
                                         callback=stop_when_converged,
                                         options={"maxcor": 30, "gtol": 0.0, "ftol": 0.0, "maxiter": iterations,
                                                  "maxfun": 2 * iterations})
        return scale * result.x, evaluate(result.x), int(result.nit)

    theta, evaluation, steps, rounds = start, (loss, grad, residual), 0, 0
    while not np.abs(evaluation[1] * test_scale).max() < stop_at and steps < max_iter:
        probs = evaluation[2].copy()
        probs[rows, y] += 1.0
        iterations = min(ODIR_RESCALE_ITERATIONS * 2**rounds, max_iter - steps)
        previous_loss = evaluation[0]
        scale = _jacobi_scale(squares, mean_squares, probs, off_mask, off_penalty, bias_penalty)
        theta, evaluation, done = scaled_round(theta, scale, evaluation, iterations)
        steps, rounds = steps + done, rounds + 1
        if done < iterations and not evaluation[0] < previous_loss:
            break  # no progress (the line search at float precision): rescaling will not help
    loss, grad, _ = evaluation
    grad_max_abs = float(np.abs(grad * test_scale).max())
    weight = theta[:size].reshape(num_classes, num_classes).copy()
    return weight, theta[size:].copy(), LBFGSResult(loss, grad_max_abs, steps, grad_max_abs < grad_tolerance)


def _jacobi_scale(squares: np.ndarray, mean_squares: np.ndarray, probs: np.ndarray, off_mask: np.ndarray,
                  off_penalty: float, bias_penalty: float) -> np.ndarray:
    """s = 1/sqrt(h) for θ = (W, b) of :func:`fit_odir`, h the Hessian's diagonal at p = ``probs``, from the
    features' squares x² (N, C) and their column means:
    h(W_kj) = mean_i p_ik(1 − p_ik) x_ij² + 2λ/(C(C−1))·[k ≠ j], h(b_k) = mean_i p_ik(1 − p_ik) + 2μ/C, the NLL
    terms at least :data:`JACOBI_FLOOR` times their bound mean_i x_ij²/4 (1/4): where p is near one-hot (a sharp
    model, a poor start) the curvature there says little about the curvature on the way.

    The softmax is invariant to W + 1vᵀ and b + c·1. Where no penalty fixes that (λ = 0 for W, μ = 0 for b) the
    NLL terms are averaged over the rows k, so that the scaled steps, like the gradient, keep the column sums of W
    (the sum of b) of the start: the fit ends at the optimum an unscaled fit from the same start reaches."""
    spread = probs * (1.0 - probs) / squares.shape[0]
    nll_weight, nll_bias = spread.T @ squares, spread.sum(axis=0)
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
                starts[fold] = (weight, bias)
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
