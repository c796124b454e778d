"""Stage II's one loop (calib/methods/population.py): a lone config is a population of one, bit for bit; the loop
against a plain restatement of it; a diverging member fails alone, with its epoch."""

import math

import pytest
import torch
from torch.nn import functional as F

from calib.methods import METHODS, tst
from calib.methods.population import TrainingDiverged
from calib.methods.tst import (
    TSTConfig,
    TSTHead,
    fit_tst,
    fit_tst_population,
    train_stage_two_head,
    train_stage_two_heads,
)
from calib.methods.vtst import VTSTConfig, VTSTHead, fit_vtst, fit_vtst_population, population_key
from calib.metrics import negative_log_likelihood

CPU = torch.device("cpu")
TST = TSTConfig(epochs=4, batch_size=64, latent_dim=8)


def noisy_features(n: int = 300, d: int = 12, classes: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centers = torch.randn(classes, d, generator=g) * 1.5
    return centers[labels] + torch.randn(n, d, generator=g), labels


TRAIN, VAL, TEST = noisy_features(), noisy_features(80, seed=1), noisy_features(50, seed=2)


def vtst_head(seed: int, num_samples: int = 1) -> VTSTHead:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return VTSTHead(12, 8, 4, num_samples)


@pytest.mark.parametrize("checkpoint", ["last", "best_val_loss"])
def test_a_lone_tst_config_is_a_population_of_one_bit_for_bit(checkpoint):
    params = TSTConfig(epochs=4, batch_size=64, latent_dim=8, checkpoint=checkpoint)
    alone = fit_tst(params, *TRAIN, *VAL, num_classes=4, seed=3, device=CPU)
    (member,) = fit_tst_population([(params, 3)], *TRAIN, *VAL, num_classes=4, device=CPU)
    assert torch.equal(alone.probs(TEST[0]), member.probs(TEST[0]))
    assert alone.history == member.history and alone.best_epoch == member.best_epoch


def test_the_loop_equals_a_plain_restatement_of_tst_training():
    """One TST head, SGD, minibatch order from torch.randperm of a generator seeded with the seed, the
    validation NLL after every epoch: written out here with nn.Linear layers instead of the stack."""
    params, seed = TSTConfig(epochs=3, batch_size=64, latent_dim=8, checkpoint="best_val_loss"), 5
    fitted = fit_tst(params, *TRAIN, *VAL, num_classes=4, seed=seed, device=CPU)
    torch.manual_seed(seed)
    head = TSTHead(12, 8, 4)
    optimizer = torch.optim.SGD(head.parameters(), lr=params.lr, momentum=params.momentum,
                                weight_decay=params.weight_decay)
    generator = torch.Generator().manual_seed(seed)
    (x, y), (val_x, val_y) = TRAIN, VAL
    val_losses, best_loss, best = [], math.inf, None
    for _ in range(params.epochs):
        total = 0.0
        for idx in torch.randperm(len(y), generator=generator).split(params.batch_size):
            loss = F.cross_entropy(head(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        with torch.no_grad():
            probs = head(val_x).double().softmax(1)
        val_losses.append(negative_log_likelihood(probs, val_y))
        if val_losses[-1] < best_loss:
            best_loss, best = val_losses[-1], head(TEST[0]).double().softmax(1).detach()
    assert [r["val_loss"] for r in fitted.history] == pytest.approx(val_losses, abs=1e-6)
    assert fitted.history[-1]["train_loss"] == pytest.approx(total / len(y), rel=1e-6)
    assert fitted.best_epoch == val_losses.index(min(val_losses))
    torch.testing.assert_close(fitted.probs(TEST[0]), best, rtol=1e-5, atol=1e-6)


def test_a_lone_vtst_head_equals_its_member_of_a_population_bit_for_bit():
    """V-TST's heads train as separate modules, so a member of a population is its lone run exactly."""
    first = VTSTConfig(epochs=3, batch_size=32, latent_dim=8, num_samples=2, checkpoint="best_val_loss")
    second = VTSTConfig(epochs=3, batch_size=32, latent_dim=8)
    together = train_stage_two_heads([(vtst_head(0, 2), first, 0), (vtst_head(4), second, 4)], *TRAIN, *VAL,
                                     device=CPU)
    for (params, seed, samples), member in zip([(first, 0, 2), (second, 4, 1)], together, strict=True):
        alone = train_stage_two_head(vtst_head(seed, samples), params, *TRAIN, *VAL, seed=seed, device=CPU)
        assert torch.equal(alone.probs(TEST[0]), member.probs(TEST[0]))
        assert alone.history == member.history and alone.best_epoch == member.best_epoch
    lone = fit_vtst(first, *TRAIN, *VAL, num_classes=4, seed=0, device=CPU)
    assert torch.equal(lone.probs(TEST[0]), together[0].probs(TEST[0]))


def test_vtst_configs_of_one_loop_train_as_one_population_each_as_alone():
    """lr, momentum, weight decay, Z, M and the checkpoint rule are each member's own (its own parameter group):
    configs differing only there share a population, and each member is :func:`fit_vtst` of its config, bit for
    bit; the registration trains them so in a study."""
    members = [(VTSTConfig(epochs=3, batch_size=32, latent_dim=8, num_samples=2, checkpoint="best_val_loss"), 0),
               (VTSTConfig(epochs=3, batch_size=32, latent_dim=16, lr=0.03, momentum=0.5, weight_decay=0.0), 4),
               (VTSTConfig(epochs=3, batch_size=32, latent_dim=8, lr=0.2), 5)]
    assert len({population_key(params) for params, _ in members}) == 1
    assert population_key(VTSTConfig(epochs=3)) != population_key(VTSTConfig(epochs=3, batch_size=64))
    together = fit_vtst_population(members, *TRAIN, *VAL, num_classes=4, device=CPU)
    for (params, seed), member in zip(members, together, strict=True):
        alone = fit_vtst(params, *TRAIN, *VAL, num_classes=4, seed=seed, device=CPU)
        assert torch.equal(alone.probs(TEST[0]), member.probs(TEST[0]))
        assert alone.history == member.history and alone.best_epoch == member.best_epoch
    spec = METHODS.get("vtst")
    assert spec.population_key is population_key and spec.run_population is not None
    with pytest.raises(ValueError, match="must share epochs, optimizer, batch_size"):
        fit_vtst_population([(VTSTConfig(epochs=2), 0), (VTSTConfig(epochs=3), 1)], *TRAIN, *VAL, num_classes=4,
                            device=CPU)


def test_adam_members_keep_their_own_lr_and_weight_decay():
    members = [(VTSTConfig(epochs=2, batch_size=32, latent_dim=8, optimizer="adam", lr=1e-3), 0),
               (VTSTConfig(epochs=2, batch_size=32, latent_dim=8, optimizer="adam", lr=1e-2, weight_decay=1e-3), 1)]
    together = fit_vtst_population(members, *TRAIN, *VAL, num_classes=4, device=CPU)
    for (params, seed), member in zip(members, together, strict=True):
        alone = fit_vtst(params, *TRAIN, *VAL, num_classes=4, seed=seed, device=CPU)
        assert torch.equal(alone.probs(TEST[0]), member.probs(TEST[0])) and alone.history == member.history
    assert not torch.equal(together[0].probs(TEST[0]), together[1].probs(TEST[0]))


def test_stage_two_heads_must_share_the_loop():
    with pytest.raises(ValueError, match="must share epochs, optimizer, batch_size"):
        train_stage_two_heads([(vtst_head(0), VTSTConfig(epochs=2), 0), (vtst_head(1), VTSTConfig(epochs=3), 1)],
                              *TRAIN, *VAL, device=CPU)


def test_the_epoch_of_a_divergence_is_a_field():
    error = TrainingDiverged("loss became nan at epoch 2.", epoch=2)
    assert isinstance(error, FloatingPointError) and error.epoch == 2 and str(error) == "loss became nan at epoch 2."
    with pytest.raises(TypeError):
        TrainingDiverged("no epoch")  # type: ignore[call-arg]


def test_a_diverging_tst_member_fails_alone(monkeypatch):
    initial_head = tst._initial_tst_head

    def poisoned(seed, *sizes):  # seed 1's head starts with a NaN weight
        head = initial_head(seed, *sizes)
        if seed == 1:
            with torch.no_grad():
                head.encoder[0].weight[0, 0] = math.nan
        return head

    monkeypatch.setattr(tst, "_initial_tst_head", poisoned)
    results = fit_tst_population([(TST, 0), (TST, 1)], *TRAIN, *VAL, num_classes=4, device=CPU)
    assert isinstance(results[1], TrainingDiverged) and results[1].epoch == 0
    assert str(results[1]) == "Stage-II training loss became nan at epoch 0."
    alone = fit_tst(TST, *TRAIN, *VAL, num_classes=4, seed=0, device=CPU)
    torch.testing.assert_close(results[0].probs(TEST[0]), alone.probs(TEST[0]), rtol=1e-5, atol=1e-5)
    assert len(results[0].history) == TST.epochs
    with pytest.raises(TrainingDiverged, match="epoch 0"):
        fit_tst(TST, *TRAIN, *VAL, num_classes=4, seed=1, device=CPU)


def test_a_diverging_vtst_member_fails_alone():
    params = VTSTConfig(epochs=3, batch_size=32, latent_dim=8)
    broken = vtst_head(1)
    with torch.no_grad():
        broken.mean_encoder[0].weight[0, 0] = math.nan
    results = train_stage_two_heads([(vtst_head(0), params, 0), (broken, params, 1)], *TRAIN, *VAL, device=CPU)
    assert isinstance(results[1], TrainingDiverged) and results[1].epoch == 0
    alone = train_stage_two_head(vtst_head(0), params, *TRAIN, *VAL, seed=0, device=CPU)
    assert torch.equal(results[0].probs(TEST[0]), alone.probs(TEST[0]))
