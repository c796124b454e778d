import math

import pandas as pd
import pytest

from calib.report import format_mean_ci, mean_ci, summarize, to_markdown


def test_mean_ci_hand_example():
    # values 1, 2, 3: mean 2, s = 1, t_{0.975, 2} = 4.302653, half-width = 4.302653 / sqrt(3) = 2.484138
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(2.484138, abs=1e-6)
    assert math.isnan(mean_ci([5.0])[1]) and mean_ci([5.0])[0] == 5.0
    assert all(math.isnan(v) for v in mean_ci([]))


def test_summarize_and_markdown():
    df = pd.DataFrame({"method": ["a", "a", "b"], "test_ece": [0.05, 0.07, 0.1], "test_nll": [0.5, 0.7, 0.9]})
    table = summarize(df, ["method"], ["test_ece", "test_nll"])
    assert table["n"].tolist() == [2, 1]
    assert table["test_ece_mean"].tolist() == pytest.approx([0.06, 0.1])
    text = to_markdown(table, ["method"], {"test_ece": "ECE", "test_nll": "NLL"})
    # ECE in percent: 6.00 ± t_{0.975,1}·0.01414/√2 = 12.706·0.01 = 12.71 (percent points)
    assert "| a | 2 | 6.00 ± 12.71 | 0.600 ± 1.271 |" in text
    assert "| b | 1 | 10.00 | 0.900 |" in text


def test_format():
    assert format_mean_ci(0.0721, 0.0105) == "7.21 ± 1.05"
    assert format_mean_ci(float("nan"), 0.1) == "–"
    assert format_mean_ci(0.5123, 0.031, percent=False) == "0.512 ± 0.031"


def test_the_uncalibrated_model_has_one_label_and_its_former_names_still_work(tmp_path):
    """Rows stored under the uncalibrated model's former names (compare_methods' "Vanilla (CE)", decompose's and
    combine's "CE", calibrate's "Uncalibrated", the γ study's "vanilla") read as "Vanilla" in the tables, also as
    the Stage I of a combined row; what a user types is mapped the same way; other labels are left alone."""
    from trial_fixtures import tiny_config

    from calib.config import parse_trial_config
    from calib.report.tables import with_current_labels
    from calib.store import read_trials, write_result
    from calib.study.rows import METHOD_ROWS, STAGE1_ROWS, row_label
    from calib.trial import TrialResult

    rows = [("Vanilla (CE)", "vanilla", "cross_entropy", None), ("CE", "vanilla", "cross_entropy", None),
            ("Uncalibrated", "vanilla", "cross_entropy", None), ("vanilla", "vanilla", "cross_entropy", None),
            ("CE +MaC-Cal", "mac_cal", "cross_entropy", None), ("CE+TS", "temperature_scaling", "cross_entropy", None),
            ("CE", "vanilla", "label_smoothing", None), ("CE", "vanilla", "cross_entropy", 1.0)]
    for i, (label, method, loss, mixup) in enumerate(rows):
        config = tiny_config(tmp_path, study="old", method={"name": method})
        config = parse_trial_config({**config, "loss": {"name": loss}, "label": label, "label_rank": i,
                                     "stage1": {**config["stage1"], "mixup_alpha": mixup}})
        write_result(tmp_path / "store", TrialResult(config=config, trial_id=f"{i:016x}", stage1_id="0" * 16,
                                                     metrics={"test_ece": 0.1}))
    trials = with_current_labels(read_trials(tmp_path / "store", study="old")).sort_values("trial_id")
    # the last two are not the vanilla CE model (another loss, Mixup): a "CE" there is left as it was stored
    assert list(trials["label"]) == ["Vanilla", "Vanilla", "Vanilla", "Vanilla", "Vanilla +MaC-Cal", "CE+TS", "CE",
                                     "CE"]
    assert [row_label(t) for t in ("Vanilla (CE)", "CE", "Uncalibrated", "vanilla", "LS")] == [
        "Vanilla", "Vanilla", "Vanilla", "Vanilla", "LS"]
    assert next(iter(METHOD_ROWS)) == next(iter(STAGE1_ROWS)) == "Vanilla"
