"""ODIR's λ and μ by Kull et al.'s 5-fold cross-validation (docs/methods.md §5.6, calib/posthoc/odir_cv.py): the
paper's grid, folds and rule; the path walk picks what the full grid picks; the choice is stored in the row; the fits'
speed-ups (Jacobi scaling, warm starts) keep the optimum."""

import warnings

import numpy as np
import posthoc_references as ref
import pytest
import torch
from posthoc_cases import overconfident_logits
from posthoc_cases import synthetic_logits as synthetic
from sklearn.model_selection import KFold
from test_posthoc_references import OBJECTIVE_TOLERANCE, PARAMETER_TOLERANCE
from test_posthoc_vector_scaling import scipy_matrix_scaling

from calib.methods import METHODS
from calib.posthoc import DegenerateFitWarning
from calib.posthoc.dirichlet import DirichletCalibration
from calib.posthoc.odir_cv import odir_grid, select_odir_weights
from calib.posthoc.vector_scaling import MatrixScaling, fit_odir

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_grid_is_the_papers_in_calibs_normalisation():
    # tune_cal_odir.py: λ_e ∈ {1, 0.25, 0.5}·10^e, μ_e ∈ 10^e, e = −5..6 (−2..6 for the 100-class data sets);
    # calib's λ/(C(C−1)) and μ/C are those per-entry coefficients.
    for num_classes, first in ((10, -5), (100, -2)):
        lambdas, mus = odir_grid(num_classes)
        per_entry = sorted(value / (num_classes * (num_classes - 1)) for value in lambdas)
        expected = sorted(f * 10.0**e for e in range(first, 7) for f in (1, 0.25, 0.5))
        np.testing.assert_allclose(per_entry, expected, rtol=1e-12)
        np.testing.assert_allclose(sorted(m / num_classes for m in mus), [10.0**e for e in range(first, 7)],
                                   rtol=1e-12)
        assert lambdas == sorted(lambdas, reverse=True) and mus == sorted(mus, reverse=True)  # strongest first


@pytest.mark.parametrize(("num_classes", "seed", "features"), [(3, 0, "logits"), (4, 1, "log_probs")])
def test_the_path_walk_picks_what_the_full_grid_picks(num_classes, seed, features):
    z, y = synthetic(240, num_classes, seed)
    x = z if features == "logits" else torch.log_softmax(z, 1)
    walked = select_odir_weights(x.numpy(), y.numpy(), fit_odir)
    full = select_odir_weights(x.numpy(), y.numpy(), fit_odir, patience=None)
    assert full.evaluated == full.grid_size == 36 * 12 and walked.evaluated < full.evaluated
    assert (walked.off_diagonal_weight, walked.intercept_weight) == (full.off_diagonal_weight, full.intercept_weight)
    assert walked.cv_nll == pytest.approx(full.cv_nll, rel=1e-9)


def test_the_chosen_pairs_loss_is_the_mean_held_out_nll_of_scikit_learns_folds():
    # Recomputed independently: KFold(5, shuffle, random_state=15) and scipy BFGS on each fold's training part.
    z, y = synthetic(200, 3, seed=2)
    selection = select_odir_weights(z.numpy(), y.numpy(), fit_odir)
    losses = []
    for train, held in KFold(n_splits=5, shuffle=True, random_state=15).split(np.arange(200)):
        w, b, _ = scipy_matrix_scaling(z[train].numpy(), y[train], selection.off_diagonal_weight,
                                       selection.intercept_weight)
        logits = z[held].numpy() @ w.T + b
        log_p = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(
            1, keepdims=True)
        losses.append(-log_p[np.arange(len(held)), y[held].numpy()].mean())
    assert selection.folds == 5 and selection.cv_nll == pytest.approx(np.mean(losses), abs=1e-5)


def test_a_given_weight_is_held_and_the_other_chosen():
    z, y = synthetic(150, 3, seed=3)
    ms = MatrixScaling(off_diagonal_weight=60.0).fit(z, y)
    assert ms.fitted_off_diagonal_weight == 60.0 and ms.selection.grid_size == 12
    assert ms.fitted_intercept_weight in odir_grid(3)[1]
    fixed = MatrixScaling(off_diagonal_weight=60.0, intercept_weight=0.3).fit(z, y)
    assert fixed.selection is None and fixed.fit_details()["cv_nll"] is None


