"""Contract test over every registered loss: builds by name, forward + backward, config round-trip."""

import dataclasses

import pytest
import torch

from calib._config import field_types, from_dict
from calib.losses import LOSSES, TrainingStateLoss

NAMES = LOSSES.names()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_builds_and_trains(name, reduction):
    spec = LOSSES.get(name)
    loss_fn = spec.create(spec.config(), num_classes=10, reduction=reduction)
    loss_fn.train()
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(8, 10, generator=gen) * 3).requires_grad_()
    features = torch.randn(8, 16, generator=gen).abs()
    targets = torch.randint(0, 10, (8,), generator=gen)
    positions = {}
    if isinstance(loss_fn, TrainingStateLoss):  # Stage I's hooks (calib/training/stage1.py)
        loss_fn.start_training(20)
        if loss_fn.needs_sample_indices:
            positions = {"indices": torch.arange(8) * 2}
    loss = loss_fn(logits, targets, features, **positions)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    for param in loss_fn.parameters():
        assert param.grad is None or torch.isfinite(param.grad).all()


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_config_round_trips(name):
    spec = LOSSES.get(name)
    default = spec.config()
    assert dataclasses.is_dataclass(default) and spec.description
    assert from_dict(spec.config, dataclasses.asdict(default)) == default
    assert spec.config.__dataclass_params__.frozen, f"{spec.config.__name__} must be a frozen dataclass"
    assert all(f.kw_only for f in dataclasses.fields(default)), f"{spec.config.__name__} must be kw_only"


def test_shared_field_names_have_one_type():
    """Config fields become store columns ``loss_<field>``: one name, one type, across all losses."""
    seen: dict[str, tuple[object, str]] = {}
    for name in NAMES:
        for field, tp in field_types(LOSSES.get(name).config).items():
            if field in seen:
                assert seen[field][0] == tp, f"`{field}` is {tp} in {name} but {seen[field][0]} in {seen[field][1]}"
            else:
                seen[field] = (tp, name)
