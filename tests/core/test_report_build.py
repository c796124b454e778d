"""Report tables: bold best per column by the metric's direction, LaTeX escaping, the published column."""

import pandas as pd
import pytest

from calib.report.build import _published_column, latex_table, markdown_table
from calib.report.published import PUBLISHED_ECE, published_ece
from calib.report.tables import column_higher_is_better


def table() -> pd.DataFrame:
    return pd.DataFrame({
        "label": ["Vanilla (CE)", "CE+TS", "MaC-Cal"], "n": [3, 3, 3],
        "test_ece_mean": [0.05, 0.02, 0.03], "test_ece_ci": [0.01, 0.01, 0.01], "test_ece_std": [0.005] * 3,
        "test_accuracy_mean": [0.80, 0.80, 0.81], "test_accuracy_ci": [0.02] * 3, "test_accuracy_std": [0.01] * 3,
    })


def test_markdown_bolds_the_best_by_direction_and_shows_the_paper():
    published = _published_column(table(), "cifar10", ["resnet110"])
    assert published == ["4.06", "–", "1.25"]
    text = markdown_table(table(), {"test_ece": "ECE", "test_accuracy": "Acc"}, "ci", published)
    lines = text.splitlines()
    assert lines[0] == "| row | n | ECE | Acc | ECE (MaC-Cal Table 1) |"
    assert lines[3] == "| CE+TS | 3 | **2.00 ± 1.00** | 80.00 ± 2.00 | – |"
    assert lines[4] == "| MaC-Cal | 3 | 3.00 ± 1.00 | **81.00 ± 2.00** | 1.25 |"
    std = markdown_table(table(), {"test_ece": "ECE"}, "std")
    assert "| Vanilla (CE) | 3 | 5.00 ± 0.50 |" in std


def test_latex_escapes_and_bolds():
    text = latex_table(table(), {"test_ece": "ECE"}, "ci", "a_b mean ± 95% CI", None)
    assert r"\caption{a\_b mean $\pm$ 95\% CI}" in text
    assert r"CE+TS & 3 & \textbf{2.00 $\pm$ 1.00} \\" in text


def test_no_published_column_off_the_papers_setups():
    assert _published_column(table(), "digits-noisy", ["small_cnn"]) is None
    assert _published_column(table(), "cifar10", ["resnet110", "resnet50"]) is None


def test_published_values_are_table1():
    assert published_ece("cifar100", "resnet110", "MaC-Cal") == 1.44  # the headline 17.85 → 1.44
    assert published_ece("cifar100", "resnet110", "Vanilla (CE)") == published_ece("cifar100", "resnet110",
                                                                                   "Vanilla") == 17.85
    # the three rows of MaC-Cal Table 1 that came with issue 53 (docs/methods.md §9.1)
    assert [published_ece("cifar10", "resnet50", row) for row in ("CPC", "PLP", "BalCAL")] == [3.92, 2.97, 1.32]
    assert published_ece("tiny-imagenet", "resnet50_tiny", "PLP") == 11.07
    assert len(PUBLISHED_ECE) == 9  # every column of Table 1
    assert published_ece("cifar10", "densenet121", "MaC-Cal") == 1.05
    assert published_ece("tiny-imagenet", "resnet50_tiny", "MbLS") == 10.17
    assert published_ece("cifar100", "wrn26_10", "V-TST") == 4.39


def test_directions():
    assert column_higher_is_better("test_accuracy") and column_higher_is_better("ood_auroc")
    assert not column_higher_is_better("test_ece") and not column_higher_is_better("ood_fpr95")
    assert not column_higher_is_better("corrupted_ece_s3")


def test_cost_table():
    from calib.report.build import cost_table

    trials = pd.DataFrame({"label_rank": [0, 0, 1], "label": ["CE", "CE", "MIT"],
                           "stage1_train_seconds": [10.0, 12.0, 21.0], "method_seconds": [0.0, 0.0, 1.0]})
    assert cost_table(trials).splitlines()[2:] == ["| CE | 11.0 | 0.00 | 11.0 | 1.00 |",
                                                   "| MIT | 21.0 | 1.00 | 22.0 | 2.00 |"]


def test_selective_metrics_in_the_methods_table():
    from calib.report.build import FULL
    from calib.report.tables import is_fraction_metric

    assert FULL["test_aurc"] == "AURC" and FULL["test_augrc"] == "AUGRC"
    assert not column_higher_is_better("test_aurc") and not column_higher_is_better("val_augrc")
    assert is_fraction_metric("test_aurc") and is_fraction_metric("test_augrc")


def test_pooled_bins_with_clopper_pearson_intervals(tmp_path):
    from scipy import stats

    from calib.report.build import pooled_bins
    from calib.report.figures import plot_reliability

    # Two seeds of one row, 3 bins. Bin 0: empty. Bin 1: 4 of 8 right + 1 of 2 -> 5 of 10 pooled.
    # Bin 2: 10 of 10 + 0 of 0 -> 10 of 10 (upper 1, lower 0.025^(1/10)).
    trials = pd.DataFrame({
        "label_rank": [0, 0], "label": ["CE", "CE"],
        "test_bin_count": [[0, 8, 10], [0, 2, 0]],
        "test_bin_confidence": [[0.0, 0.6, 0.9], [0.0, 0.7, 0.0]],
        "test_bin_accuracy": [[0.0, 0.5, 1.0], [0.0, 0.5, 0.0]],
    })
    bins = pooled_bins(trials)
    assert list(bins.columns) == ["label", "bin", "count", "confidence", "accuracy", "accuracy_lower",
                                  "accuracy_upper"]
    assert bins["count"].tolist() == [0, 10, 10]
    assert bins["confidence"].tolist() == pytest.approx([0.0, (8 * 0.6 + 2 * 0.7) / 10, 0.9], abs=1e-12)
    assert bins["accuracy"].tolist() == pytest.approx([0.0, 0.5, 1.0], abs=1e-12)
    lower = [0.0, stats.beta(5, 6).ppf(0.025), 0.025 ** (1 / 10)]
    assert bins["accuracy_lower"].tolist() == pytest.approx(lower, abs=1e-12)
    assert bins["accuracy_upper"].tolist() == pytest.approx([1.0, stats.beta(6, 5).ppf(0.975), 1.0], abs=1e-12)
    path = plot_reliability(bins, tmp_path / "reliability.png", title="t")
    assert path.stat().st_size > 0
    # without the interval columns (a caller's own bins) the diagram is drawn as before
    plain = plot_reliability(bins.drop(columns=["accuracy_lower", "accuracy_upper"]), tmp_path / "plain.png")
    assert plain.stat().st_size > 0


def test_the_bold_calibration_error_is_the_one_closest_to_zero():
    rows = pd.DataFrame({"label": ["TS", "HB", "A"], "n": [3, 3, 3],
                         "test_nll_calibration_mean": [0.004, -0.579, 0.002], "test_nll_calibration_ci": [0.001] * 3,
                         "test_nll_calibration_std": [0.001] * 3})
    lines = markdown_table(rows, {"test_nll_calibration": "NLL cal"}, "ci").splitlines()
    assert lines[2:] == ["| TS | 3 | 0.004 ± 0.001 |", "| HB | 3 | -0.579 ± 0.001 |", "| A | 3 | **0.002 ± 0.001** |"]
