"""CRL, the correctness ranking loss (calib/losses/crl.py).

Reference: CRL-R (``daintlab/confidence-aware-learning``: ``train.py``, ``crl_utils.History``, ``main.py``),
reconstructed below from its published behaviour, not copied: a NumPy correctness history (counts per sample,
``max_correctness`` from 1, raised after every epoch but the first), targets and margins from the normalised
counts of each sample and the next one of the batch (``torch.roll``), the margin folded into the second input of
``nn.MarginRankingLoss(margin=0)``, CE(mean) + λ·ranking. Checked over three epochs of training steps: the loss
value and gradient to 1e-6 (in fact to rounding) and the history after every step and every epoch.
"""

import numpy as np
import pytest
import torch
from torch import nn

from calib._config import ConfigError
from calib.losses import CRL, LOSSES, CRLConfig


class ReferenceHistory:
    """CRL-R's ``History``: counts of correct predictions per sample and the maximum count."""

    def __init__(self, n: int) -> None:
        self.correctness = np.zeros(n)
        self.max_correctness = 1

    def update(self, index: np.ndarray, correct: np.ndarray) -> None:
        self.correctness[index] += correct

    def epoch_done(self, epoch_from_one: int) -> None:
        if epoch_from_one > 1:
            self.max_correctness += 1

    def target_margin(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        low, high = self.correctness.min(), float(self.max_correctness)
        first = (self.correctness[index] - low) / (high - low)
        second = (self.correctness[np.roll(index, -1)] - low) / (high - low)
        target = np.array(first > second, dtype=float) - np.array(first < second, dtype=float)
        return target, np.abs(first - second)


def reference_loss(logits, targets, index, history, weight, rank_target="softmax"):
    probs = torch.softmax(logits, dim=1)
    if rank_target == "softmax":
        kappa = probs.max(dim=1).values
    elif rank_target == "margin":
        top = torch.topk(probs, 2, dim=1).values
        kappa = top[:, 0] - top[:, 1]
    else:  # negative entropy divided by ln C (CRL-R's 2.302585 / 4.605170 for 10 / 100 classes)
        kappa = (probs * torch.log_softmax(logits, dim=1)).sum(dim=1) / np.log(logits.shape[1])
    target, margin = history.target_margin(index.numpy())
    target = torch.from_numpy(target).to(logits.dtype)
    nonzero = target.clone()
    nonzero[nonzero == 0] = 1
    second = torch.roll(kappa, -1) + torch.from_numpy(margin).to(logits.dtype) / nonzero
    ranking = nn.MarginRankingLoss(margin=0.0)(kappa, second, target)
    return nn.CrossEntropyLoss()(logits, targets) + weight * ranking


@pytest.mark.parametrize(("weight", "rank_target"), [(1.0, "softmax"), (0.5, "margin"), (2.0, "entropy")])
def test_three_epochs_of_steps_match_the_reference(weight, rank_target):
    n, batch, classes, epochs = 24, 8, 10, 3
    generator = torch.Generator().manual_seed(0)
    targets_all = torch.randint(0, classes, (n,), generator=generator)
    loss_fn = CRL(weight, rank_target).train()
    loss_fn.start_training(n)
    history = ReferenceHistory(n)
    nonzero_targets = 0
    for epoch in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch):
            index = order[start:start + batch]
            targets = targets_all[index]
            # logits leaning to the label more and more often, so the counts differ between samples
            logits = torch.randn(batch, classes, generator=generator, dtype=torch.float64) * 2
            logits[torch.arange(batch), targets] += torch.rand(batch, generator=generator, dtype=torch.float64) * 4
            logits.requires_grad_()
            reference = reference_loss(logits, targets, index, history, weight, rank_target)
            nonzero_targets += int((history.target_margin(index.numpy())[0] != 0).sum())
            loss = loss_fn(logits, targets, indices=index)
            assert float(loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-12)
            (grad,) = torch.autograd.grad(loss, logits)
            (ref_grad,) = torch.autograd.grad(reference, logits)
            torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=0)
            history.update(index.numpy(), (logits.argmax(dim=1) == targets).numpy().astype(float))
            assert loss_fn.correctness.tolist() == history.correctness.astype(int).tolist()
        loss_fn.end_epoch(epoch)
        history.epoch_done(epoch + 1)
        assert int(loss_fn.max_correctness) == history.max_correctness
    assert history.max_correctness == 3 and nonzero_targets > 20  # the ranking term was exercised


def test_eval_mode_and_sum_reduction_leave_the_history_alone():
    loss_fn = CRL()
    loss_fn.start_training(6)
    logits = torch.eye(3, dtype=torch.float64).repeat(2, 1) * 5
    targets, index = torch.tensor([0, 1, 2, 0, 1, 2]), torch.arange(6)
    loss_fn.eval()
    mean = loss_fn(logits, targets, indices=index)
    assert loss_fn.correctness.tolist() == [0] * 6
    summed = CRL(reduction="sum")
    summed.start_training(6)
    torch.testing.assert_close(summed(logits, targets, indices=index), 6 * mean)
    assert summed.correctness.tolist() == [1] * 6  # training mode: every sample counted once


def test_equal_minimum_and_maximum_count_is_finite():
    # Every sample right in every epoch so far: min count = c_max, where CRL-R divides by zero.
    loss_fn = CRL()
    loss_fn.start_training(4)
    loss_fn.correctness.copy_(torch.tensor([1, 2, 1, 2]))
    logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64).requires_grad_()
    loss = loss_fn(logits, torch.tensor([0, 1, 2, 0]), indices=torch.arange(4))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_the_history_is_state():
    loss_fn = CRL()
    loss_fn.start_training(5)
    loss_fn(torch.eye(5, dtype=torch.float64)[:, :3] * 4, torch.tensor([0, 1, 2, 1, 1]), indices=torch.arange(5))
    loss_fn.end_epoch(0)
    loss_fn.end_epoch(1)
    restored = CRL()
    restored.start_training(5)
    restored.load_state_dict(loss_fn.state_dict())
    assert restored.correctness.tolist() == [1, 1, 1, 0, 0] and int(restored.max_correctness) == 2


def test_missing_positions_or_history_is_an_error():
    logits, targets = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(RuntimeError, match=r"call start_training\(num_samples\) first"):
        CRL()(logits, targets, indices=torch.arange(2))
    loss_fn = CRL()
    loss_fn.start_training(2)
    with pytest.raises(ValueError, match=r"CRL needs the batch's positions in the training split"):
        loss_fn(logits, targets)


def test_defaults_and_registration():
    assert (CRLConfig().penalty_weight, CRLConfig().rank_target) == (1.0, "softmax")
    assert LOSSES.get("crl").label == "CRL" and CRL.needs_sample_indices


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"penalty_weight": -1.0}, r"`penalty_weight` must be a finite number >= 0, got penalty_weight=-1\.0"),
    ({"rank_target": "nll"}, r"`rank_target` must be one of 'softmax', 'entropy', 'margin', got rank_target='nll'"),
])
def test_bad_config_names_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CRLConfig(**kwargs)
