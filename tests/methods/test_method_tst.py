"""TST (docs/methods.md §2.2): the head's shape, the shared Stage-II loop, checkpointing, the method's outcome."""

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from calib._config import ConfigError, from_dict
from calib.artifacts import SplitCache, Stage1Artifact
from calib.methods import METHODS
from calib.methods.tst import TSTConfig, TSTHead, fit_tst, run_tst
from calib.metrics import negative_log_likelihood

CPU = torch.device("cpu")


def clustered_features(n: int, d: int = 8, classes: int = 3, seed: int = 0, spread: float = 3.0):
    """Gaussian clusters, one per class (the class of sample i is i mod classes)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centres = torch.randn(classes, d, generator=torch.Generator().manual_seed(123)) * spread
    return centres[labels] + torch.randn(n, d, generator=g), labels


def fake_artifact(classes: int = 3, d: int = 8) -> Stage1Artifact:
    """An in-memory Stage-I artifact: clustered features, logits from a fixed linear map."""
    weight = torch.randn(classes, d, generator=torch.Generator().manual_seed(7))
    splits = {}
    for i, (split, n) in enumerate((("train", 240), ("val", 90), ("test", 120))):
        features, labels = clustered_features(n, d, classes, seed=i)
        splits[split] = SplitCache(features, features @ weight.T, labels)
    return Stage1Artifact("fake", Path("."), splits, {"num_classes": classes})


def fit(params: TSTConfig, seed: int = 0, **data):
    train_x, train_y = data.get("train", clustered_features(240, seed=1))
    val_x, val_y = data.get("val", clustered_features(90, seed=2))
    return fit_tst(params, train_x, train_y, val_x, val_y, num_classes=3, seed=seed, device=CPU)


class TestTSTConfig:
    def test_main(self):
        params = TSTConfig()
        assert (params.epochs, params.optimizer, params.lr, params.momentum, params.weight_decay, params.batch_size,
                params.latent_dim, params.checkpoint) == (40, "sgd", 0.1, 0.9, 5e-4, 128, 256, "last")
        assert from_dict(TSTConfig, {"optimizer": "adam", "lr": 1e-4, "batch_size": 256}).optimizer == "adam"
        assert METHODS.get("tst").config is TSTConfig

    @pytest.mark.parametrize(("kwargs", "message"), [
        ({"epochs": 0}, r"`epochs` must be an integer >= 1, got epochs=0"),
        ({"lr": 0.0}, r"`lr` must be > 0, got lr=0.0"),
        ({"momentum": 1.0}, r"`momentum` must be in \[0, 1\), got momentum=1.0"),
        ({"weight_decay": -1.0}, r"`weight_decay` must be >= 0"),
        ({"batch_size": 0}, r"`batch_size` must be an integer >= 1"),
        ({"latent_dim": 0}, r"`latent_dim` must be an integer >= 1 \(it is Z\), got latent_dim=0"),
        ({"optimizer": "rmsprop"}, r"`optimizer` must be one of 'sgd', 'adam', got optimizer='rmsprop'"),
        ({"checkpoint": "best"}, r"`checkpoint` must be one of 'last', 'best_val_loss'"),
    ])
    def test_errors(self, kwargs, message):
        with pytest.raises(ConfigError, match=message):
            TSTConfig(**kwargs)


class TestTSTHead:
    def test_main(self):
        head = TSTHead(num_features=10, latent_dim=4, num_classes=3)
        first, relu, last_hidden = head.encoder
        assert isinstance(relu, nn.ReLU)
        assert (first.in_features, first.out_features) == (10, 12)  # d → 3Z
        assert (last_hidden.in_features, last_hidden.out_features) == (12, 4)  # 3Z → Z
        assert (head.decoder.in_features, head.decoder.out_features) == (4, 3)  # Z → C
        h = torch.randn(5, 10)
        expected = head.decoder(last_hidden(F.relu(first(h))))  # no activation after the last hidden layer
        torch.testing.assert_close(head(h), expected)
        probs = head.predictive_probs(h, torch.Generator())
        assert probs.dtype == torch.float64 and probs.shape == (5, 3)
        torch.testing.assert_close(probs.sum(1), torch.ones(5, dtype=torch.float64))

    def test_errors(self):
        with pytest.raises(ValueError, match=r"`num_features` and `latent_dim` must be >= 1, got num_features=4"):
            TSTHead(4, 0, 3)
        with pytest.raises(ValueError, match=r"`num_classes` must be >= 1, got num_classes=0"):
            TSTHead(4, 2, 0)


class TestFitTST:
    def test_training_lowers_the_training_loss(self):
        fitted = fit(TSTConfig(epochs=8, batch_size=32, latent_dim=16, lr=0.05))
        rows = fitted.history
        assert [r["epoch"] for r in rows] == list(range(8)) and {r["stage"] for r in rows} == {"stage2"}
        assert rows[-1]["train_loss"] < 0.5 * rows[0]["train_loss"]
        assert rows[-1]["train_accuracy"] > 0.9 and rows[-1]["val_accuracy"] > 0.9
        assert all(0 < r["train_confidence"] <= 1 and r["lr"] == 0.05 for r in rows)
        assert fitted.best_epoch == 7

    def test_adam(self):
        fitted = fit(TSTConfig(epochs=5, optimizer="adam", lr=1e-3, batch_size=64, weight_decay=0.0, latent_dim=16))
        assert fitted.history[-1]["train_loss"] < fitted.history[0]["train_loss"]

    def test_last_checkpoint_keeps_the_final_weights(self):
        fitted = fit(TSTConfig(epochs=4, batch_size=32, latent_dim=16))
        val_x, val_y = clustered_features(90, seed=2)
        assert negative_log_likelihood(fitted.probs(val_x), val_y) == pytest.approx(fitted.history[-1]["val_loss"])

    def test_best_val_loss_keeps_the_epoch_with_the_lowest_validation_nll(self):
        # Validation labels are the training classes shifted by one: training makes the validation NLL worse.
        train = clustered_features(240, seed=1)
        val_x, val_y = clustered_features(90, seed=2)
        shifted = (val_y + 1) % 3
        params = TSTConfig(epochs=6, batch_size=32, latent_dim=16, lr=0.02, checkpoint="best_val_loss")
        fitted = fit(params, train=train, val=(val_x, shifted))
        losses = [r["val_loss"] for r in fitted.history]
        best = min(range(len(losses)), key=losses.__getitem__)
        assert fitted.best_epoch == best and best < len(losses) - 1
        assert negative_log_likelihood(fitted.probs(val_x), shifted) == pytest.approx(losses[best])
        last = fit(dataclasses.replace(params, checkpoint="last"), train=train, val=(val_x, shifted))
        assert last.history == fitted.history  # same training; only the kept weights differ
        assert negative_log_likelihood(last.probs(val_x), shifted) == pytest.approx(losses[-1])

    def test_deterministic_for_a_seed(self):
        a = fit(TSTConfig(epochs=2, batch_size=32, latent_dim=8), seed=3)
        b = fit(TSTConfig(epochs=2, batch_size=32, latent_dim=8), seed=3)
        c = fit(TSTConfig(epochs=2, batch_size=32, latent_dim=8), seed=4)
        x, _ = clustered_features(20, seed=9)
        assert torch.equal(a.probs(x), b.probs(x)) and not torch.equal(a.probs(x), c.probs(x))


def test_run_tst_outcome():
    artifact = fake_artifact()
    outcome = run_tst(TSTConfig(epochs=3, batch_size=32, latent_dim=8), artifact, seed=1, device=CPU)
    assert outcome.val_probs.shape == (90, 3) and outcome.test_probs.shape == (120, 3)
    assert outcome.test_probs.dtype == torch.float64 and outcome.test_probs.device.type == "cpu"
    torch.testing.assert_close(outcome.test_probs.sum(1), torch.ones(120, dtype=torch.float64))
    test = artifact.splits["test"]
    assert torch.equal(outcome.predict(test.features, test.logits), outcome.test_probs)
    assert [r["epoch"] for r in outcome.history] == [0, 1, 2]
    assert set(outcome.history[0]) >= {"stage", "epoch", "lr", "train_loss", "train_accuracy", "train_confidence",
                                       "val_accuracy", "val_loss"}
