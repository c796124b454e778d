"""A preset's seeds per study: the quick preset runs compare_methods (41 rows, 19 Stage Is a seed) and cost, which
reads its trials, on seeds 1-3 and every other study on 1-5; ``--seeds`` overrides both; ``--help`` says so."""

from __future__ import annotations

import pytest
from in_process import study_module

from calib.study.presets import PRESETS
from calib.study.rows import METHOD_ROWS

TINY = ["--epochs", "2", "--stage2-epochs", "2", "--check-only"]


def checked(script: str, argv: list[str], tmp_path, capsys) -> str:
    """The last line of ``--check-only`` of ``studies/<script>`` (nothing is started)."""
    code = study_module(script).main(["--store", str(tmp_path / "results"), *argv, *TINY])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert not (tmp_path / "results").exists(), "--check-only wrote to the store"
    return out.strip().splitlines()[-1]


def test_the_quick_preset_gives_compare_methods_three_seeds_and_the_others_five() -> None:
    quick = PRESETS.get("quick")
    assert quick.seeds == (1, 2, 3, 4, 5)
    assert quick.seeds_of("compare_methods") == (1, 2, 3)
    assert quick.seeds_of("sensitivity_gamma") == quick.seeds_of(None) == (1, 2, 3, 4, 5)
    assert PRESETS.get("medium").seeds_of("compare_methods") == (1, 2, 3)  # the preset's own seeds
    assert PRESETS.get("full-cpu").seeds_of("compare_methods") == (1, 2, 3, 4, 5)


@pytest.mark.parametrize(("script", "argv", "trials"), [
    ("compare_methods.py", [], len(METHOD_ROWS) * 3),
    ("compare_methods.py", ["--seeds", "1", "2", "3", "4", "5"], len(METHOD_ROWS) * 5),
    ("compare_methods.py", ["--study", "my_comparison", "--methods", "Vanilla", "CE+TS"], 2 * 3),
    ("cost.py", ["--methods", "Vanilla", "CE+TS"], 2 * 3),
    ("sensitivity_gamma.py", ["--gammas", "0.9"], 2 * 5),
])
def test_a_runs_trials_are_its_rows_times_the_seeds_its_preset_gives_its_study(script, argv, trials, tmp_path,
                                                                                 capsys) -> None:
    # a --study name of the user's keeps the script's seeds: they follow the study the script declares
    assert checked(script, argv, tmp_path, capsys).endswith(
        f"checked: {trials} trials to run; nothing was started (--check-only)")


def test_help_gives_each_presets_seeds_of_the_study(capsys) -> None:
    helps = {}
    for script in ("compare_methods.py", "sensitivity_gamma.py"):
        with pytest.raises(SystemExit):
            study_module(script).main(["--help"])
        helps[script] = " ".join(capsys.readouterr().out.split())
    assert "seeds (default: full-cpu: 1 2 3 4 5; medium: 1 2 3; paper: 1; quick: 1 2 3)" in helps["compare_methods.py"]
    assert "seeds (default: full-cpu: 1 2 3 4 5; medium: 1 2 3; paper: 1; quick: 1 2 3 4 5)" in helps[
        "sensitivity_gamma.py"]


def test_the_quick_compare_benchmark_plans_both_sizes(tmp_path) -> None:
    """benchmarks/quick_compare.py's plan: rows × seeds trials, and a Stage I per distinct (loss, Stage-I
    settings) of the rows and seed (19 a seed), counted here from the rows themselves."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "quick_compare.py"
    spec = importlib.util.spec_from_file_location("quick_compare_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    recipes = {json.dumps([row.loss, row.stage1], sort_keys=True) for row in METHOD_ROWS.values()}
    assert len(recipes) == 19
    for seeds in (module.BEFORE_SEEDS, PRESETS.get("quick").seeds_of("compare_methods")):
        counts = module.plan(module.study_configs(str(tmp_path / "artifacts"), seeds))
        assert counts["trials"] == len(METHOD_ROWS) * len(seeds)
        assert counts["stage1s"] == len(recipes) * len(seeds)
        assert len(recipes) * len(seeds) < counts["tune_trials"] < counts["trials"]  # cached rows packed
