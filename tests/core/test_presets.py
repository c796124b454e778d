"""The presets: the paper preset is MaC-Cal's and FeDLaS's Table 1 grid with the seeds' protocols (docs/methods.md
§7.2-7.3)."""

from __future__ import annotations

import argparse

import pytest

from calib._config import ConfigError
from calib._registry import UnknownNameError
from calib.config import parse_trial_config
from calib.study.flags import add_common_args
from calib.study.presets import PRESETS, base_config
from calib.study.resources import execution_options
from calib.study.sources import preset_of, study_setups


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_common_args(parser, study="t")
    return parser.parse_args(list(argv))


PAPER_SETUPS = [(d, a) for d in ("cifar10", "cifar100")
                for a in ("resnet50", "resnet101", "resnet110", "wrn26_10", "densenet121")]
TINY_SETUPS = [("tiny-imagenet", "resnet50_tiny"), ("tiny-imagenet", "resnet101_tiny")]


def test_paper_preset_is_table1s_grid():
    # MaC-Cal Table 1 (ResNet-50/110, WRN-26-10, DenseNet-121) and FeDLaS Table 1 (ResNet-50/101 on all three)
    assert PRESETS.get("paper").setups() == [*PAPER_SETUPS, *TINY_SETUPS]
    assert PRESETS.get("quick").setups() == [("digits-noisy", "small_cnn")]


@pytest.mark.parametrize("dataset, arch", [*PAPER_SETUPS, *TINY_SETUPS])
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


@pytest.fixture
def machine(monkeypatch):
    """``machine(cpus, gpus)``: what local Ray would start with, as
    :func:`calib.study.resources.execution_options` sees it."""

    def set_machine(cpus: float, gpus: float) -> None:
        monkeypatch.setattr("calib.study.resources.machine_resources", lambda: {"CPU": float(cpus), "GPU": float(gpus)})
        monkeypatch.setattr("torch.cuda.device_count", lambda: int(gpus))
        monkeypatch.setattr("torch.cuda.is_available", lambda: gpus > 0)

    return set_machine


def test_resources_whole_gpus_for_stage1_and_shares_for_the_rest(machine):
    machine(16, 2)
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


def test_medium_preset_is_fashion_mnist_resnet20_and_asks_for_gpus_only_where_there_are(machine, tmp_path):
    preset = preset_of(parse("--preset", "medium"))
    assert study_setups(parse("--preset", "medium"), preset) == [("fashion-mnist", "resnet20")]
    cfg = parse_trial_config(base_config(preset, study="t", dataset="fashion-mnist", seed=1, method={"name": "mac_cal"},
                                         data_root=str(tmp_path), artifact_root=str(tmp_path / "a")))
    assert (cfg.stage1.epochs, cfg.stage1.milestones, cfg.stage1.loss_reduction, cfg.stage1.grad_clip) == \
        (60, (30, 45), "sum", 2.0)
    assert cfg.method.params.epochs == 40 and preset.seeds == (1, 2, 3)
    machine(2, 0)
    cpu = execution_options(parse("--preset", "medium"), preset)
    assert cpu.resources("stage1") == cpu.resources("cached") == {"CPU": 1.0, "GPU": 0.0}
    with pytest.raises(ConfigError, match=r"`--gpus-per-trial` asks for 0\.5 GPU per Stage-I trial, but this "
                                          r"machine has 0 GPUs"):
        execution_options(parse("--preset", "medium", "--gpus-per-trial", "0.5"), preset)  # an explicit flag wins
    cluster = execution_options(parse("--preset", "medium", "--address", "auto"), preset)
    assert cluster.resources("stage1")["GPU"] == 0.25 and cluster.resources("cached")["GPU"] == 0.125
    machine(2, 1)
    gpu = execution_options(parse("--preset", "medium"), preset)
    assert gpu.resources("stage1") == {"CPU": 1.0, "GPU": 0.25}


def test_full_cpu_preset_is_all_of_fashion_mnist_on_lenet5_one_cpu_a_trial(machine, tmp_path):
    preset = preset_of(parse("--preset", "full-cpu"))
    assert study_setups(parse("--preset", "full-cpu"), preset) == [("fashion-mnist", "lenet5")]
    assert preset.seeds == (1, 2, 3, 4, 5)
    cfg = parse_trial_config(base_config(preset, study="t", dataset="fashion-mnist", seed=1, method={"name": "mac_cal"},
                                         data_root=str(tmp_path), artifact_root=str(tmp_path / "a")))
    s1 = cfg.stage1
    assert (s1.epochs, s1.milestones, s1.lr, s1.weight_decay, s1.loss_reduction, s1.grad_clip, s1.batch_size) == \
        (20, (10, 15), 0.05, 1e-4, "mean", 2.0, 128)
    assert s1.train_size is None and not s1.augment  # all 55,000 images, as they are: LeNet-5 overfits them
    assert s1.data_pipeline == "device"
    assert cfg.device == "cpu" and cfg.method.params.epochs == 40
    machine(2, 0)
    options = execution_options(parse("--preset", "full-cpu"), preset)
    assert options.resources("stage1") == options.resources("cached") == {"CPU": 1.0, "GPU": 0.0}
    sliced = preset_of(parse("--preset", "full-cpu", "--train-size", "300", "--epochs", "2"))
    assert {k: sliced.stage1_for("fashion-mnist")[k] for k in ("train_size", "epochs", "milestones", "lr")} == \
        {"train_size": 300, "epochs": 2, "milestones": [], "lr": 0.05}


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus-per-trial", "1"], r"`--gpus-per-trial` asks for 1 GPU per Stage-I trial, but this machine has 0 GPUs "
                                r"\(torch sees no CUDA device\).*use at most 0 \(--gpus-per-trial 0\), or --address"),
    (["--gpus-per-cached-trial", "1"], r"`--gpus-per-cached-trial` asks for 1 GPU per trial on a trained Stage I"),
    (["--cpus-per-trial", "64"], r"`--cpus-per-trial` asks for 64 CPUs per Stage-I trial, but this machine has 2 CPUs"),
    (["--cpus-per-trial", "2", "--cpus-per-cached-trial", "3"], r"`--cpus-per-cached-trial` asks for 3 CPUs"),
    (["--preset", "paper"], r"`--cpus-per-trial` asks for 4 CPUs per Stage-I trial \(the paper preset's\)"),
    (["--gpus-per-trial", "1.5"], r"`--gpus-per-trial` must be at most 1 \(a share of one GPU\) or a whole number of "
                                  r"GPUs.*got --gpus-per-trial=1\.5\. Use 1 or 2\."),
    (["--gpus-per-trial", "2.5", "--address", "auto"], r"got --gpus-per-trial=2\.5\. Use 2 or 3\."),
    (["--gpus-per-trial", "1", "--gpus-per-cached-trial", "1.25", "--address", "auto"],
     r"`--gpus-per-cached-trial` must be at most 1 .*got --gpus-per-cached-trial=1\.25"),
])
def test_resources_no_node_could_grant_are_errors(machine, argv, message):
    machine(2, 0)
    with pytest.raises(ConfigError, match=message):
        execution_options(parse(*argv), preset_of(parse(*argv)))


