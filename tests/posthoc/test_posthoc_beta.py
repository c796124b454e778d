"""Beta calibration (docs/methods.md §5.17): hand-computed fits, the family's identity and logistic (Platt) maps,
Algorithm 1's refit, the paper's objective restated and minimised by scipy's exact Newton, betacal 1.1 (one-vs-rest,
as Kull et al. 2019 ran it) and probmetrics 1.3's ``get_calibrator("beta")`` (binary only) on the reference cases."""

import math
import warnings

import numpy as np
import pytest
import torch
from posthoc_cases import check_runs_as_a_method, edge_case_data
from reference_cases import CLASS_COUNTS, reference_split
from scipy.optimize import minimize
from scipy.special import expit, log_softmax, logit, logsumexp, softmax

from calib._config import ConfigError, from_dict
from calib.methods import METHODS
from calib.posthoc import POSTHOC, DegenerateFitWarning
from calib.posthoc.beta import BetaCalibration, BetaCalibrationConfig, beta_features

pytestmark = pytest.mark.usefixtures("one_thread")

CALIBRATION_SIZE = {2: 500, 10: 1000, 100: 1000}
"""1,000 at K = 100 (10 a class on average), not test_posthoc_references.py's 3,000: the reference fits (scipy's and
betacal's) take ~0.5 s a class-set per 1,000 samples."""

TEST_SIZE = 1000

OBJECTIVE_TOLERANCE = 1e-12
"""|NLL_k(calib) − NLL_k(reference)| per class against the restated objective (measured: at most 4e-16, K = 10)."""

PARAMETER_TOLERANCE = 1e-6
"""max |θ_calib − θ_reference| against the restated objective (measured: 5e-11 at K = 2, 1.6e-8 at K = 10, 1e-7 at
K = 100, where a rare class's likelihood is flat along a nearly collinear (a, b))."""

PROBABILITY_TOLERANCE = 1e-7
"""max |p̂_calib − p̂_reference| of the test probabilities against the restated objective (measured: 9e-9, K = 100)."""

BETACAL_TOLERANCE = 1e-3
"""max |p̂_calib − p̂_betacal| at K = 2 and 10, and against probmetrics at K = 2 (measured: 7e-5, 1e-4 and 1e-4):
betacal's scikit-learn LogisticRegression stops at its lbfgs tolerance 1e-4, short of the optimum, and probmetrics
rounds the scores to float32 first."""


def binary_logits(p1):
    """Logits whose softmax is (1 − p1, p1)."""
    p1 = torch.tensor(p1, dtype=torch.float64)
    return torch.stack([(1 - p1).log(), p1.log()], dim=1)


def grouped(scores, counts, positives):
    """Binary calibration logits and labels: counts[g] samples of score scores[g], positives[g] of them class 1."""
    p1 = np.repeat(scores, counts)
    labels = np.concatenate([[1] * m + [0] * (n - m) for n, m in zip(counts, positives, strict=True)])
    return binary_logits(p1), torch.from_numpy(labels)


def saturated_parameters(scores, frequencies):
    """(a, b, c) of the beta map through three points: the maximum-likelihood fit on three distinct scores, since
    three parameters then reproduce each score's fraction of positives exactly."""
    scores = np.asarray(scores)
    features = np.stack([np.log(scores), -np.log(1 - scores), np.ones(3)], axis=1)
    return np.linalg.solve(features, logit(np.asarray(frequencies)))


def fitted_parameters(calibrator):
    return np.stack([calibrator.a.numpy(), calibrator.b.numpy(), calibrator.c.numpy()], axis=1)


@pytest.mark.parametrize(("frequencies", "expected"), [
    ((0.1, 0.5, 0.8), None),                                   # a general beta map, a ≠ b
    ((0.2, 0.5, 0.8), (1.0, 1.0, 0.0)),                        # calibrated scores: the identity, a = b = 1, c = 0
])
def test_three_scores_are_fitted_exactly(frequencies, expected):
    scores = [0.2, 0.5, 0.8]
    logits, labels = grouped(scores, [10, 10, 10], [round(10 * f) for f in frequencies])
    calibrator = BetaCalibration().fit(logits, labels)
    parameters = saturated_parameters(scores, frequencies)
    if expected is not None:
        np.testing.assert_allclose(parameters, expected, atol=1e-12)
    np.testing.assert_allclose(fitted_parameters(calibrator)[0], parameters, atol=1e-5)
    np.testing.assert_allclose(calibrator.probs(binary_logits(scores))[:, 1].numpy(), frequencies, atol=1e-6)
    assert calibrator.dropped == [""] and not calibrator.degenerate


