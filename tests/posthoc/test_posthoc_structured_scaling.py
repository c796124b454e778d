"""Structured matrix scaling and structured vector scaling (calib/posthoc/structured_scaling.py, Berta et al. 2026).

The probmetrics 1.3 comparison at K = 2, 10 and 100 is in test_posthoc_references.py."""

import math
import warnings

import numpy as np
import posthoc_references as ref
import pytest
import torch
from posthoc_cases import check_runs_as_a_method, edge_case_data
from posthoc_cases import overconfident_logits as shifted_logits
from posthoc_cases import synthetic_logits as synthetic
from scipy.optimize import brentq
from scipy.special import expit

from calib._config import ConfigError, from_dict
from calib.methods import METHODS
from calib.posthoc import DegenerateFitWarning, TemperatureScaling
from calib.posthoc.structured_scaling import (
    StructuredMatrixScaling,
    StructuredMatrixScalingConfig,
    StructuredVectorScaling,
    StructuredVectorScalingConfig,
    penalty_coefficients,
    smoothed_log_probabilities,
)
from calib.store.schema import FIT

pytestmark = pytest.mark.usefixtures("one_thread")

HAND_LOGITS = torch.tensor([[1.0, 0.0]] * 3, dtype=torch.float64)
HAND_LABELS = torch.tensor([0, 0, 1])
"""Three samples with the same logits (1, 0), labels 0, 0, 1: TS makes p = (2/3, 1/3), the labels' frequencies, so
T = 1/ln 2; with n = 3, ε = 1/4 and q = ¾·(2/3, 1/3) + ¼·(½, ½) = (0.625, 0.375)."""