def test_requests_that_fit_pass(machine):
    machine(2, 0)
    for argv in (["--cpus-per-trial", "2"], ["--cpus-per-trial", "0.5"],
                 ["--gpus-per-trial", "2", "--cpus-per-trial", "64", "--address", "auto"]):
        execution_options(parse(*argv), preset_of(parse(*argv)))
    machine(8, 2)
    options = execution_options(parse("--gpus-per-trial", "2", "--gpus-per-cached-trial", "0.25"), preset_of(parse()))
    assert options.resources("stage1")["GPU"] == 2 and options.resources("cached")["GPU"] == 0.25


@pytest.mark.parametrize(("gpus_here", "argv", "message"), [
    (0, ["--device", "cuda"], r"`--device cuda` needs a CUDA GPU, but torch sees none on this machine"),
    (0, ["--device", "cuda:0"], r"`--device cuda:0` needs a CUDA GPU"),
    (2, ["--device", "cuda:2"], r"`--device cuda:2` names GPU 2, but torch sees 2 CUDA devices on this machine "
                                r"\(cuda:0 to cuda:1\)"),
    (2, ["--device", "cuda:1", "--gpus-per-trial", "1"], r"`--device cuda:1` names GPU 1, but a Stage-I trial sees "
                                                        r"only the 1 GPU Ray gives it.*use cuda or cuda:0\."),
    (0, ["--device", "cuda", "--address", "auto"], r"`--device cuda` needs a GPU in every trial, but "
                                                   r"--gpus-per-trial is 0 \(the quick preset's\)"),
    (0, ["--device", "cuda", "--address", "auto", "--gpus-per-trial", "1", "--gpus-per-cached-trial", "0"],
     r"but --gpus-per-cached-trial is 0: on a cluster a trial on a trained Stage I that asks Ray for no GPU"),
])
def test_a_cuda_device_the_trials_would_not_see_is_an_error(machine, gpus_here, argv, message):
    machine(8, gpus_here)
    with pytest.raises(ConfigError, match=message):
        execution_options(parse(*argv), preset_of(parse(*argv)))


def test_a_cuda_device_the_trials_see_passes(machine):
    machine(8, 2)
    for argv in (["--device", "cuda"], ["--device", "cuda:1"], ["--device", "cuda:1", "--gpus-per-trial", "2"]):
        execution_options(parse(*argv), preset_of(parse(*argv)))
    machine(8, 0)
    argv = ["--device", "cuda", "--address", "auto", "--gpus-per-trial", "1", "--gpus-per-cached-trial", "0.25"]
    execution_options(parse(*argv), preset_of(parse(*argv)))


def test_train_size_flag_reaches_every_dataset_and_must_be_positive():
    preset = preset_of(parse("--preset", "paper", "--train-size", "4000", "--epochs", "50"))
    assert [preset.stage1_for(d)["train_size"] for d in ("cifar10", "tiny-imagenet")] == [4000, 4000]
    with pytest.raises(ConfigError, match=r"`--train-size` must be an integer >= 1.*--train-size=0"):
        preset_of(parse("--train-size", "0"))
    with pytest.raises(ConfigError, match=r"`--train-size` must be at least the 10 classes of digits-noisy "
                                          r"\(Stage I trains on a stratified sample that holds every class\), "
                                          r"got --train-size=9\."):
        study_setups(parse("--train-size", "9"), preset_of(parse("--train-size", "9")))
    assert study_setups(parse("--train-size", "10"), preset_of(parse("--train-size", "10"))) == [
        ("digits-noisy", "small_cnn")]


@pytest.mark.parametrize("seed", ["-1", "4294967296", "99999999999999999999"])
def test_seeds_outside_what_numpy_takes_are_errors(seed):
    with pytest.raises(ConfigError, match=rf"`--seeds` must be integers with 0 <= seed < 2\*\*32 = 4294967296 "
                                          rf"\(NumPy's seeding takes no other\), got --seeds={seed}\."):
        preset_of(parse("--seeds", "1", seed))
    assert preset_of(parse("--seeds", "0", "4294967295")).name == "quick"
