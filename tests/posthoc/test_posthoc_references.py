"""Each post-hoc calibrator against its reference on the seeded over-confident logits of tests/reference_cases.py at
K = 2, 10 and 100 classes (docs/how-to/reference-checks.md has the table).

A reference is netcal 1.4 or probmetrics 1.3 where it implements calib's variant, else the paper's objective or
algorithm restated in posthoc_references.py. The gradient fits compare the objective at both optima and the
parameters (SMS and SVS also the test probabilities); the non-parametric fits compare the calibrated test
probabilities. Probabilities are compared with an absolute tolerance only, so values below 1e-300 (a floor on exact
zeros) do not count. PTS has no reference implementation: its test checks the properties the paper states.
"""

import numpy as np
import posthoc_references as ref
import pytest
import torch
from reference_cases import CLASS_COUNTS, reference_split
from scipy.special import log_softmax, softmax

from calib.posthoc import POSTHOC, TemperatureScaling
from calib.posthoc.bbq import BBQ
from calib.posthoc.classwise_ts import ClasswiseTemperatureScaling
from calib.posthoc.dirichlet import DirichletCalibration
from calib.posthoc.ensemble_ts import EnsembleTemperatureScaling
from calib.posthoc.histogram_binning import HistogramBinningEqualMass, HistogramBinningEqualWidth
from calib.posthoc.isotonic import IsotonicIRM, IsotonicOneVsRest
from calib.posthoc.parameterized_ts import ParameterizedTemperatureScaling
from calib.posthoc.smart import SMART
from calib.posthoc.spline import SplineCalibration
from calib.posthoc.vector_scaling import MatrixScaling, VectorScaling

CALIBRATION_SIZE = {2: 500, 10: 1000, 100: 3000}
"""About 20 or more calibration samples per class, so every parameter of the gradient fits is well determined."""

TEST_SIZE = 2000

OBJECTIVE_TOLERANCE = 1e-7
"""|L(calib's optimum) − L(the reference's optimum)| of the gradient fits (the issue's trial: within 1e-7; measured
here: at most 7e-12, TS against netcal; vector scaling, fitted by Newton's method, 7e-15 at K = 100)."""

PARAMETER_TOLERANCE = 1e-3
"""max |θ_calib − θ_reference| of the gradient fits (the issue's trial: within 1e-3; measured here: at most 2e-5,
TS's T against netcal; vector scaling 1.8e-6 at K = 100, 3.2e-4 when its fit stopped just below max|∂L/∂θ| = 1e-6:
the rarer a class, the flatter its intercept's direction, hence the ~20 samples a class of CALIBRATION_SIZE)."""

PROBABILITY_TOLERANCE = 1e-10
"""max |p̂_calib − p̂_reference| of the non-parametric fits' test probabilities, absolute (the issue's trial: about
1e-9; measured here: at most 2e-13, isotonic regression at K = 2, 4e-15 elsewhere)."""

STRUCTURED_OBJECTIVE_TOLERANCE = 2e-5
"""SMS, SVS: how far above calib's optimum the objective may be at probmetrics' (never below it, up to 1e-12).
probmetrics fits in float32 with torchmin's stopping rules (gtol 1e-5, xtol 1e-8) and ends where the restated
gradient is still up to 5e-4 (SMS at K = 100), calib in float64 at 1.1e-6, so the gap is probmetrics' early stop
(measured: at most 9e-6, SMS at K = 100)."""

STRUCTURED_PARAMETER_TOLERANCE = 1e-2
"""SMS, SVS: max |θ_calib − θ_probmetrics| (measured: at most 5.1e-3, SMS at K = 100; the same early stop)."""

STRUCTURED_PROBABILITY_TOLERANCE = 5e-3
"""SMS, SVS: max |p̂_calib − p̂_probmetrics| on the test set, absolute (measured: at most 1.9e-3, SMS at K = 10 and
100)."""

