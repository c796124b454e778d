"""Dirichlet calibration with ODIR (docs/methods.md §5): the optimum against scipy, invariances, edge cases."""

import warnings

import numpy as np
import pytest
import torch
from posthoc_cases import overconfident_logits as make_data
from scipy.optimize import minimize
from scipy.special import log_softmax

from calib._config import ConfigError, from_dict
from calib.posthoc import POSTHOC
from calib.posthoc._base import DegenerateFitWarning
from calib.posthoc.dirichlet import DirichletCalibration, DirichletConfig

pytestmark = pytest.mark.usefixtures("one_thread")

FIXED_LAMBDA = 1000.0
FIXED = {"off_diagonal_weight": FIXED_LAMBDA, "intercept_weight": 0.1}
"""Fixed λ and μ (calib's defaults before the cross-validation) where a test is about something else."""


def scipy_dirichlet(z, labels, off_diagonal_weight, intercept_weight):
    """argmin_{W,b} NLL(log p Wᵀ + b) + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ b², log p = log softmax(z) in numpy,
    by scipy BFGS from W = I, b = 0 with the gradient by hand."""
    x, y = log_softmax(z.numpy(), axis=1), labels.numpy()
    c, rows = x.shape[1], np.arange(len(y))
    off = 1 - np.eye(c)

    def fun(theta):
        w, b = theta[: c * c].reshape(c, c), theta[c * c:]
        log_q = log_softmax(x @ w.T + b, axis=1)
        g = np.exp(log_q)
        g[rows, y] -= 1
        g /= len(y)
        loss = (-log_q[rows, y].mean() + off_diagonal_weight * ((w * off) ** 2).sum() / (c * (c - 1))
                + intercept_weight * (b**2).sum() / c)
        grad_w = g.T @ x + 2 * off_diagonal_weight * w * off / (c * (c - 1))
        return loss, np.concatenate([grad_w.ravel(), g.sum(0) + 2 * intercept_weight * b / c])

    result = minimize(fun, np.concatenate([np.eye(c).ravel(), np.zeros(c)]), jac=True, method="BFGS",
                      options={"gtol": 1e-10, "maxiter": 10000})
    return result.x[: c * c].reshape(c, c), result.x[c * c:], result.fun


