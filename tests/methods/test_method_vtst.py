"""V-TST (docs/methods.md §2.3): bounded variance, the KL term, Monte-Carlo prediction and seeded evaluation noise."""

import math
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from calib._config import ConfigError
from calib.artifacts import SplitCache, Stage1Artifact
from calib.methods import METHODS
from calib.methods.tst import TSTConfig
from calib.methods.vtst import VTSTConfig, VTSTHead, fit_vtst, kl_to_standard_normal, run_vtst
from calib.metrics import negative_log_likelihood

CPU = torch.device("cpu")


def clustered_features(n: int, d: int = 8, classes: int = 3, seed: int = 0):
    """Gaussian clusters, one per class (the class of sample i is i mod classes)."""
    labels = torch.arange(n) % classes
    centres = torch.randn(classes, d, generator=torch.Generator().manual_seed(123)) * 3
    return centres[labels] + torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), labels


def fake_artifact(classes: int = 3, d: int = 8) -> Stage1Artifact:
    """An in-memory Stage-I artifact: clustered features, logits from a fixed linear map."""
    weight = torch.randn(classes, d, generator=torch.Generator().manual_seed(7))
    splits = {}
    for i, (split, n) in enumerate((("train", 240), ("val", 90), ("test", 120))):
        features, labels = clustered_features(n, d, classes, seed=i)
        splits[split] = SplitCache(features, features @ weight.T, labels)
    return Stage1Artifact("fake", Path("."), splits, {"num_classes": classes})


def fit(params: VTSTConfig, seed: int = 0):
    train_x, train_y = clustered_features(240, seed=1)
    val_x, val_y = clustered_features(90, seed=2)
    return fit_vtst(params, train_x, train_y, val_x, val_y, num_classes=3, seed=seed, device=CPU)


class TestVTSTConfig:
    def test_main(self):
        params = VTSTConfig()
        assert isinstance(params, TSTConfig) and params.num_samples == 1
        assert (params.epochs, params.lr, params.latent_dim) == (40, 0.1, 256)
        assert METHODS.get("vtst").config is VTSTConfig

    def test_errors(self):
        with pytest.raises(ConfigError, match=r"`num_samples` must be an integer >= 1 \(it is M\), got num_samples=0"):
            VTSTConfig(num_samples=0)
        with pytest.raises(ConfigError, match=r"`latent_dim` must be an integer >= 1"):
            VTSTConfig(latent_dim=0)


class TestKL:
    def test_hand_value(self):
        mean = torch.tensor([[0.5, -1.0]])
        log_var = torch.tensor([[math.log(0.25), 0.0]])
        # ½(σ² + μ² − 1 − log σ²) per dimension: ½(0.25 + 0.25 − 1 + log 4) and ½(1 + 1 − 1 − 0); then / Z = 2
        expected = (0.5 * (0.25 + 0.25 - 1 + math.log(4)) + 0.5 * (1 + 1 - 1)) / 2
        assert kl_to_standard_normal(mean, log_var).item() == pytest.approx(expected)
        assert expected == pytest.approx(0.4715736, abs=1e-7)

    def test_matches_torch_distributions(self):
        mean, log_var = torch.randn(6, 5), F.logsigmoid(torch.randn(6, 5))
        q = torch.distributions.Normal(mean, (0.5 * log_var).exp())
        p = torch.distributions.Normal(torch.zeros(6, 5), torch.ones(6, 5))
        torch.testing.assert_close(kl_to_standard_normal(mean, log_var),
                                   torch.distributions.kl_divergence(q, p).sum(1) / 5)
        assert torch.equal(kl_to_standard_normal(torch.zeros(2, 3), torch.zeros(2, 3)), torch.zeros(2))


