"""Stage-II populations: every config trained in a stack equals the same config trained alone."""

import dataclasses

import pytest
import torch

from calib.methods import mac_cal_training
from calib.methods.heads import MaskableHead, StackedLinears
from calib.methods.mac_cal import MacCalConfig, population_key
from calib.methods.mac_cal_training import fit_mac_cal, fit_mac_cal_population
from calib.methods.tst import TSTConfig, fit_tst, fit_tst_population

CPU = torch.device("cpu")


def noisy_features(n: int = 300, d: int = 12, classes: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centers = torch.randn(classes, d, generator=g) * 1.5
    return centers[labels] + torch.randn(n, d, generator=g), labels


def test_stacked_linears_match_their_members():
    torch.manual_seed(0)
    heads = [MaskableHead([6, 5, 3]) for _ in range(3)]
    stack = StackedLinears([h.layers for h in heads], relu_after={0})
    x = torch.randn(3, 7, 6)
    masks = [torch.randint(0, 2, w.shape).float() for w in stack.weights]
    scale = torch.tensor([1.0, 0.5, 2.0])
    out = stack(x, masks=masks, weight_scale=scale)
    for k, head in enumerate(heads):
        expected = head(x[k], masks=[m[k] for m in masks], weight_scale=float(scale[k]))
        torch.testing.assert_close(out[k], expected, rtol=1e-6, atol=1e-6)


def test_stacked_linears_refuse_mixed_shapes():
    with pytest.raises(ValueError, match="same shapes"):
        StackedLinears([MaskableHead([4, 3]).layers, MaskableHead([4, 2]).layers], relu_after=())


MAC_CAL_MEMBERS = [  # every component on (Table 5's last row), different γ, β, θ0, q0, scaling, seeds
    (MacCalConfig(epochs=8, batch_size=64, bottleneck_width=16), 0),
    (MacCalConfig(epochs=8, batch_size=64, bottleneck_width=16, accuracy_weight=0.85, clip_decay=1.0,
                  clip_init=0.1, retention_init=0.7), 1),
    (MacCalConfig(epochs=8, batch_size=64, bottleneck_width=16, adaptive_retention="static",
                  train_mask_scaling="inverted", inference_weights="last_mask"), 2),
    (MacCalConfig(epochs=8, batch_size=64, bottleneck_width=16, gradient_restriction=False,
                  adaptive_retention="none", retention_init=0.6), 0),
]


@pytest.mark.parametrize("resample", ["epoch", "step"])
def test_mac_cal_population_equals_single_runs(resample):
    features, labels = noisy_features()
    members = [(dataclasses.replace(p, mask_resample=resample), seed) for p, seed in MAC_CAL_MEMBERS]
    together = fit_mac_cal_population(members, features, labels, num_features=12, num_classes=4, device=CPU)
    for (params, seed), batched in zip(members, together, strict=True):
        alone = fit_mac_cal(params, features, labels, num_features=12, num_classes=4, seed=seed, device=CPU)
        torch.testing.assert_close(batched.logits(features), alone.logits(features), rtol=1e-5, atol=1e-5)
        assert [r["retention_prob"] for r in batched.history] == pytest.approx(
            [r["retention_prob"] for r in alone.history], abs=1e-6)
        assert batched.last_retention == pytest.approx(alone.last_retention, abs=1e-6)


def test_mac_cal_population_clean_stats_equal_single_runs():
    features, labels = noisy_features()
    members = [(dataclasses.replace(p, stats_pass="clean"), seed) for p, seed in MAC_CAL_MEMBERS[:2]]
    together = fit_mac_cal_population(members, features, labels, num_features=12, num_classes=4, device=CPU)
    for (params, seed), batched in zip(members, together, strict=True):
        alone = fit_mac_cal(params, features, labels, num_features=12, num_classes=4, seed=seed, device=CPU)
        assert [r["train_accuracy"] for r in batched.history] == pytest.approx(
            [r["train_accuracy"] for r in alone.history], abs=1e-9)


def test_mac_cal_population_needs_one_key():
    features, labels = noisy_features()
    members = [(MacCalConfig(bottleneck_width=16), 0), (MacCalConfig(bottleneck_width=32), 0)]
    assert population_key(members[0][0]) != population_key(members[1][0])
    with pytest.raises(ValueError, match="bottleneck_width"):
        fit_mac_cal_population(members, features, labels, num_features=12, num_classes=4, device=CPU)


def test_a_diverging_member_fails_alone(monkeypatch):
    features, labels = noisy_features()
    params = MacCalConfig(epochs=3, batch_size=64, bottleneck_width=16)
    initial_head = mac_cal_training._initial_head

    def poisoned(params, seed, widths, head_state):  # seed 1's head starts with a NaN weight
        head = initial_head(params, seed, widths, head_state)
        if seed == 1:
            with torch.no_grad():
                head.layers[0].weight[0, 0] = float("nan")
        return head

    monkeypatch.setattr(mac_cal_training, "_initial_head", poisoned)
    results = fit_mac_cal_population([(params, 0), (params, 1)], features, labels, num_features=12,
                                     num_classes=4, device=CPU)
    assert isinstance(results[1], FloatingPointError) and results[1].epoch == 0
    alone = fit_mac_cal(params, features, labels, num_features=12, num_classes=4, seed=0, device=CPU)
    torch.testing.assert_close(results[0].logits(features), alone.logits(features), rtol=1e-5, atol=1e-5)
    with pytest.raises(FloatingPointError, match="epoch 0"):
        fit_mac_cal(params, features, labels, num_features=12, num_classes=4, seed=1, device=CPU)


def test_tst_population_equals_single_runs():
    train_x, train_y = noisy_features()
    val_x, val_y = noisy_features(n=80, seed=1)
    members = [(TSTConfig(epochs=6, batch_size=64, latent_dim=8), 0),
               (TSTConfig(epochs=6, batch_size=64, latent_dim=8, checkpoint="best_val_loss"), 1),
               (TSTConfig(epochs=6, batch_size=64, latent_dim=8), 2)]
    together = fit_tst_population(members, train_x, train_y, val_x, val_y, num_classes=4, device=CPU)
    for (params, seed), batched in zip(members, together, strict=True):
        alone = fit_tst(params, train_x, train_y, val_x, val_y, num_classes=4, seed=seed, device=CPU)
        torch.testing.assert_close(batched.probs(val_x), alone.probs(val_x), rtol=1e-5, atol=1e-5)
        assert batched.best_epoch == alone.best_epoch
        assert [r["val_loss"] for r in batched.history] == pytest.approx([r["val_loss"] for r in alone.history],
                                                                         abs=1e-6)
