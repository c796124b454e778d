"""Mixup and MIT (docs/methods.md §4.8-4.9)."""

import numpy as np
import pytest
import torch

from calib._config import ConfigError
from calib.artifacts import get_or_train_stage1
from calib.config import parse_trial_config
from calib.training.mixing import mit_coefficients, mit_decouple, mix


def test_mit_decoupling_is_exact_for_a_linear_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)
    x_a, x_b = torch.randn(5, 6, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    model = model.double()
    rng = np.random.default_rng(0)
    for _ in range(20):
        lam1, lam2 = mit_coefficients(1.0, rng)
        f_a, f_b = mit_decouple(model(mix(x_a, x_b, lam1)), model(mix(x_a, x_b, lam2)), lam1, lam2)
        torch.testing.assert_close(f_a, model(x_a), rtol=0, atol=1e-9)
        torch.testing.assert_close(f_b, model(x_b), rtol=0, atol=1e-9)


def test_mit_decouple_hand_example():
    # f(x_a) = 2, f(x_b) = −4; λ1 = 0.75, λ2 = 0.25: o1 = 0.75·2 + 0.25·(−4) = 0.5, o2 = 0.25·2 − 0.75·4 = −2.5
    f_a, f_b = mit_decouple(torch.tensor([0.5]), torch.tensor([-2.5]), 0.75, 0.25)
    assert f_a.item() == pytest.approx(2.0) and f_b.item() == pytest.approx(-4.0)


def test_mit_coefficients_are_ordered_and_non_singular():
    rng = np.random.default_rng(1)
    pairs = [mit_coefficients(0.2, rng) for _ in range(500)]
    assert all(l1 >= 0.5 >= l2 and l1 - l2 >= 1e-3 for l1, l2 in pairs)


def test_mix():
    assert torch.equal(mix(torch.ones(2), torch.zeros(2), 0.25), torch.full((2,), 0.25))


def test_mixup_and_mit_train_different_stage1(make_config):
    cpu = torch.device("cpu")
    plain, _ = get_or_train_stage1(parse_trial_config(make_config()), cpu)
    mit, hit = get_or_train_stage1(parse_trial_config(make_config(mit_alpha=1.0)), cpu)
    assert not hit and mit.stage1_id != plain.stage1_id
    assert not torch.equal(plain.splits["test"].logits, mit.splits["test"].logits)
    assert all(np.isfinite(r["train_loss"]) for r in mit.record["history"])


def test_mixup_and_mit_exclude_each_other(make_config):
    with pytest.raises(ConfigError, match="exclude each other"):
        parse_trial_config(make_config(mit_alpha=1.0, mixup_alpha=1.0))
    with pytest.raises(ConfigError, match=r"`stage1.mit_alpha` must be > 0"):
        parse_trial_config(make_config(mit_alpha=0.0))