def test_the_choice_is_in_the_row_and_the_final_fit_uses_it():
    z, y = synthetic(150, 4, seed=4)
    dirichlet = DirichletCalibration().fit(z, y)
    details = dirichlet.fit_details()
    assert details["fitted_off_diagonal_weight"] == dirichlet.selection.off_diagonal_weight
    assert details["fitted_intercept_weight"] == dirichlet.selection.intercept_weight
    assert details["cv_nll"] == dirichlet.selection.cv_nll and details["fit_degenerate"] is False
    refit = DirichletCalibration(off_diagonal_weight=details["fitted_off_diagonal_weight"],
                                 intercept_weight=details["fitted_intercept_weight"]).fit(z, y)
    torch.testing.assert_close(dirichlet.weight, refit.weight, rtol=0, atol=0)
    # as a method: the default config is the cross-validation, and the fit columns reach the outcome
    from types import SimpleNamespace

    splits = {"val": SimpleNamespace(features=torch.empty(150, 0), logits=z.float(), labels=y),
              "test": SimpleNamespace(features=torch.empty(20, 0), logits=z[:20].float(), labels=y[:20])}
    outcome = METHODS.get("dirichlet")(METHODS.get("dirichlet").config(), SimpleNamespace(splits=splits), seed=0,
                                       device=torch.device("cpu"))
    assert outcome.fit_details["fitted_off_diagonal_weight"] in odir_grid(4)[0]


