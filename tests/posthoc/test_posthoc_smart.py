"""SMART (docs/methods.md §5.2): SoftECE by hand, the margin statistics, T ≥ 0.1, the argmax, early stopping."""

import math

import numpy as np
import pytest
import torch

from calib._config import ConfigError, from_dict
from calib.methods import METHODS
from calib.metrics import expected_calibration_error
from calib.posthoc import POSTHOC, SMART, SMARTConfig, soft_binned_ece
from calib.posthoc.smart import logit_margin


@pytest.fixture(scope="module")
def overconfident_data():
    """Logits z with labels drawn from softmax(z / 2.5): z itself is overconfident."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1600, 5, generator=g) * 4
    labels = torch.multinomial((logits.double() / 2.5).softmax(1), 1, generator=g).squeeze(1)
    return logits, labels


def soft_ece_by_hand(confidences, correct, delta, num_bins=15, sigma=0.05):
    """SoftECE in plain Python: Gaussian weights to the centres (b + 0.5)/M, normalised per sample."""
    centres = [(b + 0.5) / num_bins for b in range(num_bins)]
    weights = []
    for conf in confidences:
        raw = [math.exp(-((conf - c) ** 2) / (2 * sigma**2)) for c in centres]
        weights.append([r / sum(raw) for r in raw])
    total = 0.0
    for b in range(num_bins):
        mass = sum(w[b] for w in weights)
        conf_b = sum(w[b] * c for w, c in zip(weights, confidences, strict=True)) / mass
        acc_b = sum(w[b] * a for w, a in zip(weights, correct, strict=True)) / mass
        gap = conf_b - acc_b
        total += mass / len(confidences) * (abs(gap) if delta is None else math.sqrt(gap**2 + delta**2))
    return total


class TestSoftBinnedECE:
    def test_one_sample_by_hand(self):
        # One sample: every bin holds only it, so each bin gap is conf − acc = 0.8 − 1 whatever the weights.
        conf, correct = torch.tensor([0.8], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
        assert soft_binned_ece(conf, correct).item() == pytest.approx(math.sqrt(0.2**2 + 1e-6))
        assert soft_binned_ece(conf, correct, charbonnier_delta=None).item() == pytest.approx(0.2)

    def test_two_samples_weights_by_hand(self):
        # conf 0.5 sits on the centre of bin 7 (7.5/15), conf 0.9 between bins 12 (0.8333) and 13 (0.9).
        # Bin 7's weight for sample 1: 1 / Σ_b exp(−(0.5 − c_b)²/(2·0.05²)); its neighbours at ±1/15 get
        # exp(−(1/15)²/0.005) = exp(−0.8889) = 0.41111 each, the next ones exp(−3.5556) = 0.02857, then 0.00034.
        w7 = 1 / (1 + 2 * (0.41111 + 0.02857 + 0.00034))
        raw = [math.exp(-((0.5 - (b + 0.5) / 15) ** 2) / 0.005) for b in range(15)]
        assert raw[7] / sum(raw) == pytest.approx(w7, rel=1e-4)
        confidences, correct = [0.5, 0.9], [0.0, 1.0]
        expected = soft_ece_by_hand(confidences, correct, delta=1e-3)
        got = soft_binned_ece(torch.tensor(confidences, dtype=torch.float64), torch.tensor(correct))
        assert got.item() == pytest.approx(expected, rel=1e-12)

    @pytest.mark.parametrize("delta", [1e-3, None])
    def test_three_samples(self, delta):
        confidences, correct = [0.95, 0.62, 0.3], [1.0, 0.0, 1.0]
        got = soft_binned_ece(torch.tensor(confidences, dtype=torch.float64),
                              torch.tensor(correct, dtype=torch.float64), charbonnier_delta=delta)
        assert got.item() == pytest.approx(soft_ece_by_hand(confidences, correct, delta), rel=1e-12)

    def test_differentiable_in_the_confidences(self):
        conf = torch.tensor([0.9, 0.7, 0.95], dtype=torch.float64, requires_grad=True)
        soft_binned_ece(conf, torch.tensor([1.0, 0.0, 1.0])).backward()
        assert torch.isfinite(conf.grad).all() and conf.grad.abs().sum() > 0


class TestSMART:
    def test_main(self, overconfident_data):
        logits, labels = overconfident_data
        fit_z, fit_y, test_z, test_y = logits[:800], labels[:800], logits[800:], labels[800:]
        smart = SMART(max_epochs=300).fit(fit_z, fit_y)
        calibrated = smart(test_z)
        assert torch.equal(calibrated.argmax(1), test_z.argmax(1))  # accuracy unchanged
        before = expected_calibration_error(test_z.double().softmax(1), test_y)
        after = expected_calibration_error(smart.probs(test_z), test_y)
        assert after < 0.5 * before
        temperatures = smart.temperatures(test_z)
        torch.testing.assert_close(calibrated, (test_z.double() / temperatures.unsqueeze(1)).float())

    def test_network_shape(self):
        linear = [m for m in SMART().network if isinstance(m, torch.nn.Linear)]
        assert [(m.in_features, m.out_features) for m in linear] == [(1, 16), (16, 16), (16, 1)]
        linear = [m for m in SMART(hidden_size=4, num_hidden_layers=1).network if isinstance(m, torch.nn.Linear)]
        assert [(m.in_features, m.out_features) for m in linear] == [(1, 4), (4, 1)]

    def test_margin_statistics_use_the_population_std(self, overconfident_data):
        logits, labels = overconfident_data[0][:50], overconfident_data[1][:50]
        smart = SMART(max_epochs=1).fit(logits, labels)
        top2 = np.sort(logits.numpy().astype(np.float64), axis=1)[:, -2:]
        margins = top2[:, 1] - top2[:, 0]
        torch.testing.assert_close(logit_margin(logits.double()), torch.from_numpy(margins))
        assert smart.margin_mean.item() == pytest.approx(margins.mean())
        assert smart.margin_std.item() == pytest.approx(np.std(margins, ddof=0))
        assert smart.margin_std.item() != pytest.approx(np.std(margins, ddof=1))

    def test_constant_margin_std_is_floored(self):
        logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 2.0]]).repeat(5, 1)
        smart = SMART(max_epochs=3).fit(logits, torch.zeros(10, dtype=torch.long))
        assert smart.margin_std.item() == 1e-8
        assert torch.isfinite(smart(logits)).all()

    def test_temperature_is_at_least_one_tenth(self, overconfident_data):
        logits, labels = overconfident_data
        smart = SMART(max_epochs=100).fit(logits[:500], labels[:500])
        extreme = torch.cat([logits, logits * 100, torch.tensor([[0.0, 0.0, 0.0, 0.0, 1e-6]])])
        assert torch.all(smart.temperatures(extreme) >= 0.1)
        with torch.no_grad():
            smart.network[-1].bias.fill_(-1e4)  # softplus(−10⁴) = 0: the floor itself
        temperatures = smart.temperatures(extreme)
        assert torch.all(temperatures >= 0.1) and temperatures.min().item() == pytest.approx(0.1)
        assert torch.equal(smart(extreme).argmax(1), extreme.argmax(1))

    def test_fit_loss_decreases(self, overconfident_data):
        logits, labels = overconfident_data
        smart = SMART(max_epochs=150).fit(logits[:500], labels[:500])
        history = smart.loss_history
        assert len(history) == 150 and smart.best_loss < 0.5 * history[0]
        assert np.mean(history[-20:]) < np.mean(history[:20])

    def test_early_stopping_restores_the_best_state(self, overconfident_data):
        logits, labels = overconfident_data
        z, y = logits[:500].double(), labels[:500]
        smart = SMART(lr=0.5, patience=5).fit(z, y)  # a large step: the loss soon stops improving
        history = smart.loss_history
        assert len(history) == smart.best_epoch + 5 + 1 < 2000
        assert min(history[smart.best_epoch + 1:]) > smart.best_loss - 1e-4  # no later improvement > min_delta
        assert history[-1] != smart.best_loss
        with torch.no_grad():
            restored = smart.fit_loss(z, (z.argmax(1) == y).double()).item()
        assert restored == pytest.approx(smart.best_loss, rel=1e-12)

    def test_seeded(self, overconfident_data):
        logits, labels = overconfident_data[0][:300], overconfident_data[1][:300]
        a, b = SMART(max_epochs=20).fit(logits, labels), SMART(max_epochs=20).fit(logits, labels)
        assert torch.equal(a.temperatures(logits), b.temperatures(logits))
        c = SMART(max_epochs=20, seed=2).fit(logits, labels)
        assert not torch.equal(a.temperatures(logits), c.temperatures(logits))

    def test_errors(self):
        with pytest.raises(ValueError, match=r"`logits` must have shape \(N, C\) with C >= 2, got shape \(4, 1\)"):
            SMART().fit(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long))
        with pytest.raises(ValueError, match=r"`hidden_size` must be an integer >= 1, got hidden_size=0"):
            SMART(hidden_size=0)
        with pytest.raises(ValueError, match=r"`objective` must be one of 'smooth_soft_ece', 'soft_ece'"):
            SMART(objective="ece")
        with pytest.raises(ValueError, match=r"`lr` must be a finite number > 0, got lr=0"):
            SMART(lr=0)
        with pytest.raises(RuntimeError, match=r"SMART is not fitted"):
            SMART()(torch.zeros(2, 3))


class TestSMARTConfig:
    def test_main(self):
        params = SMARTConfig()
        assert (params.hidden_size, params.num_hidden_layers, params.objective, params.lr, params.max_epochs,
                params.patience) == (16, 2, "smooth_soft_ece", 5e-3, 2000, 200)
        assert from_dict(SMARTConfig, {"lr": 1, "objective": "soft_ece"}).lr == 1.0
        assert METHODS.get("smart").config is SMARTConfig and POSTHOC.get("smart") is SMART

    @pytest.mark.parametrize(("kwargs", "message"), [
        ({"hidden_size": 0}, r"`hidden_size` must be an integer >= 1, got hidden_size=0"),
        ({"num_hidden_layers": 0}, r"`num_hidden_layers` must be an integer >= 1"),
        ({"objective": "nll"}, r"`objective` must be one of 'smooth_soft_ece', 'soft_ece', got objective='nll'"),
        ({"lr": -1.0}, r"`lr` must be a finite number > 0, got lr=-1.0"),
        ({"max_epochs": 0}, r"`max_epochs` must be an integer >= 1"),
        ({"patience": 0}, r"`patience` must be an integer >= 1"),
    ])
    def test_errors(self, kwargs, message):
        with pytest.raises(ConfigError, match=message):
            SMARTConfig(**kwargs)
