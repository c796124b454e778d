"""The one significance policy (calib.report.policy): n counts seeds, which test applies when, and the numbers each
gives, checked by hand, against scipy and statsmodels, and against the bootstrap's documented draws."""

from __future__ import annotations

import math
from argparse import Namespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from calib.report import bootstrap
from calib.report.policy import adjust_across, compare_setup, default_control
from calib.report.tables import summarize
from calib.study.settings import with_settings


def rows(values: dict[str, dict[int, list[float]]], metric: str = "test_ece") -> pd.DataFrame:
    """label -> seed -> the values of that seed's trials (its Stage-II seeds) as store-like rows of one setup."""
    return pd.DataFrame([{"label": label, "label_rank": rank, "dataset": "d", "arch": "a", "seed": seed,
                          "stage2_seed": i, metric: value}
                         for rank, (label, seeds) in enumerate(values.items())
                         for seed, trials in seeds.items() for i, value in enumerate(trials)])


def test_n_counts_seeds_and_stage2_seeds_are_averaged_within_their_seed():
    # seed 1's three Stage-II trials average to 0.2, seed 2's to 0.5: n = 2, mean 0.35,
    # CI half-width t(0.975, 1) · s / √2 with s = 0.3 / √2
    trials = rows({"A": {1: [0.1, 0.2, 0.3], 2: [0.4, 0.5, 0.6]}})
    summary = summarize(trials, ["label"], ["test_ece"])
    assert summary["n"].tolist() == [2]
    assert summary["test_ece_mean"].iloc[0] == pytest.approx(0.35)
    assert summary["test_ece_ci"].iloc[0] == pytest.approx(12.706204736 * (0.3 / math.sqrt(2)) / math.sqrt(2))
    assert summary["test_ece_std"].iloc[0] == pytest.approx(0.3 / math.sqrt(2))


def test_three_seeds_a_paired_t_test_on_the_seed_means_with_the_difference_interval():
    control = {1: [0.10, 0.10], 2: [0.12, 0.12], 3: [0.11, 0.11]}
    better = {1: [0.04, 0.06], 2: [0.07, 0.09], 3: [0.05, 0.07]}  # seed means 0.05, 0.08, 0.06
    trials = rows({"TS": control, "A": better}).assign(test_argmax_changed=0.1)
    result = compare_setup(trials, {"test_ece": "ECE", "test_argmax_changed": "changed"}, "TS")
    assert result.test == "t-test"
    cell = result.cells.set_index(["label", "metric"]).loc[("A", "test_ece")]
    expected = stats.ttest_rel([0.05, 0.08, 0.06], [0.10, 0.12, 0.11])
    assert cell["p"] == pytest.approx(expected.pvalue) and cell["p_adjusted"] == pytest.approx(expected.pvalue)
    d = np.array([-0.05, -0.04, -0.05])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert (cell["difference"], cell["difference_low"], cell["difference_high"]) == pytest.approx(
        (d.mean(), d.mean() - half, d.mean() + half))
    assert cell["n"] == 3 and cell["marker"] == "better" and cell["test"] == "t-test"
    # descriptive columns are never tested, and the legend says so
    changed = result.cells.set_index(["label", "metric"]).loc[("A", "test_argmax_changed")]
    assert changed["marker"] == "" and math.isnan(changed["p"])
    assert result.legend[-1] == "Not tested (descriptive): changed."
    assert result.markers() == {("A", "test_ece"): "better"}


def test_wilcoxon_on_request():
    seeds = range(1, 7)
    trials = rows({"TS": {s: [0.10 + 0.01 * s] for s in seeds}, "A": {s: [0.05 + 0.012 * s] for s in seeds}})
    result = compare_setup(trials, {"test_ece": "ECE"}, "TS", test="wilcoxon")
    d = [0.05 + 0.012 * s - (0.10 + 0.01 * s) for s in seeds]
    cell = result.cells.set_index("label").loc["A"]
    # six negative differences: the exact two-sided p is 2 / 2⁶
    assert cell["p"] == pytest.approx(stats.wilcoxon(d).pvalue) == pytest.approx(2 / 64)
    assert cell["marker"] == "better" and "Wilcoxon signed-rank test" in result.legend[0]


def test_fewer_seeds_without_kept_predictions_get_no_marker_and_say_why():
    trials = rows({"TS": {1: [0.1], 2: [0.12]}, "A": {1: [0.01], 2: [0.02]}})
    result = compare_setup(trials, {"test_ece": "ECE"}, "TS")
    assert result.test == "" and result.markers() == {}
    assert result.legend == ["No markers: TS has 2 seeds here (a paired test over seeds needs >= 3) and not every "
                             "trial kept its test predictions (--keep-predictions) for the bootstrap over seeds and "
                             "test samples."]


def per_sample(correct: np.ndarray, confidence: np.ndarray) -> dict[str, np.ndarray]:
    return {"correct": correct.astype(float), "accuracy": correct.astype(float), "confidence": confidence}


