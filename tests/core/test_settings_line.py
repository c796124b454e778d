"""The settings line every study prints first: what the run uses (flags over the preset), not the preset's text."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from calib.study.flags import add_common_args
from calib.study.presets import base_config
from calib.study.resources import execution_options, settings_line
from calib.study.sources import preset_of

ROOT = Path(__file__).resolve().parents[2]


class Scheduled(Exception):
    """Raised instead of running the trials: the study got as far as scheduling them."""


def study_main(script: str, monkeypatch: pytest.MonkeyPatch):
    """``studies/<script>``'s ``main``, with the grid and the search replaced by :class:`Scheduled`."""
    import calib.study.rows

    spec = importlib.util.spec_from_file_location(f"_settings_{Path(script).stem}", ROOT / "studies" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def scheduled(*args, **kwargs):
        raise Scheduled

    for target in (module, calib.study.rows):
        for name in ("run_grid", "run_search"):
            if hasattr(target, name):
                monkeypatch.setattr(target, name, scheduled)
    return module.main


# kept predictions, quick preset: (269 + 630) digits-noisy samples × (10 classes × 8 bytes + 4) = 75.5 kB a trial
@pytest.mark.parametrize(("script", "argv", "seeds", "kept"), [
    ("sensitivity_gamma.py", [], "4 5", "0.906 MB"),  # 12 trials
    ("compare_methods.py", ["--methods", "Vanilla (CE)", "TST"], "4 5", "0.302 MB"),  # 4 trials
    ("ablation.py", [], "4 5", "0.906 MB"),
    # --num-trials 20 trials of 1 replicate (the first seed)
    ("search.py", ["--space", str(ROOT / "search_spaces" / "mac_cal.yaml")], "4", "1.51 MB"),
])
def test_every_study_prints_the_epochs_and_seeds_it_runs(script, argv, seeds, kept, monkeypatch, capsys, tmp_path):
    main = study_main(script, monkeypatch)
    with pytest.raises(Scheduled):
        main(["--epochs", "3", "--seeds", "4", "5", "--stage2-epochs", "2", "--store", str(tmp_path / "r"), *argv])
    (line,) = [line for line in capsys.readouterr().out.splitlines() if " preset " in line]
    assert line.endswith(f"] preset quick · Stage I 3 epochs · Stage II 2 epochs · seeds {seeds} · device cpu "
                         f"· per trial 1 CPU (cached 1 CPU) · predictions kept (float64) ≈ {kept}, 75.5 kB a trial")
    assert "60 + 40 epochs" not in line


def test_per_dataset_epochs_train_size_and_gpus():
    parser = argparse.ArgumentParser()
    add_common_args(parser, study="t")
    args = parser.parse_args(["--preset", "paper", "--address", "auto", "--train-size", "4000", "--seeds", "1", "2"])
    preset = preset_of(args)
    configs = [base_config(preset, study="t", dataset=dataset, seed=seed, method={"name": method},
                           data_root="/d", artifact_root="/a")
               for dataset in ("cifar10", "tiny-imagenet") for seed in (1, 2) for method in ("vanilla", "mac_cal")]
    line = settings_line("t", preset, configs, execution_options(args, preset))
    assert line == ("[t] preset paper · Stage I cifar10 350, tiny-imagenet 100 epochs · Stage II 40 epochs · seeds 1 2 "
                    "· train size 4000 · device auto (cuda on a node with a GPU) · per trial 4 CPU + 1 GPU "
                    "(cached 2 CPU + 0.25 GPU) · predictions not kept (--keep-predictions on would take ≈ 133 MB, "
                    "16.7 MB a trial)")  # 4 × 15,000 × (10 · 8 + 4) + 4 × 20,000 × (200 · 8 + 4) bytes
