"""Stage-I options of the paper protocol and the GPU paths that must leave CPU runs unchanged."""

from __future__ import annotations

import contextlib
import copy
import io
import warnings

import pytest
import torch

from calib._config import ConfigError
from calib.artifacts import get_or_train_stage1, stage1_exists
from calib.config import parse_trial_config
from calib.datasets import load_dataset
from calib.run.execution import ExecutionOptions
from calib.run.grid import assign_roles
from calib.training import auto_num_workers, describe_device, loader_kwargs, train_stage1
from calib.training.device import autocast


def _train(make_config, **stage1):
    cfg = parse_trial_config(make_config(**stage1))
    data = load_dataset(cfg.dataset, cfg.data_root)
    return train_stage1(cfg, data, torch.device("cpu"))


def test_scheduler_step_at_epoch_start_moves_every_decay_one_epoch_early(make_config):
    # Milestone 2, decay 0.1: PyTorch's convention decays before epoch 2; FOCAL-R's step at the start of
    # each epoch has the schedule at e + 1 during epoch e, so the decay is already in effect at epoch 1.
    end = _train(make_config, epochs=4, milestones=[2], scheduler_step="epoch_end")
    start = _train(make_config, epochs=4, milestones=[2], scheduler_step="epoch_start")
    assert [row["lr"] for row in end.history] == pytest.approx([0.1, 0.1, 0.01, 0.01])
    assert [row["lr"] for row in start.history] == pytest.approx([0.1, 0.01, 0.01, 0.01])


def test_amp_leaves_cpu_training_bitwise_unchanged(make_config):
    off = _train(make_config, epochs=2, amp="off")
    for amp in ("bf16", "fp16"):
        on = _train(make_config, epochs=2, amp=amp)
        for name, tensor in off.model.state_dict().items():
            assert torch.equal(tensor, on.model.state_dict()[name]), (amp, name)


def test_throughput_is_recorded(make_config):
    trained = _train(make_config, epochs=2)
    assert trained.images_per_second > 0
    cfg = parse_trial_config(make_config())
    assert not stage1_exists(cfg)
    artifact, hit = get_or_train_stage1(cfg, torch.device("cpu"))
    assert not hit and stage1_exists(cfg)
    assert artifact.record["images_per_second"] > 0 and artifact.record["device"] == "cpu"


def test_autocast_only_on_cuda():
    assert isinstance(autocast(torch.device("cpu"), "bf16"), contextlib.nullcontext)
    assert isinstance(autocast(torch.device("cuda"), "off"), contextlib.nullcontext)
    with warnings.catch_warnings():  # without a GPU, torch warns that it disables the autocast it built
        warnings.simplefilter("ignore")
        bf16, fp16 = autocast(torch.device("cuda"), "bf16"), autocast(torch.device("cuda"), "fp16")
    assert isinstance(bf16, torch.autocast) and bf16.fast_dtype == torch.bfloat16
    assert fp16.fast_dtype == torch.float16


def test_loader_workers_from_the_trial_cpus():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert auto_num_workers(cpu, 8) == 0  # the CPU path loads in-process, as before
    assert auto_num_workers(cuda, 4) == 3 and auto_num_workers(cuda, 1) == 1
    assert loader_kwargs(cuda, 2) == {"num_workers": 2, "pin_memory": True, "persistent_workers": True}
    assert loader_kwargs(cpu, None) == {"num_workers": 0, "pin_memory": False, "persistent_workers": False}
    assert describe_device(cpu) == "cpu"


def test_cifar100_test_norm_applies_to_cifar100_only(make_config):
    with pytest.raises(ConfigError, match="cifar100_test_norm"):
        parse_trial_config({**make_config(), "cifar100_test_norm": "focal_bug"})
    with pytest.raises(ConfigError, match="cifar100_test_norm"):
        parse_trial_config({**make_config(), "cifar100_test_norm": "imagenet"})


@pytest.mark.parametrize("key, value", [("amp", "fp8"), ("scheduler_step", "midway")])
def test_bad_stage1_options_are_rejected(make_config, key, value):
    with pytest.raises(ConfigError, match=f"stage1.{key}"):
        parse_trial_config(make_config(**{key: value}))


def test_stage1_trainers_get_whole_gpus_and_the_rest_share(make_config, tmp_path):
    options = ExecutionOptions(cpus_per_trial=4, gpus_per_trial=1, cpus_per_cached_trial=1, gpus_per_cached_trial=0.25)
    assert options.resources("stage1") == {"CPU": 4, "GPU": 1}
    assert options.resources("cached") == {"CPU": 1, "GPU": 0.25}
    assert ExecutionOptions(cpus_per_trial=2, gpus_per_trial=1).resources("cached") == {"CPU": 2, "GPU": 1}

    methods = [{"name": "vanilla"}, {"name": "temperature_scaling"}, {"name": "mac_cal", "epochs": 2}]
    configs = [make_config(seed=seed, method=m) for seed in (1, 2) for m in methods]
    roles = assign_roles(configs)
    assert [r["role"] for r in roles] == ["stage1", "stage1", "cached", "cached", "cached", "cached"]
    assert {r["config"]["seed"] for r in roles[:2]} == {1, 2}  # one trainer per Stage-I config, first
    # Once seed 1's artifact is stored, all its trials are light.
    get_or_train_stage1(parse_trial_config(configs[0]), torch.device("cpu"))
    assert [r["role"] for r in assign_roles(configs)] == ["stage1"] + ["cached"] * 5


@pytest.mark.parametrize("stage1", [{}, {"mixup_alpha": 1.0}, {"checkpoint": "best_val"}])
def test_resuming_from_a_checkpoint_gives_the_uninterrupted_model(make_config, stage1):
    cfg = parse_trial_config(make_config(epochs=4, milestones=[2], **stage1))
    data = load_dataset(cfg.dataset, cfg.data_root)
    cpu = torch.device("cpu")
    states = []
    whole = train_stage1(cfg, data, cpu, on_checkpoint=lambda state: states.append(copy.deepcopy(state)))
    assert [s["epoch"] for s in states] == [0, 1, 2, 3]
    # Serialise as a Tune checkpoint would, then continue after epoch 1 in a fresh process state.
    buffer = io.BytesIO()
    torch.save(states[1], buffer)
    buffer.seek(0)
    torch.manual_seed(12345)  # the global RNG is part of the checkpoint, not of the process
    resumed = train_stage1(cfg, data, cpu, resume=torch.load(buffer, weights_only=True))
    assert resumed.history == whole.history and resumed.best_epoch == whole.best_epoch
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name
