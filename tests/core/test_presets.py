"""The presets: the paper preset is MaC-Cal Table 1's grid with the seeds' protocols (docs/methods.md §7.2-7.3)."""

from __future__ import annotations

import argparse

import pytest

from calib._config import ConfigError
from calib._registry import UnknownNameError
from calib.cli import add_common_args, execution_options, preset_of, study_setups
from calib.config import parse_trial_config
from calib.presets import PRESETS, base_config


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_common_args(parser, study="t")
    return parser.parse_args(list(argv))


PAPER_SETUPS = [(d, a) for d in ("cifar10", "cifar100") for a in ("resnet50", "resnet110", "wrn26_10", "densenet121")]


def test_paper_preset_is_table1s_grid():
    assert PRESETS.get("paper").setups() == [*PAPER_SETUPS, ("tiny-imagenet", "resnet50_tiny")]
    assert PRESETS.get("quick").setups() == [("digits-noisy", "small_cnn")]


@pytest.mark.parametrize("dataset, arch", [*PAPER_SETUPS, ("tiny-imagenet", "resnet50_tiny")])
def test_paper_configs_follow_the_protocol(dataset, arch, tmp_path):
    preset = PRESETS.get("paper")
    cfg = parse_trial_config(base_config(preset, study="t", dataset=dataset, arch=arch, seed=1,
                                         method={"name": "mac_cal"}, data_root=str(tmp_path),
                                         artifact_root=str(tmp_path / "a")))
    s1 = cfg.stage1
    assert (s1.lr, s1.momentum, s1.weight_decay, s1.batch_size, s1.grad_clip, s1.loss_reduction) == \
        (0.1, 0.9, 5e-4, 128, 2.0, "sum")
    if dataset == "tiny-imagenet":
        assert (s1.epochs, s1.milestones) == (100, (40, 60))  # §7.3
    else:
        assert (s1.epochs, s1.milestones) == (350, (150, 250))  # §7.2
    assert (cfg.method.params.epochs, cfg.method.params.lr) == (40, 0.1)  # Stage II
    assert cfg.arch == arch and cfg.num_workers is None  # workers sized from the trial's CPUs
    # on CUDA: bf16, compiled as measured fastest, data on the GPU where it fits (all ignored on the CPU)
    assert (s1.amp, s1.compile, s1.data_pipeline, s1.channels_last) == ("bf16", "auto", "auto", True)


def test_explicit_archs_apply_to_every_dataset():
    preset = preset_of(parse("--preset", "paper", "--datasets", "cifar10", "tiny-imagenet", "--archs", "resnet110"))
    assert study_setups(parse("--preset", "paper", "--datasets", "cifar10", "tiny-imagenet", "--archs", "resnet110"),
                        preset) == [("cifar10", "resnet110"), ("tiny-imagenet", "resnet110")]
    with pytest.raises(UnknownNameError, match="resnet51"):
        study_setups(parse("--archs", "resnet51"), PRESETS.get("quick"))


def test_epochs_flag_shortens_every_dataset_schedule():
    preset = preset_of(parse("--preset", "paper", "--epochs", "50"))
    gpu = {"amp": "bf16", "compile": "auto"}  # the paper preset's GPU settings stay
    assert preset.stage1_for("cifar10") == {**gpu, "epochs": 50, "milestones": []}
    assert preset.stage1_for("tiny-imagenet") == {**gpu, "epochs": 50, "milestones": [40]}


def test_resources_whole_gpus_for_stage1_and_shares_for_the_rest():
    paper = execution_options(parse("--preset", "paper"), preset_of(parse("--preset", "paper")))
    assert paper.resources("stage1") == {"CPU": 4.0, "GPU": 1.0}
    assert paper.resources("cached") == {"CPU": 2.0, "GPU": 0.25}
    args = parse("--preset", "paper", "--gpus-per-cached-trial", "0.5", "--cpus-per-trial", "8")
    custom = execution_options(args, preset_of(args))
    assert custom.resources("stage1") == {"CPU": 8.0, "GPU": 1.0} and custom.resources("cached")["GPU"] == 0.5
    quick = execution_options(parse(), preset_of(parse()))
    assert quick.resources("stage1") == quick.resources("cached") == {"CPU": 1.0, "GPU": 0.0}
    with pytest.raises(ConfigError, match="--gpus-per-cached-trial"):
        execution_options(parse("--gpus-per-cached-trial", "-1"), preset_of(parse()))


def test_medium_preset_is_fashion_mnist_resnet20_and_asks_for_gpus_only_where_there_are(monkeypatch, tmp_path):
    preset = preset_of(parse("--preset", "medium"))
    assert study_setups(parse("--preset", "medium"), preset) == [("fashion-mnist", "resnet20")]
    cfg = parse_trial_config(base_config(preset, study="t", dataset="fashion-mnist", seed=1, method={"name": "mac_cal"},
                                         data_root=str(tmp_path), artifact_root=str(tmp_path / "a")))
    assert (cfg.stage1.epochs, cfg.stage1.milestones, cfg.stage1.loss_reduction, cfg.stage1.grad_clip) == \
        (60, (30, 45), "sum", 2.0)
    assert cfg.method.params.epochs == 40 and preset.seeds == (1, 2, 3)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    cpu = execution_options(parse("--preset", "medium"), preset)
    assert cpu.resources("stage1") == cpu.resources("cached") == {"CPU": 1.0, "GPU": 0.0}
    forced = execution_options(parse("--preset", "medium", "--gpus-per-trial", "0.5"), preset)
    assert forced.resources("stage1")["GPU"] == 0.5  # an explicit flag wins
    cluster = execution_options(parse("--preset", "medium", "--address", "auto"), preset)
    assert cluster.resources("stage1")["GPU"] == 0.25 and cluster.resources("cached")["GPU"] == 0.125
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    gpu = execution_options(parse("--preset", "medium"), preset)
    assert gpu.resources("stage1") == {"CPU": 1.0, "GPU": 0.25}


def test_train_size_flag_reaches_every_dataset_and_must_be_positive():
    preset = preset_of(parse("--preset", "paper", "--train-size", "4000", "--epochs", "50"))
    assert [preset.stage1_for(d)["train_size"] for d in ("cifar10", "tiny-imagenet")] == [4000, 4000]
    with pytest.raises(ConfigError, match=r"`--train-size` must be an integer >= 1.*--train-size=0"):
        preset_of(parse("--train-size", "0"))