STRUCTURED_GRADIENT_TOLERANCE = 1e-5
"""SMS, SVS: max |∂L/∂θ| of the restated objective at calib's fit (its stop, 1e-6 in the preconditioned u =
θ·sqrt(1 + 2c), is at most 1e-6·sqrt(1 + 2c_M) in θ; measured: at most 2.1e-7). L is strictly convex (every θ
penalised): this point is its one minimum up to that gradient."""


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=CLASS_COUNTS, ids=lambda k: f"K{k}")
def split(request):
    """One calibration and test draw per K (seed K)."""
    k = request.param
    return reference_split(k, CALIBRATION_SIZE[k], TEST_SIZE, seed=k)


@pytest.fixture(scope="module")
def netcal():
    """netcal 1.4 (the test extra), imported on first use: it pulls in pyro, tensorboard and matplotlib."""
    import netcal.binning
    import netcal.scaling

    return netcal


@pytest.fixture(scope="module")
def probmetrics():
    """probmetrics 1.3's calibrators (the test extra), the implementations CalArena runs, imported on first use."""
    import probmetrics.calibrators

    return probmetrics.calibrators


def calibrated(calibrator, logits):
    """The calibrator's test probabilities, numpy float64."""
    return calibrator.probs(torch.from_numpy(logits)).numpy()


def assert_probabilities_close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=0, atol=PROBABILITY_TOLERANCE)


# --- Gradient fits: the objective at both optima and the parameters ---------------------------------------------------


def test_temperature_scaling_against_netcal(split, netcal):
    # netcal 1.4 TemperatureScaling (MLE: scipy L-BFGS-B on the NLL of softmax(w·x), w = 1/T, x = log of the
    # probabilities clipped to [eps, 1 − eps]; at K = 2 its binary form sigmoid(w·logit p_1), the same model).
    # calib fits the same x.
    probs, labels = softmax(split.calibration_logits, axis=1), split.calibration_labels
    eps = np.finfo(np.float64).eps
    logits = np.log(np.clip(probs, eps, 1 - eps))
    reference = 1.0 / np.asarray(netcal.scaling.TemperatureScaling().fit(probs, labels, tensorboard=False).weights)[0]
    temperature = TemperatureScaling().fit(torch.from_numpy(logits), torch.from_numpy(labels)).temperature.item()
    gap = ref.mean_nll(logits / temperature, labels) - ref.mean_nll(logits / reference, labels)
    assert abs(gap) < OBJECTIVE_TOLERANCE
    assert abs(temperature - reference) < PARAMETER_TOLERANCE


def test_vector_scaling_against_the_objective(split):
    # Guo et al. 2017 §4.2: the NLL of softmax(w ⊙ z + b), restated with its gradient and minimised by scipy.
    logits, labels = split.calibration_logits, split.calibration_labels
    w, b = ref.vector_scaling(logits, labels)
    vs = VectorScaling().fit(*split.calibration_tensors())
    calib_w, calib_b = vs.weight.numpy(), vs.bias.numpy()
    gap = ref.mean_nll(logits * calib_w + calib_b, labels) - ref.mean_nll(logits * w + b, labels)
    assert abs(gap) < OBJECTIVE_TOLERANCE
    np.testing.assert_allclose(calib_w, w, rtol=0, atol=PARAMETER_TOLERANCE)
    np.testing.assert_allclose(calib_b, b, rtol=0, atol=PARAMETER_TOLERANCE)  # both with Σ b = 0


@pytest.mark.parametrize("calibrator_class", [MatrixScaling, DirichletCalibration], ids=["MS-ODIR", "Dir-ODIR"])
def test_odir_against_the_objective(split, calibrator_class):
    # Kull et al. 2019 §3–§5: NLL + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² of softmax(x Wᵀ + b), x = z (MS) or
    # log softmax(z) (Dir), restated and minimised by scipy. λ and μ explicit, the same per-entry coefficients
    # λ/(C(C−1)) = 10 and μ/C = 0.1 at every K.
    k = split.num_classes
    off_diagonal_weight, intercept_weight = 10.0 * k * (k - 1), 0.1 * k
    logits, labels = split.calibration_logits, split.calibration_labels
    features = logits if calibrator_class is MatrixScaling else log_softmax(logits, axis=1)
    w, b = ref.odir_fit(features, labels, off_diagonal_weight, intercept_weight)
    fit = calibrator_class(off_diagonal_weight=off_diagonal_weight, intercept_weight=intercept_weight)
    fit.fit(*split.calibration_tensors())
    calib_w, calib_b = fit.weight.numpy(), fit.bias.numpy()
    gap = (ref.odir_objective(calib_w, calib_b, features, labels, off_diagonal_weight, intercept_weight)
           - ref.odir_objective(w, b, features, labels, off_diagonal_weight, intercept_weight))
    assert abs(gap) < OBJECTIVE_TOLERANCE
    np.testing.assert_allclose(calib_w, w, rtol=0, atol=PARAMETER_TOLERANCE)
    np.testing.assert_allclose(calib_b, b, rtol=0, atol=PARAMETER_TOLERANCE)


