"""Vector scaling and matrix scaling with ODIR (docs/methods.md §5): the optima against scipy, by hand, edge cases."""

import warnings

import numpy as np
import pytest
import torch
from posthoc_cases import overconfident_logits as make_data
from scipy.optimize import minimize
from scipy.special import log_softmax

from calib._config import ConfigError, from_dict
from calib.posthoc import POSTHOC
from calib.posthoc.vector_scaling import (
    MatrixScaling,
    MatrixScalingConfig,
    VectorScaling,
    VectorScalingConfig,
    fit_lbfgs,
    odir_penalty,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def nll_and_logit_grad(logits, labels):
    """Mean NLL of softmax(logits) and its gradient in the logits, numpy float64."""
    log_p = log_softmax(logits, axis=1)
    rows = np.arange(len(labels))
    grad = np.exp(log_p)
    grad[rows, labels] -= 1
    return -log_p[rows, labels].mean(), grad / len(labels)


def scipy_vector_scaling(z, labels, intercept_weight=0.0):
    """argmin_{w,b} NLL(z ⊙ w + b) + μ/C Σ b² by scipy BFGS from w = 1, b = 0 with the gradient by hand."""
    z, y = z.numpy(), labels.numpy()
    c = z.shape[1]

    def fun(theta):
        w, b = theta[:c], theta[c:]
        nll, g = nll_and_logit_grad(z * w + b, y)
        loss = nll + intercept_weight * (b**2).sum() / c
        return loss, np.concatenate([(g * z).sum(0), g.sum(0) + 2 * intercept_weight * b / c])

    result = minimize(fun, np.concatenate([np.ones(c), np.zeros(c)]), jac=True, method="BFGS",
                      options={"gtol": 1e-10, "maxiter": 10000})
    return result.x[:c], result.x[c:], result.fun


def scipy_matrix_scaling(x, labels, off_diagonal_weight, intercept_weight):
    """argmin_{W,b} NLL(x Wᵀ + b) + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ b² by scipy BFGS from W = I, b = 0."""
    y, c = labels.numpy(), x.shape[1]
    off = 1 - np.eye(c)

    def fun(theta):
        w, b = theta[: c * c].reshape(c, c), theta[c * c:]
        nll, g = nll_and_logit_grad(x @ w.T + b, y)
        loss = nll + off_diagonal_weight * ((w * off) ** 2).sum() / (c * (c - 1)) + intercept_weight * (b**2).sum() / c
        grad_w = g.T @ x + 2 * off_diagonal_weight * w * off / (c * (c - 1))
        return loss, np.concatenate([grad_w.ravel(), g.sum(0) + 2 * intercept_weight * b / c])

    result = minimize(fun, np.concatenate([np.eye(c).ravel(), np.zeros(c)]), jac=True, method="BFGS",
                      options={"gtol": 1e-10, "maxiter": 10000})
    return result.x[: c * c].reshape(c, c), result.x[c * c:], result.fun


def nll(probs, labels):
    return float(-probs[torch.arange(len(labels)), labels].log().mean())


class TestVectorScaling:
    def test_matches_scipy(self):
        z, labels = make_data(400, 4, shift=[1.0, 0.0, -0.5, 0.0])
        vs = VectorScaling().fit(z, labels)
        w, b, loss = scipy_vector_scaling(z, labels)
        np.testing.assert_allclose(vs.weight.numpy(), w, atol=1e-5)
        # softmax is invariant to b + const; both fits keep Σb = 0 (every gradient in b sums to 0)
        np.testing.assert_allclose(vs.bias.numpy() - vs.bias.numpy().mean(), b - b.mean(), atol=1e-5)
        assert vs.fit_result.converged and vs.fit_result.loss == pytest.approx(loss, abs=1e-10)
        assert nll(vs.probs(z), labels) == pytest.approx(loss, abs=1e-10)
        torch.testing.assert_close(vs(z), z * vs.weight + vs.bias)

    def test_intercept_term_matches_scipy(self):
        z, labels = make_data(300, 3, seed=1, shift=[1.5, 0.0, 0.0])
        vs = VectorScaling(intercept_weight=2.0).fit(z, labels)
        w, b, loss = scipy_vector_scaling(z, labels, intercept_weight=2.0)
        np.testing.assert_allclose(vs.weight.numpy(), w, atol=1e-5)
        np.testing.assert_allclose(vs.bias.numpy(), b, atol=1e-5)  # unique: the penalty fixes the constant
        assert vs.fit_result.loss == pytest.approx(loss, abs=1e-10)

    def test_repeated_logit_vector_gives_the_class_frequencies(self):
        # Every row is z = (1, 2, 3) and the labels have counts (5, 3, 2): the NLL optimum over p is the
        # empirical frequencies, which vector scaling reaches through b.
        z = torch.tensor([[1.0, 2.0, 3.0]] * 10, dtype=torch.float64)
        labels = torch.tensor([0] * 5 + [1] * 3 + [2] * 2)
        probs = VectorScaling().fit(z, labels).probs(z)
        torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.2]] * 10, dtype=torch.float64),
                                   atol=1e-6, rtol=0)

    def test_can_change_the_argmax(self):
        # Labels drawn with class 0 penalised by −2: VS learns a lower intercept for class 0 and
        # moves predictions away from it (the accuracy rises).
        z, labels = make_data(2000, 3, seed=2, shift=[-2.0, 0.0, 0.0])
        vs = VectorScaling().fit(z, labels)
        changed = vs(z).argmax(1) != z.argmax(1)
        assert changed.sum() > 20 and (z.argmax(1)[changed] == 0).double().mean() > 0.9
        assert (vs(z).argmax(1) == labels).double().mean() > (z.argmax(1) == labels).double().mean()

    def test_bad_parameters(self):
        with pytest.raises(ValueError, match=r"intercept_weight=-1"):
            VectorScaling(intercept_weight=-1)
        with pytest.raises(ConfigError,
                           match=r"`intercept_weight` must be a finite number >= 0, got intercept_weight=-0.5"):
            from_dict(VectorScalingConfig, {"intercept_weight": -0.5})
        assert from_dict(VectorScalingConfig, {}).intercept_weight == 0.0
        with pytest.raises(RuntimeError, match="not fitted"):
            VectorScaling()(torch.zeros(2, 3))
        z, labels = make_data(50, 3)
        with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 4"):
            VectorScaling().fit(z, labels)(torch.zeros(2, 4))

    def test_registered(self):
        assert isinstance(POSTHOC.create("vector_scaling"), VectorScaling)


