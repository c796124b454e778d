"""Where MaC-Cal's q update reads Acc_t and Conf_t (``stats_source``) and calib's estimated γ."""

from __future__ import annotations

import pytest
import torch
from test_mac_cal import separable_features

from calib._config import ConfigError
from calib.artifacts import SplitCache, stage1_dir
from calib.config import config_hash, parse_trial_config, stage1_identity, trial_identity
from calib.methods.mac_cal import MacCalConfig, clip_threshold, estimated_accuracy_weight, retention_update
from calib.methods.mac_cal_training import fit_mac_cal, run_mac_cal_population
from calib.trial import run_trial


def test_first_update_reads_the_statistics_images():
    """Epoch 0 trains the same head whatever the statistics' labels are; against labels shifted by 0, 1
    and 2 of 3 classes every prediction is right exactly once, so the three accuracies add up to 1."""
    inputs, labels = separable_features(classes=3)
    params = MacCalConfig(epochs=2, batch_size=32)
    runs = [fit_mac_cal(params, inputs, labels, num_features=8, num_classes=3, seed=0, device=torch.device("cpu"),
                        stats_inputs=(inputs, (labels + shift) % 3)).history[0] for shift in range(3)]
    assert sum(r["update_accuracy"] for r in runs) == pytest.approx(1.0)
    assert runs[0]["update_confidence"] == runs[1]["update_confidence"] == runs[2]["update_confidence"]
    assert runs[0]["train_loss"] == runs[1]["train_loss"]  # the training itself is the same
    for shift, first in enumerate(runs):
        again = fit_mac_cal(params, inputs, labels, num_features=8, num_classes=3, seed=0,
                            device=torch.device("cpu"), stats_inputs=(inputs, (labels + shift) % 3)).history[1]
        expected = retention_update(params.retention_init, first["update_accuracy"], first["update_confidence"],
                                    clip_threshold(0, params), params)
        assert again["retention_prob"] == pytest.approx(expected)


def test_stats_on_the_training_inputs_equal_the_clean_pass():
    inputs, labels = separable_features()
    cpu = torch.device("cpu")
    clean = fit_mac_cal(MacCalConfig(epochs=3, stats_pass="clean"), inputs, labels, num_features=8, num_classes=3,
                        seed=1, device=cpu)
    given = fit_mac_cal(MacCalConfig(epochs=3), inputs, labels, num_features=8, num_classes=3, seed=1, device=cpu,
                        stats_inputs=(inputs, labels))
    assert [r["retention_prob"] for r in clean.history] == [r["retention_prob"] for r in given.history]


class _Artifact:
    """Five images per split, all of class 0; the Stage-I logits get the first ``right`` of them right."""

    num_features, num_classes = 2, 2

    def __init__(self, train_right: int, val_right: int, heldout_right: int = 5) -> None:
        def split(right: int) -> SplitCache:
            labels = torch.zeros(5, dtype=torch.long)
            logits = torch.tensor([[1.0, 0.0]] * right + [[0.0, 1.0]] * (5 - right))
            return SplitCache(torch.randn(5, 2), logits, labels)
        self.splits = {"train": split(train_right), "val": split(val_right), "test": split(5),
                       "train_heldout": split(heldout_right)}


def test_estimated_gamma_is_validation_over_the_statistics_images_accuracy():
    assert estimated_accuracy_weight(_Artifact(train_right=4, val_right=3)) == pytest.approx(0.6 / 0.8)
    assert estimated_accuracy_weight(_Artifact(4, 3, heldout_right=3), "train_heldout") == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"accuracy is 0.6000 on the validation split and 0.0000 on the split 'train'"):
        estimated_accuracy_weight(_Artifact(train_right=0, val_right=3))


def test_a_failed_estimate_fails_its_members_only():
    fixed = MacCalConfig(epochs=2, head="linear")
    estimated = MacCalConfig(epochs=2, head="linear", accuracy_weight_source="estimated")
    outcomes = run_mac_cal_population([fixed, estimated], _Artifact(train_right=0, val_right=3), seeds=[1, 1],
                                      device=torch.device("cpu"))
    assert isinstance(outcomes[1], ValueError) and "needs a Stage-I model with some correct" in str(outcomes[1])
    assert not isinstance(outcomes[0], BaseException) and outcomes[0].test_probs.shape == (5, 2)


