"""BBQ (docs/methods.md §5): against an independent loop implementation of the scoring and averaging."""

import itertools
import math

import numpy as np
import pytest
import torch
from posthoc_cases import check_runs_as_a_method, edge_case_data
from scipy.special import gammaln, softmax

from calib._config import ConfigError, from_dict
from calib.methods import METHODS
from calib.posthoc import POSTHOC
from calib.posthoc.bbq import BBQ, BBQConfig, bbq_bin_range, fit_bbq_binary


def reference_bins(sorted_scores, num_bins):
    """Index ranges [lo, hi) of equal-frequency bins: cuts ⌊jN/B⌋, each moved left out of its tie group."""
    n, cuts = len(sorted_scores), []
    for j in range(1, num_bins):
        cut = j * n // num_bins
        while cut > 0 and sorted_scores[cut - 1] == sorted_scores[cut]:
            cut -= 1
        if cut > 0 and cut not in cuts:
            cuts.append(cut)
    bounds = [0, *cuts, n]
    return list(itertools.pairwise(bounds))


def reference_model(sorted_scores, sorted_targets, bins, prior_count):
    """(log P(D|M), cuts, bin estimates) of one binning model, written out bin by bin."""
    n, log_evidence, cuts, estimates = len(sorted_scores), 0.0, [], []
    for lo, hi in bins:
        lower = 0.0 if lo == 0 else (sorted_scores[lo - 1] + sorted_scores[lo]) / 2
        upper = 1.0 if hi == n else (sorted_scores[hi - 1] + sorted_scores[hi]) / 2
        p = min(max((lower + upper) / 2, 0.005), 0.995)
        alpha, beta = prior_count * p, prior_count * (1 - p)
        count, positive = hi - lo, float(sum(sorted_targets[lo:hi]))
        log_evidence += (gammaln(prior_count) - gammaln(count + prior_count) + gammaln(positive + alpha)
                         - gammaln(alpha) + gammaln(count - positive + beta) - gammaln(beta))
        estimates.append((positive + alpha) / (count + prior_count))
        if lo > 0:
            cuts.append(lower)
    return log_evidence, cuts, estimates


def reference_bbq(scores, targets, bin_counts, prior_count=2.0):
    """f(x) = Σ_M P(M|D) θ_M(x) with a uniform model prior; returns (f, log evidences, weights)."""
    order = np.argsort(scores, kind="stable")
    s, t = np.asarray(scores)[order], np.asarray(targets, dtype=float)[order]
    models = [reference_model(s, t, reference_bins(s, b), prior_count) for b in bin_counts]
    log_evidence = np.array([m[0] for m in models])
    weights = np.exp(log_evidence - log_evidence.max())
    weights /= weights.sum()

    def f(x):
        return np.array([sum(w * est[int(np.sum(np.array(cuts) <= xi))]
                             for w, (_, cuts, est) in zip(weights, models, strict=True)) for xi in x])

    return f, log_evidence, weights


TINY_SCORES = np.array([0.3, 0.05, 0.9, 0.1, 0.75, 0.2, 0.5, 0.25, 0.6, 0.4, 0.7, 0.8])
TINY_TARGETS = np.array([0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 1, 0])


