"""Class-wise temperature scaling (docs/methods.md §5): the NLL optimum against scipy, recovery, edge cases."""

import math
import warnings

import numpy as np
import pytest
import torch
from posthoc_cases import overconfident_logits
from scipy.optimize import minimize, minimize_scalar
from scipy.special import log_softmax

from calib.posthoc import POSTHOC
from calib.posthoc.classwise_ts import ClasswiseTemperatureScaling, ClasswiseTemperatureScalingConfig

pytestmark = pytest.mark.usefixtures("one_thread")

TRUE_TEMPERATURES = (0.5, 1.0, 2.0, 4.0)


def make_data(num_samples, temperatures, *, seed=0, scale=3.0):
    """Logits z = scale·N(0, 1) and labels drawn from softmax(z_k / T_k) with the given T_k."""
    return overconfident_logits(num_samples, len(temperatures), seed=seed, scale=scale, temperature=temperatures)


def nll_and_grad(log_temperatures, z, y):
    """NLL of softmax(z_k / T_k) and its gradient in τ = log T, numpy float64, by hand."""
    temperatures = np.exp(log_temperatures)
    log_p = log_softmax(z / temperatures, axis=1)
    rows = np.arange(len(y))
    g = np.exp(log_p)
    g[rows, y] -= 1
    # ∂(z_ik e^{−τ_k})/∂τ_k = −z_ik / T_k
    return -log_p[rows, y].mean(), -(g * z / temperatures).sum(0) / len(y)


def scipy_classwise(z, labels):
    """The single NLL-optimal T by bounded Brent, then τ by scipy BFGS from log T."""
    z, y = z.numpy(), labels.numpy()
    single = minimize_scalar(lambda t: nll_and_grad(np.full(z.shape[1], t), z, y)[0], method="bounded",
                             bounds=(math.log(0.01), math.log(100.0)), options={"xatol": 1e-10}).x
    result = minimize(nll_and_grad, np.full(z.shape[1], single), args=(z, y), jac=True, method="BFGS",
                      options={"gtol": 1e-10, "maxiter": 10000})
    return math.exp(single), np.exp(result.x), result.fun


class TestClasswiseTemperatureScaling:
    def test_matches_scipy(self):
        z, labels = make_data(600, TRUE_TEMPERATURES, seed=1)
        cts = ClasswiseTemperatureScaling().fit(z, labels)
        single, temperatures, loss = scipy_classwise(z, labels)
        assert cts.initial_temperature == pytest.approx(single, rel=1e-5)
        np.testing.assert_allclose(cts.temperatures.numpy(), temperatures, rtol=1e-4)  # both stop at |grad| ~ 1e-6
        assert cts.fit_result.converged and cts.fit_result.loss == pytest.approx(loss, abs=1e-10)
        torch.testing.assert_close(cts(z), z / cts.temperatures)

    def test_recovers_class_temperatures(self):
        z, labels = make_data(20000, TRUE_TEMPERATURES, seed=2)
        cts = ClasswiseTemperatureScaling().fit(z, labels)
        # the T_k are identified (no common rescaling leaves softmax(z_k / T_k) unchanged); loose: N = 20000
        np.testing.assert_allclose(cts.temperatures.numpy(), TRUE_TEMPERATURES, rtol=0.1)

    def test_can_change_the_argmax(self):
        # T = (0.5, 4): class 0 is sharpened, class 1 flattened, so z = (1, 1.5) becomes (2, 0.375).
        z, labels = make_data(4000, (0.5, 4.0), seed=3)
        cts = ClasswiseTemperatureScaling().fit(z, labels)
        changed = cts(z).argmax(1) != z.argmax(1)
        assert changed.sum() > 50
        assert (cts(z).argmax(1) == labels).double().mean() > (z.argmax(1) == labels).double().mean()

    def test_bad_parameters(self):
        with pytest.raises(ValueError, match=r"grad_tolerance=0"):
            ClasswiseTemperatureScaling(grad_tolerance=0)
        with pytest.raises(RuntimeError, match="not fitted"):
            ClasswiseTemperatureScaling()(torch.zeros(2, 3))
        z, labels = make_data(60, (1.0, 1.0, 1.0))
        with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 2"):
            ClasswiseTemperatureScaling().fit(z, labels)(torch.zeros(2, 2))
        with pytest.raises(ValueError, match=r"got values in \[3, 3\]"):
            ClasswiseTemperatureScaling().fit(z, torch.tensor([3] * 60))
        assert ClasswiseTemperatureScalingConfig().calibration_size is None

    def test_registered(self):
        assert isinstance(POSTHOC.create("classwise_ts"), ClasswiseTemperatureScaling)


class TestEdgeCases:
    def check_outputs(self, calibrator, z):
        probs = calibrator.probs(z)
        assert torch.isfinite(calibrator(z)).all() and torch.isfinite(probs).all()
        torch.testing.assert_close(probs.sum(1), torch.ones(len(z), dtype=torch.float64))
        assert (calibrator.temperatures > 0).all()
        return probs

    def test_absent_class(self):
        z, labels = make_data(300, (1.0, 1.0, 1.0, 1.0), seed=4)
        keep = labels != 3
        cts = ClasswiseTemperatureScaling().fit(z[keep], labels[keep])
        self.check_outputs(cts, z[keep])
        assert cts.fit_result.converged

    def test_ties_in_confidence(self):
        z, labels = make_data(100, (1.0, 1.0, 1.0, 1.0), seed=5)
        z[:, 1] = z[:, 0]
        z[50:] = z[:50]
        cts = ClasswiseTemperatureScaling().fit(z, labels)
        self.check_outputs(cts, z)
        torch.testing.assert_close(cts(z[50:]), cts(z[:50]))

    def test_fifty_samples_ten_classes(self):
        z, labels = make_data(50, (1.0,) * 10, seed=6)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            cts = ClasswiseTemperatureScaling().fit(z, labels)
        self.check_outputs(cts, z)

    @pytest.mark.parametrize("value", [2.0, 0.0])
    def test_constant_column(self, value):
        # A constant column c acts as an intercept c / T_k; c = 0 leaves T_k without gradient (it stays at T_TS).
        z, labels = make_data(300, (1.0, 1.0, 1.0, 1.0), seed=7)
        z[:, 2] = value
        cts = ClasswiseTemperatureScaling().fit(z, labels)
        self.check_outputs(cts, z)
        if value == 0.0:
            assert cts.temperatures[2].item() == pytest.approx(cts.initial_temperature)
