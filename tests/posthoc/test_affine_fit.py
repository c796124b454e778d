"""The exact-derivative fits of VS, SVS and SMS (calib/posthoc/_affine_fit.py): the per-class problem's gradient and
Hessian against torch's autograd, both fits' optima against scipy's BFGS on the objective restated here, and the
singular, unconverged and invariant cases."""

import numpy as np
import pytest
import torch
from posthoc_cases import overconfident_logits
from scipy.optimize import minimize
from scipy.special import log_softmax

from calib.posthoc._affine_fit import _PerClassProblem, fit_full_affine, fit_per_class_affine, softmax_nll

pytestmark = pytest.mark.usefixtures("one_thread")


def data(num_samples=300, num_classes=4, seed=0):
    z, y = overconfident_logits(num_samples, num_classes, seed=seed, shift=np.linspace(-1, 1, num_classes))
    return z.numpy(), y.numpy()


def mean_nll(logits, labels):
    return -log_softmax(logits, axis=1)[np.arange(len(labels)), labels].mean()


def scipy_minimum(objective, start):
    """argmin of ``objective`` (value, gradient) by scipy's BFGS to a 1e-10 gradient."""
    result = minimize(objective, start, jac=True, method="BFGS", options={"gtol": 1e-10, "maxiter": 10_000})
    return result.x, result.fun


def test_softmax_nll_in_place():
    x, y = data()
    logits = 2 * x
    nll, probs = softmax_nll(logits.copy(), y, np.arange(len(y)))
    assert nll == pytest.approx(mean_nll(2 * x, y), abs=1e-14)
    np.testing.assert_allclose(probs, np.exp(log_softmax(2 * x, axis=1)), rtol=1e-13, atol=0)


def test_per_class_gradient_and_hessian_against_autograd():
    x, y = data(60, 3)
    weight_penalty, bias_penalty = 0.3, 0.2
    problem = _PerClassProblem(x, y, weight_penalty, bias_penalty)
    theta = np.array([0.8, 1.3, 1.1, 0.4, -0.2, 0.1])

    def objective(t):
        w, b = t[:3], t[3:]
        nll = torch.nn.functional.cross_entropy(torch.from_numpy(x) * w + b, torch.from_numpy(y))
        return nll + weight_penalty * ((w - 1) ** 2).sum() + bias_penalty * (b**2).sum()

    t = torch.from_numpy(theta)
    assert problem.loss(theta) == pytest.approx(float(objective(t)), abs=1e-14)
    np.testing.assert_allclose(problem.gradient(theta), torch.autograd.functional.jacobian(objective, t).numpy(),
                               rtol=0, atol=1e-14)
    np.testing.assert_allclose(problem.hessian(), torch.autograd.functional.hessian(objective, t).numpy(),
                               rtol=0, atol=1e-13)


def per_class_objective(x, y, weight_penalty, bias_penalty):
    """NLL(w ⊙ x + b) + c_w Σ (w − 1)² + c_b Σ b² and its gradient, restated."""
    k = x.shape[1]

    def objective(theta):
        w, b = theta[:k], theta[k:]
        log_p = log_softmax(x * w + b, axis=1)
        residual = np.exp(log_p)
        residual[np.arange(len(y)), y] -= 1
        residual /= len(y)
        loss = -log_p[np.arange(len(y)), y].mean() + weight_penalty * ((w - 1) ** 2).sum() + bias_penalty * (b**2).sum()
        return loss, np.concatenate([(residual * x).sum(0) + 2 * weight_penalty * (w - 1),
                                     residual.sum(0) + 2 * bias_penalty * b])

    return objective, np.concatenate([np.ones(k), np.zeros(k)])


@pytest.mark.parametrize(("weight_penalty", "bias_penalty"), [(0.0, 0.0), (0.05, 0.01), (2.0, 0.5)])
def test_per_class_fit_matches_scipy(weight_penalty, bias_penalty):
    x, y = data()
    expected, loss = scipy_minimum(*per_class_objective(x, y, weight_penalty, bias_penalty))
    weight, bias, result = fit_per_class_affine(x, y, weight_penalty=weight_penalty, bias_penalty=bias_penalty)
    assert result.converged and result.grad_max_abs < 1e-6 and result.steps < 15  # Newton: a handful of steps
    assert result.loss == pytest.approx(loss, abs=1e-12)
    if bias_penalty == 0:  # b is fixed up to a constant; the fit keeps the start's Σ b = 0, as scipy's gradient does
        assert abs(bias.sum()) < 1e-12
    np.testing.assert_allclose(np.concatenate([weight, bias]), expected, rtol=0, atol=1e-6)


def test_per_class_fit_with_a_singular_hessian():
    # A constant column: w_2 and b_2 move the logits alike (a zero eigenvalue): the pseudo-inverse's steps reach the
    # minimum, whose value is unique, and stay finite.
    x, y = data(200, 4, seed=8)
    x[:, 2] = 1.5
    weight, bias, result = fit_per_class_affine(x, y, weight_penalty=0.0, bias_penalty=0.0)
    assert result.converged and np.isfinite(weight).all() and np.isfinite(bias).all()
    assert result.loss == pytest.approx(scipy_minimum(*per_class_objective(x, y, 0.0, 0.0))[1], abs=1e-12)
    unconverged = fit_per_class_affine(x, y, weight_penalty=0.0, bias_penalty=0.0, max_iter=1)[2]
    assert not unconverged.converged and unconverged.steps == 1 and unconverged.grad_max_abs >= 1e-6


@pytest.mark.parametrize(("off_diagonal", "diagonal", "bias_penalty"), [(0.5, 0.1, 0.2), (0.0, 0.0, 0.0)])
def test_full_fit_matches_scipy(off_diagonal, diagonal, bias_penalty):
    x, y = data(300, 3, seed=3)
    k = x.shape[1]
    penalty = np.full((k, k), off_diagonal)
    np.fill_diagonal(penalty, diagonal)

    def objective(theta):
        deviation, b = theta[:k * k].reshape(k, k), theta[k * k:]
        logits = x @ (np.eye(k) + deviation).T + b
        log_p = log_softmax(logits, axis=1)
        residual = np.exp(log_p)
        residual[np.arange(len(y)), y] -= 1
        residual /= len(y)
        loss = (-log_p[np.arange(len(y)), y].mean() + (penalty * deviation**2).sum() + bias_penalty * (b**2).sum())
        return loss, np.concatenate([(residual.T @ x + 2 * penalty * deviation).ravel(),
                                     residual.sum(0) + 2 * bias_penalty * b])

    expected, loss = scipy_minimum(objective, np.zeros(k * k + k))
    deviation, bias, result = fit_full_affine(x, y, weight_penalty=penalty, bias_penalty=bias_penalty)
    assert result.converged and result.grad_max_abs < 1e-7  # runs on to a tenth of the tolerance
    assert result.loss == pytest.approx(loss, abs=1e-12)
    if bias_penalty == 0:  # unpenalised: the scaled steps keep the invariant sums of the start, as the gradient does
        assert abs(bias.sum()) < 1e-10 and np.abs(deviation.sum(axis=0)).max() < 1e-10
    np.testing.assert_allclose(np.concatenate([deviation.ravel(), bias]), expected, rtol=0, atol=1e-5)
