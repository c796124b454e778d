"""Tests for calib/metrics/ood.py (MSP scores, in-distribution positive)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_curve

from calib.metrics import ood_auroc, ood_fpr_at_95_tpr


class TestOodAuroc:
    def test_main(self) -> None:
        # ID-vs-OOD pairs: .9>.7 1, .9>.6 1, .6<.7 0, .6=.6 1/2 -> 2.5/4 = .625
        assert ood_auroc([0.9, 0.6], [0.7, 0.6]) == pytest.approx(0.625)

    def test_separated_and_identical(self) -> None:
        assert ood_auroc([0.9, 0.8, 0.95], [0.1, 0.5]) == 1.0
        assert ood_auroc([0.1, 0.5], [0.9, 0.8, 0.95]) == 0.0
        assert ood_auroc([0.5] * 4, [0.5] * 7) == 0.5

    def test_torch_input(self) -> None:
        torch = pytest.importorskip("torch")
        assert ood_auroc(torch.tensor([0.9, 0.6]), torch.tensor([0.7, 0.6])) == pytest.approx(0.625)

    def test_errors(self) -> None:
        with pytest.raises(
            ValueError, match=r"^`id_scores` must be a non-empty 1-D array, got shape \(0,\)\.$"
        ):
            ood_auroc([], [0.5])
        with pytest.raises(
            ValueError, match=r"`ood_scores` must be a non-empty 1-D array, got shape \(1, 2\)\."
        ):
            ood_auroc([0.5], [[0.5, 0.2]])
        with pytest.raises(
            ValueError, match=r"`ood_scores` must be finite \(no NaN or inf\), got ood_scores\[1\]=nan"
        ):
            ood_auroc([0.5], [0.2, float("nan")])


class TestOodFprAt95Tpr:
    def test_main(self) -> None:
        # ID = .05, .10, ..., 1.00 (20 scores). Keeping 95% = 19 of them needs threshold .10.
        # OOD scores >= .10: .15 and .5 -> FPR95 = 2/4 = .5 (.02 and .05 fall below).
        ids = np.arange(1, 21) / 20
        assert ood_fpr_at_95_tpr(ids, [0.02, 0.05, 0.15, 0.5]) == 0.5

    def test_interpolated(self) -> None:
        # ID [.9 .8 .7 .6], OOD [.6 .3]. ROC points (FPR, TPR) by threshold:
        # .9 (0, .25), .8 (0, .5), .7 (0, .75), .6 (.5, 1.0): the tie at .6 makes a diagonal step.
        # TPR .95 is (.95 - .75)/(1 - .75) = .8 of the way along it -> FPR = .8 * .5 = .4.
        assert ood_fpr_at_95_tpr([0.9, 0.8, 0.7, 0.6], [0.6, 0.3]) == pytest.approx(0.4, abs=1e-12)

    def test_exact_hit_takes_smallest_fpr(self) -> None:
        # Threshold .10 keeps 19/20 ID and no OOD score (.07) reaches it -> 0. np.interp over the ROC
        # points (ood_metrics) would return 1.0, the far end of the flat segment at TPR .95.
        ids = np.arange(1, 21) / 20
        assert ood_fpr_at_95_tpr(ids, [0.07]) == 0.0
        fpr, tpr, _ = roc_curve(np.r_[np.ones(20), 0.0], np.r_[ids, 0.07])
        assert np.interp(0.95, tpr, fpr) == 1.0

    def test_matches_roc_interpolation(self) -> None:
        # With 1001 ID samples no threshold hits TPR .95 exactly: same as ood_metrics' np.interp.
        rng = np.random.default_rng(0)
        ids, oods = rng.normal(1.0, 1.0, size=1001), rng.normal(0.0, 1.0, size=700)
        fpr, tpr, _ = roc_curve(np.r_[np.ones(ids.size), np.zeros(oods.size)], np.r_[ids, oods])
        assert ood_fpr_at_95_tpr(ids, oods) == pytest.approx(np.interp(0.95, tpr, fpr), abs=1e-12)

    def test_separated_and_identical(self) -> None:
        assert ood_fpr_at_95_tpr([0.9, 0.8, 0.95], [0.1, 0.5]) == 0.0
        # All scores tied: the ROC is the diagonal, so FPR = TPR = .95.
        assert ood_fpr_at_95_tpr([0.5] * 4, [0.5] * 7) == pytest.approx(0.95, abs=1e-12)

    def test_errors(self) -> None:
        with pytest.raises(ValueError, match=r"`ood_scores` must be a real numeric array, got dtype <U"):
            ood_fpr_at_95_tpr([0.5], ["x"])
