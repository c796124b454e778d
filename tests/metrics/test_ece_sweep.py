"""Tests for calib/metrics/ece_sweep.py (ECE-sweep, Roelofs et al. 2022, equal-mass monotone sweep)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from metric_cases import binary, overconfident_probs
from metric_references import reference_ece_sweep

from calib.metrics import ece_sweep
from calib.metrics.ece_sweep import _sweep_bin_indices, _sweep_num_bins


class TestEceSweep:
    def test_main(self) -> None:
        # Sorted conf .55 .6 .7 .8 .9 .95, correct 0 1 0 1 1 1 (N = 6).
        # B = 2: ranks r·2//6 -> [0 0 0 1 1 1]: acc 1/3, 1          monotone
        # B = 3: r·3//6       -> [0 0 1 1 2 2]: acc 1/2, 1/2, 1     monotone (ties allowed)
        # B = 4: r·4//6       -> [0 0 1 2 2 3]: acc 1/2, 0, 1, 1    not monotone -> B* = 3
        # ECE at B = 3: conf .575, .75, .925 vs acc .5, .5, 1 -> (2/6)(.075 + .25 + .075) = .4/3
        probs, labels = binary([0.55, 0.6, 0.7, 0.8, 0.9, 0.95], [0, 1, 0, 1, 1, 1])
        assert _sweep_num_bins(np.array([0.0, 1, 0, 1, 1, 1])) == 3
        assert ece_sweep(probs, labels) == pytest.approx(0.4 / 3, abs=1e-12)
        # p = 2: sqrt((2/6)(.075² + .25² + .075²))
        assert ece_sweep(probs, labels, p=2) == pytest.approx(np.sqrt((0.075**2 * 2 + 0.25**2) / 3), abs=1e-12)

    def test_stops_at_the_first_non_monotone_number_of_bins(self) -> None:
        # Correct (sorted by conf) 0 0 0 1 1 0 1, N = 7:
        # B = 2: r·2//7 -> [0 0 0 0 1 1 1]: acc 1/4, 2/3            monotone
        # B = 3: r·3//7 -> [0 0 0 1 1 2 2]: acc 0, 1, 1/2           not monotone: stop, B* = 2
        # B = 4: r·4//7 -> [0 0 1 1 2 2 3]: acc 0, 1/2, 1/2, 1      monotone again, but never reached
        # ECE at B = 2: (4/7)|.625 − .25| + (3/7)|.85 − 2/3| = (1.5 + .55)/7
        correct = [0, 0, 0, 1, 1, 0, 1]
        probs, labels = binary([0.55, 0.6, 0.65, 0.7, 0.8, 0.85, 0.9], correct)
        assert _sweep_num_bins(np.array(correct, dtype=float)) == 2
        assert ece_sweep(probs, labels) == pytest.approx(2.05 / 7, abs=1e-12)

    def test_equal_mass_rule(self) -> None:
        # N = 10, B = 4: floor(r·4/10) for r = 0..9 -> sizes 3, 2, 3, 2.
        assert _sweep_bin_indices(10, 4).tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
        # N = 44, B = 22: rank 30 has r·B/N = 15 exactly; floor((30/44)·22) in floats is 14.
        assert _sweep_bin_indices(44, 22)[30] == 15
        assert np.bincount(_sweep_bin_indices(44, 22)).tolist() == [2] * 22
        for n, b in [(7, 3), (100, 7), (10_000, 15)]:
            sizes = np.bincount(_sweep_bin_indices(n, b), minlength=b)
            assert sizes.sum() == n and set(sizes.tolist()) <= {n // b, -(-n // b)}

    @pytest.mark.parametrize("p", [1, 2])
    @pytest.mark.parametrize(("n", "num_classes", "seed"), [(2000, 10, 0), (2000, 10, 1), (300, 3, 2), (50, 10, 3)])
    def test_independent_reference(self, n: int, num_classes: int, seed: int, p: int) -> None:
        probs, labels = overconfident_probs(n, num_classes, seed)
        expected, _ = reference_ece_sweep(probs, labels, p)
        assert ece_sweep(probs, labels, p=p) == pytest.approx(expected, abs=1e-12)

    def test_fifty_samples_ten_classes(self) -> None:
        probs, labels = overconfident_probs(50, 10, seed=7)
        expected, num_bins = reference_ece_sweep(probs, labels)
        assert 1 <= num_bins <= 49
        assert ece_sweep(probs, labels) == pytest.approx(expected, abs=1e-12)

    def test_class_absent(self) -> None:
        # Class 2 is never the label: nothing changes, the value is the reference's.
        probs, labels = overconfident_probs(200, 3, seed=4)
        labels = np.where(labels == 2, 0, labels)
        assert ece_sweep(probs, labels) == pytest.approx(reference_ece_sweep(probs, labels)[0], abs=1e-12)

    def test_ties_keep_input_order(self) -> None:
        # All conf .5, correct 0 1 1 0 in input order (stable sort keeps it):
        # B = 2: [0 1][1 0] acc .5, .5 monotone; B = 3: r·3//4 = [0 0 1 2]: .5, 1, 0 not -> B* = 2.
        # Every bin has conf .5 and acc .5: ECE 0.
        probs, labels = binary([0.5] * 4, [0, 1, 1, 0])
        assert _sweep_num_bins(np.array([0.0, 1, 1, 0])) == 2
        assert ece_sweep(probs, labels) == 0.0
        # Rounded logits: many ties; same as the stable-sorted reference.
        rng = np.random.default_rng(5)
        logits = np.round(rng.normal(scale=2.0, size=(500, 4)))
        tied = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        tied_labels = rng.integers(0, 4, size=500)
        assert ece_sweep(tied, tied_labels) == pytest.approx(reference_ece_sweep(tied, tied_labels)[0], abs=1e-12)

    def test_all_correct_and_all_wrong(self) -> None:
        # Every B is monotone (all accuracies equal), so B* = N − 1; every gap has the same sign, so
        # ECE = |mean(conf) − accuracy| whatever the bins.
        conf = [0.55, 0.6, 0.7, 0.8, 0.9, 0.95]
        probs, labels = binary(conf, [1] * 6)
        assert _sweep_num_bins(np.ones(6)) == 5
        assert ece_sweep(probs, labels) == pytest.approx(1 - np.mean(conf), abs=1e-12)
        probs, labels = binary(conf, [0] * 6)
        assert ece_sweep(probs, labels) == pytest.approx(np.mean(conf), abs=1e-12)

    @pytest.mark.parametrize(("correct", "expected"), [(1, 0.3), (0, 0.7)])
    def test_single_sample(self, correct: int, expected: float) -> None:
        # N = 1: one bin, |conf − correct|.
        probs, labels = binary([0.7], [correct])
        assert ece_sweep(probs, labels) == pytest.approx(expected, abs=1e-12)

    def test_two_samples_one_bin(self) -> None:
        # N = 2: the reference sweeps B = 2..N − 1, i.e. nothing: one bin, |mean conf − acc| = |.75 − .5|.
        probs, labels = binary([0.6, 0.9], [1, 0])
        assert ece_sweep(probs, labels) == pytest.approx(0.25, abs=1e-12)

    def test_fast_on_ten_thousand_samples(self) -> None:
        # One swapped pair at the median keeps every B monotone up to about N/2: the slowest case.
        rng = np.random.default_rng(0)
        conf = np.sort(rng.uniform(0.5, 1.0, 10_000))
        correct = (np.arange(10_000) >= 5_000).astype(int)
        correct[[4_999, 5_000]] = [1, 0]
        probs, labels = binary(conf.tolist(), correct.tolist())
        start = time.perf_counter()
        ece_sweep(probs, labels)
        assert time.perf_counter() - start < 1.0

    @pytest.mark.parametrize("p", [0.5, 0, True, float("nan"), float("inf"), "1"], ids=repr)
    def test_bad_p(self, p: object) -> None:
        probs, labels = binary([0.6, 0.9], [1, 0])
        with pytest.raises(ValueError, match=r"^`p` must be a finite number >= 1 \(1: ECE, 2: L2 error\), got p="):
            ece_sweep(probs, labels, p=p)
