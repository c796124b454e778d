"""Exact-derivative fits of the ridge-penalised affine maps of features x under a softmax: vector scaling and SVS
(:func:`fit_per_class_affine`, Newton's method) and SMS (:func:`fit_full_affine`, Jacobi-scaled L-BFGS-B).

Both minimise L(θ) = NLL(logits(θ)) + Σ c_j (θ_j − θ°_j)², θ° the identity map (weights 1, intercepts 0), with the
loss, gradient (and for the per-class map the Hessian) written out in numpy float64: one softmax pass and a few
matrix products an evaluation, no autograd graph. Both stop once max|∂L/∂u| < the gradient tolerance, u = θ·sqrt(1 +
2c) each parameter scaled by its penalty's curvature (the test of :func:`~calib.posthoc._lbfgs.fit_lbfgs`, so the
same stopping rule as the LBFGS fits they replace).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.optimize
from threadpoolctl import threadpool_limits

from calib.posthoc._lbfgs import GRAD_TOLERANCE, LBFGSResult
from calib.posthoc.odir_cv import JACOBI_FLOOR, ODIR_STOP_MARGIN, nll_curvature

__all__ = ["FULL_HISTORY", "FULL_MAX_ITER", "FULL_ROUNDS", "NEWTON_MAX_ITER", "fit_full_affine",
           "fit_per_class_affine", "softmax_nll"]

NEWTON_MAX_ITER = 200
"""At most this many Newton iterations (a fit from the identity takes 5–15; a class without samples or a separable
calibration set, whose optimum is at infinity, about one per e-fold of the vanishing gradient)."""

FULL_MAX_ITER = 15_000
"""At most this many L-BFGS-B iterations of :func:`fit_full_affine` (all rounds)."""

FULL_HISTORY = 50
"""L-BFGS-B's history (``maxcor``) in :func:`fit_full_affine`."""

FULL_ROUNDS = 4
"""At most this many L-BFGS-B rounds of :func:`fit_full_affine`, each with the scaling where it starts."""

_ARMIJO = 1e-4
"""The sufficient decrease a Newton step must make: L(θ + t s) <= L(θ) + ARMIJO·t·∇Lᵀs (halving t otherwise)."""

_PIVOT_RATIO = 1e-13
"""A Cholesky factor whose smallest squared pivot is below this fraction of its largest is treated as singular:
the step is then the pseudo-inverse's (eigenvalues below 1e-12 of the largest dropped)."""


def softmax_nll(logits: np.ndarray, labels: np.ndarray, rows: np.ndarray) -> tuple[float, np.ndarray]:
    """(mean NLL of softmax(logits) at the labels, the probabilities): ``logits`` (N, K) is overwritten in place by
    the probabilities, one exp pass."""
    logits -= logits.max(axis=1, keepdims=True)
    picked = logits[rows, labels]
    np.exp(logits, out=logits)
    total = logits.sum(axis=1)
    logits /= total[:, None]
    return float(np.mean(np.log(total) - picked)), logits


