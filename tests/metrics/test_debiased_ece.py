"""Tests for calib/metrics/debiased_ece.py (debiased L2 calibration error, Kumar et al. 2019)."""

from __future__ import annotations

import numpy as np
import pytest
from metric_cases import binary, overconfident_probs

from calib.metrics import debiased_l2_calibration_error
from calib.metrics.debiased_ece import _kumar_equal_mass_edges

CASES = {
    "2000x10": overconfident_probs(2000, 10, 0),
    "2000x10-b": overconfident_probs(2000, 10, 1),
    "50x10": overconfident_probs(50, 10, 2),
    "300x3-ties": overconfident_probs(300, 3, 3, round_logits=True),
    "7x4": overconfident_probs(7, 4, 4),
}


class TestHandComputed:
    def test_main_is_below_plug_in(self) -> None:
        # Sorted conf [.5 .5 .5 .5 | .75 .75 .75 .75], M = 2: chunks of 4, edge (.5 + .75)/2 = .625.
        # Bin 1: conf .5,  acc 2/4: gap² 0,   variance (.5·.5)/3   = 1/12 -> −1/12
        # Bin 2: conf .75, acc 1/4: gap² .25, variance (.25·.75)/3 = 1/16 -> 3/16
        # CE² = ½(−1/12 + 3/16) = 5/96; plug-in L2 = sqrt(½(0 + .25)) = sqrt(1/8).
        probs, labels = binary([0.5] * 4 + [0.75] * 4, [1, 1, 0, 0, 1, 0, 0, 0])
        value = debiased_l2_calibration_error(probs, labels, num_bins=2)
        assert value == pytest.approx(np.sqrt(5 / 96), abs=1e-12)
        assert value < np.sqrt(1 / 8)

    def test_negative_square_is_clipped_to_zero(self) -> None:
        # Two bins of two, each with acc 1/2: gaps .125 and .3125, variances .25/1 each:
        # CE² = ½(.125² − .25) + ½(.3125² − .25) < 0 -> 0.
        probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
        assert debiased_l2_calibration_error(probs, [0, 1, 0, 1], num_bins=2) == 0.0

    def test_equal_mass_edges(self) -> None:
        # np.array_split(5 values, 2) -> sizes 3, 2: edge between .7 and .8.
        assert _kumar_equal_mass_edges(np.array([0.9, 0.5, 0.7, 0.6, 0.8]), 2).tolist() == [0.75, 1.0]
        # Ties: chunks [.5 .5][.5 .5][.6 .6] -> edges .5, .55, 1: the four .5 share the first bin.
        edges = _kumar_equal_mass_edges(np.array([0.5, 0.5, 0.5, 0.5, 0.6, 0.6]), 3)
        assert edges.tolist() == [0.5, 0.55, 1.0]
        # Fewer samples than bins: one chunk per sample.
        assert _kumar_equal_mass_edges(np.array([0.9, 0.6, 0.7]), 15).tolist() == pytest.approx([0.65, 0.8, 1.0])
        # Duplicate edges are dropped: all four equal.
        assert _kumar_equal_mass_edges(np.full(4, 0.5), 3).tolist() == [0.5, 1.0]

    def test_ties_share_a_bin(self) -> None:
        # Edges [.5, .55, 1]: bin 1 = four .5 with acc 1/4: gap² .0625, variance (.25·.75)/3 = .0625 -> 0;
        # bin 2 empty; bin 3 = two .6 both right: gap² .16, variance 0. CE² = (2/6)(.16) -> sqrt(.16/3).
        probs, labels = binary([0.5, 0.5, 0.5, 0.5, 0.6, 0.6], [1, 0, 0, 0, 1, 1])
        assert debiased_l2_calibration_error(probs, labels, num_bins=3) == pytest.approx(np.sqrt(0.16 / 3), abs=1e-12)

    def test_all_correct_and_all_wrong(self) -> None:
        # acc 0 or 1 in every bin: no variance term, so the debiased error is the plug-in one.
        # One bin: |mean conf − acc|.
        conf = [0.55, 0.6, 0.7, 0.8, 0.9, 0.95]
        probs, labels = binary(conf, [1] * 6)
        assert debiased_l2_calibration_error(probs, labels, num_bins=1) == pytest.approx(1 - np.mean(conf), abs=1e-12)
        probs, labels = binary(conf, [0] * 6)
        assert debiased_l2_calibration_error(probs, labels, num_bins=1) == pytest.approx(np.mean(conf), abs=1e-12)
        # Three bins of two: conf .575, .75, .925, all wrong -> sqrt(mean of squares).
        assert debiased_l2_calibration_error(probs, labels, num_bins=3) == pytest.approx(
            np.sqrt((0.575**2 + 0.75**2 + 0.925**2) / 3), abs=1e-12
        )

    @pytest.mark.parametrize("n", [1, 3])
    def test_bins_of_one_sample_contribute_zero(self, n: int) -> None:
        # N <= M: one chunk per sample, each bin has one sample and contributes 0.
        probs, labels = binary([0.6, 0.7, 0.9][:n], [0, 0, 0][:n])
        assert debiased_l2_calibration_error(probs, labels) == 0.0


class TestReferencePackage:
    """Against Kumar et al.'s ``uncertainty-calibration`` (``import calibration``), the test extra."""

    @pytest.mark.parametrize("name", list(CASES))
    @pytest.mark.parametrize("num_bins", [1, 2, 15, 40])
    def test_lower_bound_scaling_top_ce(self, name: str, num_bins: int) -> None:
        calibration = pytest.importorskip("calibration")
        probs, labels = CASES[name]
        expected = calibration.lower_bound_scaling_top_ce(probs, labels, p=2, debias=True, num_bins=num_bins)
        assert debiased_l2_calibration_error(probs, labels, num_bins=num_bins) == pytest.approx(expected, abs=1e-12)

    @pytest.mark.parametrize("name", ["2000x10", "2000x10-b", "50x10"])
    def test_get_calibration_error(self, name: str) -> None:
        # The package's entry point with its defaults (15 equal-mass bins) for continuous outputs.
        calibration = pytest.importorskip("calibration")
        probs, labels = CASES[name]
        assert not calibration.is_discrete(probs)
        expected = calibration.get_calibration_error(probs, labels, p=2, debias=True, mode="top-label")
        assert debiased_l2_calibration_error(probs, labels) == pytest.approx(expected, abs=1e-12)

    def test_class_absent(self) -> None:
        calibration = pytest.importorskip("calibration")
        probs, labels = overconfident_probs(400, 5, seed=6)
        labels = np.where(labels == 4, 0, labels)
        expected = calibration.lower_bound_scaling_top_ce(probs, labels, p=2, debias=True, num_bins=15)
        assert debiased_l2_calibration_error(probs, labels) == pytest.approx(expected, abs=1e-12)

    @pytest.mark.parametrize("name", ["2000x10", "50x10"])
    def test_below_the_plug_in_estimate(self, name: str) -> None:
        calibration = pytest.importorskip("calibration")
        probs, labels = CASES[name]
        plug_in = calibration.lower_bound_scaling_top_ce(probs, labels, p=2, debias=False, num_bins=15)
        assert debiased_l2_calibration_error(probs, labels) < plug_in


def test_errors() -> None:
    probs, labels = binary([0.6, 0.9], [1, 0])
    with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins=0\.$"):
        debiased_l2_calibration_error(probs, labels, num_bins=0)