def test_tiny_case_against_independent_scoring():
    # N = 12: N^(1/3) = 2.29, so B = max(1, ⌊0.229⌋) = 1 … min(⌈12/5⌉, ⌈22.9⌉) = 3: three models.
    fit = fit_bbq_binary(TINY_SCORES, TINY_TARGETS)
    np.testing.assert_array_equal(fit.nominal_bins, [1, 2, 3])
    np.testing.assert_array_equal(fit.bins, [1, 2, 3])
    s = np.sort(TINY_SCORES)
    assert reference_bins(s, 3) == [(0, 4), (4, 8), (8, 12)] and reference_bins(s, 2) == [(0, 6), (6, 12)]
    # B = 1: p = 1/2, α = β = 1, so P(D|M) = m!(N − m)!/(N + 1)! with m = 6 positives of N = 12.
    assert fit.log_evidence[0] == pytest.approx(math.log(math.factorial(6) ** 2 / math.factorial(13)), rel=1e-12)
    f, log_evidence, weights = reference_bbq(TINY_SCORES, TINY_TARGETS, [1, 2, 3])
    np.testing.assert_allclose(fit.log_evidence, log_evidence, rtol=1e-12)
    np.testing.assert_allclose(fit.weights, weights, rtol=1e-10)
    assert fit.weights.sum() == pytest.approx(1.0)
    grid = np.concatenate([np.linspace(0, 1, 101), TINY_SCORES, [0.225, 0.275, 0.45, 0.65]])  # cuts included
    np.testing.assert_allclose(fit(grid), f(grid), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("decimals", [None, 1, 2])  # None: distinct scores; 1, 2: heavy ties
@pytest.mark.parametrize("prior_count", [2.0, 0.5])
def test_random_cases_against_independent_scoring(decimals, prior_count):
    rng = np.random.default_rng(0)
    scores = rng.beta(2, 3, 300)
    scores = scores if decimals is None else np.round(scores, decimals)
    targets = rng.random(300) < scores ** 1.5
    fit = fit_bbq_binary(scores, targets, prior_count=prior_count)
    assert bbq_bin_range(300) == (1, 60)
    f, log_evidence, weights = reference_bbq(scores, targets, range(1, 61), prior_count)
    np.testing.assert_allclose(fit.log_evidence, log_evidence, rtol=1e-11)
    np.testing.assert_allclose(fit.weights, weights, rtol=1e-8, atol=1e-300)
    grid = np.concatenate([np.linspace(0, 1, 201), scores[:50]])
    np.testing.assert_allclose(fit(grid), f(grid), rtol=1e-10, atol=1e-14)
    if decimals == 1:  # at most 11 distinct scores: no model has more bins
        assert fit.bins.max() <= len(np.unique(scores)) and (fit.bins <= fit.nominal_bins).all()


def test_multiclass_is_one_vs_rest_renormalised():
    g = torch.Generator().manual_seed(0)
    logits = 2 * torch.randn(400, 3, generator=g, dtype=torch.float64)
    labels = torch.multinomial(logits.softmax(1), 1, generator=g).squeeze(1)
    test = 2 * torch.randn(50, 3, generator=g, dtype=torch.float64)
    probs, probs_test = softmax(logits.numpy(), axis=1), softmax(test.numpy(), axis=1)
    lo, hi = bbq_bin_range(400)
    f = np.stack([reference_bbq(probs[:, k], labels.numpy() == k, range(lo, hi + 1))[0](probs_test[:, k])
                  for k in range(3)], axis=1)
    calibrator = BBQ().fit(logits, labels)
    np.testing.assert_allclose(calibrator.probs(test).numpy(), f / f.sum(1, keepdims=True), rtol=1e-10)


def test_bin_range():
    assert bbq_bin_range(10_000) == (2, 216)
    assert bbq_bin_range(8000) == (2, 200)  # exact cube root: ⌊20/10⌋ = 2
    assert bbq_bin_range(5) == (1, 1) and bbq_bin_range(1) == (1, 1)
    assert bbq_bin_range(1000, range_factor=2.0) == (5, 20)
    assert bbq_bin_range(8, range_factor=1.0) == (2, 2)


def test_limit_few_samples_is_laplace():
    # N <= 5: one model, one bin, p_b = 1/2, so f ≡ (m + 1)/(N + 2), Laplace's rule.
    fit = fit_bbq_binary(np.array([0.1, 0.5, 0.9, 0.3]), np.array([1, 0, 1, 1]))
    np.testing.assert_array_equal(fit.nominal_bins, [1])
    np.testing.assert_allclose(fit(np.array([0.0, 0.2, 1.0])), 4 / 6)


def test_limit_calibrated_scores_stay_put():
    rng = np.random.default_rng(1)
    scores = rng.random(20_000)
    fit = fit_bbq_binary(scores, rng.random(20_000) < scores)
    grid = np.linspace(0.05, 0.95, 19)
    np.testing.assert_allclose(fit(grid), grid, atol=0.05)
    assert np.all(np.diff(fit(np.linspace(0, 1, 1001))) > -0.05)  # close to monotone


def test_limit_a_single_informative_model_dominates():
    # Scores < 0.5 are always negative, > 0.5 always positive, 150 each: the 2-bin model explains the data
    # perfectly; the averaged f is ~0 below and ~1 above the split.
    scores = np.concatenate([np.linspace(0.01, 0.49, 150), np.linspace(0.51, 0.99, 150)])
    fit = fit_bbq_binary(scores, scores > 0.5)
    assert fit(np.array([0.1]))[0] < 0.05 and fit(np.array([0.9]))[0] > 0.95


def test_can_change_the_argmax():
    # A systematically wrong binary classifier: class 1 scores 0.3-0.45 are always class 1, 0.55-0.7 class 0.
    p1 = torch.cat([torch.linspace(0.3, 0.45, 50), torch.linspace(0.55, 0.7, 50)]).double()
    logits = torch.stack([(1 - p1).log(), p1.log()], dim=1)
    labels = torch.tensor([1] * 50 + [0] * 50)
    probs = BBQ().fit(logits, labels).probs(logits)
    assert (probs.argmax(1) != logits.argmax(1)).all()


@pytest.mark.parametrize(("name", "logits", "labels"), edge_case_data())
def test_edge_cases(name, logits, labels):
    calibrator = BBQ().fit(logits, labels)
    test = torch.cat([logits, 4 * torch.randn(30, logits.shape[1], dtype=torch.float64)])
    out, probs = calibrator(test), calibrator.probs(test)
    assert torch.isfinite(out).all() and out.dtype == torch.float64
    assert torch.isfinite(probs).all() and (probs > 0).all()  # the Beta prior keeps every f_k > 0
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))
    for fit in calibrator.class_fits:
        assert fit.weights.sum() == pytest.approx(1.0) and np.isfinite(fit.log_evidence).all()
    if name == "ties":
        assert all(fit.bins.max() <= 10 for fit in calibrator.class_fits)  # 10 distinct scores per class
        torch.testing.assert_close(probs[:10].repeat(20, 1), probs[:200], rtol=0, atol=0)
    if name == "absent_class":  # f_4 is small but positive: the prior's pseudo-positives
        assert calibrator.class_fits[4].values.max() < 0.05


