"""BalCAL (calib/training/balcal.py) against BALCAL-R (``JianiNi/BalCAL`` 0ef3b5c), reconstructed here.

What is checked against what:
- the loss: ``BalCAL_models.training_step`` computes λ·CE(W h + b, y) + (1 − λ)·CE(f · (Ew ⊙ M), y) with
  ``produce_Ew`` (a per-class loop: sqrt((B / classes present) / n_c)); reconstructed below as that loop and
  compared in value and gradient (features, head weights) to 1e-6;
- the λ state: ``find_lamd`` (bisection with the first gap as the bar) on the epoch's logits, reconstructed as
  BALCAL-R's loop, against :class:`BalCALObjective` over several minibatches and two epochs;
- the ETF M = sqrt(C/(C−1))·P·(I − 11ᵀ/C): unit columns with pairwise cosine −1/(C−1), summing to zero.
"""

import math

import pytest
import torch
from torch.nn import functional as F

from calib._config import ConfigError
from calib.config import parse_trial_config
from calib.losses import CrossEntropy
from calib.models import create_model
from calib.training.balcal import (
    INITIAL_WEIGHT,
    BalCALModel,
    BalCALObjective,
    balance_scale,
    feedback_weight,
    simplex_etf,
)
from calib.training.procedures import weighted_pair


def official_ew(labels, num_classes):
    """produce_Ew: 1 per class, sqrt(gamma / count) for the classes in the batch."""
    unique, counts = torch.unique(labels, return_counts=True)
    gamma = labels.numel() / unique.numel()
    ew = torch.ones(1, num_classes)
    for label, count in zip(unique.tolist(), counts.tolist(), strict=True):
        ew[0, label] = math.sqrt(gamma / count)
    return ew


def official_find_lamd(linear_logits, etf_logits, labels, delta, tol=1e-4):
    """find_lamd, as BALCAL-R writes it (softmax confidences; min_diff never updated)."""
    def conf_acc(logits):
        conf, pred = logits.double().softmax(1).max(1)
        return conf.mean().item(), (pred == labels).double().mean().item()

    conf1, acc1 = conf_acc(linear_logits)
    best = 1.0
    if acc1 * delta > conf1:
        return best
    min_diff = abs(acc1 * delta - conf1)
    left, right = 0.0, 1.0
    while right - left > tol:
        mid = (left + right) / 2
        conf, acc = conf_acc(mid * linear_logits.double() + (1 - mid) * etf_logits.double())
        if abs(acc * delta - conf) < min_diff:
            best = mid
        if acc * delta > conf:
            left = mid
        else:
            right = mid
    return best


@pytest.fixture
def model():
    torch.manual_seed(0)
    return BalCALModel(create_model("small_cnn", num_classes=10, in_channels=1)).double()


def test_simplex_etf_is_equiangular():
    etf = simplex_etf(64, 10, torch.Generator().manual_seed(0)).double()
    torch.testing.assert_close(etf.norm(dim=0), torch.ones(10, dtype=torch.float64), atol=1e-6, rtol=0)
    cosines = etf.T @ etf
    off_diagonal = cosines[~torch.eye(10, dtype=torch.bool)]
    torch.testing.assert_close(off_diagonal, torch.full_like(off_diagonal, -1 / 9), atol=1e-6, rtol=0)
    torch.testing.assert_close(etf.sum(dim=1), torch.zeros(64, dtype=torch.float64), atol=1e-6, rtol=0)


def test_balance_scale_matches_produce_ew():
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        labels = torch.randint(0, 7, (13,), generator=gen)
        torch.testing.assert_close(balance_scale(labels, 10), official_ew(labels, 10)[0], atol=1e-6, rtol=0)


def test_model_output_is_the_lambda_mix(model):
    model.eval()
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    features = model.features(x)
    h, f = features[:, :128], features[:, 128:]
    torch.testing.assert_close(f.norm(dim=1), torch.ones(4, dtype=torch.float64))
    head = model.head
    lam = float(head.weight)
    assert lam == pytest.approx(INITIAL_WEIGHT)
    expected = lam * head.linear(h) + (1 - lam) * f @ head.etf
    torch.testing.assert_close(model.head(features), expected, atol=1e-12, rtol=0)


def test_loss_value_gradient_and_lambda_state_match_balcal_r(model):
    model.train()
    objective = BalCALObjective(model, delta=0.95)
    loss_fn = CrossEntropy()
    head = model.head
    gen = torch.Generator().manual_seed(3)
    lam, lams = float(head.weight), []
    for _ in range(2):
        recorded = []
        for _ in range(3):
            h, f = torch.randn(2, 12, 128, generator=gen, dtype=torch.float64)  # h over-confident, f unit-length
            features = torch.cat([6 * h, f / f.norm(dim=1, keepdim=True)], dim=1).requires_grad_()
            labels = torch.randint(0, 10, (12,), generator=gen)
            loss = objective.loss(loss_fn, features, labels, weighted_pair)
            # BALCAL-R, from the same features: y_linear = logits(out), y_ETF = feat_ETF @ (Ew * ori_M)
            linear_logits = features[:, :128] @ head.linear.weight.T + head.linear.bias
            etf_logits = features[:, 128:] @ (official_ew(labels, 10).double() * head.etf)
            reference = lam * F.cross_entropy(linear_logits, labels) + (1 - lam) * F.cross_entropy(etf_logits, labels)
            params = [features, head.linear.weight, head.linear.bias]
            ours, theirs = torch.autograd.grad(loss, params), torch.autograd.grad(reference, params)
            assert float(loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-6)
            for a, b in zip(ours, theirs, strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
            recorded.append((linear_logits.detach(), etf_logits.detach(), labels))
        expected = official_find_lamd(*(torch.cat(p) for p in zip(*recorded, strict=True)), delta=0.95)
        lam = objective.end_epoch()
        assert lam == expected and float(head.weight) == pytest.approx(lam)
        lams.append(lam)
    assert all(0 < lam < 1 for lam in lams)  # the bisection ran (random features: over-confident linear head)


def test_feedback_rule_cases():
    gen = torch.Generator().manual_seed(4)
    labels = torch.randint(0, 5, (200,), generator=gen)
    sharp = F.one_hot(labels, 5).double() * 20  # right and confident: conf ≈ 1 > δ·acc → bisect
    soft = torch.randn(200, 5, generator=gen, dtype=torch.float64) * 0.1  # under-confident linear head → λ = 1
    assert feedback_weight(soft, sharp, labels, 0.95) == 1.0
    for delta in (0.8, 0.9, 0.95):  # δ = 1 with acc = 1 would be the under-confident case
        weight = feedback_weight(sharp, soft, labels, delta)
        assert weight == official_find_lamd(sharp, soft, labels, delta) and 0 < weight < 1


def test_degenerate_configurations_fail_clearly(make_config):
    with pytest.raises(ConfigError, match=r"`stage1.balcal_delta` must be > 0"):
        parse_trial_config(make_config(method={"name": "vanilla"}, balcal_delta=0.0))
    with pytest.raises(ConfigError, match=r"`stage1.balcal_delta` trains on clean inputs"):
        parse_trial_config(make_config(method={"name": "vanilla"}, balcal_delta=0.95, mit_alpha=1.0))
    with pytest.raises(ConfigError, match=r"at least as many features as classes.*got 128 features for 200"):
        BalCALModel(create_model("small_cnn", num_classes=200, in_channels=1))