def hand_optimum(penalties: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """The fit of the hand case, by hand. Every sample has the same x = log q, so the NLL depends on the parameters θ
    only through the shift s = aᵀθ of the logit gap (a: ``directions``, ∂(ℓ_0 − ℓ_1)/∂θ): NLL(s) = −⅔ log σ(Δ + s)
    − ⅓ log σ(−Δ − s), Δ = log(0.625/0.375). The cheapest θ with aᵀθ = s under Σ c_j θ_j² is θ_j = s·(a_j/c_j)/S,
    S = Σ a_j²/c_j, at a cost s²/S; so s solves σ(Δ + s) − ⅔ + 2s/S = 0."""
    total = float((directions**2 / penalties).sum())
    gap = math.log(0.625 / 0.375)
    shift = brentq(lambda s: expit(gap + s) - 2 / 3 + 2 * s / total, -5.0, 5.0, xtol=1e-15)
    return shift * (directions / penalties) / total


class TestStructuredVectorScaling:
    def test_main(self):
        svs = StructuredVectorScaling().fit(HAND_LOGITS, HAND_LABELS)
        assert svs.temperature == pytest.approx(1 / math.log(2), rel=1e-8) and svs.mixture_weight == 0.25
        assert svs.coefficients[:2] == (2 / 3, 2 / 3)  # λ·K/n = 1·2/3
        x = np.log([0.625, 0.375])
        torch.testing.assert_close(smoothed_log_probabilities(HAND_LOGITS, svs.temperature, 0.25)[0],
                                   torch.from_numpy(x), rtol=0, atol=1e-8)
        # ℓ_0 − ℓ_1 = Δ + (v_0 x_0 − v_1 x_1 + b_0 − b_1): a = (x_0, −x_1, 1, −1) over (v_0, v_1, b_0, b_1)
        expected = hand_optimum(np.full(4, 2 / 3), np.array([x[0], -x[1], 1.0, -1.0]))
        fitted = torch.cat([svs.weight_deviation, svs.bias]).numpy()
        np.testing.assert_allclose(fitted, expected, rtol=0, atol=1e-7)
        assert not svs.degenerate and svs.fit_result.converged

    def test_errors(self):
        with pytest.raises(ValueError, match=r"`diagonal_strength` must be a finite number >= 0, got "
                                             r"diagonal_strength=-1.0\."):
            StructuredVectorScaling(diagonal_strength=-1.0)
        with pytest.raises(ValueError, match=r"`sample_exponent` must be a finite number, got sample_exponent=inf\."):
            StructuredVectorScaling(sample_exponent=math.inf)
        with pytest.raises(ValueError, match=r"`grad_tolerance` must be a finite number > 0, got grad_tolerance=0"):
            StructuredVectorScaling(grad_tolerance=0)
        with pytest.raises(RuntimeError, match=r"StructuredVectorScaling is not fitted"):
            StructuredVectorScaling()(HAND_LOGITS)
        with pytest.raises(ValueError, match=r"`logits` must have shape \(N, C\) with C >= 2, got shape \(3, 1\)"):
            StructuredVectorScaling().fit(HAND_LOGITS[:, :1], torch.zeros(3, dtype=torch.long))
        svs = StructuredVectorScaling().fit(HAND_LOGITS, HAND_LABELS)
        with pytest.raises(ValueError, match=r"`logits` must have the 2 classes of the fit, got 3"):
            svs(torch.zeros(3, 3, dtype=torch.float64))


class TestStructuredMatrixScaling:
    def test_main(self):
        # λ_M = 3: c_M = 3·(2·1)/3 = 2 on W_01, W_10; c_v = c_b = 2/3 on W_00, W_11, b_0, b_1.
        sms = StructuredMatrixScaling(off_diagonal_strength=3.0).fit(HAND_LOGITS, HAND_LABELS)
        assert sms.coefficients == (2 / 3, 2 / 3, 2.0)
        x = np.log([0.625, 0.375])
        # ℓ_0 − ℓ_1 = Δ + (W_00 x_0 + W_01 x_1 + b_0) − (W_10 x_0 + W_11 x_1 + b_1)
        expected = hand_optimum(np.array([2 / 3, 2.0, 2.0, 2 / 3, 2 / 3, 2 / 3]),
                                np.array([x[0], x[1], -x[0], -x[1], 1.0, -1.0]))
        fitted = torch.cat([sms.weight_deviation.flatten(), sms.bias]).numpy()
        np.testing.assert_allclose(fitted, expected, rtol=0, atol=1e-7)
        gap = math.log(0.625 / 0.375) + (expected[0] - expected[2]) * x[0] + (expected[1] - expected[3]) * x[1] + (
            expected[4] - expected[5])
        np.testing.assert_allclose(sms.probs(HAND_LOGITS)[:, 0].numpy(), expit(gap), rtol=0, atol=1e-7)

    def test_errors(self):
        with pytest.raises(ValueError, match=r"`off_diagonal_strength` must be a finite number >= 0, got "
                                             r"off_diagonal_strength=nan\."):
            StructuredMatrixScaling(off_diagonal_strength=math.nan)
        with pytest.raises(ConfigError, match=r"`off_diagonal_strength` must be a finite number >= 0, got "
                                              r"off_diagonal_strength=-0.5\."):
            StructuredMatrixScalingConfig(off_diagonal_strength=-0.5)
        with pytest.raises(ConfigError, match=r"`intercept_strength` must be a finite number >= 0, got "
                                              r"intercept_strength=inf\."):
            StructuredMatrixScalingConfig(intercept_strength=math.inf)
        with pytest.raises(ConfigError, match=r"`class_exponent` must be a finite number, got class_exponent=nan\."):
            StructuredVectorScalingConfig(class_exponent=math.nan)
        with pytest.raises(ConfigError, match=r"`calibration_size` must be null"):
            StructuredVectorScalingConfig(calibration_size=1)
        with pytest.raises(ConfigError, match=r"off_diagonal_strength"):  # SVS has no M: an unknown key
            from_dict(StructuredVectorScalingConfig, {"off_diagonal_strength": 1.0})


def test_defaults_are_the_papers():
    # probmetrics 1.3 get_calibrator("sms") / ("svs"): ridge, λ_b = λ_v = λ_M = 1, ρ = τ = 1.
    assert StructuredMatrixScalingConfig() == StructuredMatrixScalingConfig(
        intercept_strength=1.0, diagonal_strength=1.0, off_diagonal_strength=1.0, class_exponent=1.0,
        sample_exponent=1.0)
    assert penalty_coefficients(100, 5000, intercept_strength=1, diagonal_strength=1, off_diagonal_strength=1,
                                class_exponent=1, sample_exponent=1) == (0.02, 0.02, 1.98)
    # ρ = ½, τ = 2: (λ_b √K, λ_v √K, λ_M √(K(K−1))) / n²
    assert penalty_coefficients(10, 100, intercept_strength=2, diagonal_strength=3, off_diagonal_strength=4,
                                class_exponent=0.5, sample_exponent=2) == pytest.approx(
        (2 * math.sqrt(10) / 1e4, 3 * math.sqrt(10) / 1e4, 4 * math.sqrt(90) / 1e4), rel=1e-15)


@pytest.mark.parametrize("calibrator_class", [StructuredVectorScaling, StructuredMatrixScaling])
def test_strong_penalties_leave_the_preprocessed_map(calibrator_class):
    # Every deviation penalised at 1e12: the map is the identity on x, so p̂ is TS + Laplace smoothing, which keeps
    # the predicted class.
    z, y = synthetic(400, 10, seed=0)
    strong = dict(intercept_strength=1e12, diagonal_strength=1e12)
    if calibrator_class is StructuredMatrixScaling:
        strong["off_diagonal_strength"] = 1e12
    calibrator = calibrator_class(**strong).fit(z, y)
    test, _ = synthetic(500, 10, seed=1)
    temperature = TemperatureScaling().fit(z, y).temperature.item()
    expected = (1 - 1 / 401) * (test / temperature).softmax(1) + 1 / 401 / 10
    torch.testing.assert_close(calibrator.probs(test), expected, rtol=0, atol=1e-9)
    assert torch.equal(calibrator.probs(test).argmax(1), test.argmax(1))


def test_svs_is_sms_without_off_diagonal_entries():
    # λ_M = 1e12 holds M at ~0: SMS is then SVS (both fitted to a gradient of 1e-8, so they agree to ~1e-8)
    z, y = synthetic(600, 10, seed=2)
    svs = StructuredVectorScaling(grad_tolerance=1e-8).fit(z, y)
    sms_diagonal = StructuredMatrixScaling(off_diagonal_strength=1e12, grad_tolerance=1e-8).fit(z, y)
    torch.testing.assert_close(sms_diagonal.weight_deviation, torch.diag(svs.weight_deviation), rtol=0, atol=1e-7)
    torch.testing.assert_close(sms_diagonal.bias, svs.bias, rtol=0, atol=1e-7)
    # SVS's map is one SMS can take (M = 0): SMS's optimum is at least as low under SMS's objective
    sms = StructuredMatrixScaling().fit(z, y)
    x = smoothed_log_probabilities(z, sms.temperature, sms.mixture_weight).numpy()
    penalties = sms.coefficients
    at_sms = ref.structured_objective(sms.weight_deviation.numpy(), sms.bias.numpy(), x, y.numpy(), penalties)
    at_svs = ref.structured_objective(np.diag(svs.weight_deviation.numpy()), svs.bias.numpy(), x, y.numpy(), penalties)
    assert at_sms < at_svs


@pytest.mark.parametrize("calibrator_class", [StructuredVectorScaling, StructuredMatrixScaling])
def test_the_predicted_class_can_change(calibrator_class):
    # Labels drawn with class 1 shifted up by 2 nats: TS cannot follow, the intercepts do, and predictions move to
    # class 1 (SVS: 800 of 2000, all to class 1; SMS: 798, all but 3, its cross terms moving a few elsewhere).
    z, y = shifted_logits(2000, 4, seed=3, shift=[0.0, 2.0, 0.0, 0.0])
    calibrator = calibrator_class().fit(z, y)
    assert int(calibrator.bias.argmax()) == 1
    predicted = calibrator.probs(z).argmax(1)
    changed = predicted != z.argmax(1)
    assert changed.sum() > 500 and (predicted[changed] == 1).double().mean() > 0.99
    assert (predicted == y).double().mean() > (z.argmax(1) == y).double().mean()


@pytest.mark.parametrize("calibrator_class", [StructuredVectorScaling, StructuredMatrixScaling])
def test_permuting_the_classes_permutes_the_fit(calibrator_class):
    # The objective treats every class alike: relabelling the classes relabels the parameters and the output.
    z, y = synthetic(300, 5, seed=4)
    permutation = torch.tensor([3, 0, 4, 1, 2])
    inverse = torch.argsort(permutation)
    fit = calibrator_class().fit(z, y)
    permuted = calibrator_class().fit(z[:, permutation], inverse[y])
    test, _ = synthetic(100, 5, seed=5)
    torch.testing.assert_close(permuted.probs(test[:, permutation]), fit.probs(test)[:, permutation], rtol=0,
                               atol=1e-7)


def test_fit_details_are_store_columns():
    z, y = synthetic(500, 10, seed=6)
    sms, svs = StructuredMatrixScaling().fit(z, y), StructuredVectorScaling().fit(z, y)
    columns = {name for name, _, _ in FIT}
    assert set(sms.fit_details()) <= columns and set(svs.fit_details()) == set(sms.fit_details())
    details = sms.fit_details()
    assert details["fitted_temperature"] == sms.temperature and details["fitted_mixture_weight"] == 1 / 501
    assert (details["fitted_intercept_penalty"], details["fitted_diagonal_penalty"],
            details["fitted_off_diagonal_penalty"]) == (10 / 500, 10 / 500, 90 / 500)
    assert svs.fit_details()["fitted_off_diagonal_penalty"] is None and details["fit_degenerate"] is False


def test_a_degenerate_temperature_and_an_absent_class_are_flagged():
    z, y = synthetic(40, 20, seed=5)  # several of the 20 classes never occur
    with pytest.warns(DegenerateFitWarning, match=r"StructuredMatrixScaling: degenerate fit: .* absent from the "
                                                  r"calibration set: their parameters are fitted only to push"):
        sms = StructuredMatrixScaling().fit(z, y)
    assert "held by the ridge penalty alone" in sms.degenerate_reason
    separable = torch.randn(300, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.warns(DegenerateFitWarning, match=r"the temperature-scaling preprocessing: no finite optimum: every "
                                                  r"calibration sample's label has its row's top logit"):
        svs = StructuredVectorScaling().fit(separable, separable.argmax(1))
    assert svs.temperature == 0.05 and torch.isfinite(svs.probs(separable)).all()


@pytest.mark.parametrize(("name", "logits", "labels"), edge_case_data())
@pytest.mark.parametrize("calibrator_class", [StructuredVectorScaling, StructuredMatrixScaling])
def test_edge_cases(calibrator_class, name, logits, labels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        calibrator = calibrator_class().fit(logits, labels)
    probs = calibrator.probs(logits)
    assert torch.isfinite(probs).all() and calibrator.fit_result.converged
    torch.testing.assert_close(probs.sum(1), torch.ones(len(logits), dtype=torch.float64))
    assert (probs > 0).all()  # the Laplace smoothing keeps every class possible
    assert calibrator.degenerate == (name in ("absent_class", "ties", "50_samples_10_classes"))  # absent, T at 20


def test_runs_as_a_method():
    with warnings.catch_warnings():  # random logits: TS's optimum is above 20, flagged
        warnings.simplefilter("ignore", DegenerateFitWarning)
        check_runs_as_a_method([(name, METHODS.get(name).config(**fields)) for name in ("sms", "svs")
                                for fields in ({}, {"calibration_size": 60, "calibration_draw": 1})])