class TestMatrixScaling:
    def test_odir_penalty_by_hand(self):
        weight = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
        bias = torch.tensor([1.0, -1.0], dtype=torch.float64)
        # λ/(C(C−1))·(2² + 3²) + μ/C·(1 + 1) = 2/2·13 + 3/2·2 = 16
        assert odir_penalty(weight, bias, 2.0, 3.0).item() == pytest.approx(16.0)
        diagonal, zero = 5 * torch.eye(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
        assert odir_penalty(diagonal, zero, 9.0, 9.0).item() == 0  # no off-diagonal, no intercept

    @pytest.mark.parametrize(("off_diagonal_weight", "intercept_weight"), [(0.5, 0.2), (1000.0, 0.1)])
    def test_matches_scipy(self, off_diagonal_weight, intercept_weight):
        z, labels = make_data(300, 3, seed=3, shift=[0.5, -0.5, 0.0])
        ms = MatrixScaling(off_diagonal_weight=off_diagonal_weight, intercept_weight=intercept_weight).fit(z, labels)
        w, b, loss = scipy_matrix_scaling(z.numpy(), labels, off_diagonal_weight, intercept_weight)
        np.testing.assert_allclose(ms.weight.numpy(), w, atol=1e-5)
        np.testing.assert_allclose(ms.bias.numpy(), b, atol=1e-5)
        assert ms.fit_result.converged and ms.fit_result.loss == pytest.approx(loss, abs=1e-10)
        torch.testing.assert_close(ms(z), z @ ms.weight.T + ms.bias)

    def test_strong_off_diagonal_weight_gives_a_diagonal_map(self):
        z, labels = make_data(300, 4, seed=4)
        ms = MatrixScaling(off_diagonal_weight=1e9, intercept_weight=0.0).fit(z, labels)
        off_diagonal = ms.weight - torch.diag(ms.weight.diagonal())
        assert ms.fit_result.converged and off_diagonal.abs().max() < 1e-8  # well conditioned despite λ = 1e9
        vs = VectorScaling().fit(z, labels)  # then matrix scaling is vector scaling
        np.testing.assert_allclose(ms.weight.diagonal().numpy(), vs.weight.numpy(), atol=1e-4)

    def test_can_change_the_argmax(self):
        z, labels = make_data(2000, 3, seed=2, shift=[-2.0, 0.0, 0.0])
        ms = MatrixScaling(off_diagonal_weight=1.0, intercept_weight=0.0).fit(z, labels)
        assert (ms(z).argmax(1) != z.argmax(1)).any()

    def test_bad_parameters(self):
        with pytest.raises(ValueError, match=r"off_diagonal_weight=-1"):
            MatrixScaling(off_diagonal_weight=-1)
        with pytest.raises(ValueError, match=r"intercept_weight=nan"):
            MatrixScaling(intercept_weight=float("nan"))
        with pytest.raises(ConfigError, match=r"`off_diagonal_weight` must be null \(chosen by 5-fold cross-"
                                              r"validation\) or a finite number >= 0, got off_diagonal_weight=-2.0"):
            from_dict(MatrixScalingConfig, {"off_diagonal_weight": -2.0})
        with pytest.raises(ConfigError, match=r"`intercept_weight` must be null .* or a finite number >= 0"):
            from_dict(MatrixScalingConfig, {"intercept_weight": -1e-3})
        config = from_dict(MatrixScalingConfig, {})  # the default: both by cross-validation
        assert (config.off_diagonal_weight, config.intercept_weight) == (None, None)
        assert from_dict(MatrixScalingConfig, {"off_diagonal_weight": None}).off_diagonal_weight is None

    def test_registered(self):
        assert isinstance(POSTHOC.create("matrix_scaling"), MatrixScaling)


CALIBRATORS = [VectorScaling, MatrixScaling]


@pytest.mark.parametrize("calibrator_class", CALIBRATORS)
class TestEdgeCases:
    def check_outputs(self, calibrator, z):
        probs = calibrator.probs(z)
        assert torch.isfinite(calibrator(z)).all() and torch.isfinite(probs).all()
        torch.testing.assert_close(probs.sum(1), torch.ones(len(z), dtype=torch.float64))
        return probs

    def test_absent_class(self, calibrator_class):
        z, labels = make_data(200, 5, seed=5)
        keep = labels != 4
        z, labels = z[keep], labels[keep]
        calibrator = calibrator_class().fit(z, labels)
        probs = self.check_outputs(calibrator, z)
        assert probs[:, 4].mean() < z.softmax(1)[:, 4].mean() / 3  # pushed towards 0, finitely

    def test_absent_class_without_intercept_penalty_stops_at_the_gradient_tolerance(self, calibrator_class):
        z, labels = make_data(200, 5, seed=5)
        keep = labels != 4
        calibrator = calibrator_class(intercept_weight=0.0).fit(z[keep], labels[keep])
        assert calibrator.fit_result.converged and torch.isfinite(calibrator.bias).all()

    def test_ties_in_confidence(self, calibrator_class):
        z, labels = make_data(100, 4, seed=6)
        z[:, 1] = z[:, 0]  # two tied top classes wherever class 0 leads
        z[50:] = z[:50]  # and every row twice
        calibrator = calibrator_class().fit(z, labels)
        self.check_outputs(calibrator, z)
        torch.testing.assert_close(calibrator(z[50:]), calibrator(z[:50]))

    def test_fifty_samples_ten_classes(self, calibrator_class):
        z, labels = make_data(50, 10, seed=7)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            calibrator = calibrator_class().fit(z, labels)
        self.check_outputs(calibrator, z)

    def test_constant_column(self, calibrator_class):
        z, labels = make_data(200, 4, seed=8)
        z[:, 2] = 1.5
        calibrator = calibrator_class().fit(z, labels)
        self.check_outputs(calibrator, z)

    def test_float32_input(self, calibrator_class):
        z, labels = make_data(100, 3, seed=9)
        calibrator = calibrator_class().fit(z.float(), labels)
        assert calibrator(z.float()).dtype == torch.float32
        torch.testing.assert_close(calibrator(z.float()).double(), calibrator(z.float().double()), atol=1e-5, rtol=0)


class TestFitLBFGS:
    def test_quadratic(self):
        # min (x − 3)² + 10 (y + 1)²: x = 3, y = −1.
        x = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        result = fit_lbfgs([x], lambda: (x[0] - 3) ** 2 + 10 * (x[1] + 1) ** 2, what="quadratic")
        assert result.converged and result.grad_max_abs < 1e-6
        torch.testing.assert_close(x.detach(), torch.tensor([3.0, -1.0], dtype=torch.float64))

    def test_warns_when_not_converged(self):
        x = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        with pytest.warns(RuntimeWarning, match=r"exp LBFGS fit stopped at max\|∂L/∂u\|="):
            result = fit_lbfgs([x], lambda: torch.exp(x).sum(), what="exp", max_iter=1, max_steps=1)
        assert not result.converged

    def test_non_finite_objective_raises(self):
        x = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        with pytest.raises(FloatingPointError, match="non-finite objective"):
            fit_lbfgs([x], lambda: (x * float("nan")).sum(), what="nan")