def test_the_family_holds_logistic_calibration_on_the_log_odds():
    # Platt's σ(A·logit(s) + B) is the beta map a = b = A, c = B. With A = 2, B = ln 3 at s = ⅓, ½, ⅔ it gives
    # σ(ln ¾) = 3/7, σ(ln 3) = ¾, σ(ln 12) = 12/13: 3 of 7, 3 of 4 and 12 of 13 positives are its maximum likelihood.
    logits, labels = grouped([1 / 3, 1 / 2, 2 / 3], [7, 4, 13], [3, 3, 12])
    calibrator = BetaCalibration().fit(logits, labels)
    np.testing.assert_allclose(fitted_parameters(calibrator)[0], [2.0, 2.0, math.log(3)], atol=1e-5)
    s = np.linspace(0.01, 0.99, 50)
    np.testing.assert_allclose(calibrator.probs(binary_logits(s))[:, 1].numpy(),
                               expit(2 * logit(s) + math.log(3)), atol=1e-6)


def test_the_fitted_coefficients_are_store_columns(tmp_path):
    """Platt's case above (a = b = 2, c = ln 3) and the dropped a (0 in the column); at K = 3 one (a, b, c) per
    class, in class order; they survive a write and read of a store row."""
    import pyarrow as pa

    from calib.store.schema import trial_schema

    details = BetaCalibration().fit(*grouped([1 / 3, 1 / 2, 2 / 3], [7, 4, 13], [3, 3, 12])).fit_details()
    np.testing.assert_allclose([details[f"fitted_beta_{name}"] for name in "abc"], [[2.0], [2.0], [math.log(3)]],
                               atol=1e-5)
    dropped = BetaCalibration().fit(*grouped([0.2, 0.5, 0.8], [20, 20, 20], [5, 10, 18])).fit_details()
    assert dropped["fitted_beta_a"] == [0.0] and dropped["fitted_beta_b"][0] > 0
    rng = np.random.default_rng(0)
    logits, labels = torch.from_numpy(rng.normal(size=(300, 3)) * 2), torch.from_numpy(rng.integers(0, 3, 300))
    calibrator = BetaCalibration().fit(logits, labels)
    details = calibrator.fit_details()
    assert [len(details[f"fitted_beta_{name}"]) for name in "abc"] == [3, 3, 3]
    assert details["fitted_beta_c"] == calibrator.c.tolist()
    schema = trial_schema()
    row = pa.Table.from_pylist([{name: details.get(name) for name in schema.names}], schema=schema).to_pylist()[0]
    assert [row[f"fitted_beta_{name}"] for name in "abc"] == [details[f"fitted_beta_{name}"] for name in "abc"]


def test_a_negative_coefficient_is_dropped_and_the_rest_refitted():
    # Fractions ¼, ½, 9/10 at 0.2, 0.5, 0.8 need a = −0.042 < 0: Algorithm 1 refits σ(−b ln(1 − s) + c), whose
    # maximum likelihood the test finds by scipy.
    scores, counts, positives = np.array([0.2, 0.5, 0.8]), np.array([20, 20, 20]), np.array([5, 10, 18])
    assert saturated_parameters(scores, positives / counts)[0] < 0
    calibrator = BetaCalibration().fit(*grouped(scores, counts, positives))
    assert calibrator.dropped == ["a"] and calibrator.a.item() == 0.0

    def nll(theta):
        eta = -theta[0] * np.log(1 - scores) + theta[1]
        return float(np.sum(counts * np.logaddexp(0, eta) - positives * eta) / counts.sum())

    expected = minimize(nll, np.zeros(2), method="BFGS", options={"gtol": 1e-12}).x
    np.testing.assert_allclose([calibrator.b.item(), calibrator.c.item()], expected, atol=1e-5)
    assert not calibrator.degenerate