class TestVTSTHead:
    def test_variance_is_strictly_inside_zero_one(self):
        torch.manual_seed(0)
        head = VTSTHead(num_features=8, latent_dim=6, num_classes=3)
        mean, log_var = head.posterior(torch.randn(200, 8) * 5)
        variance = log_var.exp()
        assert mean.shape == log_var.shape == (200, 6)
        assert torch.all(log_var < 0) and torch.all(variance > 0) and torch.all(variance < 1)
        first, _, last = head.log_var_encoder
        assert (first.in_features, first.out_features, last.out_features) == (8, 18, 6)  # d → 3Z → Z
        assert (head.decoder.in_features, head.decoder.out_features) == (6, 3)

    def test_training_loss_is_ce_plus_kl_over_z(self):
        torch.manual_seed(0)
        head = VTSTHead(8, 4, 3)
        h, y = torch.randn(10, 8), torch.arange(10) % 3
        loss, logits = head.training_loss(h, y, torch.Generator().manual_seed(5))
        mean, log_var = head.posterior(h)
        noise = torch.randn(10, 4, generator=torch.Generator().manual_seed(5))
        expected_logits = head.decoder(mean + (0.5 * log_var).exp() * noise)
        torch.testing.assert_close(logits, expected_logits)
        kl = (0.5 * (log_var.exp() + mean**2 - 1 - log_var)).sum(1) / 4
        torch.testing.assert_close(loss, F.cross_entropy(expected_logits, y) + kl.mean())

    def test_several_samples_average_the_softmaxes(self):
        torch.manual_seed(0)
        head = VTSTHead(8, 4, 3, num_samples=4)
        h = torch.randn(7, 8)
        averaged = head.predictive_probs(h, torch.Generator().manual_seed(11))
        generator = torch.Generator().manual_seed(11)
        singles = [head.sample_probs(h, generator) for _ in range(4)]
        torch.testing.assert_close(averaged, torch.stack(singles).mean(0))
        assert averaged.dtype == torch.float64
        torch.testing.assert_close(averaged.sum(1), torch.ones(7, dtype=torch.float64))

    def test_one_sample_still_samples(self):
        torch.manual_seed(0)
        head = VTSTHead(8, 4, 3).eval()
        h = torch.randn(7, 8)
        a = head.predictive_probs(h, torch.Generator().manual_seed(1))
        b = head.predictive_probs(h, torch.Generator().manual_seed(2))
        assert not torch.allclose(a, b)
        assert torch.equal(a, head.predictive_probs(h, torch.Generator().manual_seed(1)))

    def test_errors(self):
        with pytest.raises(ValueError, match=r"`num_classes` and `num_samples` must be >= 1, got num_classes=3, "
                                             r"num_samples=0"):
            VTSTHead(8, 4, 3, num_samples=0)


class TestFitVTST:
    def test_training_lowers_the_loss(self):
        fitted = fit(VTSTConfig(epochs=8, batch_size=32, latent_dim=16, lr=0.05))
        assert fitted.history[-1]["train_loss"] < 0.6 * fitted.history[0]["train_loss"]
        assert fitted.history[-1]["val_accuracy"] > 0.9

    def test_deterministic_for_a_seed(self):
        params = VTSTConfig(epochs=3, batch_size=32, latent_dim=8, num_samples=3)
        a, b, c = fit(params, seed=2), fit(params, seed=2), fit(params, seed=3)
        x, _ = clustered_features(30, seed=9)
        assert a.history == b.history
        assert torch.equal(a.probs(x), b.probs(x)) and torch.equal(a.probs(x), a.probs(x))
        assert not torch.equal(a.probs(x), c.probs(x))

    def test_best_val_loss_uses_the_monte_carlo_predictive(self):
        params = VTSTConfig(epochs=4, batch_size=32, latent_dim=8, num_samples=2, checkpoint="best_val_loss")
        fitted = fit(params)
        val_x, val_y = clustered_features(90, seed=2)
        losses = [r["val_loss"] for r in fitted.history]
        assert fitted.best_epoch == losses.index(min(losses))
        assert negative_log_likelihood(fitted.probs(val_x), val_y) == pytest.approx(min(losses))


def test_run_vtst_outcome_is_reproducible():
    artifact = fake_artifact()
    params = VTSTConfig(epochs=2, batch_size=32, latent_dim=8, num_samples=3)
    first = run_vtst(params, artifact, seed=5, device=CPU)
    second = run_vtst(params, artifact, seed=5, device=CPU)
    assert torch.equal(first.test_probs, second.test_probs) and torch.equal(first.val_probs, second.val_probs)
    test = artifact.splits["test"]
    assert torch.equal(first.predict(test.features, test.logits), first.test_probs)
    assert first.test_probs.dtype == torch.float64 and first.test_probs.shape == (120, 3)
