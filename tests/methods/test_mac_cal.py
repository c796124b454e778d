"""MaC-Cal's components against hand-computed values and their defining properties (docs/methods.md §1.3)."""

import itertools
import math

import pytest
import torch
from torch.nn import functional as F

from calib.methods.heads import MaskableHead
from calib.methods.mac_cal import MacCalConfig, clip_threshold, retention_update, sample_weight_masks
from calib.methods.mac_cal_training import fit_mac_cal
from calib.methods.restricted_sgd import RestrictedSGD


def separable_features(n: int = 256, d: int = 8, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centers = torch.randn(classes, d, generator=g) * 3
    return centers[labels] + torch.randn(n, d, generator=g), labels


class TestRetentionUpdate:
    def test_hand_examples(self):
        p = MacCalConfig(accuracy_weight=0.9, retention_min=0.1)
        # overconfident: Δ = 0.9·0.8 − 0.95 = −0.23, clipped to −0.05: q = 0.9 − 0.05
        assert retention_update(0.9, 0.8, 0.95, 0.05, p) == pytest.approx(0.85)
        # small underconfidence inside the clip: Δ = 0.9·1.0 − 0.88 = 0.02
        assert retention_update(0.5, 1.0, 0.88, 0.05, p) == pytest.approx(0.52)
        # clamped at 1 and at q_min
        assert retention_update(0.99, 1.0, 0.5, 0.05, p) == 1.0
        assert retention_update(0.12, 0.0, 1.0, 0.05, p) == pytest.approx(0.1)

    def test_threshold(self):
        decay = MacCalConfig(epochs=40, clip_init=0.05, clip_decay=3.0)
        assert clip_threshold(0, decay) == pytest.approx(0.05)
        assert clip_threshold(20, decay) == pytest.approx(0.05 * math.exp(-1.5))
        assert clip_threshold(40, decay) == pytest.approx(0.05 * math.exp(-3.0))  # ≈ 0.0025
        static = MacCalConfig(adaptive_retention="static", clip_init=0.05)
        assert clip_threshold(30, static) == 0.05


class TestMasks:
    def test_bernoulli_rate_and_shapes(self):
        head = MaskableHead([64, 32, 10])
        masks = sample_weight_masks(head, 0.7, torch.Generator().manual_seed(0))
        assert [m.shape for m in masks] == [(32, 64), (10, 32)]
        values = torch.cat([m.flatten() for m in masks])
        assert set(values.unique().tolist()) <= {0.0, 1.0}
        assert values.mean().item() == pytest.approx(0.7, abs=0.03)

    def test_masked_forward_matches_manual(self):
        torch.manual_seed(0)
        head = MaskableHead([5, 4, 3])
        h = torch.randn(7, 5)
        masks = sample_weight_masks(head, 0.5, torch.Generator().manual_seed(1))
        l1, l2 = head.layers
        hidden = F.relu(h @ (0.5 * masks[0] * l1.weight).T + l1.bias)
        expected = hidden @ (0.5 * masks[1] * l2.weight).T + l2.bias
        torch.testing.assert_close(head(h, masks=masks, weight_scale=0.5), expected)


class TestRestrictedStep:
    def _step(self, restricted: bool):
        torch.manual_seed(0)
        weight = torch.nn.Parameter(torch.randn(4, 6))
        mask = (torch.arange(24).reshape(4, 6) % 2).float()
        opt = RestrictedSGD([weight], lr=0.1, momentum=0.9, weight_decay=0.1)
        before = weight.detach().clone()
        for _ in range(3):
            opt.zero_grad()
            (weight * mask).sum().backward()
            opt.step([mask if restricted else None])
        return before, weight.detach(), mask, opt.buffers[0]

    def test_dropped_weights_and_momentum_stay_put(self):
        before, after, mask, buffer = self._step(restricted=True)
        dropped = mask == 0
        assert torch.equal(after[dropped], before[dropped])
        assert torch.all(buffer[dropped] == 0)
        assert torch.all(after[~dropped] != before[~dropped])

    def test_unrestricted_step_is_torch_sgd(self):
        torch.manual_seed(0)
        ours, theirs = torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(4, 6))
        with torch.no_grad():
            theirs.copy_(ours)
        mine = RestrictedSGD([ours], lr=0.1, momentum=0.9, weight_decay=0.1)
        reference = torch.optim.SGD([theirs], lr=0.1, momentum=0.9, weight_decay=0.1)
        for step in range(3):
            for p in (ours, theirs):
                p.grad = torch.full_like(p, float(step + 1)) * torch.arange(24.0).reshape(4, 6)
            mine.step([None])
            reference.step()
            torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-6, atol=1e-7)

    def test_plain_sgd_leaks_weight_decay_into_dropped_weights(self):
        before, after, mask, _ = self._step(restricted=False)  # pitfall P2
        assert not torch.equal(after[mask == 0], before[mask == 0])