def test_the_features_are_exact_where_the_softmax_saturates():
    z = torch.tensor([[800.0, 0.0, -5.0], [0.0, 1e-3, 0.0]], dtype=torch.float64)
    log_s, log_rest = beta_features(z)
    expected_rest = np.stack([logsumexp(np.delete(z.numpy(), k, axis=1), axis=1) for k in range(3)], axis=1) \
        - logsumexp(z.numpy(), axis=1, keepdims=True)
    np.testing.assert_allclose(log_s.numpy(), log_softmax(z.numpy(), axis=1), rtol=1e-15)
    np.testing.assert_allclose(log_rest.numpy(), expected_rest, rtol=1e-14)
    # 1 − s_0 rounds to 0, ln(1 − s_0) = ln(1 + e^−5) − 800 does not
    assert log_rest[0, 0].item() == pytest.approx(math.log1p(math.exp(-5)) - 800, rel=1e-15)


def test_the_argmax_can_change():
    # Fractions of positives 0.1, 0.3, 0.9 at scores 0.3, 0.6, 0.9 (a = 0.23, b = 2.13): the score 0.6 gets p̂_1 = 0.3.
    calibrator = BetaCalibration().fit(*grouped([0.3, 0.6, 0.9], [10, 10, 10], [1, 3, 9]))
    probs = calibrator.probs(binary_logits([0.6]))
    assert probs[0, 1].item() == pytest.approx(0.3, abs=1e-9) and probs.argmax(1).item() == 0


@pytest.mark.parametrize(("labels", "fragment"), [
    ([0] * 12, r"class 1 absent from the calibration set: the likelihood has no finite optimum, so the map stopped"),
    ([0] * 6 + [1] * 6, r"class 1: the calibration samples are separated \(every one right, in-sample NLL < 0\.0001\)"),
])
def test_degenerate_binary_fits_are_flagged(labels, fragment):
    p1 = np.linspace(0.05, 0.95, 12)
    with pytest.warns(DegenerateFitWarning, match=r"BetaCalibration: degenerate fit: " + fragment):
        calibrator = BetaCalibration().fit(binary_logits(p1), torch.tensor(labels))
    assert torch.isfinite(calibrator(binary_logits(p1))).all()


def test_two_distinct_scores_are_not_identifiable():
    with pytest.warns(DegenerateFitWarning, match=r"class 1: fewer than 3 distinct calibration scores, so a, b and c "
                                                  r"are not identifiable"):
        calibrator = BetaCalibration().fit(*grouped([0.3, 0.7], [10, 10], [3, 6]))
    # the likelihood still fixes the two scores' probabilities: their fractions of positives
    np.testing.assert_allclose(calibrator.probs(binary_logits([0.3, 0.7]))[:, 1].numpy(), [0.3, 0.6], atol=1e-5)


def test_an_absent_class_is_flagged():
    split = reference_split(10, 300, 200, seed=4)
    z, y = split.calibration_tensors()
    keep = y != 3
    with pytest.warns(DegenerateFitWarning, match=r"class 3 absent from the calibration set: the likelihood has no "
                                                  r"finite optimum, so their maps stopped"):
        calibrator = BetaCalibration().fit(z[keep], y[keep])
    probs = calibrator.probs(torch.from_numpy(split.test_logits))
    assert probs[:, 3].max() < 1e-3 and (probs[:, 3] > 0).all()  # pushed towards 0, finitely


@pytest.mark.parametrize(("name", "logits", "labels"), edge_case_data())
def test_edge_cases(name, logits, labels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        calibrator = BetaCalibration().fit(logits, labels)
    g = torch.Generator().manual_seed(0)
    test = torch.cat([logits, 4 * torch.randn(30, logits.shape[1], generator=g, dtype=torch.float64)])
    probs = calibrator.probs(test)
    # finite calibrated logits; a near-separated class of the 50 samples can get p̂ below float64's range
    assert torch.isfinite(calibrator(test)).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))
    if name == "ties":  # 10 distinct rows: identical rows, identical outputs
        torch.testing.assert_close(probs[:10].repeat(20, 1), probs[:200], rtol=0, atol=0)
    if name == "absent_class":
        assert "class 4 absent from the calibration set" in calibrator.degenerate_reason


