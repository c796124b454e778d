"""CalArena's win rates in the report's rank table, and the prediction-change columns of the tables, on hand-made
trials frames."""

import math

import numpy as np
import pandas as pd
import pytest

from calib.report.build import CALIBRATION_SIZE_METRICS, FULL, _rank_outputs, calibration_size_summary
from calib.report.significance import rank_comparison
from calib.report.significance_tables import rank_latex, rank_markdown
from calib.report.tables import column_higher_is_better, is_fraction_metric, with_current_labels
from calib.report.win_rates import win_rates
from calib.trial import prediction_change

SETUPS = [("d1", "a"), ("d2", "a")]


def posthoc_trials() -> pd.DataFrame:
    """The post-hoc study's shape over 2 setups × 2 seeds: Uncalibrated; TS and HB at n=50 (draws 0 and 1) and all.

    NLL per trial: Uncalibrated 1.0; TS 0.5; HB 0.4 at draw 0 and 0.6 at draw 1 of n=50 (wins against TS on one
    draw of two), 0.5 at all (ties TS: no win). Brier: Uncalibrated 0.3, TS 0.2, HB 0.25 everywhere.
    """
    rows = []
    for dataset, arch in SETUPS:
        for seed in (1, 2):
            common = {"dataset": dataset, "arch": arch, "seed": seed}
            rows.append({**common, "label": "Uncalibrated", "label_rank": 0, "method": "vanilla",
                         "method_calibration_size": np.nan, "method_calibration_draw": np.nan,
                         "test_nll": 1.0, "test_brier": 0.3})
            for method, rank, label, nll in (("temperature_scaling", 1, "TS", (0.5, 0.5, 0.5)),
                                             ("histogram_binning_equal_width", 2, "HB", (0.4, 0.6, 0.5))):
                for (size, draw), value in zip(((50, 0), (50, 1), (np.nan, np.nan)), nll, strict=True):
                    part = "all" if math.isnan(size) else f"n={size}"
                    rows.append({**common, "label": f"{label} · {part}", "label_rank": rank, "method": method,
                                 "method_calibration_size": size, "method_calibration_draw": draw,
                                 "test_nll": value, "test_brier": 0.2 if label == "TS" else 0.25})
    return pd.DataFrame(rows)


def test_win_rates_pair_on_setup_seed_and_calibration_set():
    trials = posthoc_trials()
    order = ["Uncalibrated", "TS · n=50", "TS · all", "HB · n=50", "HB · all"]
    rates = win_rates(trials, order)
    assert list(rates) == [("test_nll", "Uncalibrated"), ("test_brier", "Uncalibrated"), ("test_nll", "TS"),
                           ("test_brier", "TS")]
    # against the uncalibrated model (paired on dataset, arch, seed): every calibrated trial is lower
    assert rates[("test_nll", "Uncalibrated")] == {"TS · n=50": (1.0, 8), "TS · all": (1.0, 4), "HB · n=50": (1.0, 8),
                                                   "HB · all": (1.0, 4)}
    # against TS of the same size and draw: HB n=50 wins at draw 0 (0.4 < 0.5), not at draw 1; HB all ties TS;
    # the uncalibrated trial pairs with TS · all (no calibration set: the whole split) and loses
    assert rates[("test_nll", "TS")] == {"Uncalibrated": (0.0, 4), "HB · n=50": (0.5, 8), "HB · all": (0.0, 4)}
    assert rates[("test_brier", "TS")]["HB · n=50"] == (0.0, 8)


def test_win_rates_without_a_reference_pair_or_value():
    trials = posthoc_trials()
    no_ts = trials[~trials["label"].str.startswith("TS")]
    assert [key[1] for key in win_rates(no_ts, ["Uncalibrated", "HB · all"])] == ["Uncalibrated", "Uncalibrated"]
    # NaN values pair with nothing; a reference without a finite value gives no column
    assert win_rates(trials.assign(test_nll=np.nan, test_brier=np.nan), ["Uncalibrated"]) == {}
    # compare_methods' uncalibrated row is Vanilla (CE); calibration-set columns absent: the whole split
    frame = pd.DataFrame({"label": ["Vanilla (CE)", "CE+TS", "MaC-Cal"] * 2, "dataset": "d", "arch": "a",
                          "seed": [1, 1, 1, 2, 2, 2], "test_nll": [0.9, 0.5, 0.4, 0.9, 0.5, 0.6]})
    rates = win_rates(frame, ["Vanilla (CE)", "CE+TS", "MaC-Cal"])
    assert rates[("test_nll", "Vanilla (CE)")] == {"CE+TS": (1.0, 2), "MaC-Cal": (1.0, 2)}
    assert rates[("test_nll", "TS")] == {"Vanilla (CE)": (0.0, 2), "MaC-Cal": (0.5, 2)}


