"""Tests for calib/metrics/aurc.py (AURC and AUGRC)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from metric_references import reference_areas

from calib.metrics import area_under_generalized_risk_coverage as augrc
from calib.metrics import area_under_risk_coverage as aurc


def naive_areas(confidences: list[float], wrong: list[int]) -> tuple[float, float]:
    """(AURC, AUGRC) of samples already in their ranking order, no tie handling."""
    n = len(wrong)
    errors = np.cumsum(wrong)
    return sum(errors[k - 1] / k for k in range(1, n + 1)) / n, sum(errors) / n / n


def binary(confidences: list[float], correct: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Two-class probs [[c, 1 − c]] (c > 0.5, so class 0 is predicted) and labels giving ``correct``."""
    probs = np.array([[c, 1.0 - c] for c in confidences])
    labels = np.array([0 if ok else 1 for ok in correct])
    return probs, labels


def tied_case(seed: int, n: int = 600) -> tuple[np.ndarray, np.ndarray]:
    """Three classes, the top probability from {.4, .5, ..., .9} (many ties), labels at random."""
    rng = np.random.default_rng(seed)
    top = rng.choice([0.4, 0.5, 0.6, 0.7, 0.8, 0.9], size=n)
    predicted = rng.integers(0, 3, size=n)
    probs = np.repeat(((1.0 - top) / 2)[:, None], 3, axis=1)
    probs[np.arange(n), predicted] = top
    labels = np.where(rng.random(n) < top, predicted, (predicted + 1) % 3)
    return probs, labels


