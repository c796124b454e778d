"""FeDLaS-LS / FeDLaS-MbLS (docs/methods.md §3): hand-computed values, β = 0 = base loss, NCI, BCG/STE, training."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from calib._config import ConfigError, from_dict
from calib.config import parse_trial_config
from calib.losses._registry import LOSSES
from calib.losses.fedlas import (
    BidirectionalCalibrationGate,
    FeDLaSLS,
    FeDLaSLSConfig,
    FeDLaSMbLS,
    FeDLaSMbLSConfig,
    NormConfidenceIndicator,
)

# A tiny batch, B = 2, C = 3. Gate set by hand (see sign_of_first_logit): ψ_i = sign(z_{i,0}).
LOGITS = torch.tensor([[1.0, 2.0, 0.0], [-1.0, 0.0, 2.0]])  # ψ = [+1, −1]
TARGETS = torch.tensor([1, 0])
FEATURES = torch.tensor([[10.0, -30.0], [4.0, 6.0]])  # n = ‖h‖₁ = [40, 10]


def sign_of_first_logit(gate: BidirectionalCalibrationGate) -> BidirectionalCalibrationGate:
    """Set the C=3 gate so that ψ_i = sign(z_{i,0}).

    fc1: u = z_0 (hidden width ⌊3/2⌋ = 1); LeakyReLU keeps the sign of u; fc2: outputs [0, leaky(u)];
    so s = softmax_1 − softmax_0 = tanh(leaky(u)/2), whose sign is sign(z_0).
    """
    with torch.no_grad():
        gate.fc1.weight.copy_(torch.tensor([[1.0, 0.0, 0.0]]))
        gate.fc1.bias.zero_()
        gate.fc2.weight.copy_(torch.tensor([[0.0], [1.0]]))
        gate.fc2.bias.zero_()
    return gate


def log_softmax_row(z: list[float]) -> list[float]:
    lse = math.log(sum(math.exp(v) for v in z))
    return [v - lse for v in z]


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def expected_gammas(theta: float) -> list[float]:
    # n = [40, 10]: mean 25, unbiased std sqrt((15² + 15²)/1) = sqrt(450) = 21.2132.
    # μ = θ·25 + (1−θ)·20, σ = θ·21.2132 + (1−θ)·100; γ_i = (n_i − μ)/(σ + 1e-3).
    # θ = 0.5: μ = 22.5, σ = 60.6066, γ = [17.5/60.6076, −12.5/60.6076] = [0.288743, −0.206245].
    mu = theta * 25 + (1 - theta) * 20
    sigma = theta * math.sqrt(450) + (1 - theta) * 100
    return [(40 - mu) / (sigma + 1e-3), (10 - mu) / (sigma + 1e-3)]


class TestFeDLaSLS:
    def test_main(self):
        loss_fn = FeDLaSLS(0.05, modulation_strength=4.0, norm_momentum=0.5, num_classes=3)
        sign_of_first_logit(loss_fn.gate)
        value = loss_fn(LOGITS, TARGETS, FEATURES)
        # α_i = 0.05·2·sigmoid(4·ψ_i·γ_i): α_0 = 0.1·sigmoid(4·0.288743) = 0.1·sigmoid(1.154971) = 0.076042,
        # α_1 = 0.1·sigmoid(4·(−1)·(−0.206245)) = 0.1·sigmoid(0.824979) = 0.069529.
        g = expected_gammas(0.5)
        alphas = [0.1 * sigmoid(4 * 1 * g[0]), 0.1 * sigmoid(4 * -1 * g[1])]
        # log p_0 = [1,2,0] − log(e + e² + 1) = [−1.40761, −0.40761, −2.40761]; CE_0 = 0.40761, E_0 = 1.40761.
        # log p_1 = [−1,0,2] − log(e⁻¹ + 1 + e²) = [−3.16985, −2.16985, −0.16985]; CE_1 = 3.16985, E_1 = 1.83651.
        # L = mean_i[(1−α_i)·CE_i + α_i·E_i] = ((0.92396·0.40761 + 0.07604·1.40761)
        #                                       + (0.93047·3.16985 + 0.06953·1.83651))/2
        #   = (0.48364 + 3.07714)/2 = 1.78039
        terms = []
        for i, (z, y) in enumerate(zip(LOGITS.tolist(), TARGETS.tolist(), strict=True)):
            logp = log_softmax_row(z)
            ce, e = -logp[y], -sum(logp) / 3
            terms.append((1 - alphas[i]) * ce + alphas[i] * e)
        expected = sum(terms) / 2
        assert value.item() == pytest.approx(expected, rel=1e-6)
        assert expected == pytest.approx(1.78039, abs=1e-5)

    def test_beta_zero_is_label_smoothing_exactly(self):
        torch.manual_seed(0)
        logits, targets, features = torch.randn(16, 5) * 3, torch.randint(0, 5, (16,)), torch.randn(16, 8) * 40
        loss_fn = FeDLaSLS(0.05, modulation_strength=0.0, norm_momentum=0.95, num_classes=5)
        value = loss_fn(logits, targets, features)
        # α_i = 0.05·2·sigmoid(0) = 0.05 for every sample: L = mean_i[(1 − α)·CE_i + α·E_i].
        alpha = torch.full((16,), 0.05)
        ce = F.cross_entropy(logits, targets, reduction="none")
        uniform = -F.log_softmax(logits, dim=1).mean(dim=1)
        assert torch.equal(value, ((1 - alpha) * ce + alpha * uniform).mean())
        # torch's label smoothing is the same (1 − α)·CE + α·E, up to rounding.
        torch.testing.assert_close(value, F.cross_entropy(logits, targets, label_smoothing=0.05))

    def test_sum_is_batch_size_times_mean(self):
        torch.manual_seed(1)
        logits, targets, features = torch.randn(8, 4), torch.randint(0, 4, (8,)), torch.rand(8, 6) * 30
        mean_fn = FeDLaSLS(0.1, modulation_strength=4.0, norm_momentum=0.5, num_classes=4, reduction="mean")
        sum_fn = FeDLaSLS(0.1, modulation_strength=4.0, norm_momentum=0.5, num_classes=4, reduction="sum")
        sum_fn.load_state_dict(mean_fn.state_dict())
        torch.testing.assert_close(sum_fn(logits, targets, features), 8 * mean_fn(logits, targets, features))

    def test_features_are_detached(self):
        features = FEATURES.clone().requires_grad_(True)
        logits = LOGITS.clone().requires_grad_(True)
        loss_fn = FeDLaSLS(0.05, modulation_strength=4.0, norm_momentum=0.5, num_classes=3)
        loss_fn(logits, TARGETS, features).backward()
        assert features.grad is None  # γ is computed from sg[h]
        assert logits.grad is not None

    def test_errors(self):
        loss_fn = FeDLaSLS(0.05, modulation_strength=4.0, norm_momentum=0.5, num_classes=3)
        with pytest.raises(ValueError, match=r"FeDLaSLS needs the penultimate features h"):
            loss_fn(LOGITS, TARGETS)
        with pytest.raises(ValueError, match=r"same batch size, got 3 and 2"):
            loss_fn(LOGITS, TARGETS, torch.ones(3, 2))
        with pytest.raises(ConfigError, match=r"`reduction` must be 'mean' or 'sum', got reduction='none'"):
            FeDLaSLS(0.05, modulation_strength=4.0, norm_momentum=0.5, num_classes=3, reduction="none")


class TestFeDLaSMbLS:
    def test_main(self):
        loss_fn = FeDLaSMbLS(0.1, margin=1.0, modulation_strength=0.5, norm_momentum=0.5, num_classes=3)
        sign_of_first_logit(loss_fn.gate)
        value = loss_fn(LOGITS, TARGETS, FEATURES)
        # α_i = 0.1·2·sigmoid(0.5·ψ_i·γ_i): α_0 = 0.2·sigmoid(0.5·0.288743) = 0.2·sigmoid(0.144371) = 0.107206,
        # α_1 = 0.2·sigmoid(0.5·(−1)·(−0.206245)) = 0.2·sigmoid(0.103122) = 0.105152.
        g = expected_gammas(0.5)
        alphas = [0.2 * sigmoid(0.5 * 1 * g[0]), 0.2 * sigmoid(0.5 * -1 * g[1])]
        # d_0 = 2 − [1,2,0] = [1,0,2] → relu(d − 1) = [0,0,1] → class mean 1/3;
        # d_1 = 2 − [−1,0,2] = [3,2,0] → relu(d − 1) = [2,1,0] → class mean 1.
        penalties = [1 / 3, 1.0]
        # CE = [0.40761, 3.16985] (as in the LS test).
        # L = ((1−α_0)·CE_0 + (1−α_1)·CE_1)/2 + (α_0·1/3 + α_1·1)/2
        #   = (0.89279·0.40761 + 0.89485·3.16985)/2 + (0.035735 + 0.105152)/2 = 1.60022 + 0.07044 = 1.67066
        ce = [-log_softmax_row(z)[y] for z, y in zip(LOGITS.tolist(), TARGETS.tolist(), strict=True)]
        expected = sum((1 - a) * c for a, c in zip(alphas, ce, strict=True)) / 2 + sum(
            a * r for a, r in zip(alphas, penalties, strict=True)) / 2
        assert value.item() == pytest.approx(expected, rel=1e-6)
        assert expected == pytest.approx(1.67066, abs=1e-5)

    def test_beta_zero_is_convex_mbls_exactly(self):
        torch.manual_seed(2)
        logits, targets, features = torch.randn(16, 10) * 5, torch.randint(0, 10, (16,)), torch.randn(16, 8) * 40
        loss_fn = FeDLaSMbLS(0.1, margin=2.0, modulation_strength=0.0, norm_momentum=0.95, num_classes=10)
        value = loss_fn(logits, targets, features)
        # α_i = λ: L = mean_i[(1 − λ)·CE_i] + mean_i[λ·(1/C)·Σ_k relu(max_l z_l − z_k − m)].
        lam = torch.full((16,), 0.1)
        ce = F.cross_entropy(logits, targets, reduction="none")
        penalty = (logits.max(dim=1, keepdim=True).values - logits - 2.0).clamp_min(0).mean(dim=1)
        assert torch.equal(value, ((1 - lam) * ce).mean() + (lam * penalty).mean())
        assert penalty.sum() > 0  # the margin term is exercised

    def test_sum_is_batch_size_times_mean(self):
        torch.manual_seed(3)
        logits, targets, features = torch.randn(8, 4) * 6, torch.randint(0, 4, (8,)), torch.rand(8, 6) * 30
        mean_fn = FeDLaSMbLS(0.1, margin=1.0, modulation_strength=1.0, norm_momentum=0.5, num_classes=4).eval()
        sum_fn = FeDLaSMbLS(0.1, margin=1.0, modulation_strength=1.0, norm_momentum=0.5, num_classes=4,
                            reduction="sum").eval()
        sum_fn.load_state_dict(mean_fn.state_dict())
        torch.testing.assert_close(sum_fn(logits, targets, features), 8 * mean_fn(logits, targets, features))

    def test_errors(self):
        loss_fn = FeDLaSMbLS(0.1, margin=6.0, modulation_strength=0.5, norm_momentum=0.95, num_classes=3)
        with pytest.raises(ValueError, match=r"FeDLaSMbLS needs the penultimate features h"):
            loss_fn(LOGITS, TARGETS, None)


class TestNormConfidenceIndicator:
    def test_main(self):
        nci = NormConfidenceIndicator(0.5)
        assert (nci.running_mean.item(), nci.running_std.item()) == (20.0, 100.0)
        gamma = nci(FEATURES)  # train mode (the default): the hand-computed EMA, then γ with the new statistics
        assert nci.running_mean.item() == pytest.approx(22.5)  # 0.5·25 + 0.5·20
        assert nci.running_std.item() == pytest.approx(0.5 * math.sqrt(450) + 0.5 * 100)  # 60.6066
        torch.testing.assert_close(gamma, torch.tensor(expected_gammas(0.5)))

    def test_statistics_frozen_in_eval_mode(self):
        nci = NormConfidenceIndicator(0.95).eval()
        gamma = nci(FEATURES)
        assert (nci.running_mean.item(), nci.running_std.item()) == (20.0, 100.0)
        # γ = (n − 20)/(100 + 1e-3) = [20, −10]/100.001
        torch.testing.assert_close(gamma, torch.tensor([20.0, -10.0]) / 100.001)
        nci.train()
        nci(FEATURES)
        # θ = 0.95: μ = 0.95·25 + 0.05·20 = 24.75, σ = 0.95·21.2132 + 0.05·100 = 25.1525
        assert nci.running_mean.item() == pytest.approx(24.75)
        assert nci.running_std.item() == pytest.approx(0.95 * math.sqrt(450) + 5)

    def test_one_update_per_call_and_single_sample_batch(self):
        nci = NormConfidenceIndicator(1.0)
        nci(torch.tensor([[3.0, -4.0]]))  # n = 7; one sample: μ = 7, σ kept (no unbiased std)
        assert (nci.running_mean.item(), nci.running_std.item()) == (7.0, 100.0)
        nci(FEATURES)  # θ = 1: the batch statistics exactly
        assert nci.running_mean.item() == pytest.approx(25.0)
        assert nci.running_std.item() == pytest.approx(math.sqrt(450))

    def test_errors(self):
        with pytest.raises(ConfigError, match=r"`momentum` must be in \(0, 1\], got momentum=0"):
            NormConfidenceIndicator(0)


class TestBidirectionalCalibrationGate:
    def test_main(self):
        gate = BidirectionalCalibrationGate(10)
        assert (gate.fc1.in_features, gate.fc1.out_features, gate.fc2.out_features) == (10, 5, 2)
        assert gate.fc1.out_features == 5 and BidirectionalCalibrationGate(100).fc1.out_features == 50
        assert BidirectionalCalibrationGate(1).fc1.out_features == 1  # at least one hidden unit
        psi = sign_of_first_logit(BidirectionalCalibrationGate(3))(LOGITS)
        assert torch.equal(psi, torch.tensor([1.0, -1.0]))

    def test_sign_is_exact_and_ste_passes_gradient(self):
        torch.manual_seed(4)
        gate = BidirectionalCalibrationGate(10)
        logits = torch.randn(64, 10) * 4
        psi = gate(logits)
        assert torch.equal(psi, torch.sign(gate.score(logits)))
        assert set(psi.tolist()) <= {-1.0, 0.0, 1.0}
        weights = torch.randn(64)
        (psi * weights).sum().backward()
        ste_grads = [p.grad.clone() for p in gate.parameters()]
        assert all(g.abs().sum() > 0 for g in ste_grads)
        gate.zero_grad()
        (gate.score(logits) * weights).sum().backward()  # identity backward: the same gradient as through s
        for g, p in zip(ste_grads, gate.parameters(), strict=True):
            torch.testing.assert_close(g, p.grad)

    def test_input_logits_are_detached(self):
        logits = LOGITS.clone().requires_grad_(True)
        BidirectionalCalibrationGate(3)(logits).sum().backward()
        assert logits.grad is None

    def test_psi_zero_when_s_zero(self):
        gate = BidirectionalCalibrationGate(3)
        with torch.no_grad():
            gate.fc2.weight.zero_()
            gate.fc2.bias.zero_()  # both outputs 0 → softmax [0.5, 0.5] → s = 0 exactly
        psi = gate(LOGITS)
        assert torch.equal(gate.score(LOGITS), torch.zeros(2))
        assert torch.equal(psi, torch.zeros(2))
        # ψ = 0 → α_i = α_base exactly, whatever γ and β.
        loss_fn = FeDLaSLS(0.05, modulation_strength=8.0, norm_momentum=0.5, num_classes=3)
        loss_fn.gate.load_state_dict(gate.state_dict())
        assert torch.equal(loss_fn.coefficients(LOGITS, FEATURES), torch.full((2,), 0.05))


def test_alpha_stays_in_open_interval():
    torch.manual_seed(5)
    loss_fn = FeDLaSLS(0.1, modulation_strength=4.0, norm_momentum=0.5, num_classes=10)
    for _ in range(5):
        alpha = loss_fn.coefficients(torch.randn(256, 10) * 5, torch.rand(256, 64) * 3)
        assert alpha.min() > 0 and alpha.max() < 0.2
        assert alpha.max() > 0.1 > alpha.min()  # both directions occur (random gate, spread-out γ)


class TestConfigs:
    def test_main(self):
        assert FeDLaSLSConfig() == FeDLaSLSConfig(smoothing=0.05, modulation_strength=4.0, norm_momentum=0.95)
        assert FeDLaSMbLSConfig() == FeDLaSMbLSConfig(penalty_weight=0.1, margin=6.0, modulation_strength=0.5,
                                                      norm_momentum=0.95)
        cfg = from_dict(FeDLaSMbLSConfig, {"margin": 10, "penalty_weight": 0.05})
        assert cfg.margin == 10.0 and isinstance(cfg.margin, float)

    @pytest.mark.parametrize(("cls", "kwargs", "message"), [
        (FeDLaSLSConfig, {"smoothing": 1.0}, r"`smoothing` must be in \[0, 1\), got smoothing=1.0"),
        (FeDLaSLSConfig, {"smoothing": -0.1}, r"`smoothing` must be in \[0, 1\)"),
        (FeDLaSLSConfig, {"modulation_strength": -1.0}, r"`modulation_strength` must be a finite number >= 0"),
        (FeDLaSLSConfig, {"norm_momentum": 0.0}, r"`norm_momentum` must be in \(0, 1\], got norm_momentum=0.0"),
        (FeDLaSLSConfig, {"norm_momentum": 1.5}, r"`norm_momentum` must be in \(0, 1\]"),
        (FeDLaSMbLSConfig, {"penalty_weight": -0.1}, r"`penalty_weight` must be a finite number >= 0"),
        (FeDLaSMbLSConfig, {"margin": -1.0}, r"`margin` must be a finite number >= 0, got margin=-1.0"),
        (FeDLaSMbLSConfig, {"modulation_strength": float("inf")}, r"`modulation_strength` must be a finite"),
    ])
    def test_errors(self, cls, kwargs, message):
        with pytest.raises(ConfigError, match=message):
            cls(**kwargs)

    def test_unknown_key_rejected(self):
        with pytest.raises(ConfigError, match=r"Unknown key 'beta' for FeDLaSLSConfig"):
            from_dict(FeDLaSLSConfig, {"beta": 4.0})

    def test_trial_config(self, make_config):
        config = make_config()
        config["loss"] = {"name": "fedlas_mbls", "margin": 10.0, "norm_momentum": 0.5}
        cfg = parse_trial_config(config)
        assert cfg.loss.params == FeDLaSMbLSConfig(margin=10.0, norm_momentum=0.5)
        config["loss"] = {"name": "fedlas_ls", "smoothing": 2.0}
        with pytest.raises(ConfigError, match=r"`loss.smoothing` must be in \[0, 1\)"):
            parse_trial_config(config)

    def test_store_columns(self):
        from calib.store.schema import trial_columns

        columns = {name: str(arrow) for name, arrow, _ in trial_columns()}
        for field in ("smoothing", "penalty_weight", "margin", "modulation_strength", "norm_momentum"):
            assert columns[f"loss_{field}"] == "double"


@pytest.mark.parametrize("name", ["fedlas_ls", "fedlas_mbls"])
def test_gate_trained_by_the_model_optimizer(name):
    """Built through the registry, optimised with the model by one SGD (FEDLAS-R trainer): the gate learns."""
    torch.manual_seed(6)
    spec = LOSSES.get(name)
    loss_fn = spec.create(spec.config(), num_classes=4, reduction="mean")
    body, head = nn.Sequential(nn.Linear(6, 16), nn.ReLU()), nn.Linear(16, 4)
    params = list(body.parameters()) + list(head.parameters())
    optimizer = torch.optim.SGD(params + list(loss_fn.parameters()), lr=0.1, momentum=0.9, weight_decay=5e-4)
    gate_before = [p.detach().clone() for p in loss_fn.gate.parameters()]
    x, y = torch.randn(32, 6) * 3, torch.randint(0, 4, (32,))
    loss_fn.train()
    for _ in range(3):
        features = body(x)
        loss = loss_fn(head(features), y, features)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 2.0)
        optimizer.step()
    assert all(not torch.equal(b, p) for b, p in zip(gate_before, loss_fn.gate.parameters(), strict=True))
    assert loss_fn.nci.running_mean.item() != 20.0 and loss_fn.nci.running_std.item() != 100.0
    assert torch.isfinite(loss)