def test_registry_config_and_errors():
    assert POSTHOC.get("beta") is BetaCalibration and METHODS.get("beta").config is BetaCalibrationConfig
    assert from_dict(BetaCalibrationConfig, {"calibration_size": 50}).calibration_size == 50
    with pytest.raises(ConfigError, match=r"`calibration_size` must be null \(the whole validation split\) or an "
                                          r"integer >= 2, got calibration_size=0\."):
        BetaCalibrationConfig(calibration_size=0)
    with pytest.raises(ConfigError, match=r"Unknown key 'parameters' for BetaCalibrationConfig"):
        from_dict(BetaCalibrationConfig, {"parameters": "am"})
    with pytest.raises(ValueError, match=r"`grad_tolerance` must be > 0, got grad_tolerance=0"):
        BetaCalibration(grad_tolerance=0)
    with pytest.raises(RuntimeError, match=r"BetaCalibration is not fitted"):
        BetaCalibration()(torch.zeros(2, 3))
    calibrator = BetaCalibration().fit(torch.randn(30, 3), torch.arange(30) % 3)
    with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 4"):
        calibrator(torch.zeros(2, 4))


def test_runs_as_a_method_on_float32_logits():
    check_runs_as_a_method([("beta", BetaCalibrationConfig()), ("beta", BetaCalibrationConfig(calibration_size=60))])


# --- Reference checks on the seeded over-confident logits -------------------------------------------------------------


def restated_features(logits):
    """(ln s, ln(1 − s)) of s = softmax(z): ln(1 − s_k) = log Σ_{j≠k} e^{z_j} − log Σ_j e^{z_j}, class by class."""
    total = logsumexp(logits, axis=1)
    rest = np.stack([logsumexp(np.delete(logits, k, axis=1), axis=1) for k in range(logits.shape[1])], axis=1)
    return log_softmax(logits, axis=1), rest - total[:, None]


def restated_beta_fit(log_s, log_rest, targets):
    """Kull et al.'s Algorithm 1 on one class: the logistic regression of the targets on (ln s, −ln(1 − s)) by
    scipy's exact Newton (trust-exact, gradient and Hessian by hand), refitted without a if a < 0, else without b if
    b < 0; returns (a, b, c)."""
    columns = np.stack([log_s, -log_rest, np.ones_like(log_s)], axis=1)

    def fit(free):
        x = columns[:, free]

        def loss(w):
            eta = x @ w
            return (float(np.mean(np.logaddexp(0, eta) - targets * eta)),
                    x.T @ (expit(eta) - targets) / len(targets))

        def hessian(w):
            q = expit(x @ w)
            return (x * (q * (1 - q))[:, None]).T @ x / len(targets)

        w = minimize(loss, np.array([1.0, 1.0, 0.0])[free], jac=True, hess=hessian, method="trust-exact",
                     options={"gtol": 1e-12}).x
        theta = np.zeros(3)
        theta[free] = w
        return theta

    theta = fit(np.array([True, True, True]))
    if theta[0] < 0:
        return fit(np.array([False, True, True]))
    return fit(np.array([True, False, True])) if theta[1] < 0 else theta


def mean_nll(theta, log_s, log_rest, targets):
    """Per-class mean NLL (m,) of parameters theta (m, 3) on features and targets (N, m)."""
    eta = theta[:, 0] * log_s - theta[:, 1] * log_rest + theta[:, 2]
    return np.mean(np.logaddexp(0, eta) - targets * eta, axis=0)


def one_vs_rest(binary, num_classes):
    """The K = 2 pair (1 − μ, μ) or the renormalised one-vs-rest rows of the binary outputs μ (N, m)."""
    if num_classes == 2:
        return np.concatenate([1 - binary, binary], axis=1)
    return binary / binary.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module", params=CLASS_COUNTS, ids=lambda k: f"K{k}")
def case(request):
    """The split, calib's fit and its test probabilities, the classes of the binary problems, their calibration
    features and targets, per K (seed K)."""
    k = request.param
    split = reference_split(k, CALIBRATION_SIZE[k], TEST_SIZE, seed=k)
    calibrator = BetaCalibration().fit(*split.calibration_tensors())
    classes = [1] if k == 2 else list(range(k))
    log_s, log_rest = (f[:, classes] for f in restated_features(split.calibration_logits))
    targets = (split.calibration_labels[:, None] == np.array(classes)[None, :]).astype(np.float64)
    probs = calibrator.probs(torch.from_numpy(split.test_logits)).numpy()
    return split, calibrator, probs, classes, (log_s, log_rest, targets)


