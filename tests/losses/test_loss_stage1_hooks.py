"""Stage I feeds the losses that keep state across steps and epochs (``TrainingStateLoss``: CRL's correctness
history, AdaFocal's per-bin γ): on both batch pipelines, under Mixup, saved in its checkpoints and resumed."""

from __future__ import annotations

import copy

import pytest
import torch
from trial_fixtures import tiny_config

from calib._config import ConfigError
from calib.config import parse_trial_config
from calib.datasets import load_dataset
from calib.training import train_stage1

CPU = torch.device("cpu")
DIGITS = load_dataset("digits-noisy", "")
TRAIN = len(DIGITS.train)


def trained(tmp_path, loss, **stage1):
    """The per-epoch checkpoint states of a 2-epoch Stage I with ``loss``."""
    states = []
    cfg = parse_trial_config({**tiny_config(tmp_path, **stage1), "loss": loss})
    result = train_stage1(cfg, DIGITS, CPU, on_checkpoint=lambda state: states.append(copy.deepcopy(state)))
    return cfg, result, states


@pytest.mark.parametrize("pipeline", ["loader", "device"])
def test_crl_counts_every_training_sample_once_an_epoch(tmp_path, pipeline):
    _, result, states = trained(tmp_path, {"name": "crl"}, data_pipeline=pipeline)
    counts = [state["loss_fn"]["correctness"] for state in states]
    assert [len(c) for c in counts] == [TRAIN, TRAIN]
    assert counts[0].max() <= 1 and counts[1].max() <= 2 and (counts[1] >= counts[0]).all()
    # every sample seen once an epoch: the counts rose by the epoch's correct predictions, as many as it reported
    assert int(counts[0].sum()) == round(result.history[0]["train_accuracy"] * TRAIN)
    assert int((counts[1] - counts[0]).sum()) == round(result.history[1]["train_accuracy"] * TRAIN)
    assert [int(state["loss_fn"]["max_correctness"]) for state in states] == [1, 2]  # CRL-R: after epoch 2 on


def test_adafocal_updates_gamma_from_validation_each_epoch(tmp_path):
    _, _, states = trained(tmp_path, {"name": "adafocal"})
    gammas = [state["loss_fn"]["gammas"] for state in states]
    edges = [state["loss_fn"]["edges"] for state in states]
    assert not torch.equal(gammas[0], torch.ones(15, dtype=torch.float64)) and not torch.equal(gammas[0], gammas[1])
    assert not torch.equal(edges[0], torch.arange(16, dtype=torch.float64) / 15)  # the validation bins' edges
    assert (edges[1].diff() >= 0).all() and (gammas[1].abs() >= 0.2).all()


@pytest.mark.parametrize("loss", ["crl", "adafocal"])
def test_a_resumed_stage1_continues_the_loss_state(tmp_path, loss):
    cfg, full, states = trained(tmp_path, {"name": loss}, mixup_alpha=0.4)
    resumed = train_stage1(cfg, DIGITS, CPU, resume=states[0])
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in full.history]
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("loss", "message"), [
    ({"name": "adafocal", "gamma_min": 3.0, "gamma_max": 1.0}, r"`loss\.gamma_min` must be below gamma_max=1\.0"),
    ({"name": "crl", "rank_target": "top5"}, r"`loss\.rank_target` must be one of 'softmax', 'entropy', 'margin'"),
    ({"name": "ecp", "entropy_reduction": "max"}, r"`loss\.entropy_reduction` must be one of 'mean', 'sum'"),
    ({"name": "mdca", "base": "ls"}, r"`loss\.base` must be one of 'nll', 'focal'"),
])
def test_a_degenerate_loss_config_is_refused_naming_the_key(tmp_path, loss, message):
    with pytest.raises(ConfigError, match=message):
        parse_trial_config({**tiny_config(tmp_path), "loss": loss})
