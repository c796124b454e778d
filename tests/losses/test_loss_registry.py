"""Contract test over every registered loss: builds by name, forward + backward, config round-trip; the loss class
takes its config's defaults (read from the config, not written again) and is built from the config by field name; a
loss written as one file (config + class + ``register_loss``) meets the same contract."""

import dataclasses
import inspect
from dataclasses import dataclass

import pytest
import torch
from torch.nn import functional as F

from calib._config import ConfigError, check_fields, checked_field, field_types, from_dict, in_range
from calib._registry import Registry
from calib.losses import LOSSES, ConfiguredLoss, LossSpec, TrainingStateLoss, register_loss
from calib.losses import _base as loss_base

NAMES = LOSSES.names()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_builds_and_trains(name, reduction):
    _builds_and_trains(LOSSES.get(name), reduction)


def _builds_and_trains(spec, reduction):
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


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_the_loss_takes_its_configs_defaults_by_name(name):
    """Each config field is a keyword of the loss class whose default (if any) is the config's own; the loss built
    from a non-default config carries every value."""
    spec = LOSSES.get(name)
    parameters = inspect.signature(spec.loss).parameters
    for field in dataclasses.fields(spec.config):
        default = parameters[field.name].default
        assert default is inspect.Parameter.empty or default == field.default, (name, field.name)
    changed = {f.name: f.default * 2 if isinstance(f.default, float) else f.default
               for f in dataclasses.fields(spec.config)}
    changed = {k: min(v, 0.9) if k in ("smoothing", "norm_momentum") else v for k, v in changed.items()}
    if name == "adafocal":
        changed["gamma_initial"] = 2.0  # within [gamma_min, gamma_max] = [-4, 40]
    loss_fn = spec.create(spec.config(**changed), num_classes=10, reduction="sum")
    assert {k: getattr(loss_fn, k) for k in changed} == changed and loss_fn.reduction == "sum"


@dataclass(frozen=True, kw_only=True)
class SquaredGapConfig:
    """A loss written as one file: its one hyperparameter declared once."""

    weight: float = checked_field(0.5, in_range(at_least=0))

    def __post_init__(self) -> None:
        check_fields(self)


class SquaredGap(ConfiguredLoss):
    """CE_i + w·(1 − p_{i,y_i})², reduced by ``reduction``."""

    def __init__(self, weight: float = SquaredGapConfig.weight, *, num_classes: int, reduction: str = "mean") -> None:
        super().__init__(SquaredGapConfig, locals())
        self.num_classes = num_classes

    def forward(self, logits, targets, features=None):
        log_p = F.log_softmax(logits, dim=1).gather(1, targets[:, None]).squeeze(1)
        per_sample = -log_p + self.weight * (1 - log_p.exp()).square()
        return per_sample.sum() if self.reduction == "sum" else per_sample.mean()


@pytest.fixture
def own_registry(monkeypatch):
    """A fresh loss registry for ``register_loss`` (calib's stays as it is)."""
    registry = Registry("loss")
    monkeypatch.setattr(loss_base, "LOSSES", registry)
    return registry


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_loss_written_as_one_file_meets_the_contract(own_registry, reduction):
    register_loss("squared_gap", SquaredGapConfig, SquaredGap, "CE + w·(1 − p_y)²", label="SqGap", order=50)
    spec = own_registry.get("squared_gap")
    assert (spec.label, spec.order, spec.loss, spec.build) == ("SqGap", 50, SquaredGap, None)
    _builds_and_trains(spec, reduction)
    built = spec.create(SquaredGapConfig(weight=2), num_classes=3, reduction=reduction)
    assert (built.weight, built.num_classes) == (2.0, 3)
    assert repr(built) == f"SquaredGap(weight=2.0, reduction={reduction!r})"
    # by hand: logits (0, 0, ln 2) -> p = (1/4, 1/4, 1/2); label 2: CE = ln 2, (1 - p_y)^2 = 1/4
    value = built(torch.tensor([[0.0, 0.0, float(torch.log(torch.tensor(2.0)))]]), torch.tensor([2]))
    assert value.item() == pytest.approx(0.693147 + 2 * 0.25, abs=1e-5)
    with pytest.raises(ConfigError, match=r"^`reduction` must be 'mean' or 'sum', got reduction='none'\.$"):
        spec.create(SquaredGapConfig(weight=1.0), num_classes=3, reduction="none")
    with pytest.raises(ConfigError, match=r"^`weight` must be >= 0, got weight=-1\.0\.$"):
        SquaredGap(-1.0, num_classes=3)  # the loss and its config say the same


def test_a_loss_that_does_not_take_its_fields_by_name_is_refused(own_registry):
    class Positional(torch.nn.Module):
        def __init__(self, w, reduction="mean"):
            super().__init__()

    with pytest.raises(TypeError, match=r"Positional must take each field of SquaredGapConfig .* it has no 'weight'"):
        register_loss("positional", SquaredGapConfig, Positional, "refused")
    assert "positional" not in own_registry


def test_the_former_build_factory_still_works_with_a_deprecation_warning(own_registry):
    with pytest.deprecated_call(match=r"LossSpec\(build=...\) is renamed calib.losses.register_loss\(name, "
                                      r"Config, Loss"):
        spec = LossSpec(config=SquaredGapConfig, description="old form", label="Old",
                        build=lambda params, *, num_classes, reduction: SquaredGap(
                            params.weight, num_classes=num_classes, reduction=reduction))
    built = spec.create(SquaredGapConfig(weight=0.25), num_classes=4, reduction="sum")
    assert (built.weight, built.num_classes, built.reduction) == (0.25, 4, "sum")
    with pytest.raises(TypeError, match="exactly one of them"):
        LossSpec(SquaredGapConfig, None, "neither")
