"""AdaFocal (calib/losses/adafocal.py).

Reference: ADAFOCAL-R (``3mcloud/adafocal``: ``losses/adafocal.py`` ``AdaFocal``, ``utils/metrics.py``
``adaECE_error_mukhoti``, ``utils/train_utils.py``), reconstructed below from its published behaviour, not copied:
a per-bin dict of γ and edges, the per-sample bin found by scanning the bins in order, the loss
−(1 − sign(γ)·p_t + 1e-20)^|γ|·log p_t, and after every epoch equal-mass validation bins from ``np.interp`` and
``np.histogram`` edges, gaps E_b = mean confidence − accuracy (c > lower, c ≤ upper), the update
γ·exp(±λ·E_b), the switch at |γ| < S and the clipping to [γ_min, γ_max]. Checked over four epochs of
(training steps, validation update): the loss value and gradient to 1e-6 (in fact to rounding), and every bin's
γ and edges after every update to 1e-12; with settings that make the switch and the clipping happen.
"""

import math

import numpy as np
import pytest
import torch

from calib._config import ConfigError
from calib.losses import LOSSES, AdaFocal, AdaFocalConfig


class ReferenceAdaFocal:
    """ADAFOCAL-R's bin statistics and loss, in plain Python and NumPy."""

    def __init__(self, num_bins, lam, gamma0, switch, gamma_max, gamma_min):
        self.num_bins, self.lam, self.switch = num_bins, lam, switch
        self.gamma_max, self.gamma_min = gamma_max, gamma_min
        self.bins = [{"lower": b * (1 / num_bins), "upper": (b + 1) * (1 / num_bins), "gamma": gamma0}
                     for b in range(num_bins)]

    def gamma_of(self, pt: float) -> float:
        for b, stats in enumerate(self.bins):
            if b == 0 and pt < stats["upper"]:
                break
            if b == self.num_bins - 1 and pt >= stats["lower"]:
                break
            if stats["lower"] <= pt < stats["upper"]:
                break
        return stats["gamma"]

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logpt = torch.log_softmax(logits, dim=1).gather(1, targets.view(-1, 1)).view(-1)
        pt = logpt.exp()
        gamma = torch.tensor([self.gamma_of(p.item()) for p in pt], dtype=logits.dtype)
        signed = torch.sign(gamma) * pt
        return (-1 * (1 - signed + 1e-20) ** torch.abs(gamma) * logpt).sum()

    def update(self, val_logits: torch.Tensor, val_labels: torch.Tensor) -> None:
        confidence, predicted = torch.softmax(val_logits, dim=1).max(dim=1)
        conf, correct = confidence.numpy(), (predicted == val_labels).numpy()
        n = len(conf)
        edges = np.interp(np.linspace(0, n, self.num_bins + 1), np.arange(n), np.sort(conf))
        _, edges = np.histogram(conf, edges)
        for b in range(self.num_bins):
            lower, upper = edges[b], edges[b + 1]
            in_bin = (conf > lower) & (conf <= upper)
            gap = conf[in_bin].mean() - correct[in_bin].mean() if in_bin.any() else 0.0
            previous = self.bins[b]["gamma"]
            if previous > 0:
                proposed = previous * math.exp(self.lam * gap)
            else:
                proposed = previous * math.exp(-self.lam * gap)
            if abs(proposed) < self.switch:
                proposed = -self.switch if proposed > 0 else self.switch
            self.bins[b] = {"lower": lower, "upper": upper,
                            "gamma": max(min(proposed, self.gamma_max), self.gamma_min)}


