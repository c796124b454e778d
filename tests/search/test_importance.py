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
    importances, files = importance_report(store_rows(), SPACE, "val_ece", tmp_path, "demo")
    assert next(iter(importances)) == "method.accuracy_weight"
    assert importances["method.accuracy_weight"] > 0.8
    assert abs(sum(importances.values()) - 1.0) < 1e-9
    assert files[0].read_text().startswith("fANOVA importance of each parameter for val_ece (40 trials)")
    assert files[1].read_bytes()[:4] == b"\x89PNG"
