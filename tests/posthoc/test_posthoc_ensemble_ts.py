"""Ensemble temperature scaling (docs/methods.md §5): both stages against scipy, the mixture by hand, edge cases."""

import functools
import math

import numpy as np
import pytest
import torch
from posthoc_cases import overconfident_logits
from scipy.optimize import minimize, minimize_scalar
from scipy.special import softmax

from calib._config import ConfigError, from_dict
from calib.posthoc import POSTHOC
from calib.posthoc.ensemble_ts import EnsembleTemperatureScaling, EnsembleTemperatureScalingConfig

make_data = functools.partial(overconfident_logits, scale=4.0, temperature=2.5)

pytestmark = pytest.mark.usefixtures("one_thread")


def loss_np(probs, labels, loss):
    """Mix-n-Match's losses in numpy: "mse" mean (p − onehot)², "ce" mean −log p_y."""
    if loss == "mse":
        return float(((probs - np.eye(probs.shape[1])[labels]) ** 2).mean())
    return float(-np.log(probs[np.arange(len(labels)), labels]).mean())


def scipy_temperature(z, labels, loss):
    """Stage 1 by bounded Brent on T ∈ [0.05, 5] (the official bounds)."""
    return minimize_scalar(lambda t: loss_np(softmax(z / t, axis=1), labels, loss), method="bounded",
                           bounds=(0.05, 5.0), options={"xatol": 1e-10}).x


def scipy_weights(z, labels, temperature, loss):
    """Stage 2 over the simplex as w = (a, (1 − a)b, (1 − a)(1 − b)), a, b ∈ [0, 1], by L-BFGS-B from 9 starts."""
    components = [softmax(z / temperature, axis=1), softmax(z, axis=1), np.full(z.shape, 1 / z.shape[1])]

    def weights(ab):
        a, b = ab
        return np.array([a, (1 - a) * b, (1 - a) * (1 - b)])

    def fun(ab):
        w = weights(ab)
        return loss_np(sum(wi * ci for wi, ci in zip(w, components, strict=True)), labels, loss)

    starts = [(a, b) for a in (0.1, 0.5, 0.9) for b in (0.1, 0.5, 0.9)]
    best = min((minimize(fun, start, method="L-BFGS-B", bounds=[(0, 1), (0, 1)],
                         options={"ftol": 1e-15, "gtol": 1e-10}) for start in starts), key=lambda r: r.fun)
    return weights(best.x), best.fun


def mixture_loss(ets, z, labels, loss):
    return loss_np(ets.probs(torch.from_numpy(z)).numpy(), labels, loss)


