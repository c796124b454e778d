"""Isotonic regression, one-vs-rest and IRM (docs/methods.md §5): against sklearn directly and hand-computed PAV."""


import numpy as np
import pytest
import torch
from posthoc_cases import check_runs_as_a_method, edge_case_data
from scipy.special import softmax
from sklearn.isotonic import IsotonicRegression

from calib._config import from_dict
from calib.methods import METHODS
from calib.posthoc import POSTHOC
from calib.posthoc.isotonic import IsotonicConfig, IsotonicIRM, IsotonicIRMConfig, IsotonicOneVsRest

CALIBRATORS = [IsotonicOneVsRest, IsotonicIRM]


def binary_logits(p1):
    """Logits whose softmax is (1 − p1, p1)."""
    p1 = torch.tensor(p1, dtype=torch.float64)
    return torch.stack([(1 - p1).log(), p1.log()], dim=1)


@pytest.fixture(scope="module")
def random_data():
    g = torch.Generator().manual_seed(0)
    logits = 2.0 * torch.randn(3000, 6, generator=g, dtype=torch.float64)
    labels = torch.multinomial((0.5 * logits).softmax(1), 1, generator=g).squeeze(1)
    test = 2.0 * torch.randn(1000, 6, generator=g, dtype=torch.float64)
    return logits, labels, test


def test_one_vs_rest_matches_sklearn(random_data):
    logits, labels, test = random_data
    probs, probs_test = softmax(logits.numpy(), axis=1), softmax(test.numpy(), axis=1)
    mapped = np.stack([
        IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)
        .fit(probs[:, k], labels.numpy() == k).predict(probs_test[:, k]) for k in range(6)
    ], axis=1)
    expected = mapped / mapped.sum(1, keepdims=True)
    calibrator = IsotonicOneVsRest().fit(logits, labels)
    np.testing.assert_allclose(calibrator.probs(test).numpy(), expected, rtol=1e-12, atol=1e-15)


def test_irm_matches_sklearn_on_pooled_pairs(random_data):
    logits, labels, test = random_data
    probs, probs_test = softmax(logits.numpy(), axis=1), softmax(test.numpy(), axis=1)
    one_hot = np.eye(6)[labels.numpy()]
    regressor = IsotonicRegression(out_of_bounds="clip").fit(probs.flatten(), one_hot.flatten())
    mapped = regressor.predict(probs_test.flatten()).reshape(probs_test.shape) + 1e-9 * probs_test
    expected = mapped / mapped.sum(1, keepdims=True)
    calibrator = IsotonicIRM().fit(logits, labels)
    np.testing.assert_allclose(calibrator.probs(test).numpy(), expected, rtol=1e-12, atol=1e-15)
    assert torch.equal(calibrator.probs(test).argmax(1), test.argmax(1))  # IRM keeps the argmax


# Hand-computed PAV. Class 1: scores 0.1..0.6 with targets 0,1,0,0,1,1 → 0, 1/3, 1/3, 1/3, 1, 1.
# Class 0: scores 0.4..0.9 (ascending) with targets 0,0,1,1,0,1 → 0, 0, 2/3, 2/3, 2/3, 1.
HAND_P1 = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
HAND_LABELS = [0, 1, 0, 0, 1, 1]


def test_one_vs_rest_hand_computed_pav():
    calibrator = IsotonicOneVsRest().fit(binary_logits(HAND_P1), torch.tensor(HAND_LABELS))
    probs = calibrator.probs(binary_logits([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.15, 0.05, 0.95]))
    expected_p1 = [0, 1 / 3, 1 / 3, 1 / 3, 1, 1,
                   1 / 6,  # interpolated: class 1 at 0.15 → 1/6, class 0 at 0.85 → 5/6
                   0,      # below the range: class 1 clipped to g(0.1) = 0, class 0 to g(0.9) = 1
                   1]      # above: class 1 g(0.6) = 1, class 0 g(0.4) = 0 (clipped)
    np.testing.assert_allclose(probs[:, 1].numpy(), expected_p1, atol=1e-12)
    np.testing.assert_allclose(probs.sum(1).numpy(), 1.0, atol=1e-12)
    np.testing.assert_allclose(calibrator.regressors[1].predict([0.1, 0.2, 0.35, 0.5]), [0, 1 / 3, 1 / 3, 1])


