"""Ranks over setups and paired tests over seeds (calib.report.significance), checked against Demšar (2006)'s
worked example and hand-computed values."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from calib.report.significance import (
    average_ranks,
    default_control,
    friedman_test,
    holm,
    holm_against_control,
    iman_davenport,
    nemenyi_critical_difference,
    not_different_groups,
    paired_against_control,
    rank_comparison,
)
from calib.report.tables import latex_escape

# Demšar (2006), Table 6: AUC of C4.5 with its defaults, with m fitted (C4.5+m), with cf fitted (C4.5+cf) and
# with both (C4.5+m+cf) on 14 UCI data sets, printed to 3 decimals.
DEMSAR_METHODS = ["C4.5", "C4.5+m", "C4.5+cf", "C4.5+m+cf"]
DEMSAR_AUC = [
    [0.763, 0.768, 0.771, 0.798],  # adult (sample)
    [0.599, 0.591, 0.590, 0.569],  # breast cancer
    [0.954, 0.971, 0.968, 0.967],  # breast cancer wisconsin
    [0.628, 0.661, 0.654, 0.657],  # cmc
    [0.882, 0.888, 0.886, 0.898],  # ionosphere
    [0.936, 0.931, 0.916, 0.931],  # iris
    [0.661, 0.668, 0.609, 0.685],  # liver disorders
    [0.583, 0.583, 0.563, 0.625],  # lung cancer
    [0.775, 0.838, 0.866, 0.875],  # lymphography
    [1.000, 1.000, 1.000, 1.000],  # mushroom
    [0.940, 0.962, 0.965, 0.962],  # primary tumor
    [0.619, 0.666, 0.614, 0.669],  # rheum
    [0.972, 0.981, 0.975, 0.975],  # voting
    [0.957, 0.978, 0.946, 0.970],  # wine
]


def demsar_table(*, printed: bool = False) -> pd.DataFrame:
    """Table 6. The paper's average ranks (3.143, 2.000, 2.893, 1.964) rank C4.5+cf ahead of C4.5+m+cf on voting,
    the only printed tie between the two (the AUCs behind it had more digits); unless ``printed``, that tie
    is broken the same way."""
    values = np.array(DEMSAR_AUC)
    if not printed:
        values[12, 2:] = [0.9752, 0.9748]
    return pd.DataFrame(values, columns=DEMSAR_METHODS)


def test_demsar_average_ranks_friedman_and_iman_davenport():
    table = demsar_table()
    ranks = average_ranks(table, higher_is_better=True)
    assert ranks.round(3).tolist() == [3.143, 2.000, 2.893, 1.964]  # the paper's §3.2.2 example
    n, k = 14, 4
    # Demšar's Eq.: χ²_F = 12·14/(4·5) · [Σ R_j² − 4·5²/4] = 9.28, and F_F = 13·9.28 / (14·3 − 9.28) = 3.69
    chi2_demsar = 12 * n / (k * (k + 1)) * (float((ranks ** 2).sum()) - k * (k + 1) ** 2 / 4)
    assert chi2_demsar == pytest.approx(9.28, abs=5e-3)
    assert iman_davenport(9.28, n, k)[0] == pytest.approx(3.69, abs=5e-3)
    # scipy corrects for ties: iris, lung cancer and primary tumor tie two methods (t³ − t = 6 each), mushroom
    # all four (60): χ²_F / (1 − 78 / (N k (k² − 1))) = χ²_F / (1 − 78/840)
    result = friedman_test(table)
    assert (result.n, result.k) == (n, k)
    assert result.chi2 == pytest.approx(chi2_demsar / (1 - 78 / 840), rel=1e-12)
    assert result.chi2_p == pytest.approx(stats.chi2.sf(result.chi2, 3), rel=1e-12)
    f = 13 * result.chi2 / (42 - result.chi2)
    assert result.f == pytest.approx(f, rel=1e-12) and result.f_p == pytest.approx(stats.f.sf(f, 3, 39), rel=1e-12)
    # the paper: F_F is over F(3, 39)'s critical value 2.85 at α = 0.05, so the null hypothesis is rejected
    assert result.f_p < 0.05


def test_demsar_ranks_of_the_printed_table_share_the_voting_tie():
    # voting prints C4.5+cf = C4.5+m+cf = 0.975: both get (2 + 3)/2; rank sums 44, 28, 41, 27
    ranks = average_ranks(demsar_table(printed=True), higher_is_better=True)
    assert ranks.tolist() == pytest.approx([44 / 14, 28 / 14, 41 / 14, 27 / 14], abs=1e-12)


def test_demsar_nemenyi_critical_difference_and_groups():
    ranks = average_ranks(demsar_table(), higher_is_better=True)
    q05, cd05 = nemenyi_critical_difference(4, 14, 0.05)
    q10, cd10 = nemenyi_critical_difference(4, 14, 0.10)
    # Table 5(a): q_0.05 = 2.569, q_0.10 = 2.291; the text: CD = 2.569 · √(4·5 / (6·14)) = 1.25, at α = 0.10 1.12
    assert (q05, cd05) == (pytest.approx(2.569, abs=5e-4), pytest.approx(1.25, abs=5e-3))
    assert (q10, cd10) == (pytest.approx(2.291, abs=5e-4), pytest.approx(1.12, abs=5e-3))
    assert nemenyi_critical_difference(10, 5, 0.05)[0] == pytest.approx(3.164, abs=5e-4)  # Table 5(a), k = 10
    # α = 0.05: "even the difference between the best and the worst is smaller than CD"; α = 0.10: C4.5 is worse
    # than C4.5+m and C4.5+m+cf, and C4.5+cf belongs to neither group (the paper's Figure 1)
    assert not_different_groups(ranks, cd05) == [["C4.5+m+cf", "C4.5+m", "C4.5+cf", "C4.5"]]
    assert not_different_groups(ranks, cd10) == [["C4.5+m+cf", "C4.5+m", "C4.5+cf"], ["C4.5+cf", "C4.5"]]


def test_demsar_holm_against_c45():
    ranks = average_ranks(demsar_table(), higher_is_better=True)
    holm = holm_against_control(ranks, 14, "C4.5", 0.05)
    se = math.sqrt(4 * 5 / (6 * 14))  # 0.488
    z = {"C4.5+m": (2.000 - 3.143) / se, "C4.5+cf": (2.893 - 3.143) / se, "C4.5+m+cf": (1.964 - 3.143) / se}
    assert holm["z"].to_dict() == pytest.approx(z, abs=2e-3)  # -2.342, -0.512, -2.416
    assert holm["p"].round(3).to_dict() == {"C4.5+m": 0.019, "C4.5+cf": 0.608, "C4.5+m+cf": 0.016}
    # Holm: 0.016 < 0.05/3 rejects C4.5+m+cf, 0.019 < 0.05/2 rejects C4.5+m, 0.608 > 0.05 stops
    assert holm["verdict"].to_dict() == {"C4.5+m": "better", "C4.5+cf": "", "C4.5+m+cf": "better"}
    p = holm["p"]
    # adjusted: C4.5+m+cf 3p, C4.5+m max(3p of C4.5+m+cf, 2p) = 3p of C4.5+m+cf, C4.5+cf max(that, p) = p
    assert holm["p_holm"].to_dict() == pytest.approx({"C4.5+m": 3 * p["C4.5+m+cf"], "C4.5+cf": p["C4.5+cf"],
                                                      "C4.5+m+cf": 3 * p["C4.5+m+cf"]})


def test_holm_is_statsmodels_holm():
    from statsmodels.stats.multitest import multipletests

    p = [0.01, 0.04, 0.03, 0.005, 0.2, 0.04]
    rejected, adjusted = holm(p, 0.05)
    reference = multipletests(p, alpha=0.05, method="holm")
    assert adjusted.tolist() == pytest.approx(reference[1].tolist(), rel=1e-12) and rejected.tolist() == reference[
        0].tolist()
    # by hand: sorted 0.005, 0.01, 0.03, 0.04, 0.04, 0.2 times 6, 5, 4, 3, 2, 1 -> 0.03, 0.05, 0.12, 0.12, ...;
    # 0.01 ≤ 0.05 / 5 is rejected (p̃ = 0.05 ≤ α), 0.03 > 0.05 / 4 stops
    assert adjusted.tolist() == pytest.approx([0.05, 0.12, 0.12, 0.03, 0.2, 0.12])
    assert rejected.tolist() == [True, False, False, True, False, False]
    # one more call only: statsmodels' Holm runs gc.collect(), seconds in a test process holding torch
    p = np.random.default_rng(0).uniform(0, 0.004, size=40) ** np.linspace(1, 0.2, 40)
    reference = multipletests(p, alpha=0.05, method="holm")
    rejected, adjusted = holm(p, 0.05)
    assert adjusted.tolist() == pytest.approx(reference[1].tolist(), rel=1e-12)
    assert rejected.tolist() == reference[0].tolist() and 0 < rejected.sum() < 40
    assert holm([], 0.05)[1].size == 0


def test_friedman_without_ties_is_demsars_formula():
    values = pd.DataFrame(np.random.default_rng(3).normal(size=(6, 5)), columns=list("abcde"))
    ranks = average_ranks(values, higher_is_better=False)
    chi2 = 12 * 6 / (5 * 6) * (float((ranks ** 2).sum()) - 5 * 36 / 4)
    result = friedman_test(values)
    assert result.chi2 == pytest.approx(chi2, rel=1e-12)
    assert result.chi2_p == pytest.approx(stats.chi2.sf(chi2, 4), rel=1e-12)


def test_ranks_follow_the_metric_direction_and_agreement_is_the_maximum():
    # 3 setups all ordering a < b < c: lower is better ranks a first; χ²_F = N(k − 1) = 6, F_F infinite
    values = pd.DataFrame({"a": [0.1, 0.2, 0.3], "b": [0.2, 0.3, 0.4], "c": [0.5, 0.6, 0.7]})
    assert average_ranks(values, higher_is_better=False).tolist() == [1.0, 2.0, 3.0]
    assert average_ranks(values, higher_is_better=True).tolist() == [3.0, 2.0, 1.0]
    result = friedman_test(values)
    assert result.chi2 == pytest.approx(6.0) and (result.f, result.f_p) == (math.inf, 0.0)
    with pytest.raises(ValueError, match="needs >= 2 setups and >= 3 methods, got 3 setups and 2 methods"):
        friedman_test(values[["a", "b"]])


def trials_of(values: dict[tuple[str, str], list[float]], metric: str = "test_ece") -> pd.DataFrame:
    """Store-like rows: {(label, "dataset/arch"): per-seed values (seeds 1, 2, ...; NaN: no trial)}."""
    rows = []
    for (label, setup), per_seed in values.items():
        dataset, arch = setup.split("/")
        rows += [{"label": label, "dataset": dataset, "arch": arch, "seed": seed, metric: value}
                 for seed, value in enumerate(per_seed, start=1) if not math.isnan(value)]
    return pd.DataFrame(rows)


SETUPS = ["d1/a", "d1/b", "d2/a", "d2/b"]


def test_rank_comparison_over_setups():
    # per setup means: A 0.01 < TS 0.02 < B 0.03 everywhere but d2/b, where B ties TS
    means = {"A": [0.01] * 4, "TS": [0.02] * 4, "B": [0.03, 0.03, 0.03, 0.02]}
    trials = trials_of({(label, s): [m[i] - 0.001, m[i] + 0.001] for label, m in means.items()
                        for i, s in enumerate(SETUPS)})
    comparison = rank_comparison(trials, "test_ece", ["TS", "A", "B"], control="TS", alpha=0.05)
    assert comparison.setups == ["d1 · a", "d1 · b", "d2 · a", "d2 · b"]
    assert comparison.ranks.to_dict() == pytest.approx({"TS": (2 * 3 + 2.5) / 4, "A": 1.0, "B": (3 * 3 + 2.5) / 4})
    assert comparison.friedman.n == 4 and comparison.friedman.k == 3 and comparison.notes == []
    assert comparison.cd == pytest.approx(nemenyi_critical_difference(3, 4, 0.05)[1])
    assert list(comparison.holm.index) == ["A", "B"]


def test_a_method_missing_in_a_setup_is_left_out_and_named():
    values = {(label, s): [0.01 * (i + 1), 0.01 * (i + 1)] for i, label in enumerate(["TS", "A", "B"])
              for s in SETUPS}
    values[("C", "d1/a")] = [0.001, 0.001]
    values[("C", "d2/b")] = [math.nan, math.nan]  # a value of NaN is no value
    comparison = rank_comparison(trials_of(values), "test_ece", ["TS", "A", "B", "C"], control="TS", alpha=0.05)
    assert list(comparison.ranks.index) == ["TS", "A", "B"] and comparison.left_out == {
        "C": ["d1 · b", "d2 · a", "d2 · b"]}
    assert comparison.notes == ["left out of the ranks (no value in every setup): C (none in d1 · b, d2 · a, d2 · b)"]
    assert comparison.friedman is not None


def test_a_metric_without_values():
    trials = pd.DataFrame([{"label": label, "dataset": s.split("/")[0], "arch": s.split("/")[1], "seed": 1,
                            "test_ece": math.nan} for label in ["TS", "A", "B"] for s in SETUPS])
    comparison = rank_comparison(trials, "test_ece", ["TS", "A", "B"], control="TS", alpha=0.05)
    assert comparison.ranks.empty and comparison.friedman is None and comparison.notes == ["no value in any setup"]


def test_too_few_setups_or_methods_give_no_friedman_test():
    one_setup = trials_of({(label, "d1/a"): [v, v] for label, v in [("TS", 0.02), ("A", 0.01), ("B", 0.03)]})
    comparison = rank_comparison(one_setup, "test_ece", ["TS", "A", "B"], control="TS", alpha=0.05)
    assert comparison.friedman is None and comparison.holm is None and comparison.cd is None
    assert comparison.notes == ["no Friedman test: 1 setup and 3 methods ranked; it needs >= 2 setups and >= 3 methods"]
    two = trials_of({(label, s): [v, v] for label, v in [("TS", 0.02), ("A", 0.01)] for s in SETUPS})
    comparison = rank_comparison(two, "test_ece", ["TS", "A"], control="TS", alpha=0.05)
    assert comparison.ranks.to_dict() == {"TS": 2.0, "A": 1.0}
    assert comparison.notes == ["no Friedman test: 4 setups and 2 methods ranked; it needs >= 2 setups and >= 3 "
                                "methods"]


def test_all_equal_values_and_an_unranked_control():
    equal = trials_of({(label, s): [0.9, 0.9] for label in ["TS", "A", "B"] for s in SETUPS}, "test_accuracy")
    comparison = rank_comparison(equal, "test_accuracy", ["TS", "A", "B"], control="TS", alpha=0.05)
    assert comparison.ranks.tolist() == [2.0, 2.0, 2.0]
    assert (comparison.friedman.chi2, comparison.friedman.chi2_p, comparison.friedman.f_p) == (0.0, 1.0, 1.0)
    assert comparison.notes == ["every method has the same value in every setup: all ranks are 2, nothing to test"]
    assert comparison.holm["verdict"].tolist() == ["", ""]
    values = {(label, s): [0.01 * (i + 1)] for i, label in enumerate(["A", "B", "C"]) for s in SETUPS}
    values[("TS", "d1/a")] = [0.02]
    comparison = rank_comparison(trials_of(values), "test_ece", ["TS", "A", "B", "C"], control="TS", alpha=0.05)
    assert comparison.holm is None
    assert comparison.notes[-1] == "no Holm test against TS: it is not ranked (left out)"


def test_paired_t_test_against_the_control_hand_example():
    # differences A − TS = −0.05, −0.04, −0.05: mean −0.04667, s = 0.005774, t = mean / (s/√3) = −14.0; with 2
    # degrees of freedom P(|T| > t) = 1 − t/√(t² + 2) = 1 − 14/√198 = 0.00506
    trials = trials_of({("TS", "d/a"): [0.10, 0.12, 0.11], ("A", "d/a"): [0.05, 0.08, 0.06],
                        ("B", "d/a"): [0.11, 0.11, 0.12], ("C", "d/a"): [0.20, 0.22, 0.21]})
    tests = paired_against_control(trials, "test_ece", "TS", alpha=0.05)
    assert list(tests.index) == ["A", "B", "C"] and tests["seeds"].tolist() == [3, 3, 3]
    assert tests.at["A", "t"] == pytest.approx(-14.0, rel=1e-9)
    assert tests.at["A", "p"] == pytest.approx(1 - 14 / math.sqrt(198), rel=1e-9)
    # B − TS = +0.01, −0.01, +0.01: t = 0.00333 / (0.011547/√3) = 0.5, p = 1 − 0.5/√2.25 = 0.667
    assert tests.at["B", "p"] == pytest.approx(1 - 0.5 / math.sqrt(2.25), rel=1e-9)
    # C − TS = +0.10 on every seed: t = +∞, p = 0
    assert (tests.at["C", "t"], tests.at["C", "p"]) == (math.inf, 0.0)
    # Holm over 3: sorted p 0, 0.00506, 0.667 -> adjusted 0, 2 · 0.00506, 0.667
    assert tests["p_holm"].tolist() == pytest.approx([2 * (1 - 14 / math.sqrt(198)), 1 - 0.5 / 1.5, 0.0])
    assert tests["verdict"].tolist() == ["better", "", "worse"]
    accuracy = trials.rename(columns={"test_ece": "test_accuracy"})  # higher is better: A is worse
    assert paired_against_control(accuracy, "test_accuracy", "TS", alpha=0.05)["verdict"].tolist() == [
        "worse", "", "better"]


def test_paired_test_edge_cases():
    trials = trials_of({("TS", "d/a"): [0.10, 0.12, 0.11], ("same", "d/a"): [0.10, 0.12, 0.11],
                        ("one seed", "d/a"): [0.01, math.nan, math.nan]})
    other_seeds = pd.DataFrame([{"label": "elsewhere", "dataset": "d", "arch": "a", "seed": s, "test_ece": 0.0}
                                for s in (7, 8)])
    drawn = pd.DataFrame([{"label": "drawn", "dataset": "d", "arch": "a", "seed": s, "test_ece": v}
                          for s, v in [(1, 0.01), (1, 0.03), (2, 0.02), (3, 0.05), (3, 0.01)]])
    tests = paired_against_control(pd.concat([trials, other_seeds, drawn]), "test_ece", "TS", alpha=0.05)
    assert tests.loc["same", ["seeds", "p", "reason"]].tolist() == [3, 1.0, "equal on every seed"]
    assert tests.loc["one seed", ["seeds", "reason"]].tolist() == [1, "fewer than 3 common seeds"]
    assert tests.loc["elsewhere", ["seeds", "reason"]].tolist() == [0, "fewer than 3 common seeds"]
    assert math.isnan(tests.at["one seed", "p_holm"]) and tests.at["one seed", "verdict"] == ""
    # draws of one seed are averaged first: drawn's seeds are 0.02, 0.02, 0.03
    expected = stats.ttest_rel([0.02, 0.02, 0.03], [0.10, 0.12, 0.11])
    assert tests.at["drawn", "t"] == pytest.approx(expected.statistic, rel=1e-9)
    # Holm counts the two tested rows (same: p = 1, drawn)
    assert tests.at["drawn", "p_holm"] == pytest.approx(2 * expected.pvalue, rel=1e-9)


def test_default_control_and_latex_escape():
    assert default_control(["Vanilla (CE)", "CE+TS", "TS"]) == "CE+TS"
    assert default_control(["Uncalibrated", "TS", "TST"]) == "TS"
    assert default_control(["Uncalibrated", "TS · n=50", "TS · all"]) == "TS · all"
    assert default_control(["vanilla", "MaC-Cal γ=0.9"]) is None
    # every non-ASCII character escaped (the middle dot too: pdflatex stops at a raw one)
    assert latex_escape("a_b ± 1 · χ²_F, F_F & α = 5% ▲ ▼ γ=0.9 – ∞") == (
        r"a\_b $\pm$ 1 $\cdot$ $\chi^2_F$, $F_F$ \& $\alpha$ = 5\% $^{\blacktriangle}$ $^{\blacktriangledown}$ "
        r"$\gamma$=0.9 -- $\infty$")


def test_a_calibration_error_estimate_is_compared_by_its_distance_to_zero():
    # NLL cal = NLL(f) − NLL(recalibrated f) is 0 at best; −0.30 (the recalibrator did worse) is far from it.
    trials = trials_of({("TS", "d/a"): [0.001, 0.002, 0.001], ("HB", "d/a"): [-0.30, -0.31, -0.29],
                        ("A", "d/a"): [0.020, 0.030, 0.025]}, metric="test_nll_calibration")
    verdicts = paired_against_control(trials, "test_nll_calibration", "TS", alpha=0.05)["verdict"]
    assert verdicts.tolist() == ["worse", "worse"]
    setups = {(label, s): [v] for s, values in (("d1/a", (0.001, -0.30, 0.02)), ("d2/a", (-0.002, -0.20, 0.03)))
              for label, v in zip(["TS", "HB", "A"], values, strict=True)}
    ranks = rank_comparison(trials_of(setups, metric="test_nll_calibration"), "test_nll_calibration",
                            ["TS", "HB", "A"], control=None, alpha=0.05).ranks
    assert ranks.to_dict() == {"TS": 1.0, "HB": 3.0, "A": 2.0}