def _newton_step(hessian: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """−H⁻¹g by Cholesky, or by the pseudo-inverse where H is (nearly) singular."""
    try:
        factor = scipy.linalg.cho_factor(hessian, lower=True, check_finite=False)
        pivots = np.diag(factor[0]) ** 2
        if pivots.min() > _PIVOT_RATIO * pivots.max():
            return -scipy.linalg.cho_solve(factor, grad, check_finite=False)
    except np.linalg.LinAlgError:
        pass
    values, vectors = np.linalg.eigh(hessian)
    keep = values > 1e-12 * values.max()
    return -vectors[:, keep] @ ((vectors[:, keep].T @ grad) / values[keep])


class _PerClassProblem:
    """L(w, b) = NLL(w ⊙ x + b) + c_w Σ (w_k − 1)² + c_b Σ b_k² on float64 features x (N, K), labels y: its value,
    gradient and Hessian from one softmax pass."""

    def __init__(self, x: np.ndarray, y: np.ndarray, weight_penalty: float, bias_penalty: float) -> None:
        self.x, self.y = x, y
        self.num_samples, self.num_classes = x.shape
        self.rows = np.arange(self.num_samples)
        self.penalty = np.repeat([weight_penalty, bias_penalty], self.num_classes)
        self.centre = np.repeat([1.0, 0.0], self.num_classes)
        # the labels' sums Σ_{n: y_n = k} (x_nk, 1): the gradient's −onehot(y) terms
        self.label_sums = np.concatenate([np.bincount(y, weights=x[self.rows, y], minlength=self.num_classes),
                                          np.bincount(y, minlength=self.num_classes).astype(np.float64)])
        # A = [p ⊙ x, p] (N, 2K): the gradient is A's column sums less the labels', the Hessian diag(Aᵀ[x, 1]) − AᵀA;
        # p is written into A's right half
        self.buffer = np.empty((self.num_samples, 2 * self.num_classes))
        self.sums = np.zeros(2 * self.num_classes)
        self.null_direction = None
        if bias_penalty == 0:  # softmax(w ⊙ x + b + t·1) does not depend on t: a zero eigenvalue, b's mean
            self.null_direction = np.concatenate([np.zeros(self.num_classes),
                                                  np.full(self.num_classes, self.num_classes**-0.5)])

    def loss(self, theta: np.ndarray) -> float:
        """L(θ); the probabilities at θ stay in A's right half."""
        k = self.num_classes
        probs = self.buffer[:, k:]
        np.multiply(self.x, theta[:k], out=probs)
        probs += theta[k:]
        nll, _ = softmax_nll(probs, self.y, self.rows)
        deviation = theta - self.centre
        return nll + float(np.sum(self.penalty * deviation * deviation))

    def gradient(self, theta: np.ndarray) -> np.ndarray:
        """∇L at the θ of the last :meth:`loss` (A's left half filled with p ⊙ x)."""
        k = self.num_classes
        np.multiply(self.buffer[:, k:], self.x, out=self.buffer[:, :k])
        self.sums = self.buffer.sum(axis=0)  # (Σ p x, Σ p), also the Hessian's
        return (self.sums - self.label_sums) / self.num_samples + 2 * self.penalty * (theta - self.centre)

    def hessian(self) -> np.ndarray:
        """∇²L at the θ of the last :meth:`gradient`: diag(Aᵀ[x, 1]) − AᵀA, the w_k b_k cross terms and 2c."""
        k, n = self.num_classes, self.num_samples
        hessian = self.buffer.T @ self.buffer
        hessian /= -n
        diagonal = np.concatenate([np.einsum("nk,nk->k", self.buffer[:, :k], self.x), self.sums[k:]]) / n
        hessian[np.diag_indices(2 * k)] += diagonal + 2 * self.penalty
        cross = self.sums[:k] / n  # ∂²/∂w_k∂b_k
        hessian[np.arange(k), np.arange(k, 2 * k)] += cross
        hessian[np.arange(k, 2 * k), np.arange(k)] += cross
        if self.null_direction is not None:  # H + eeᵀ: the same step where g ⟂ e, and a Cholesky factor
            hessian += np.outer(self.null_direction, self.null_direction)
        return hessian


@threadpool_limits.wrap(limits=1, user_api="blas")  # small linear algebra: competing BLAS threads cost ~50x
def fit_per_class_affine(x: np.ndarray, y: np.ndarray, *, weight_penalty: float, bias_penalty: float,
                         grad_tolerance: float = GRAD_TOLERANCE,
                         max_iter: int = NEWTON_MAX_ITER) -> tuple[np.ndarray, np.ndarray, LBFGSResult]:
    """(w, b, how it ended) minimising NLL(w ⊙ x + b) + c_w Σ (w_k − 1)² + c_b Σ b_k² (c_w = ``weight_penalty``,
    c_b = ``bias_penalty``) on float64 features x (N, K) and labels y (N,), from w = 1, b = 0.

    Newton's method with the exact Hessian H = Σ_n J_nᵀ(diag(p_n) − p_n p_nᵀ)J_n / N + 2 diag(c), J_n = [diag(x_n), I]
    (a (N, 2K) × (N, 2K) product an iteration) and a backtracking (Armijo) line search, until max|∂L/∂u| <
    ``grad_tolerance``, u = θ·sqrt(1 + 2c). With c_b = 0 the NLL does not change along b + t·1; the steps keep Σ b
    at 0, as the gradient does. A singular H (a constant column of x) takes the pseudo-inverse's step.
    """
    problem = _PerClassProblem(x, y, weight_penalty, bias_penalty)
    test_scale = 1.0 / np.sqrt(1.0 + 2.0 * problem.penalty)
    theta = problem.centre.copy()
    loss = problem.loss(theta)
    grad = problem.gradient(theta)
    iterations = 0
    while np.abs(grad * test_scale).max() >= grad_tolerance and iterations < max_iter:
        iterations += 1
        step = _newton_step(problem.hessian(), grad)
        slope, size = float(grad @ step), 1.0
        if not slope < 0:
            break
        while True:
            new_loss = problem.loss(theta + size * step)
            if new_loss <= loss + _ARMIJO * size * slope or size < 1e-10:
                break
            size /= 2
        if not new_loss < loss:  # no decrease at float precision: the optimum is as close as it gets
            problem.loss(theta)
            break
        theta, loss = theta + size * step, new_loss
        grad = problem.gradient(theta)
    if not np.isfinite(loss):
        raise FloatingPointError(f"The per-class affine fit reached a non-finite objective ({loss}).")
    grad_max_abs = float(np.abs(grad * test_scale).max())
    k = problem.num_classes
    return theta[:k].copy(), theta[k:].copy(), LBFGSResult(loss, grad_max_abs, iterations,
                                                           grad_max_abs < grad_tolerance)


class _FullProblem:
    """L(Δ, b) = NLL(x (I + Δ)ᵀ + b) + Σ C_kj Δ_kj² + c_b Σ b_k² on float64 features x (N, K), labels y: its value and
    gradient from one softmax pass and two (N, K) × (K, K) products."""

    def __init__(self, x: np.ndarray, y: np.ndarray, weight_penalty: np.ndarray, bias_penalty: float) -> None:
        self.x, self.y = x, y
        self.num_samples, self.num_classes = x.shape
        self.rows = np.arange(self.num_samples)
        self.penalty = np.concatenate([weight_penalty.ravel(), np.full(self.num_classes, bias_penalty)])
        self.buffer = np.empty_like(x)
        self.last: tuple[np.ndarray, float, np.ndarray] | None = None

    def evaluate(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """(L, ∇L) at θ = (Δ, b) flattened; the probabilities at θ stay in the buffer."""
        if self.last is not None and np.array_equal(theta, self.last[0]):
            return self.last[1], self.last[2]
        k, n = self.num_classes, self.num_samples
        deviation, bias = theta[:k * k].reshape(k, k), theta[k * k:]
        logits = np.matmul(self.x, deviation.T, out=self.buffer)
        logits += self.x
        logits += bias
        nll, residual = softmax_nll(logits, self.y, self.rows)
        residual[self.rows, self.y] -= 1.0
        grad = np.concatenate([(residual.T @ self.x).ravel(), residual.sum(axis=0)]) / n + 2 * self.penalty * theta
        residual[self.rows, self.y] += 1.0  # the buffer holds p again
        loss = nll + float(np.sum(self.penalty * theta * theta))
        self.last = (theta.copy(), loss, grad)
        return loss, grad

    def jacobi_scale(self, theta: np.ndarray) -> np.ndarray:
        """1/sqrt(h), h the Hessian's diagonal at θ: mean_n p_nk(1 − p_nk) x_nj² for Δ_kj and mean_n p_nk(1 − p_nk)
        for b_k (each at least :data:`~calib.posthoc.odir_cv.JACOBI_FLOOR` times its bound), plus 2c. A group no
        penalty pins (the NLL is invariant to Δ + 1vᵀ and b + t·1) gets its rows' mean, so that the scaled steps keep
        the invariant sums of the start, as the gradient does."""
        self.evaluate(theta)
        k, squares = self.num_classes, self.x * self.x
        weight_curvature, bias_curvature = nll_curvature(squares, self.buffer)
        weight_curvature = np.maximum(weight_curvature, JACOBI_FLOOR * squares.mean(axis=0) / 4)
        bias_curvature = np.maximum(bias_curvature, JACOBI_FLOOR / 4)
        if not self.penalty[:k * k].any():
            weight_curvature = np.broadcast_to(weight_curvature.mean(axis=0), weight_curvature.shape)
        if not self.penalty[k * k:].any():
            bias_curvature = np.full_like(bias_curvature, bias_curvature.mean())
        curvature = np.concatenate([weight_curvature.ravel(), bias_curvature]) + 2 * self.penalty
        return 1.0 / np.sqrt(curvature)


@threadpool_limits.wrap(limits=1, user_api="blas")  # L-BFGS-B's small linear algebra: competing threads cost ~50x
def fit_full_affine(x: np.ndarray, y: np.ndarray, *, weight_penalty: np.ndarray, bias_penalty: float,
                    grad_tolerance: float = GRAD_TOLERANCE,
                    max_iter: int = FULL_MAX_ITER) -> tuple[np.ndarray, np.ndarray, LBFGSResult]:
    """(Δ, b, how it ended) minimising NLL(x (I + Δ)ᵀ + b) + Σ C_kj Δ_kj² + c_b Σ b_k² (C = ``weight_penalty``
    (K, K), c_b = ``bias_penalty``) on float64 features x (N, K) and labels y (N,), from Δ = 0, b = 0.

    scipy's L-BFGS-B (history :data:`FULL_HISTORY`) with the exact gradient on v = θ/s, s = 1/sqrt(h) with h the
    Hessian's diagonal at the start (a change of variables: the same optimum in about half the iterations), until
    max|∂L/∂u| < ``grad_tolerance``, u = θ·sqrt(1 + 2c): as the scaled steps reach it by another path than unscaled
    ones, the fit runs on to :data:`~calib.posthoc.odir_cv.ODIR_STOP_MARGIN` times it, as ODIR's does. A round that
    stops short (L-BFGS-B's line search at float precision) is followed by one from where it ended with the scaling
    estimated there, up to :data:`FULL_ROUNDS` rounds and ``max_iter`` iterations in all.
    """
    problem = _FullProblem(x, y, weight_penalty, bias_penalty)
    test_scale = 1.0 / np.sqrt(1.0 + 2.0 * problem.penalty)
    theta = np.zeros_like(problem.penalty)

    iterations, stop_at = 0, ODIR_STOP_MARGIN * grad_tolerance
    for _ in range(FULL_ROUNDS):
        if _converged(problem, theta, test_scale, stop_at) or iterations >= max_iter:
            break
        start_loss = problem.evaluate(theta)[0]
        theta, done = _scaled_round(problem, theta, max_iter - iterations, test_scale, stop_at)
        iterations += done
        if not problem.evaluate(theta)[0] < start_loss:
            break
    loss, grad = problem.evaluate(theta)
    if not np.isfinite(loss):
        raise FloatingPointError(f"The affine fit reached a non-finite objective ({loss}).")
    grad_max_abs = float(np.abs(grad * test_scale).max())
    k = problem.num_classes
    return (theta[:k * k].reshape(k, k).copy(), theta[k * k:].copy(),
            LBFGSResult(loss, grad_max_abs, iterations, grad_max_abs < grad_tolerance))


def _converged(problem: _FullProblem, theta: np.ndarray, test_scale: np.ndarray, grad_tolerance: float) -> bool:
    return bool(np.abs(problem.evaluate(theta)[1] * test_scale).max() < grad_tolerance)


def _scaled_round(problem: _FullProblem, theta: np.ndarray, iterations: int, test_scale: np.ndarray,
                  grad_tolerance: float) -> tuple[np.ndarray, int]:
    """L-BFGS-B on v = θ/s, s the Jacobi scaling at θ, for at most ``iterations`` iterations, stopped once
    max|∂L/∂θ ⊙ test_scale| < ``grad_tolerance``: (θ where it ended, iterations)."""
    scale = problem.jacobi_scale(theta)

    def scaled(v: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = problem.evaluate(scale * v)
        return loss, scale * grad

    def stop_when_converged(intermediate_result: scipy.optimize.OptimizeResult) -> None:
        if _converged(problem, scale * intermediate_result.x, test_scale, grad_tolerance):
            raise StopIteration

    result = scipy.optimize.minimize(scaled, theta / scale, jac=True, method="L-BFGS-B", callback=stop_when_converged,
                                     options={"maxcor": FULL_HISTORY, "gtol": 0.0, "ftol": 0.0, "maxiter": iterations,
                                              "maxfun": 2 * iterations})
    return scale * result.x, int(result.nit)