def test_fewer_samples_than_folds_is_flagged():
    z = torch.randn(4, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with pytest.warns(DegenerateFitWarning, match=r"only 4 calibration samples: 4-fold instead of 5-fold"):
        ms = MatrixScaling().fit(z, torch.tensor([0, 1, 0, 1]))
    assert ms.selection.folds == 4


def test_the_fixed_weights_stay_an_option_and_cost_what_the_issue_measured_at_many_classes():
    # 20 classes, 1,000 samples: λ = 1000 is a per-entry coefficient of 2.6 here; the cross-validated choice is
    # at least as good on held-out data (the issue's 100-class case: NLL 4.32 fixed against 3.6 for TS).
    z, y = synthetic(1000, 20, seed=6)
    test, test_labels = synthetic(3000, 20, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        chosen = MatrixScaling().fit(z, y)
        fixed = MatrixScaling(off_diagonal_weight=1000.0, intercept_weight=0.1).fit(z, y)

    def nll(calibrator):
        return float(torch.nn.functional.cross_entropy(calibrator(test), test_labels))

    assert nll(chosen) <= nll(fixed) + 1e-3


# --- The fits' speed-ups keep the optimum (issue 45) ------------------------------------------------------------------

def sharp_log_probabilities(num_samples, num_classes, seed):
    """log p of a confident model, down to about −80 as DenseNet-BC-100's on CIFAR-100 (columns of widely different
    scales: the conditioning fit_odir's Jacobi scaling is for), with labels."""
    z, y = synthetic(num_samples, num_classes, seed)
    return torch.log_softmax(6.0 * z, 1).numpy(), y.numpy()


def assert_same_optimum(fitted, expected, x, y, off_diagonal_weight, intercept_weight):
    """``fitted`` (W, b, result) converged to ``expected`` (W, b): the ODIR objective within
    :data:`OBJECTIVE_TOLERANCE`, the parameters within :data:`PARAMETER_TOLERANCE`."""
    weight, bias, result = fitted
    expected_weight, expected_bias = expected
    gap = (ref.odir_objective(weight, bias, x, y, off_diagonal_weight, intercept_weight)
           - ref.odir_objective(expected_weight, expected_bias, x, y, off_diagonal_weight, intercept_weight))
    assert result.converged and abs(gap) < OBJECTIVE_TOLERANCE
    np.testing.assert_allclose(weight, expected_weight, rtol=0, atol=PARAMETER_TOLERANCE)
    np.testing.assert_allclose(bias, expected_bias, rtol=0, atol=PARAMETER_TOLERANCE)


def test_the_scaled_fit_reaches_the_reference_optimum_on_wide_log_probabilities():
    x, y = sharp_log_probabilities(600, 12, seed=8)
    assert x.min() < -60
    for per_entry_lambda, per_entry_mu in ((25.0, 1e6), (0.5, 0.01)):
        off_diagonal_weight, intercept_weight = per_entry_lambda * 12 * 11, per_entry_mu * 12
        assert_same_optimum(fit_odir(x, y, off_diagonal_weight, intercept_weight),
                            ref.odir_fit(x, y, off_diagonal_weight, intercept_weight), x, y, off_diagonal_weight,
                            intercept_weight)


def test_a_warm_start_reaches_the_cold_starts_optimum():
    # The cross-validation's warm starts (a neighbouring λ's or μ's solution, or a poor start) end within the
    # reference checks' tolerances of the fit from W = I, b = 0.
    x, y = sharp_log_probabilities(400, 8, seed=9)
    lambdas, mus = odir_grid(8)
    off_diagonal_weight, intercept_weight = lambdas[20], mus[6]
    cold = fit_odir(x, y, off_diagonal_weight, intercept_weight)[:2]
    neighbour = fit_odir(x, y, lambdas[19], intercept_weight)[:2]
    other_mu = fit_odir(x, y, off_diagonal_weight, mus[5])[:2]
    poor = (np.random.default_rng(0).normal(size=(8, 8)), np.full(8, 3.0))
    for start in (neighbour, other_mu, poor):
        assert_same_optimum(fit_odir(x, y, off_diagonal_weight, intercept_weight, init=[start]), cold, x, y,
                            off_diagonal_weight, intercept_weight)


def test_of_several_starts_the_lowest_objective_is_taken():
    x, y = sharp_log_probabilities(300, 5, seed=10)
    near = fit_odir(x, y, 40.0, 0.5)[:2]
    far = (5 * np.eye(5), np.full(5, -4.0))
    both = fit_odir(x, y, 20.0, 0.5, init=[far, near])
    alone = fit_odir(x, y, 20.0, 0.5, init=[near])
    np.testing.assert_array_equal(both[0], alone[0])  # the same start, so the same path
    assert both[2].steps == alone[2].steps


@pytest.mark.parametrize(("off_diagonal_weight", "intercept_weight"), [(0.0, 5.0), (30.0, 0.0), (0.0, 0.0)])
def test_the_scaling_keeps_what_no_penalty_fixes(off_diagonal_weight, intercept_weight):
    # The softmax ignores W + 1vᵀ and b + c·1: with λ = 0 (μ = 0) every gradient keeps the column sums of W (the
    # sum of b), and so do the scaled steps: the fit ends where an unscaled fit from W = I, b = 0 does.
    x, y = sharp_log_probabilities(300, 4, seed=11)
    weight, bias, result = fit_odir(x, y, off_diagonal_weight, intercept_weight)
    assert result.converged
    if off_diagonal_weight == 0:
        np.testing.assert_allclose(weight.sum(axis=0), np.ones(4), rtol=0, atol=1e-9)
    if intercept_weight == 0:
        assert abs(bias.sum()) < 1e-9


def test_warm_started_cross_validation_picks_what_cold_fits_pick():
    # Every fold fit from W = I, b = 0 instead of the path's warm starts: the same pair and the same cross-validated
    # loss within the fits' tolerance. Logits mixed across neighbouring classes, with per-class temperatures and
    # shifts, so that the optimum is inside the grid (at the strongest λ many pairs tie within that tolerance).
    z, y = overconfident_logits(300, 4, temperature=[1.0, 2.0, 3.0, 0.7], shift=[1.0, 0.0, -1.0, 0.5])
    x = (z @ (torch.eye(4, dtype=torch.float64) + 0.5 * torch.eye(4, dtype=torch.float64).roll(1, 1))).numpy()

    def cold(features, labels, off_diagonal_weight, intercept_weight, *, init, **options):
        return fit_odir(features, labels, off_diagonal_weight, intercept_weight, **options)

    warm, cold_selection = (select_odir_weights(x, y.numpy(), fit) for fit in (fit_odir, cold))
    assert 0 < warm.off_diagonal_weight < odir_grid(4)[0][0]
    assert (warm.off_diagonal_weight, warm.intercept_weight) == (cold_selection.off_diagonal_weight,
                                                                cold_selection.intercept_weight)
    assert warm.cv_nll == pytest.approx(cold_selection.cv_nll, abs=1e-6)


def test_the_faster_cross_validation_keeps_the_choice_at_100_classes():
    # Issue 62, without the real records: §5.12's over-confident 100-class logits (1,000 calibration and 1,000 test
    # samples); MS-ODIR as the code before the issue's cheap warm starts chose it: λ = 24,750,000 (2,500 per entry),
    # μ = 1e8 (10^6 per entry), cross-validated NLL 3.668769958303744, test NLL 3.6752005749274743. The warm starts
    # reuse the NLL's terms where a fold's last fit ended instead of recomputing them: the same iterates, so the
    # same numbers.
    z, y = synthetic(2000, 100, 62)
    x = torch.log_softmax(z, 1)
    fitted = MatrixScaling().fit(x[:1000], y[:1000])
    assert (fitted.selection.off_diagonal_weight, fitted.selection.intercept_weight) == (24_750_000.0, 1e8)
    assert fitted.selection.cv_nll == pytest.approx(3.668769958303744, rel=1e-12)
    test_nll = float(torch.nn.functional.cross_entropy(torch.log(fitted.probs(x[1000:])), y[1000:]))
    assert test_nll == pytest.approx(3.6752005749274743, abs=1e-4)