def test_classwise_ts_against_the_objective(split):
    # docs/methods.md §5.3: Frenkel & Goldberger's model z_k / T_k with the NLL objective, restated and minimised
    # by scipy over the inverse temperatures (where it is convex) from 1, not from calib's TS start.
    logits, labels = split.calibration_logits, split.calibration_labels
    temperatures = ref.classwise_temperatures(logits, labels)
    calib_temperatures = ClasswiseTemperatureScaling().fit(*split.calibration_tensors()).temperatures.numpy()
    gap = ref.mean_nll(logits / calib_temperatures, labels) - ref.mean_nll(logits / temperatures, labels)
    assert abs(gap) < OBJECTIVE_TOLERANCE
    np.testing.assert_allclose(calib_temperatures, temperatures, rtol=0, atol=PARAMETER_TOLERANCE)


def test_ensemble_ts_against_the_objective(split):
    # Zhang et al. 2020 (Mix-n-Match) §3 and its ets_calibrate: T ∈ [0.05, 5] by the "mse" loss of softmax(z/T),
    # then w on the simplex by the loss of w1 softmax(z/T) + w2 softmax(z) + w3/C; restated, stage 2 solved exactly.
    logits, labels = split.calibration_logits, split.calibration_labels
    temperature, weights = ref.ensemble_ts(logits, labels)
    ets = EnsembleTemperatureScaling("mse").fit(*split.calibration_tensors())
    calib_probs, reference_probs = calibrated(ets, logits), ref.ensemble_probs(logits, temperature, weights)
    gap = ref.brier_per_entry(calib_probs, labels) - ref.brier_per_entry(reference_probs, labels)
    assert abs(gap) < OBJECTIVE_TOLERANCE
    assert abs(ets.temperature.item() - temperature) < PARAMETER_TOLERANCE
    np.testing.assert_allclose(ets.weights.numpy(), weights, rtol=0, atol=PARAMETER_TOLERANCE)


def test_smart_against_the_objective(split):
    # SMART (arXiv 2506.23492 §3; official losses.py): the Charbonnier SoftECE of the calibrated confidences,
    # restated. calib's fit (the best state, restored) must score what calib reports under the restated objective,
    # and no worse than scipy's best single temperature T ≥ 0.1, which SMART's temperature network can output.
    logits, labels = split.calibration_logits[:500], split.calibration_labels[:500]
    smart = SMART(max_epochs=300, seed=0).fit(torch.from_numpy(logits), torch.from_numpy(labels))
    correct = (logits.argmax(axis=1) == labels).astype(np.float64)
    objective = ref.smooth_soft_ece(calibrated(smart, logits).max(axis=1), correct)
    assert abs(objective - smart.best_loss) < 1e-12
    assert objective < ref.best_constant_temperature_soft_ece(logits, labels)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")  # torchmin, probmetrics' fit