class TestEnsembleTemperatureScaling:
    @pytest.mark.parametrize("loss", ["mse", "ce"])
    def test_matches_scipy(self, loss):
        z, labels = make_data(1000, 5, seed=1)
        ets = EnsembleTemperatureScaling(loss).fit(z, labels)
        zn, yn = z.numpy(), labels.numpy()
        temperature = scipy_temperature(zn, yn, loss)
        assert ets.temperature.item() == pytest.approx(temperature, rel=1e-5)
        weights, best = scipy_weights(zn, yn, ets.temperature.item(), loss)
        assert mixture_loss(ets, zn, yn, loss) <= best + 1e-10
        np.testing.assert_allclose(ets.weights.numpy(), weights, atol=2e-4)
        assert ets.weights.sum().item() == pytest.approx(1.0) and (ets.weights >= 0).all()

    def test_mixture_by_hand(self):
        ets = EnsembleTemperatureScaling()
        ets.temperature.fill_(2.0)
        ets.weights = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
        ets.is_fitted = True
        z = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
        # row 1: 0.5·softmax(1, 0, −0.5) + 0.3·softmax(2, 0, −1) + 0.2/3
        expected = 0.5 * softmax(z / 2, axis=1) + 0.3 * softmax(z, axis=1) + 0.2 / 3
        np.testing.assert_allclose(ets(torch.from_numpy(z)).numpy(), np.log(expected), rtol=1e-12)
        np.testing.assert_allclose(ets.probs(torch.from_numpy(z)).numpy(), expected, rtol=1e-12)
        np.testing.assert_allclose(expected[1], [1 / 3] * 3)

    def test_zero_weights(self):
        ets = EnsembleTemperatureScaling()
        ets.weights = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
        ets.is_fitted = True
        z = torch.tensor([[3.0, 1.0, 0.5]], dtype=torch.float64)
        torch.testing.assert_close(ets(z), z.log_softmax(1))  # log 0 terms drop out of the logsumexp

    def test_temperature_bounds(self):
        # Labels from softmax(z / 20): the loss-optimal T ≈ 20 is outside the official bounds [0.05, 5].
        z, labels = make_data(500, 4, seed=2, temperature=20.0)
        assert EnsembleTemperatureScaling().fit(z, labels).temperature.item() == pytest.approx(5.0)

    def test_uninformative_logits_lean_on_the_uniform_component(self):
        z, _ = make_data(2000, 4, seed=3)
        labels = torch.randint(0, 4, (2000,), generator=torch.Generator().manual_seed(4))
        ets = EnsembleTemperatureScaling().fit(z, labels)
        assert ets.weights[2].item() > 0.5

    def test_argmax_unchanged(self):
        z, labels = make_data(1000, 6, seed=5)
        for loss in ("mse", "ce"):
            ets = EnsembleTemperatureScaling(loss).fit(z[:500], labels[:500])
            assert torch.equal(ets.probs(z).argmax(1), z.argmax(1))

    def test_bad_parameters(self):
        with pytest.raises(ValueError, match=r"objective='nll'"):
            EnsembleTemperatureScaling("nll")
        with pytest.raises(ConfigError, match=r"`objective` must be one of 'mse', 'ce', got objective='brier'"):
            from_dict(EnsembleTemperatureScalingConfig, {"objective": "brier"})
        assert from_dict(EnsembleTemperatureScalingConfig, {}).objective == "mse"
        with pytest.raises(RuntimeError, match="not fitted"):
            EnsembleTemperatureScaling()(torch.zeros(2, 3))

    def test_registered(self):
        assert isinstance(POSTHOC.create("ensemble_ts", objective="ce"), EnsembleTemperatureScaling)


@pytest.mark.parametrize("loss", ["mse", "ce"])
class TestEdgeCases:
    def check_outputs(self, ets, z):
        probs = ets.probs(z)
        assert torch.isfinite(ets(z)).all() and torch.isfinite(probs).all()
        torch.testing.assert_close(probs.sum(1), torch.ones(len(z), dtype=torch.float64))
        assert torch.equal(probs.argmax(1), z.argmax(1))
        assert 0.05 <= ets.temperature.item() <= 5.0 and math.isclose(ets.weights.sum().item(), 1.0)
        return probs

    def test_absent_class(self, loss):
        z, labels = make_data(300, 5, seed=6)
        keep = labels != 4
        self.check_outputs(EnsembleTemperatureScaling(loss).fit(z[keep], labels[keep]), z[keep])

    def test_ties_in_confidence(self, loss):
        z, labels = make_data(100, 4, seed=7)
        z[:, 1] = z[:, 0]
        z[50:] = z[:50]
        ets = EnsembleTemperatureScaling(loss).fit(z, labels)
        probs = ets.probs(z)
        assert torch.equal(probs[:, 0], probs[:, 1])  # tied classes stay exactly tied
        torch.testing.assert_close(probs[50:], probs[:50])
        assert torch.isfinite(probs).all()

    def test_fifty_samples_ten_classes(self, loss):
        z, labels = make_data(50, 10, seed=8)
        self.check_outputs(EnsembleTemperatureScaling(loss).fit(z, labels), z)

    def test_constant_column(self, loss):
        z, labels = make_data(300, 4, seed=9)
        z[:, 2] = 0.5
        self.check_outputs(EnsembleTemperatureScaling(loss).fit(z, labels), z)