def test_rank_table_has_the_win_rate_columns_in_markdown_and_latex():
    trials = posthoc_trials().assign(test_ece=lambda f: f["test_nll"] / 10)
    order = ["Uncalibrated", "TS · n=50", "TS · all", "HB · n=50", "HB · all"]
    comparison = rank_comparison(trials, "test_ece", order, control="TS · all", alpha=0.05)
    wins = win_rates(trials, order)
    text = rank_markdown("caption", {"test_ece": comparison}, {"test_ece": "ECE"}, order, 0.05, wins)
    lines = text.splitlines()
    assert lines[2] == ("| row | ECE | NLL win % vs Uncalibrated | Brier win % vs Uncalibrated | NLL win % vs TS | "
                        "Brier win % vs TS |")
    rows = dict(zip(order, lines[4:9], strict=True))
    assert rows["Uncalibrated"] == "| Uncalibrated | 5.00 | – | – | 0.0 (4) | 0.0 (4) |"
    assert rows["HB · n=50"].endswith(" | 100.0 (8) | 100.0 (8) | 50.0 (8) | 0.0 (8) |")
    assert rows["TS · n=50"].endswith(" | 100.0 (8) | 100.0 (8) | – | – |")
    assert lines[9] == "| setups N / methods k | 2 / 5 |  |  |  |  |"
    assert any(line.startswith("Win % vs Uncalibrated and TS: the share of the row's trials") for line in lines)
    tex = rank_latex("caption", {"test_ece": comparison}, {"test_ece": "ECE"}, order, 0.05, wins)
    assert r"Method & ECE & NLL win \% vs Uncalibrated & Brier win \% vs Uncalibrated & NLL win \% vs TS" in tex
    assert r" & 100.0 (8) & 100.0 (8) & 50.0 (8) & 0.0 (8) \\" in tex
    assert r"Uncalibrated & 5.00 & -- & -- & 0.0 (4) & 0.0 (4) \\" in tex
    # without win rates the table is as before
    assert "win %" not in rank_markdown("caption", {"test_ece": comparison}, {"test_ece": "ECE"}, order, 0.05)


def test_rank_outputs_rank_no_prediction_change_column(tmp_path):
    trials = posthoc_trials().assign(test_ece=lambda f: f["test_nll"] / 10, test_accuracy=0.9,
                                     test_accuracy_change=0.0, test_argmax_changed=0.0)
    metrics = {"test_ece": "ECE", "test_accuracy": "Acc", "test_accuracy_change": "ΔAcc",
               "test_argmax_changed": "changed"}
    lines: list[str] = []
    written = _rank_outputs("posthoc", trials, metrics, "TS · all", 0.05, tmp_path, lines.append)
    header = (tmp_path / "tables" / "posthoc_ranks.md").read_text().splitlines()[2]
    assert header == ("| row | ECE | Acc | NLL win % vs Uncalibrated | Brier win % vs Uncalibrated | NLL win % vs TS | "
                      "Brier win % vs TS |")
    assert {p.name for p in written} >= {"posthoc_ranks.md", "posthoc_ranks.tex"}


def test_prediction_change_by_hand():
    # argmax under probs 0, 0, 2; under the logits 0, 1, 2: one of three changed.
    probs = np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.1, 0.2, 0.7]])
    logits = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.0, 0.0, 1.0]])
    # labels 0, 0, 1: probs right on 2 of 3, the logits on 1 of 3
    change = prediction_change(probs, logits, np.array([0, 0, 1]))
    assert change == pytest.approx({"test_argmax_changed": 1 / 3, "test_accuracy_change": 2 / 3 - 1 / 3}, abs=1e-15)
    # labels 1, 1, 2: probs right on 1 of 3, the logits on 2 of 3
    change = prediction_change(probs, logits, np.array([1, 1, 2]))
    assert change["test_accuracy_change"] == pytest.approx(1 / 3 - 2 / 3, abs=1e-15)
    # ties go to the lowest class on both sides: equal logits are class 0, as are equal probabilities
    assert prediction_change(np.array([[0.5, 0.5]]), np.array([[1.0, 1.0]]), np.array([1])) == {
        "test_argmax_changed": 0.0, "test_accuracy_change": 0.0}


def test_prediction_change_in_the_tables():
    assert FULL["test_accuracy_change"] == "ΔAcc" and FULL["test_argmax_changed"] == "changed"
    assert column_higher_is_better("test_accuracy_change") and not column_higher_is_better("test_argmax_changed")
    assert is_fraction_metric("test_accuracy_change") and is_fraction_metric("test_argmax_changed")
    assert is_fraction_metric("test_ks_ce") and not is_fraction_metric("test_nll_calibration")
    assert not column_higher_is_better("test_nll_refinement")
    frame = posthoc_trials().assign(**{column: 0.0 for column in CALIBRATION_SIZE_METRICS})
    frame.loc[frame["label"] == "HB · all", ["test_accuracy_change", "test_argmax_changed"]] = [-0.02, 0.1]
    summary = calibration_size_summary(frame, "d1", 1000)
    row = summary[(summary["method"] == "HB") & (summary["calibration set"] == "all")].iloc[0]
    assert (row["test_accuracy_change_mean"], row["test_argmax_changed_mean"]) == pytest.approx((-0.02, 0.1))


def test_equal_mass_trials_stored_as_hb_are_hb_em():
    frame = pd.DataFrame({"label": ["HB · n=50", "HB · all", "CE+HB", "HB", "HB · all", "CE+HB", None],
                          "method": ["histogram_binning"] * 4 + ["histogram_binning_equal_width", "vanilla",
                                                                  "histogram_binning"]})
    current = with_current_labels(frame)
    labels = current["label"].tolist()
    assert labels[:6] == ["HB-EM · n=50", "HB-EM · all", "CE+HB-EM", "HB-EM", "HB · all", "CE+HB"]
    # the method's former name reads as its name (MethodSpec.former_name)
    assert current["method"].tolist() == ["histogram_binning_equal_mass"] * 4 + [
        "histogram_binning_equal_width", "vanilla", "histogram_binning_equal_mass"]
    assert pd.isna(labels[6])  # no label: left for the report to label by method
    summary = calibration_size_summary(frame.iloc[:2].assign(label_rank=1, dataset="d", arch="a", seed=1,
                                                              **{column: 0.1 for column in CALIBRATION_SIZE_METRICS}),
                                       "d", 100)
    assert summary["method"].tolist() == ["HB-EM", "HB-EM"]
