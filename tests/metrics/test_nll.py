"""Tests for calib/metrics/nll.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss

from calib.metrics import METRICS, negative_log_likelihood, softmax64
from calib.metrics.nll import NLL_FLOOR, NLL_MAX

# A confident mistake with logit gap 50: -log p_y = log(1 + e^-50) + 50 (sample 0 below).
GAP_50_NLL = math.log1p(math.exp(-50.0)) + 50.0


class TestNegativeLogLikelihood:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # p_{i,y_i} = [.9 .15 .65 .3 .85 .5]; -log: .10536 1.89712 .43078 1.20397 .16252 .69315
        # sum 4.49290 / 6 = .748817
        probs, labels = worked
        expected = -(math.log(0.9) + math.log(0.15) + math.log(0.65) + math.log(0.3) + math.log(0.85)
                     + math.log(0.5)) / 6  # fmt: skip
        assert expected == pytest.approx(0.748817, abs=1e-6)
        assert negative_log_likelihood(probs, labels) == pytest.approx(expected, abs=1e-12)
        logits = np.log(probs) + 3.0  # softmax(log p + c) = p
        assert negative_log_likelihood(logits, labels, from_logits=True) == pytest.approx(expected, abs=1e-12)

    def test_sklearn_log_loss(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = random_case
        probs = 0.98 * probs + 0.02 / probs.shape[1]  # keep every p_{i,y} far above sklearn's eps clip
        expected = log_loss(labels, probs, labels=np.arange(probs.shape[1]))
        assert negative_log_likelihood(probs, labels) == pytest.approx(expected, rel=1e-12)
        assert negative_log_likelihood(np.log(probs), labels, from_logits=True) == pytest.approx(expected, rel=1e-12)

    def test_sklearn_log_loss_from_logits(self) -> None:
        rng = np.random.default_rng(3)
        logits = 4.0 * rng.standard_normal((1000, 7))  # smallest p_y ~ 4e-10: sklearn's eps clip never bites
        labels = rng.integers(0, 7, size=1000)
        expected = log_loss(labels, softmax64(logits), labels=np.arange(7))
        assert negative_log_likelihood(logits, labels, from_logits=True) == pytest.approx(expected, rel=1e-12)
        assert negative_log_likelihood(torch.from_numpy(logits).float(), torch.from_numpy(labels),
                                       from_logits=True) == pytest.approx(expected, rel=1e-6)  # fmt: skip

    def test_confident_mistake_gap_50_is_exact(self) -> None:
        # p_y = e^-50 / (1 + e^-50) ~ 1.9e-22; the old clip at 1e-12 reported 27.63 nats.
        logits, labels = np.array([[50.0, 0.0]]), np.array([1])
        assert negative_log_likelihood(softmax64(logits), labels) == pytest.approx(GAP_50_NLL, abs=1e-9)
        assert negative_log_likelihood(logits, labels, from_logits=True) == pytest.approx(GAP_50_NLL, abs=1e-9)

    def test_mixed_batch_the_old_clip_got_wrong(self) -> None:
        # Rows: gap-50 mistake (50.0000), a tie (log 2 = 0.693147), a right answer by 2
        # (log(1 + e^-2) = 0.126928), a right answer by 40 (log(1 + e^-40) = 4.2e-18).
        # Exact mean: 50.820075 / 4 = 12.705019; the 1e-12 clip gave (27.631021 + 0.820075) / 4 = 7.112774.
        logits = np.array([[50.0, 0.0], [0.0, 0.0], [3.0, 1.0], [0.0, 40.0]])
        labels = np.array([1, 0, 0, 1])
        expected = (GAP_50_NLL + math.log(2.0) + math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-40.0))) / 4
        assert expected == pytest.approx(12.705019, abs=1e-6)
        old_clipped = (-math.log(1e-12) + math.log(2.0) + math.log1p(math.exp(-2.0))) / 4
        assert expected - old_clipped == pytest.approx(5.592245, abs=1e-6)
        assert negative_log_likelihood(softmax64(logits), labels) == pytest.approx(expected, abs=1e-9)
        assert negative_log_likelihood(logits, labels, from_logits=True) == pytest.approx(expected, abs=1e-9)

    def test_zero_probability_gives_the_float64_floor(self) -> None:
        # Row 0 gives p_y = 0 -> floored at the smallest positive float64 -> -log = 744.44 (finite, not
        # inf); row 1 gives p_y = 1 -> 0. (This test used to pin the old 1e-12 clip, 27.63 / 2.)
        assert NLL_FLOOR == np.finfo(np.float64).smallest_subnormal and NLL_MAX == pytest.approx(744.440072, abs=1e-6)
        probs = np.array([[1.0, 0.0], [0.0, 1.0]])
        value = negative_log_likelihood(probs, np.array([1, 1]))
        assert math.isfinite(value)
        assert value == pytest.approx(-math.log(NLL_FLOOR) / 2, abs=1e-9)
        # From logits a gap of 1000 nats is computed exactly, then capped at the same 744.44.
        assert negative_log_likelihood([[1000.0, 0.0]], [1], from_logits=True) == NLL_MAX
        assert negative_log_likelihood([[700.0, 0.0]], [1], from_logits=True) == pytest.approx(700.0, abs=1e-9)
        assert METRICS["nll"].bounds == (0.0, NLL_MAX)

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, _ = worked
        with pytest.raises(ValueError, match=r"got labels\[0\]=-1\."):
            negative_log_likelihood(probs, np.array([-1, 1, 1, 0, 2, 0]))
        with pytest.raises(ValueError, match=r"`logits` must be finite \(no NaN or inf\), got logits\[0, 1\]=inf"):
            negative_log_likelihood([[0.0, np.inf]], [0], from_logits=True)
        with pytest.raises(ValueError, match=r"`logits` must have shape \(N, C\) with N >= 1 and C >= 2, got shape"):
            negative_log_likelihood([0.0, 1.0], [0], from_logits=True)
        with pytest.raises(ValueError, match=r"`labels` must be in \[0, C\) = \[0, 2\).*got labels\[1\]=2\."):
            negative_log_likelihood([[0.0, 1.0], [1.0, 0.0]], [0, 2], from_logits=True)
        with pytest.raises(ValueError, match=r"`labels` must have an integer dtype, got dtype float64"):
            negative_log_likelihood([[0.0, 1.0]], [0.0], from_logits=True)
        with pytest.raises(ValueError, match=r"`labels` must have shape \(N,\) = \(1,\).*got shape \(2,\)"):
            negative_log_likelihood([[0.0, 1.0]], [0, 1], from_logits=True)