def test_irm_hand_computed_pav():
    # Pooled (score: targets): 0.1: 0 | 0.2: 1 | 0.3: 0 | 0.4: 0, 0 | 0.5: 1, 0 | 0.6: 1, 1 | 0.7: 1 | 0.8: 0 | 0.9: 1
    # PAV: 0.1 → 0; 0.2-0.4 → 1/4; 0.5 → 1/2; 0.6-0.8 → 3/4; 0.9 → 1.
    calibrator = IsotonicIRM().fit(binary_logits(HAND_P1), torch.tensor(HAND_LABELS))
    g = calibrator.regressor.predict([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    np.testing.assert_allclose(g, [0, 0.25, 0.25, 0.25, 0.5, 0.75, 0.75, 0.75, 1.0], atol=1e-12)
    probs = calibrator.probs(binary_logits([0.1, 0.3, 0.5]))
    eps = 1e-9
    expected_p1 = [(0 + eps * 0.1) / (1 + eps), (0.25 + eps * 0.3) / (1 + eps), 0.5]
    np.testing.assert_allclose(probs[:, 1].numpy(), expected_p1, rtol=1e-12, atol=1e-20)


def test_one_vs_rest_can_change_the_argmax_and_irm_cannot():
    # Rows (0.5, 0.4, 0.1) are always class 1; (0.1, 0.1, 0.8) class 2; (0.9, 0.05, 0.05) class 0.
    # One-vs-rest: g_0(0.5) = 0 (0.5 is never class 0 but 0.9 is), g_1(0.4) = 1, g_2(0.1) = 0, so the
    # first rows become (0, 1, 0): the argmax moves from 0 to 1. IRM pools 0.4 (positive) with 0.5
    # (negative) into g = 1/2 on both, and ε·p keeps class 0 on top.
    rows = torch.tensor([[0.5, 0.4, 0.1], [0.1, 0.1, 0.8], [0.9, 0.05, 0.05]], dtype=torch.float64)
    logits, labels = rows.log().repeat(10, 1), torch.tensor([1, 2, 0]).repeat(10)
    one_vs_rest = IsotonicOneVsRest().fit(logits, labels).probs(rows.log())
    torch.testing.assert_close(one_vs_rest[0], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))
    irm = IsotonicIRM().fit(logits, labels).probs(rows.log())
    assert torch.equal(irm.argmax(1), torch.tensor([0, 2, 0]))
    np.testing.assert_allclose(irm[0, :2].numpy(), [0.5, 0.5], atol=1e-8)


@pytest.mark.parametrize("calibrator_class", CALIBRATORS)
@pytest.mark.parametrize(("name", "logits", "labels"), edge_case_data())
def test_edge_cases(calibrator_class, name, logits, labels):
    calibrator = calibrator_class().fit(logits, labels)
    test = torch.cat([logits, 4 * torch.randn(30, logits.shape[1], dtype=torch.float64)])
    out = calibrator(test)
    probs = calibrator.probs(test)
    assert torch.isfinite(out).all() and out.dtype == torch.float64
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))
    if name == "ties":  # identical rows, identical outputs
        torch.testing.assert_close(probs[:10].repeat(20, 1), probs[:200], rtol=0, atol=0)
    if name == "absent_class" and calibrator_class is IsotonicOneVsRest:
        assert (probs[:200, 4] < 1e-300).all()  # g_4 ≡ 0: the absent class gets (numerically) nothing


def test_registry_config_and_errors():
    assert POSTHOC.get("isotonic") is IsotonicOneVsRest and POSTHOC.get("isotonic_irm") is IsotonicIRM
    assert METHODS.get("isotonic").config is IsotonicConfig
    assert METHODS.get("isotonic_irm").config is IsotonicIRMConfig
    assert from_dict(IsotonicConfig, {"calibration_size": 100}).calibration_size == 100
    with pytest.raises(ValueError, match=r"`calibration_size` must be null .* got calibration_size=1"):
        IsotonicIRMConfig(calibration_size=1)
    with pytest.raises(RuntimeError, match=r"IsotonicIRM is not fitted"):
        IsotonicIRM()(torch.zeros(2, 3))
    calibrator = IsotonicOneVsRest().fit(torch.randn(20, 3), torch.arange(20) % 3)
    with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 4"):
        calibrator(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"`logits` must have shape \(N, C\) with C >= 2, got shape \(4, 1\)"):
        IsotonicIRM().fit(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long))


def test_runs_as_a_method_on_float32_logits():
    cases = [("isotonic", IsotonicConfig()), ("isotonic_irm", IsotonicIRMConfig(calibration_size=60))]
    check_runs_as_a_method(cases)
