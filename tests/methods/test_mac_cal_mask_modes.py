"""The three readings of MaC-Cal's Eq. 9-11 (``mask_mode``), each on a hand-checked example: a linear
2×3 head, one SGD step on a full batch, the exact weights after it, with and without gradient restriction.

The expected weights come from the formulas written out here with NumPy (float64), independently of
calib's stacked heads and restricted SGD: logits z = X·W_effᵀ + b, ∂L/∂z = (softmax(z) − onehot(y))/n,
∂L/∂W_eff = (∂L/∂z)ᵀ·X, and SGD without momentum, W ← W − η·(g + λ·W) (masked by M under restriction).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calib._config import ConfigError
from calib.config import config_hash, parse_trial_config, trial_identity
from calib.methods.mac_cal import MacCalConfig
from calib.methods.mac_cal_training import fit_mac_cal

X = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0], [2.0, 0.5, -1.0], [-1.0, 1.5, 0.0]])
Y = np.array([0, 1, 1, 0])
W0 = np.array([[0.3, -0.2, 0.1], [-0.4, 0.5, 0.25]])
B0 = np.array([0.05, -0.1])
LR, DECAY, RETENTION, SEED = 0.5, 0.1, 0.5, 0


def drawn_mask() -> np.ndarray:
    """The mask MaC-Cal draws first for this seed: Bernoulli(q) from the member's generator (Eq. 8)."""
    generator = torch.Generator().manual_seed(SEED)
    return torch.bernoulli(torch.full(W0.shape, RETENTION), generator=generator).double().numpy()


def by_hand(mode: str, restrict: bool) -> tuple[np.ndarray, np.ndarray]:
    """W and b after one step under ``mode``: the formulas of the module docstring."""
    mask = drawn_mask()
    start = W0 * mask if mode == "in_place" else W0  # in place: the dropped weights are zeroed at the draw
    effective = start if mode == "in_place" else W0 * mask
    logits = X @ effective.T + B0
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    dlogits = (probs - np.eye(2)[Y]) / len(X)
    grad_effective = dlogits.T @ X
    grad = grad_effective * mask if mode == "forward" else grad_effective  # straight-through / in place: unmasked
    update = grad + DECAY * start
    if restrict:
        update = update * mask
    return start - LR * update, B0 - LR * (dlogits.sum(0) + DECAY * B0)


def fitted_head(mode: str, restrict: bool) -> tuple[np.ndarray, np.ndarray]:
    params = MacCalConfig(epochs=1, lr=LR, momentum=0.0, weight_decay=DECAY, batch_size=len(X), head="linear",
                          head_init="stage1", mask_mode=mode, gradient_restriction=restrict,
                          adaptive_retention="none", retention_init=RETENTION)
    fitted = fit_mac_cal(params, torch.tensor(X, dtype=torch.float32), torch.tensor(Y), num_features=3,
                         num_classes=2, seed=SEED, device=torch.device("cpu"),
                         head_state={"weight": torch.tensor(W0, dtype=torch.float32),
                                     "bias": torch.tensor(B0, dtype=torch.float32)})
    layer = fitted.head.layers[0]
    return layer.weight.detach().double().numpy(), layer.bias.detach().double().numpy()


def test_the_example_has_kept_and_dropped_weights():
    np.testing.assert_array_equal(drawn_mask(), [[1, 0, 1], [1, 1, 0]])


@pytest.mark.parametrize("restrict", [False, True])
@pytest.mark.parametrize("mode", ["forward", "in_place", "straight_through"])
def test_one_step_gives_the_hand_computed_weights(mode, restrict):
    weight, bias = fitted_head(mode, restrict)
    expected_weight, expected_bias = by_hand(mode, restrict)
    np.testing.assert_allclose(weight, expected_weight, rtol=0, atol=1e-6)
    np.testing.assert_allclose(bias, expected_bias, rtol=0, atol=1e-6)


def test_what_restriction_changes_in_each_reading():
    dropped = drawn_mask() == 0
    for mode in ("forward", "in_place", "straight_through"):
        free, restricted = fitted_head(mode, False)[0], fitted_head(mode, True)[0]
        if mode == "in_place":
            assert np.all(restricted[dropped] == 0), "in place + restriction: dropped weights stay zero"
            assert np.all(free[dropped] != 0), "in place without restriction: they regrow through their gradients"
        else:
            np.testing.assert_array_equal(restricted[dropped], W0[dropped].astype(np.float32))
        if mode == "forward":  # no gradient reaches dropped weights; restriction removes only their weight decay
            np.testing.assert_allclose(free[dropped], W0[dropped] * (1 - LR * DECAY), atol=1e-7)
        if mode == "straight_through":  # the gradient itself reaches them unless restricted
            assert not np.allclose(free[dropped], W0[dropped] * (1 - LR * DECAY), atol=1e-4)


def test_the_default_reading_keeps_stored_trial_ids(tmp_path):
    from trial_fixtures import tiny_config

    config = tiny_config(tmp_path)
    explicit = {**config, "method": {**config["method"], "mask_mode": "forward"}}
    other = {**config, "method": {**config["method"], "mask_mode": "in_place"}}
    ids = [config_hash(trial_identity(parse_trial_config(c))) for c in (config, explicit, other)]
    assert ids[0] == ids[1] != ids[2]


def test_a_mask_mode_without_masks_is_refused():
    with pytest.raises(ConfigError, match="`mask_mode`='in_place' needs `masked_forward`=true"):
        MacCalConfig(masked_forward=False, gradient_restriction=False, adaptive_retention="none", mask_mode="in_place")

def test_an_unknown_mask_mode_names_the_allowed_ones(tmp_path):
    from trial_fixtures import tiny_config

    config = tiny_config(tmp_path)
    with pytest.raises(ConfigError, match=r"mask_mode.*'forward'.*'in_place'.*'straight_through'"):
        parse_trial_config({**config, "method": {**config["method"], "mask_mode": "sideways"}})