SETTINGS = {
    "defaults": {"num_bins": 15, "lam": 1.0, "gamma0": 1.0, "switch": 0.2, "gamma_max": 20.0, "gamma_min": -2.0},
    # fast updates from a small γ: bins switch to inverse focal, and γ hits both clipping bounds
    "switching": {"num_bins": 6, "lam": 8.0, "gamma0": 0.3, "switch": 0.2, "gamma_max": 1.5, "gamma_min": -0.5},
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_four_epochs_match_the_reference(setting):
    s = SETTINGS[setting]
    loss_fn = AdaFocal(s["num_bins"], gamma_initial=s["gamma0"], update_rate=s["lam"], switch_point=s["switch"],
                       gamma_min=s["gamma_min"], gamma_max=s["gamma_max"], reduction="sum")
    reference = ReferenceAdaFocal(**s)
    generator = torch.Generator().manual_seed(0)
    classes, seen = 10, set()
    for epoch in range(4):
        for _ in range(3):  # training steps
            targets = torch.randint(0, classes, (32,), generator=generator)
            logits = torch.randn(32, classes, generator=generator, dtype=torch.float64) * (1 + epoch)
            logits[torch.arange(32), targets] += torch.rand(32, generator=generator, dtype=torch.float64) * 5
            logits.requires_grad_()
            loss, expected = loss_fn(logits, targets), reference.loss(logits, targets)
            assert float(loss.detach()) == pytest.approx(float(expected.detach()), abs=1e-9, rel=1e-12)
            (grad,) = torch.autograd.grad(loss, logits)
            (ref_grad,) = torch.autograd.grad(expected, logits)
            torch.testing.assert_close(grad, ref_grad, atol=1e-10, rtol=1e-10)
        # validation: under-confident logits for two epochs, then over-confident ones
        val_labels = torch.randint(0, classes, (200,), generator=generator)
        val_logits = torch.randn(200, classes, generator=generator, dtype=torch.float64) * (3 if epoch >= 2 else 0.7)
        val_logits[torch.arange(200), val_labels] += 2.0
        loss_fn.observe_validation(val_logits, val_labels)
        reference.update(val_logits, val_labels)
        gammas = [stats["gamma"] for stats in reference.bins]
        np.testing.assert_allclose(loss_fn.gammas.numpy(), gammas, rtol=1e-12, atol=1e-12)
        edges = [reference.bins[0]["lower"]] + [stats["upper"] for stats in reference.bins]
        np.testing.assert_allclose(loss_fn.edges.numpy(), edges, rtol=0, atol=1e-15)
        seen.update(np.sign(gammas).tolist())
        seen.update({"max"} if s["gamma_max"] in gammas else set())
        seen.update({"min"} if s["gamma_min"] in gammas else set())
    if setting == "switching":
        assert {-1.0, 1.0, "max", "min"} <= seen, seen  # both modes and both clipping bounds were reached


def test_initial_bins_are_equal_width_and_lookup_follows_the_edges():
    loss_fn = AdaFocal(num_bins=4)
    assert loss_fn.edges.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    loss_fn.gammas.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    # p_y = 0.1, 0.25 (an upper edge: the next bin), 0.6, 1.0 (past the last edge: the last bin)
    probs = torch.tensor([[0.1, 0.9], [0.25, 0.75], [0.6, 0.4], [1.0, 0.0]], dtype=torch.float64)
    logits = probs.clamp_min(1e-300).log()
    assert loss_fn.sample_gamma(logits, torch.zeros(4, dtype=torch.long)).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_hand_computed_focal_and_inverse_focal():
    # p_y = 0.5 in bin 1 of 2 (γ = 2, focal): −(0.5)²·ln 0.5; p_y = 0.25 in bin 0 (γ = −1, inverse): −1.25·ln 0.25.
    loss_fn = AdaFocal(num_bins=2, reduction="sum")
    loss_fn.gammas.copy_(torch.tensor([-1.0, 2.0], dtype=torch.float64))
    logits = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=torch.float64).log()
    expected = -(0.25 * math.log(0.5)) - 1.25 * math.log(0.25)
    assert float(loss_fn(logits, torch.tensor([0, 0]))) == pytest.approx(expected, rel=1e-14)


def test_state_round_trips_and_an_empty_validation_split_is_an_error():
    loss_fn = AdaFocal()
    generator = torch.Generator().manual_seed(1)
    loss_fn.observe_validation(torch.randn(50, 5, generator=generator), torch.randint(0, 5, (50,), generator=generator))
    restored = AdaFocal()
    restored.load_state_dict(loss_fn.state_dict())
    assert torch.equal(restored.gammas, loss_fn.gammas) and torch.equal(restored.edges, loss_fn.edges)
    assert not torch.equal(restored.gammas, AdaFocal().gammas)
    with pytest.raises(ValueError, match="validation split, which is empty"):
        loss_fn.observe_validation(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long))


def test_defaults_and_registration():
    default = AdaFocalConfig()
    assert (default.num_bins, default.gamma_initial, default.update_rate, default.switch_point, default.gamma_min,
            default.gamma_max) == (15, 1.0, 1.0, 0.2, -2.0, 20.0)
    assert LOSSES.get("adafocal").label == "AdaFocal"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_bins": 0}, r"`num_bins` must be an integer >= 1, got num_bins=0"),
    ({"gamma_min": 5.0, "gamma_max": 5.0}, r"`gamma_min` must be below gamma_max=5\.0, got gamma_min=5\.0"),
    ({"gamma_initial": 30.0}, r"`gamma_initial` must be in \[gamma_min, gamma_max\] = \[-2\.0, 20\.0\]"),
    ({"update_rate": -1.0}, r"`update_rate` must be >= 0, got update_rate=-1\.0"),
    ({"switch_point": float("inf")}, r"`switch_point` must be a finite number"),
])
def test_bad_config_names_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        AdaFocalConfig(**kwargs)