def test_the_two_level_bootstrap_is_its_documented_draws():
    rng = np.random.default_rng(7)
    n, seeds = 40, [1, 2]
    samples = {label: {s: [per_sample(rng.random(n) < p, rng.uniform(0.5, 1, n)) for _ in range(trials)]
                       for s in seeds}
               for label, p, trials in (("TS", 0.6, 1), ("A", 0.75, 2))}
    result = bootstrap.two_level_bootstrap(samples, "TS", "test_accuracy", resamples=300, seed=3)
    # the same draws written out: S seeds and N samples with replacement per draw, a seed's value the mean over its
    # trials on the drawn samples, a row's the mean over the drawn seeds
    draws = np.random.default_rng(3)
    seed_draws, sample_draws = draws.integers(0, 2, size=(300, 2)), draws.integers(0, n, size=(300, n))

    def value(label: str, b: int) -> float:
        return float(np.mean([np.mean([t["accuracy"][sample_draws[b]].mean() for t in samples[label][seeds[j]]])
                              for j in seed_draws[b]]))

    a = np.array([value("A", b) for b in range(300)])
    ts = np.array([value("TS", b) for b in range(300)])
    d = a - ts
    row = result.loc["A"]
    assert (row["low"], row["high"]) == pytest.approx((np.percentile(a, 2.5), np.percentile(a, 97.5)))
    assert (row["difference_low"], row["difference_high"]) == pytest.approx(
        (np.percentile(d, 2.5), np.percentile(d, 97.5)))
    assert row["p"] == pytest.approx(min(1, 2 * min(1 + (d <= 0).sum(), 1 + (d >= 0).sum()) / 301))
    full = np.mean([np.mean([t["accuracy"].mean() for t in samples["A"][s]]) for s in seeds])
    assert row["mean"] == pytest.approx(full)
    assert math.isnan(result.loc["TS", "p"]) and result.loc["TS", "low"] == pytest.approx(np.percentile(ts, 2.5))


def test_the_bootstrap_carries_the_seeds_variation():
    """Within a seed every sample agrees, so only the seed draws move the row: its seeds 1.0 and 0.0 against a
    control at 0.5 on both give a difference that is as often below 0 as above (p = 1), where a test-sample bootstrap
    alone would see the mean 0.5 − 0.5 = 0 on every draw."""
    n = 20
    samples = {"TS": {1: [per_sample(np.arange(n) % 2 == 0, np.full(n, 0.7))],
                      2: [per_sample(np.arange(n) % 2 == 0, np.full(n, 0.7))]},
               "A": {1: [per_sample(np.ones(n, bool), np.full(n, 0.7))],
                     2: [per_sample(np.zeros(n, bool), np.full(n, 0.7))]}}
    result = bootstrap.two_level_bootstrap(samples, "TS", "test_accuracy", resamples=400)
    assert result.loc["A", "p"] == 1.0
    assert result.loc["A", "low"] == 0.0 and result.loc["A", "high"] == 1.0


def test_default_controls():
    assert default_control("compare_methods", ["Vanilla", "CE+TS", "MaC-Cal"]) == "CE+TS"
    assert default_control("ablation", ["Vanilla", "+Masked Retraining"]) == "Vanilla"
    assert default_control("search_mac_cal_confirm", ["MaC-Cal", "MaC-Cal (tuned: search_mac_cal #3)", "CE+TS"]) \
        == "MaC-Cal"
    assert default_control("compare_methods", ["MaC-Cal", "MaC-Cal (tuned: search_mac_cal #3)"]) == "MaC-Cal"
    assert default_control("sensitivity_gamma", ["vanilla", "MaC-Cal γ=0.9"]) is None


def test_correcting_across_a_table_is_holm_over_every_tested_cell():
    from statsmodels.stats.multitest import multipletests

    cells = pd.DataFrame({"label": ["A", "B", "A", "B", "TS"], "metric": ["test_ece"] * 2 + ["test_nll"] * 2 + [
        "test_ece"], "p": [0.01, 0.04, 0.012, 0.3, np.nan], "difference": [-0.1, 0.2, -0.3, 0.1, np.nan],
        "p_adjusted": [0.02, 0.04, 0.024, 0.3, np.nan], "marker": ["better", "worse", "better", "", ""]})
    adjusted = adjust_across(cells, 0.05)
    reject, expected, *_ = multipletests([0.01, 0.04, 0.012, 0.3], alpha=0.05, method="holm")
    assert adjusted["p_adjusted"].iloc[:4].tolist() == pytest.approx(expected.tolist())
    assert (adjusted["marker"].iloc[:4] != "").tolist() == reject.tolist() == [True, False, True, False]
    assert adjusted["marker"].tolist() == ["better", "", "better", "", ""]


def test_the_uncalibrated_row_runs_once_per_seed_under_stage2_seeds():
    def config(method: str, seed: int) -> dict:
        return {"study": "s", "dataset": "d", "arch": "a", "seed": seed, "label": method,
                "method": {"name": method}, "loss": {"name": "cross_entropy"}}

    out = with_settings(Namespace(study="s", set=None, stage2_seeds=[1, 2, 3]),
                        [config("vanilla", 4), config("mac_cal", 4), config("vanilla", 5)])
    assert [(c["method"]["name"], c["seed"], c.get("stage2_seed")) for c in out] == [
        ("vanilla", 4, None), ("mac_cal", 4, 1), ("mac_cal", 4, 2), ("mac_cal", 4, 3), ("vanilla", 5, None)]