class TestFitMacCal:
    def fit(self, **kwargs):
        features, labels = separable_features()
        params = MacCalConfig(epochs=6, batch_size=32, bottleneck_width=16, **kwargs)
        return params, fit_mac_cal(params, features, labels, num_features=8, num_classes=3, seed=0,
                                   device=torch.device("cpu")), features

    def test_history_follows_eq12(self):
        _, fitted, _ = self.fit(accuracy_weight=0.9)
        rows = fitted.history
        assert [r["epoch"] for r in rows] == list(range(6))
        assert rows[0]["retention_prob"] == 0.9
        for prev, nxt in itertools.pairwise(rows):
            delta = 0.9 * prev["train_accuracy"] - prev["train_confidence"]
            theta = 0.05 * math.exp(-3.0 * prev["epoch"] / 6)
            expected = min(1.0, max(0.1, prev["retention_prob"] + max(-theta, min(theta, delta))))
            assert nxt["retention_prob"] == pytest.approx(expected)
            assert prev["clip_threshold"] == pytest.approx(theta)

    def test_fixed_retention_without_adaptation(self):
        _, fitted, _ = self.fit(adaptive_retention="none", retention_init=0.6)
        assert {r["retention_prob"] for r in fitted.history} == {0.6}
        assert all(r["clip_threshold"] is None for r in fitted.history)

    def test_epoch_masks_freeze_dropped_weights_for_the_epoch(self):
        features, labels = separable_features()
        params = MacCalConfig(epochs=1, batch_size=32, bottleneck_width=16)
        torch.manual_seed(0)
        init = [w.detach().clone() for w in MaskableHead([8, 16, 3]).weights]
        fitted = fit_mac_cal(params, features, labels, num_features=8, num_classes=3, seed=0,
                             device=torch.device("cpu"))
        for w0, w, m in zip(init, fitted.head.weights, fitted.last_masks, strict=True):
            assert torch.equal(w.detach()[m == 0], w0[m == 0])
            assert not torch.equal(w.detach()[m == 1], w0[m == 1])

    def test_inference_weights(self):
        _, fitted, features = self.fit()
        q = fitted.last_retention
        torch.testing.assert_close(fitted.logits(features), fitted.head(features, weight_scale=q))
        fitted.params = MacCalConfig(inference_weights="full")
        torch.testing.assert_close(fitted.logits(features), fitted.head(features))
        fitted.params = MacCalConfig(inference_weights="last_mask")
        torch.testing.assert_close(fitted.logits(features), fitted.head(features, masks=fitted.last_masks))
        fitted.params = MacCalConfig(inference_weights="expected", train_mask_scaling="inverted")
        torch.testing.assert_close(fitted.logits(features), fitted.head(features))  # E[M⊙W/q] = W

    def test_deterministic_given_seed(self):
        _, a, features = self.fit()
        _, b, _ = self.fit()
        torch.testing.assert_close(a.logits(features), b.logits(features))
        assert a.history == b.history

    def test_stage1_head_init(self):
        features, labels = separable_features()
        state = {"weight": torch.ones(3, 8), "bias": torch.zeros(3)}
        params = MacCalConfig(epochs=1, head="linear", head_init="stage1", masked_forward=False,
                              gradient_restriction=False, adaptive_retention="none", lr=1e-9, weight_decay=0.0)
        fitted = fit_mac_cal(params, features, labels, num_features=8, num_classes=3, seed=0,
                             device=torch.device("cpu"), head_state=state)
        torch.testing.assert_close(fitted.head.layers[0].weight.detach(), torch.ones(3, 8), atol=1e-6, rtol=0)

    def test_overconfident_head_loses_retention(self):
        # Separable data: training accuracy → 1, so with γ = 0.8 the head is overconfident and q falls.
        _, fitted, _ = self.fit(accuracy_weight=0.8)
        qs = [r["retention_prob"] for r in fitted.history]
        assert qs[-1] < qs[0]


@pytest.mark.parametrize("row", [
    {"head": "linear", "head_init": "stage1", "gradient_restriction": False, "adaptive_retention": "none"},
    {"head": "linear", "head_init": "stage1", "adaptive_retention": "none"},
    {"adaptive_retention": "none"},
    {"adaptive_retention": "static"},
    {},
], ids=["masked_retraining", "gradient_restriction", "classifier_restructure", "static", "decaying"])
def test_table5_rows_are_configs(row):
    MacCalConfig(**row)