@pytest.mark.parametrize("name", ["svs", "sms"])
def test_structured_scaling_against_probmetrics(split, probmetrics, name):
    # Berta et al. 2026 (arXiv 2511.03685): probmetrics 1.3 get_calibrator(name) with its defaults (what CalArena
    # runs) on softmax(z). Both: T by NLL, x = log((1 − ε) softmax(z/T) + ε/K) with ε = 1/(n + 1), then the deviations
    # from the identity under the ridge penalties (1·K/n, 1·K/n, 1·K(K−1)/n). The objective is restated in
    # posthoc_references.py and evaluated at both fits on calib's float64 x.
    logits, labels = split.calibration_logits, split.calibration_labels
    k, n = split.num_classes, len(labels)
    reference = probmetrics.get_calibrator(name).fit(softmax(logits, axis=1), labels)
    weight, reference_bias = ((reference.W_[:, :k], reference.W_[:, k]) if name == "sms"
                              else (reference.v_, reference.b_))  # float32: its fit's precision
    reference_deviation = weight.astype(np.float64) - (np.eye(k) if name == "sms" else 1.0)
    reference_bias = reference_bias.astype(np.float64)
    calibrator = POSTHOC.create(name).fit(*split.calibration_tensors())
    deviation, bias = calibrator.weight_deviation.numpy(), calibrator.bias.numpy()
    assert calibrator.temperature == pytest.approx(1.0 / reference.ts_.cal_.invtemp_, abs=1e-5)
    penalties = ref.structured_penalties(k, n, (1.0, 1.0, 1.0 if name == "sms" else 0.0))  # SVS: no M
    np.testing.assert_allclose(calibrator.coefficients, penalties, rtol=1e-14)
    x = ref.ts_mix_log_probabilities(logits, calibrator.temperature, n)
    ours = ref.structured_objective(deviation, bias, x, labels, penalties)
    theirs = ref.structured_objective(reference_deviation, reference_bias, x, labels, penalties)
    assert ours <= theirs + 1e-12 and theirs - ours < STRUCTURED_OBJECTIVE_TOLERANCE
    gradients = ref.structured_gradient(deviation, bias, x, labels, penalties)
    assert max(np.abs(g).max() for g in gradients) < STRUCTURED_GRADIENT_TOLERANCE
    np.testing.assert_allclose(deviation, reference_deviation, rtol=0, atol=STRUCTURED_PARAMETER_TOLERANCE)
    np.testing.assert_allclose(bias, reference_bias, rtol=0, atol=STRUCTURED_PARAMETER_TOLERANCE)
    reference_probs = reference.predict_proba(softmax(split.test_logits, axis=1))
    np.testing.assert_allclose(calibrated(calibrator, split.test_logits), reference_probs, rtol=0,
                               atol=STRUCTURED_PROBABILITY_TOLERANCE)


# --- PTS: no reference implementation; the paper's properties --------------------------------------------------------


def test_parameterized_ts_properties(split):
    # Tomani et al. 2022 (ECCV) publish TensorFlow code only (tochris/pts-uncertainty); there is no Python package to
    # compare with. The paper's properties: T(z) > 0 is a function of the sorted top-k logits, so (1) the prediction
    # is unchanged, (2) permuting the classes permutes the output alike, (3) fitting lowers the MSE it minimises.
    logits, labels = split.calibration_logits, split.calibration_labels
    pts = ParameterizedTemperatureScaling(lr=1e-3, steps=200, seed=0)
    pts.fit(torch.from_numpy(logits), torch.from_numpy(labels))
    probs = calibrated(pts, split.test_logits)
    np.testing.assert_array_equal(probs.argmax(axis=1), split.test_logits.argmax(axis=1))
    permutation = np.random.default_rng(0).permutation(split.num_classes)
    # the same T exactly; the softmax sums the classes in another order
    np.testing.assert_allclose(calibrated(pts, split.test_logits[:, permutation]), probs[:, permutation], rtol=1e-12)
    assert pts.loss_history[-1] < pts.loss_history[0]
    uncalibrated = softmax(split.test_logits, axis=1)
    assert ref.brier_per_entry(probs, split.test_labels) < ref.brier_per_entry(uncalibrated, split.test_labels)


# --- Non-parametric fits: the calibrated test probabilities -----------------------------------------------------------


