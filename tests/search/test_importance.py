"""fANOVA importances rebuilt from store rows: the parameter that drives the objective ranks first."""

import numpy as np
import pandas as pd

from calib.search import parse_search_space
from calib.search.importance import importance_report, optuna_study_from_trials

SPACE = parse_search_space({"parameters": {
    "method.accuracy_weight": {"distribution": "uniform", "low": 0.8, "high": 1.0},
    "method.bottleneck_width": {"distribution": "int", "low": 32, "high": 512, "log": True},
    "stage1.mixup_alpha": {"distribution": "categorical", "choices": [None, 0.2, 1.0]},
}})


def store_rows(n: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    gamma = rng.uniform(0.8, 1.0, n)
    return pd.DataFrame({
        "method_accuracy_weight": gamma,
        "method_bottleneck_width": rng.integers(32, 513, n),
        "stage1_mixup_alpha": rng.choice([np.nan, 0.2, 1.0], n),
        "val_ece": (gamma - 0.9) ** 2 + 1e-4 * rng.random(n),  # only γ matters
    })


def test_study_from_store_rows():
    study = optuna_study_from_trials(store_rows(), SPACE, "val_ece")
    assert len(study.trials) == 40 and study.direction.name == "MINIMIZE"
    assert {t.params["stage1.mixup_alpha"] for t in study.trials} == {None, 0.2, 1.0}
    assert all(isinstance(t.params["method.bottleneck_width"], int) for t in study.trials)


def test_importance_ranks_the_driving_parameter_first(tmp_path):
    report = importance_report(store_rows(), SPACE, "val_ece", tmp_path, "demo")
    importances, files = report.importances, report.files
    assert next(iter(importances)) == "method.accuracy_weight"
    assert importances["method.accuracy_weight"] > 0.8
    assert abs(sum(importances.values()) - 1.0) < 1e-9
    assert report.notes == []
    assert files[0].read_text().startswith("fANOVA importance of each parameter for val_ece (40 trials)")
    assert files[1].read_bytes()[:4] == b"\x89PNG" and files[2].read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------- degenerate searches never raise
# The search's trials are already stored when the report runs: whatever they hold, the report makes
# what it can and says in one line per thing why the rest is missing.

CLIP_SPACE = parse_search_space({
    "base": {"method.name": "mac_cal", "method.adaptive_retention": "none"},
    "parameters": {"method.clip_decay": {"distribution": "uniform", "low": 0.0, "high": 6.0}},
})


def clip_rows(values, status=None) -> pd.DataFrame:
    frame = pd.DataFrame({"method_clip_decay": np.linspace(0.5, 5.5, len(values)), "val_ece": values})
    if status is not None:
        frame["status"] = status
    return frame


def degenerate(tmp_path, trials, space=CLIP_SPACE):
    report = importance_report(trials, space, "val_ece", tmp_path, "demo")
    table = (tmp_path / "demo_importances.md").read_text()
    assert all(f"- {note}" in table for note in report.notes)
    return report


def test_equal_objective_values_the_issues_search(tmp_path):
    # β cannot change anything when retention does not adapt: every trial has the same ECE, which made
    # fANOVA raise "Encountered zero total variance in all trees" and the search exit 1.
    report = degenerate(tmp_path, clip_rows([0.0731, 0.0731, 0.0731]))
    assert report.importances == {}
    assert report.notes == ["importances not computed: every trial has val_ece = 0.0731, so no parameter "
                            "explains any of its variance"]
    assert [f.name for f in report.files] == ["demo_importances.md", "demo_slices.png", "demo_history.png"]


def test_one_trial(tmp_path):
    report = degenerate(tmp_path, clip_rows([0.05]))
    assert report.importances == {}
    assert report.notes == ["importances not computed: they need 2 trials with a finite val_ece, got 1"]


def test_no_trial(tmp_path):
    report = degenerate(tmp_path, clip_rows([]))
    assert report.notes == ["importances not computed: they need 2 trials with a finite val_ece, got none",
                            "slice plot not drawn: no trial to plot", "history plot not drawn: no trial to plot"]
    assert [f.name for f in report.files] == ["demo_importances.md"]


def test_nan_objectives_and_a_failed_trial_are_left_out(tmp_path):
    rng = np.random.default_rng(1)
    values = [*(0.05 + 0.01 * rng.random(8)), float("nan"), 0.5]
    report = degenerate(tmp_path, clip_rows(values, status=["ok"] * 9 + ["failed"]))
    assert report.notes == ["2 of 10 trials left out: failed, or no finite val_ece, or no value for a parameter "
                            "of the space"]
    assert report.importances == {"method.clip_decay": 1.0}
    all_nan = degenerate(tmp_path, clip_rows([float("nan")] * 3))
    assert all_nan.notes[0] == ("3 of 3 trials left out: failed, or no finite val_ece, or no value for a "
                                "parameter of the space")
    assert all_nan.notes[1] == "importances not computed: they need 2 trials with a finite val_ece, got none"


def test_a_categorical_parameter_with_one_value(tmp_path):
    space = parse_search_space({"parameters": {
        "method.accuracy_weight": {"distribution": "uniform", "low": 0.8, "high": 1.0},
        "stage1.mixup_alpha": {"distribution": "categorical", "choices": [0.2]},
    }})
    rows = store_rows(12).assign(stage1_mixup_alpha=0.2)
    report = degenerate(tmp_path, rows, space)
    assert report.notes == ["left out of the importances (one value in every trial): stage1.mixup_alpha"]
    assert report.importances == {"method.accuracy_weight": 1.0}
    only = parse_search_space({"parameters": {"stage1.mixup_alpha": {"distribution": "categorical",
                                                                     "choices": [0.2]}}})
    nothing = degenerate(tmp_path, rows, only)
    assert nothing.notes == ["importances not computed: no parameter took two different values"]


def test_a_replicated_search_is_counted_and_plotted_per_optuna_trial(tmp_path, monkeypatch):
    # One row per Optuna trial (calib.search.chosen.completed_trials), out of order, with the value Optuna saw.
    from calib.report import figures

    trials = store_rows(12).assign(search_trial=[5, 0, 3, 1, 2, 4, 11, 6, 9, 7, 8, 10])
    seen = {}
    draw_slices, draw_history = figures.plot_slices, figures.plot_history

    def slices(values, objective, path, **kwargs):
        seen["slice"] = list(enumerate(values[objective]))
        return draw_slices(values, objective, path, **kwargs)

    def history(values, objective, path, **kwargs):
        seen["history"] = list(zip(values.index, values, strict=True))
        return draw_history(values, objective, path, **kwargs)

    monkeypatch.setattr(figures, "plot_slices", slices)
    monkeypatch.setattr(figures, "plot_history", history)
    report = importance_report(trials, SPACE, "val_ece", tmp_path, "demo", "each the mean of 2 replicates")
    assert report.files[0].read_text().startswith(
        "fANOVA importance of each parameter for val_ece (12 trials, each the mean of 2 replicates)")
    in_order = trials.sort_values("search_trial")["val_ece"].tolist()
    assert seen["slice"] == seen["history"] == list(enumerate(in_order))  # one point per Optuna trial, in order
    assert [f.name for f in report.files] == ["demo_importances.md", "demo_slices.png", "demo_history.png"]