def test_heldout_needs_a_training_subset(make_config):
    with pytest.raises(ConfigError, match=r"stats_source`='heldout'.*set stage1.train_size"):
        parse_trial_config(make_config(method={"name": "mac_cal", "stats_source": "heldout"}))


def test_train_size_is_below_the_training_split(make_config):
    # digits-noisy trains on 898 images; all of them is train_size null, one Stage I with one id.
    assert parse_trial_config(make_config(train_size=897)).stage1.train_size == 897
    with pytest.raises(ConfigError, match=r"`stage1.train_size` must be below the 898 images of digits-noisy's "
                                          r"training split, got stage1.train_size=898. Leave it null"):
        parse_trial_config(make_config(train_size=898))


@pytest.mark.parametrize(("method", "message"), [
    ({"stats_source": "augmented", "stats_pass": "clean"},
     r"`method.stats_pass`='clean' applies to `stats_source`='train' only .*leave `stats_pass` at 'online'"),
    ({"accuracy_weight_source": "estimated", "accuracy_weight": 0.9},
     r"`method.accuracy_weight`=0.9 is unused under `accuracy_weight_source`='estimated'.*default 0.95"),
])
def test_a_setting_the_other_makes_unused_is_refused(make_config, method, message):
    with pytest.raises(ConfigError, match=message):
        parse_trial_config(make_config(method={"name": "mac_cal", **method}))


def test_new_fields_at_their_defaults_keep_the_ids(make_config):
    cfg = parse_trial_config(make_config())
    identity = stage1_identity(cfg)
    assert "train_size" not in identity["stage1"]
    assert not {"stats_source", "accuracy_weight_source"} & set(trial_identity(cfg)["method"])
    subset = parse_trial_config(make_config(train_size=300))
    assert config_hash(stage1_identity(subset)) != config_hash(identity)
    other = parse_trial_config(make_config(method={"name": "mac_cal", "stats_source": "augmented"}))
    assert config_hash(trial_identity(other)) != config_hash(trial_identity(cfg))


def _cache(result, name: str) -> dict:
    return torch.load(stage1_dir(result.config.artifact_root, result.stage1_id) / name)


def test_heldout_and_augmented_splits_in_a_trial(make_config):
    heldout = run_trial(make_config(method={"name": "mac_cal", "stats_source": "heldout", "epochs": 3},
                                    train_size=300))
    assert heldout.status == "ok", heldout.error
    trained, held = _cache(heldout, "cache.pt"), _cache(heldout, "train_heldout.pt")
    assert trained["train_features"].shape[0] == 300
    total = 300 + held["features"].shape[0]
    assert total > 300 and held["labels"].numel() == total - 300
    rows = [r for r in heldout.history if r["stage"] == "stage2"]
    assert rows[0]["update_accuracy"] != rows[0]["train_accuracy"]

    augmented = run_trial(make_config(method={"name": "mac_cal", "stats_source": "augmented", "epochs": 3},
                                      train_size=300))
    assert augmented.stage1_id == heldout.stage1_id  # the same Stage I serves both
    views = _cache(augmented, "train_augmented.pt")
    assert torch.equal(views["labels"], trained["train_labels"])  # one view per trained image, in order
    # digits has no training augmentation: its views are the images themselves
    assert torch.allclose(views["features"], trained["train_features"], atol=1e-5)


def test_estimated_gamma_in_a_trial(make_config):
    result = run_trial(make_config(method={"name": "mac_cal", "accuracy_weight_source": "estimated", "epochs": 2}))
    cache = _cache(result, "cache.pt")

    def accuracy(split: str) -> float:
        return float((cache[f"{split}_logits"].argmax(1) == cache[f"{split}_labels"]).double().mean())

    gammas = [r["accuracy_weight"] for r in result.history if r["stage"] == "stage2"]
    assert gammas == [pytest.approx(accuracy("val") / accuracy("train"))] * 2