def test_against_the_restated_objective(case):
    split, calibrator, probs, classes, (log_s, log_rest, targets) = case
    reference = np.array([restated_beta_fit(log_s[:, j], log_rest[:, j], targets[:, j]) for j in range(len(classes))])
    assert calibrator.dropped == ["a" if a == 0 else "b" if b == 0 else "" for a, b, _ in reference]
    gap = mean_nll(fitted_parameters(calibrator), log_s, log_rest, targets) - mean_nll(reference, log_s, log_rest,
                                                                                      targets)
    assert np.abs(gap).max() < OBJECTIVE_TOLERANCE
    np.testing.assert_allclose(fitted_parameters(calibrator), reference, rtol=0, atol=PARAMETER_TOLERANCE)
    test_log_s, test_log_rest = (f[:, classes] for f in restated_features(split.test_logits))
    eta = reference[:, 0] * test_log_s - reference[:, 1] * test_log_rest + reference[:, 2]
    np.testing.assert_allclose(probs, one_vs_rest(expit(eta), split.num_classes), rtol=0, atol=PROBABILITY_TOLERANCE)


def test_against_betacal(case):
    # betacal 1.1's BetaCalibration(parameters="abm") class by class on the float64 softmax probabilities, renormalised
    # (Kull et al. 2019's OneVsRestCalibrator; probmetrics' MulticlassOneVsRestCalibrator at K = 2). Its
    # LogisticRegression(C=99999999999) stops at lbfgs's tolerance: calib's optimum must be at least as good on every
    # class (measured: betacal's NLL 1e-12 to 3e-5 above); the probabilities agree within 1e-3 at K = 2 and 10 (at
    # K = 100 betacal stops well short on rare classes: up to 0.07 apart).
    from betacal import BetaCalibration as Betacal

    split, calibrator, probs, classes, (log_s, log_rest, targets) = case
    calibration, test = softmax(split.calibration_logits, axis=1), softmax(split.test_logits, axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = [Betacal(parameters="abm").fit(calibration[:, k], split.calibration_labels == k) for k in classes]
    reference = np.array([[*fit.calibrator_.map_[:2], fit.calibrator_.lr_.intercept_[0]] for fit in fits])
    gap = mean_nll(fitted_parameters(calibrator), log_s, log_rest, targets) - mean_nll(reference, log_s, log_rest,
                                                                                      targets)
    assert gap.max() < OBJECTIVE_TOLERANCE
    if split.num_classes <= 10:
        expected = one_vs_rest(np.stack([fit.predict(test[:, k]) for fit, k in zip(fits, classes, strict=True)],
                                        axis=1), split.num_classes)
        np.testing.assert_allclose(probs, expected, rtol=0, atol=BETACAL_TOLERANCE)


def test_against_probmetrics_at_two_classes():
    # probmetrics 1.3 get_calibrator("beta") = BetacalCalibrator("abm"), what CalArena runs on its binary tasks: it
    # rounds p_1 to float32 and betacal clips it to [eps, 1 − eps] of float32. calib gets those same scores as logits.
    from probmetrics.calibrators import get_calibrator

    split = reference_split(2, CALIBRATION_SIZE[2], TEST_SIZE, seed=2)
    calibration, test = softmax(split.calibration_logits, axis=1), softmax(split.test_logits, axis=1)
    reference = get_calibrator("beta").fit(calibration, split.calibration_labels).predict_proba(test)
    eps = np.finfo(np.float32).eps

    def as_logits(probs):
        return binary_logits(np.clip(probs[:, 1].astype(np.float32), eps, 1 - eps).astype(np.float64))

    calibrator = BetaCalibration().fit(as_logits(calibration), torch.from_numpy(split.calibration_labels))
    np.testing.assert_allclose(calibrator.probs(as_logits(test)).numpy(), reference, rtol=0, atol=BETACAL_TOLERANCE)