class TestAreaUnderRiskCoverage:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # conftest's example by decreasing confidence: .90 R, .85 R, .70 W, .65 R, .50 R, .45 W.
        # errors among the k most confident E_k = 0, 0, 1, 1, 1, 2
        # selective risks E_k/k = 0, 0, 1/3, 1/4, 1/5, 2/6; sum = (20 + 15 + 12 + 20)/60 = 67/60
        # AURC = (67/60)/6 = 67/360
        probs, labels = worked
        assert aurc(probs, labels) == pytest.approx(67 / 360, abs=1e-12)

    def test_ties_hand(self) -> None:
        # conf .9 R | .8 W, .8 R, .8 R (a tie group: g = 3, e = 1) | .6 W
        # E_1 = 0; in the group E_{1+j} = 0 + j/3: 1/3, 2/3, 1; E_5 = 2
        # AURC = (0/1 + (1/3)/2 + (2/3)/3 + 1/4 + 2/5)/5 = (30 + 40 + 45 + 72)/180/5 = 187/900
        # = the mean over the 3 positions of the error in the group: risks (0, 1/2, 1/3, 1/4, 2/5),
        #   (0, 0, 1/3, 1/4, 2/5), (0, 0, 0, 1/4, 2/5) average to (0, 1/6, 2/9, 1/4, 2/5).
        probs, labels = binary([0.9, 0.8, 0.8, 0.8, 0.6], [1, 0, 1, 1, 0])
        assert aurc(probs, labels) == pytest.approx(187 / 900, abs=1e-12)

    def test_independent_reference(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = random_case
        assert aurc(probs, labels) == pytest.approx(reference_areas(probs, labels)[0], abs=1e-12)

    @pytest.mark.parametrize("seed", [0, 1])
    def test_independent_reference_with_ties(self, seed: int) -> None:
        probs, labels = tied_case(seed)
        assert aurc(probs, labels) == pytest.approx(reference_areas(probs, labels)[0], abs=1e-12)

    def test_torch_uncertainty_convention(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        # torch-uncertainty: trapezoid over coverages k/N, k = 1..N, divided by 1 - 1/N. No ties here.
        probs, labels = random_case
        n = len(labels)
        order = np.argsort(-probs.max(axis=1))
        wrong = (probs.argmax(axis=1) != labels)[order]
        risks = np.cumsum(wrong) / np.arange(1, n + 1)
        coverage = np.arange(1, n + 1) / n
        trapezoid = np.sum((risks[1:] + risks[:-1]) / 2 * np.diff(coverage)) / (1 - 1 / n)
        expected = (n * aurc(probs, labels) - (risks[0] + risks[-1]) / 2) / (n - 1)
        assert trapezoid == pytest.approx(expected, abs=1e-12)
        assert abs(trapezoid - aurc(probs, labels)) < 2 / n

    def test_edge_cases(self) -> None:
        # every prediction right: 0; every one wrong: E_k/k = 1 for all k
        assert aurc(*binary([0.9, 0.7, 0.6], [1, 1, 1])) == 0.0
        assert aurc(*binary([0.9, 0.7, 0.6], [0, 0, 0])) == pytest.approx(1.0, abs=1e-12)
        # one sample: its 0/1 error
        assert aurc(*binary([0.8], [0])) == 1.0
        # perfect ranking, 2 errors of 4 at the bottom: E_k = 0, 0, 1, 2 -> (1/3 + 2/4)/4 = 5/24
        assert aurc(*binary([0.9, 0.8, 0.7, 0.6], [1, 1, 0, 0])) == pytest.approx(5 / 24, abs=1e-12)
        # worst ranking: E_k = 1, 2, 2, 2 -> (1 + 1 + 2/3 + 1/2)/4 = 19/24
        assert aurc(*binary([0.9, 0.8, 0.7, 0.6], [0, 0, 1, 1])) == pytest.approx(19 / 24, abs=1e-12)

    def test_constant_confidence_is_the_error_rate(self) -> None:
        # all tied: E_k = k·e/N, so every selective risk is e/N (3 errors of 8 here)
        probs, labels = binary([0.75] * 8, [1, 0, 1, 1, 0, 1, 0, 1])
        assert aurc(probs, labels) == pytest.approx(3 / 8, abs=1e-12)

    def test_torch_input(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        torch = pytest.importorskip("torch")
        probs, labels = worked
        value = aurc(torch.tensor(probs), torch.tensor(labels))
        assert isinstance(value, float)
        assert value == pytest.approx(67 / 360, abs=1e-12)

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"`labels` must be a 1-D array of shape \(N,\) = \(6,\)"):
            aurc(probs, labels[:5])
        with pytest.raises(ValueError, match=r"`probs` must be a 2-D array of shape \(N, C\), got shape \(6,\)"):
            aurc(probs[:, 0], labels)
        with pytest.raises(ValueError, match=r"`probs` rows must sum to 1"):
            aurc(probs * 0.5, labels)
        with pytest.raises(ValueError, match=r"`labels` must have an integer dtype"):
            aurc(probs, labels.astype(float))


class TestAreaUnderGeneralizedRiskCoverage:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # E_k = 0, 0, 1, 1, 1, 2 (see TestAreaUnderRiskCoverage.test_main)
        # generalized risks E_k/N = 0, 0, 1/6, 1/6, 1/6, 2/6; sum 5/6; AUGRC = (5/6)/6 = 5/36
        probs, labels = worked
        assert augrc(probs, labels) == pytest.approx(5 / 36, abs=1e-12)

    def test_ties_hand(self) -> None:
        # E_k = 0, 1/3, 2/3, 1, 2 (see TestAreaUnderRiskCoverage.test_ties_hand)
        # AUGRC = (0 + 1/3 + 2/3 + 1 + 2)/5/5 = 4/25
        probs, labels = binary([0.9, 0.8, 0.8, 0.8, 0.6], [1, 0, 1, 1, 0])
        assert augrc(probs, labels) == pytest.approx(4 / 25, abs=1e-12)

    def test_independent_reference(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = random_case
        assert augrc(probs, labels) == pytest.approx(reference_areas(probs, labels)[1], abs=1e-12)

    @pytest.mark.parametrize("seed", [0, 1])
    def test_independent_reference_with_ties(self, seed: int) -> None:
        probs, labels = tied_case(seed)
        assert augrc(probs, labels) == pytest.approx(reference_areas(probs, labels)[1], abs=1e-12)

    def test_torch_uncertainty_convention(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        # torch-uncertainty: trapezoid of E_k/N over coverages k/N, divided by 1 - 1/N. No ties here.
        probs, labels = random_case
        n = len(labels)
        order = np.argsort(-probs.max(axis=1))
        generalized = np.cumsum((probs.argmax(axis=1) != labels)[order]) / n
        trapezoid = np.sum((generalized[1:] + generalized[:-1]) / 2) / n / (1 - 1 / n)
        expected = (n * augrc(probs, labels) - (generalized[0] + generalized[-1]) / 2) / (n - 1)
        assert trapezoid == pytest.approx(expected, abs=1e-12)

    def test_edge_cases(self) -> None:
        assert augrc(*binary([0.9, 0.7, 0.6], [1, 1, 1])) == 0.0
        # every one wrong: E_k = k, mean k/N over k = (N + 1)/(2N) = 4/6
        assert augrc(*binary([0.9, 0.7, 0.6], [0, 0, 0])) == pytest.approx(4 / 6, abs=1e-12)
        assert augrc(*binary([0.8], [0])) == 1.0
        # perfect ranking: E_k = 0, 0, 1, 2 -> 3/16; worst: 1, 2, 2, 2 -> 7/16
        assert augrc(*binary([0.9, 0.8, 0.7, 0.6], [1, 1, 0, 0])) == pytest.approx(3 / 16, abs=1e-12)
        assert augrc(*binary([0.9, 0.8, 0.7, 0.6], [0, 0, 1, 1])) == pytest.approx(7 / 16, abs=1e-12)

    def test_constant_confidence(self) -> None:
        # all tied: E_k = k·3/8, AUGRC = (3/8)·(N + 1)/(2N) = (3/8)(9/16)
        probs, labels = binary([0.75] * 8, [1, 0, 1, 1, 0, 1, 0, 1])
        assert augrc(probs, labels) == pytest.approx(3 / 8 * 9 / 16, abs=1e-12)

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"`labels` must be in \[0, C\) = \[0, 3\)"):
            augrc(probs, labels + 1)
        with pytest.raises(ValueError, match=r"`probs` must contain at least one sample"):
            augrc(np.zeros((0, 3)), np.zeros(0, dtype=int))
        with pytest.raises(ValueError, match=r"`probs` must be finite"):
            augrc(np.where(probs == 0.9, np.nan, probs), labels)


class TestTies:
    @pytest.mark.parametrize("metric", [aurc, augrc], ids=["aurc", "augrc"])
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_input_order_does_not_matter(self, metric, seed: int) -> None:
        probs, labels = tied_case(seed)
        permutation = np.random.default_rng(100 + seed).permutation(len(labels))
        assert metric(probs[permutation], labels[permutation]) == pytest.approx(metric(probs, labels), abs=1e-12)
        # reversing the order flips every tie-break of a stable sort
        assert metric(probs[::-1], labels[::-1]) == pytest.approx(metric(probs, labels), abs=1e-12)

    def test_mean_over_every_order_of_the_ties(self) -> None:
        # 7 samples, confidences from {.9, .7, .6}: the value equals the naive (no tie handling) value
        # averaged over all 7! input orders, each sorted stably by decreasing confidence.
        confidences = [0.7, 0.9, 0.7, 0.6, 0.9, 0.7, 0.6]
        correct = [1, 0, 0, 1, 1, 1, 0]
        probs, labels = binary(confidences, correct)
        totals = np.zeros(2)
        orders = list(itertools.permutations(range(7)))
        for order in orders:
            ranked = sorted(order, key=lambda i: -confidences[i])  # stable: ties keep the input order
            totals += naive_areas([confidences[i] for i in ranked], [1 - correct[i] for i in ranked])
        expected = totals / len(orders)
        assert aurc(probs, labels) == pytest.approx(expected[0], abs=1e-12)
        assert augrc(probs, labels) == pytest.approx(expected[1], abs=1e-12)

    def test_no_ties_is_the_plain_definition(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        order = np.argsort(-probs.max(axis=1))
        wrong = (probs.argmax(axis=1) != labels)[order].astype(int).tolist()
        expected = naive_areas(probs.max(axis=1)[order].tolist(), wrong)
        assert (aurc(probs, labels), augrc(probs, labels)) == pytest.approx(expected, abs=1e-12)