def test_isotonic_against_netcal(split, netcal):
    # netcal 1.4 IsotonicRegression: one-vs-rest sklearn isotonic regressions, rows renormalised (K = 2: one
    # regression on p_1, which calib's two complementary ones reproduce). netcal would leave a row whose every g_k is 0
    # as 0/0 where calib makes it uniform; no test row here is one.
    probs, test = softmax(split.calibration_logits, axis=1), softmax(split.test_logits, axis=1)
    reference = netcal.binning.IsotonicRegression().fit(probs, split.calibration_labels).transform(test)
    actual = calibrated(IsotonicOneVsRest().fit(*split.calibration_tensors()), split.test_logits)
    assert_probabilities_close(actual[:, 1] if split.num_classes == 2 else actual, reference)


def test_isotonic_irm_against_the_algorithm(split):
    # Zhang et al. 2020 (Mix-n-Match) §3 and its mir_calibrate: one isotonic regression on the pooled pairs
    # (p_ik, 1[y_i = k]) plus ε·p_k, ε = 1e-9; restated with a pool-adjacent-violators loop.
    probs = softmax(split.calibration_logits, axis=1)
    expected = ref.isotonic_irm(probs, split.calibration_labels, softmax(split.test_logits, axis=1))
    assert_probabilities_close(calibrated(IsotonicIRM().fit(*split.calibration_tensors()), split.test_logits), expected)


def test_histogram_binning_equal_width_against_netcal(split, netcal):
    # netcal 1.4 HistogramBinning(bins=15) (equal_intervals=True, its default): bins linspace(0, 1, 16), an empty bin's
    # value its midpoint, one-vs-rest renormalised (a class without samples 0; none here); at K = 2 one binning of p_1,
    # which it returns alone. Its fit bins [lower, upper), its transform (lower, upper]; calib both (lower, upper]: no
    # score here lies on an edge. K = 100 has empty bins (their midpoints are compared too).
    probs, test = softmax(split.calibration_logits, axis=1), softmax(split.test_logits, axis=1)
    edges = np.linspace(0, 1, 16)[1:-1]
    assert not np.isin(probs, edges).any() and not np.isin(test, edges).any()
    reference = netcal.binning.HistogramBinning(bins=15).fit(probs, split.calibration_labels).transform(test)
    actual = calibrated(HistogramBinningEqualWidth(num_bins=15).fit(*split.calibration_tensors()), split.test_logits)
    assert_probabilities_close(actual[:, 1] if split.num_classes == 2 else actual, reference)


def test_histogram_binning_against_the_algorithm(split):
    # Zadrozny & Elkan 2001: equal-frequency bins per class (docs/methods.md §5.9's cuts), the bins' fractions of
    # positives, rows renormalised (HB-EM). netcal's HistogramBinning bins by equal width (the test above; equal mass
    # is fit-only there).
    probs = softmax(split.calibration_logits, axis=1)
    expected = ref.histogram_binning(probs, split.calibration_labels, softmax(split.test_logits, axis=1), 15)
    actual = calibrated(HistogramBinningEqualMass(num_bins=15).fit(*split.calibration_tensors()), split.test_logits)
    assert_probabilities_close(actual, expected)


def test_bbq_against_the_algorithm(split):
    # Naeini et al. 2015 §3: the BDeu-scored equal-frequency binnings, all averaged (docs/methods.md §5.10).
    # netcal's BBQ scores by BIC/AIC over equal-width bins, another variant.
    probs = softmax(split.calibration_logits, axis=1)
    expected = ref.bbq(probs, split.calibration_labels, softmax(split.test_logits, axis=1))
    assert_probabilities_close(calibrated(BBQ().fit(*split.calibration_tensors()), split.test_logits), expected)


def test_spline_against_the_algorithm(split):
    # Gupta et al. 2021 §4: the natural-spline fit of cumulative accuracy − score, its derivative + score at the
    # calibration scores, interpolated linearly (the official interpolated_function swaps the weights).
    probs, test = softmax(split.calibration_logits, axis=1), softmax(split.test_logits, axis=1)
    expected = ref.spline_confidence(probs, split.calibration_labels, test.max(axis=1))
    spline = SplineCalibration(num_knots=6).fit(*split.calibration_tensors())
    np.testing.assert_allclose(spline.calibrated_confidence(test.max(axis=1)), expected, rtol=0,
                               atol=PROBABILITY_TOLERANCE)
