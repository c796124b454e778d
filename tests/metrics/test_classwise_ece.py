"""Tests for calib/metrics/classwise_ece.py (FOCAL-R ClasswiseECELoss)."""

from __future__ import annotations

import numpy as np
import pytest
from metric_references import reference_cwece

from calib.metrics import classwise_ece


class TestClasswiseEce:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # 5 bins; per bin, count * |mean p_k - freq_k| = |sum p_k - #(y = k)|.
        # class 0: p = [.9 .7 .1 .3 .1 .5], y=0 at rows 0, 3, 5
        #   (0,.2]: {.1,.1} no 0s -> .2 | (.2,.4]: {.3} y=0 -> .7 | (.4,.6]: {.5} y=0 -> .5
        #   (.6,.8]: {.7} -> .7     | (.8,1]: {.9} y=0 -> .1           sum 2.2 -> 2.2/6
        # class 1: p = [.05 .15 .65 .25 .05 .35], y=1 at rows 1, 2
        #   (0,.2]: {.05,.15,.05} one 1 -> |.25 - 1| = .75 | (.2,.4]: {.25,.35} -> .6
        #   (.6,.8]: {.65} y=1 -> .35                                  sum 1.7 -> 1.7/6
        # class 2: p = [.05 .15 .25 .45 .85 .15], y=2 at row 4
        #   (0,.2]: {.05,.15,.15} -> .35 | (.2,.4]: {.25} -> .25 | (.4,.6]: {.45} -> .45
        #   (.8,1]: {.85} y=2 -> .15                                    sum 1.2 -> 1.2/6
        # cwECE = (2.2 + 1.7 + 1.2) / 6 / 3 = 5.1 / 18 = .28333...
        probs, labels = worked
        assert classwise_ece(probs, labels, num_bins=5) == pytest.approx(5.1 / 18, abs=1e-12)

    def test_num_classes_from_probs_not_labels(self) -> None:
        # C = 3 though no label is 2. 4 bins (0,.25] (.25,.5] (.5,.75] (.75,1].
        # class 0: {.7 y=0} -> .3, {.2} -> .2: .5/2 = .25;   class 1: same, .25
        # class 2: {.1, .1} -> .2: .2/2 = .1                  cwECE = (.25 + .25 + .1)/3 = .2
        # (FOCAL-R infers C = max(label) + 1 = 2 and would report (.25 + .25)/2 = .25.)
        probs = np.array([[0.7, 0.2, 0.1], [0.2, 0.7, 0.1]])
        labels = np.array([0, 1])
        assert classwise_ece(probs, labels, num_bins=4) == pytest.approx(0.2, abs=1e-12)

    def test_zero_probability_is_in_first_bin(self) -> None:
        # class 0: p 1.0 with y=1 -> |1 - 0| = 1;  class 1: p 0.0 with y=1 -> first bin, |0 - 1| = 1.
        # cwECE = (1 + 1)/2 = 1. (FOCAL-R's gt(0) would drop the 0.0 and report .5.)
        assert classwise_ece(np.array([[1.0, 0.0]]), np.array([1]), num_bins=2) == 1.0

    @pytest.mark.parametrize("num_bins", [1, 5, 15])
    def test_independent_reference(self, random_case: tuple[np.ndarray, np.ndarray], num_bins: int) -> None:
        probs, labels = random_case
        expected = reference_cwece(probs, labels, num_bins)
        assert classwise_ece(probs, labels, num_bins=num_bins) == pytest.approx(expected, abs=1e-12)

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins=0\.$"):
            classwise_ece(probs, labels, num_bins=0)
        with pytest.raises(ValueError, match=r"`labels` must be in \[0, C\) = \[0, 3\)"):
            classwise_ece(probs, labels + 1)