class TestDirichletCalibration:
    @pytest.mark.parametrize(("off_diagonal_weight", "intercept_weight"), [(0.5, 0.2), (1000.0, 0.1), (0.0, 1e4)])
    def test_matches_scipy(self, off_diagonal_weight, intercept_weight):
        z, labels = make_data(300, 3, seed=1, shift=[0.8, -0.4, 0.0])
        dirichlet = DirichletCalibration(off_diagonal_weight=off_diagonal_weight,
                                         intercept_weight=intercept_weight).fit(z, labels)
        w, b, loss = scipy_dirichlet(z, labels, off_diagonal_weight, intercept_weight)
        np.testing.assert_allclose(dirichlet.weight.numpy(), w, atol=1e-5)
        np.testing.assert_allclose(dirichlet.bias.numpy(), b, atol=1e-5)
        assert dirichlet.fit_result.converged and dirichlet.fit_result.loss == pytest.approx(loss, abs=1e-10)
        expected = log_softmax(log_softmax(z.numpy(), axis=1) @ w.T + b, axis=1)
        np.testing.assert_allclose(dirichlet.probs(z).log().numpy(), expected, atol=1e-5)

    def test_defaults(self):
        # None: chosen by the paper's 5-fold cross-validation (tests/posthoc/test_odir_cv.py)
        dirichlet = DirichletCalibration()
        assert (dirichlet.off_diagonal_weight, dirichlet.intercept_weight) == (None, None)
        config = from_dict(DirichletConfig, {})
        assert (config.off_diagonal_weight, config.intercept_weight) == (None, None)

    def test_repeated_logit_vector_gives_the_class_frequencies(self):
        # One logit vector repeated, labels with counts (5, 3, 2): without the intercept penalty the NLL
        # optimum is p̂ = (0.5, 0.3, 0.2), reached through b.
        z = torch.tensor([[0.0, 1.0, 4.0]] * 10, dtype=torch.float64)
        labels = torch.tensor([0] * 5 + [1] * 3 + [2] * 2)
        probs = DirichletCalibration(off_diagonal_weight=FIXED_LAMBDA, intercept_weight=0.0).fit(z, labels).probs(z)
        torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.2]] * 10, dtype=torch.float64),
                                   atol=1e-6, rtol=0)

    def test_reads_only_the_probabilities(self):
        # log p is invariant to adding a constant to a row of logits, so the fit and the output are too.
        z, labels = make_data(300, 4, seed=2)
        shifted = z + 7 * torch.randn(300, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        a = DirichletCalibration(off_diagonal_weight=1.0, intercept_weight=0.1).fit(z, labels)
        b = DirichletCalibration(off_diagonal_weight=1.0, intercept_weight=0.1).fit(shifted, labels)
        torch.testing.assert_close(a.weight, b.weight, atol=1e-6, rtol=0)
        torch.testing.assert_close(a.probs(z), b.probs(shifted), atol=1e-7, rtol=0)

    def test_can_change_the_argmax(self):
        z, labels = make_data(2000, 3, seed=4, shift=[-2.0, 0.0, 0.0])
        dirichlet = DirichletCalibration(**FIXED).fit(z, labels)
        changed = dirichlet(z).argmax(1) != z.argmax(1)
        assert changed.sum() > 20 and (z.argmax(1)[changed] == 0).double().mean() > 0.9

    def test_bad_parameters(self):
        with pytest.raises(ValueError, match=r"off_diagonal_weight=-1"):
            DirichletCalibration(off_diagonal_weight=-1)
        with pytest.raises(ValueError, match=r"intercept_weight=inf"):
            DirichletCalibration(intercept_weight=float("inf"))
        with pytest.raises(ConfigError, match=r"`off_diagonal_weight` must be null \(chosen by 5-fold cross-"
                                              r"validation\) or a finite number >= 0, got off_diagonal_weight=-3.0"):
            from_dict(DirichletConfig, {"off_diagonal_weight": -3.0})
        with pytest.raises(ConfigError, match=r"`intercept_weight` must be null .* got intercept_weight=-1.0"):
            from_dict(DirichletConfig, {"intercept_weight": -1.0})
        with pytest.raises(ConfigError, match=r"`intercept_weight` must be a finite number, got intercept_weight=inf"):
            from_dict(DirichletConfig, {"intercept_weight": float("inf")})
        with pytest.raises(ConfigError, match=r"`off_diagonal_weight` must be a number"):
            from_dict(DirichletConfig, {"off_diagonal_weight": "big"})
        with pytest.raises(RuntimeError, match="not fitted"):
            DirichletCalibration()(torch.zeros(2, 3))
        z, labels = make_data(60, 3)
        with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 5"):
            DirichletCalibration(**FIXED).fit(z, labels)(torch.zeros(2, 5))

    def test_registered(self):
        assert isinstance(POSTHOC.create("dirichlet"), DirichletCalibration)


class TestEdgeCases:
    def check_outputs(self, calibrator, z):
        probs = calibrator.probs(z)
        assert torch.isfinite(calibrator(z)).all() and torch.isfinite(probs).all()
        torch.testing.assert_close(probs.sum(1), torch.ones(len(z), dtype=torch.float64))
        return probs

    @pytest.mark.parametrize("intercept_weight", [0.1, 0.0])
    def test_absent_class(self, intercept_weight):
        z, labels = make_data(200, 5, seed=5)
        keep = labels != 4
        z, labels = z[keep], labels[keep]
        with pytest.warns(DegenerateFitWarning, match=r"class 4 absent from the calibration set: their diagonal "
                                                      r"weight W_kk has no finite optimum"):
            dirichlet = DirichletCalibration(off_diagonal_weight=FIXED_LAMBDA,
                                             intercept_weight=intercept_weight).fit(z, labels)
        probs = self.check_outputs(dirichlet, z)
        assert dirichlet.fit_result.converged and probs[:, 4].mean() < z.softmax(1)[:, 4].mean() / 3
        assert dirichlet.degenerate and dirichlet.fit_details()["fit_degenerate"]

    def test_ties_in_confidence(self):
        z, labels = make_data(100, 4, seed=6)
        z[:, 1] = z[:, 0]
        z[50:] = z[:50]
        dirichlet = DirichletCalibration(**FIXED).fit(z, labels)
        self.check_outputs(dirichlet, z)
        torch.testing.assert_close(dirichlet(z[50:]), dirichlet(z[:50]))

    def test_fifty_samples_ten_classes(self):
        z, labels = make_data(50, 10, seed=7)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            dirichlet = DirichletCalibration(**FIXED).fit(z, labels)
        self.check_outputs(dirichlet, z)

    def test_constant_column(self):
        z, labels = make_data(200, 4, seed=8)
        z[:, 2] = -1.0
        self.check_outputs(DirichletCalibration(**FIXED).fit(z, labels), z)

    def test_extreme_logits(self):
        # Logit gaps of ~1000: p underflows in float64, log p does not (it is computed as a log-softmax).
        z, labels = make_data(200, 4, seed=9)
        z[:, 3] = z[:, 3] * 300
        self.check_outputs(DirichletCalibration().fit(z, labels), z)