def test_registry_config_and_errors():
    assert POSTHOC.get("bbq") is BBQ and METHODS.get("bbq").config is BBQConfig
    params = BBQConfig()
    assert (params.range_factor, params.prior_count) == (10.0, 2.0)
    assert from_dict(BBQConfig, {"range_factor": 5, "prior_count": 1}).range_factor == 5.0
    with pytest.raises(ConfigError, match=r"`range_factor` must be a finite number >= 1, got range_factor=0.5"):
        BBQConfig(range_factor=0.5)
    with pytest.raises(ConfigError, match=r"`prior_count` must be a finite number > 0, got prior_count=0"):
        BBQConfig(prior_count=0)
    with pytest.raises(ValueError, match=r"`range_factor` must be a finite number >= 1, got range_factor=0.1"):
        BBQ(range_factor=0.1)
    with pytest.raises(ValueError, match=r"`prior_count` must be a finite number > 0, got prior_count=-1"):
        BBQ(prior_count=-1)
    with pytest.raises(RuntimeError, match=r"BBQ is not fitted"):
        BBQ()(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 2"):
        BBQ().fit(torch.randn(9, 3), torch.arange(9) % 3)(torch.zeros(2, 2))


def test_runs_as_a_method_on_float32_logits():
    cases = [("bbq", BBQConfig()), ("bbq", BBQConfig(range_factor=2.0, prior_count=1.0, calibration_size=60))]
    check_runs_as_a_method(cases)
