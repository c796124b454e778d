"""Stage-I training and the device/seed plumbing every stage shares."""

from calib.training.device import auto_num_workers, describe_device, loader_kwargs, resolve_device, seed_everything
from calib.training.stage1 import Stage1Training, predict, prepare_model, train_stage1

__all__ = [
    "Stage1Training",
    "auto_num_workers",
    "describe_device",
    "loader_kwargs",
    "predict",
    "prepare_model",
    "resolve_device",
    "seed_everything",
    "train_stage1",
]
