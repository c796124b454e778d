"""``--set KEY=VALUE`` and ``--stage2-seeds`` on every study that runs trials: the value reaches every trial config
(``--check-only``, the configs' shared settings read where the study checks them against its stored ones), a bad key
or value exits 2 with one ``error:`` line and writes nothing, and one real run stores what was set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from in_process import run_refused, run_study

import calib.run.skeleton as skeleton

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--seeds", "1", "--epochs", "2", "--stage2-epochs", "2"]
TRIAL_STUDIES = sorted(p.name for p in (ROOT / "studies").glob("*.py") if p.name != "report.py")


def study_args(script: str, tmp_path: Path) -> list[str]:
    """The cheapest command line of ``script``, on the quick preset."""
    if script == "calibrate.py":
        rng = np.random.default_rng(0)
        path = tmp_path / "model.npz"
        np.savez(path, logits=rng.normal(size=(120, 3)), labels=np.arange(120) % 3)
        return ["--predictions", str(path), "--splits", "2"]
    extra = {"search.py": ["--space", str(ROOT / "search_spaces" / "mac_cal.yaml"), "--num-trials", "2"],
             "posthoc.py": ["--methods", "TS", "--sizes", "all"], "mixup_alpha.py": ["--alphas", "0.2"],
             "sensitivity_gamma.py": ["--gammas", "0.9"]}.get(script, [])
    return [*TINY, *extra]


@pytest.fixture
def checked_manifests(monkeypatch):
    """The fixed configs that the studies check against the store (grid and search), as they pass them."""
    seen: list[dict] = []
    check = skeleton.check_manifest  # every grid and search checks its manifest there (TuneRun.check)

    def recording(store, study, manifest):
        seen.append(manifest)
        return check(store, study, manifest)

    monkeypatch.setattr(skeleton, "check_manifest", recording)
    return seen


@pytest.mark.parametrize("script", TRIAL_STUDIES)
def test_set_reaches_every_trial_of_every_study(script, tmp_path, checked_manifests, monkeypatch, capsys):
    store = tmp_path / "results"
    args = ["--store", str(store), "--data-root", str(ROOT / "data"), *study_args(script, tmp_path),
            "--set", "stage1.scheduler_step=epoch_start", "--set", "num_bins=10", "--check-only"]
    code, err = run_refused(script, args, monkeypatch, capsys)
    assert code == 0, err
    (manifest,) = checked_manifests
    shared = manifest["constant"]
    assert shared["stage1.scheduler_step"] == "epoch_start" and shared["num_bins"] == 10, script
    assert not store.exists() or not any(store.rglob("*.parquet")), "--check-only wrote to the store"


@pytest.mark.parametrize(("script", "setting", "message"), [
    ("compare_methods.py", "stage1.scheduler_step=batch",
     "error: `stage1.scheduler_step` must be one of 'epoch_end', 'epoch_start', got stage1.scheduler_step='batch'."),
    ("ablation.py", "stage1.sheduler_step=epoch_start",
     "error: `--set stage1.sheduler_step`: not a field of stage1 (Stage1Config). Did you mean "
     "'stage1.scheduler_step'? Allowed keys: stage1.epochs, "),
    ("posthoc.py", "method.accuracy_weight=0.9",
     "error: `--set method.accuracy_weight`: none of this run's methods (vanilla, temperature_scaling) has the "
     "field 'accuracy_weight' (mac_cal has it)"),
    ("sensitivity_gamma.py", "method.accuracy_weight=0.5",
     "error: `--set method.accuracy_weight=0.5`: this study varies method.accuracy_weight between its rows "
     "(MaC-Cal γ=0.9: 0.9; MaC-Cal γ=1: 1.0)"),
    ("search.py", "method.clip_init=0.1", "error: `--set method.clip_init=0.1`: the search space"),
    ("mixup_alpha.py", "seed=4", "error: `--set seed`: seed is set by --seeds, not --set."),
    ("compare_methods.py", "stage1.lr=-1", "error: `stage1.lr` must be > 0, got stage1.lr=-1.0."),
])
def test_a_bad_setting_exits_2_with_one_line_and_writes_nothing(script, setting, message, tmp_path, monkeypatch,
                                                                 capsys):
    store = tmp_path / "results"
    args = ["--store", str(store), "--data-root", str(ROOT / "data"), *study_args(script, tmp_path)]
    if script == "sensitivity_gamma.py":
        args += ["--gammas", "0.9", "1.0"]
    code, err = run_refused(script, [*args, "--set", setting], monkeypatch, capsys)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert not store.exists(), "a refused run wrote to the store"


def test_stage2_seeds_and_set_name_one_seed(tmp_path, monkeypatch, capsys):
    code, err = run_refused("compare_methods.py", ["--store", str(tmp_path), *TINY, "--stage2-seeds", "1", "2",
                                                   "--set", "stage2_seed=3"], monkeypatch, capsys)
    assert code == 2 and err.startswith("error: `--stage2-seeds` and `--set stage2_seed=...` both choose"), err


def test_one_method_and_every_method_setting_of_one_field_are_refused(tmp_path, monkeypatch, capsys):
    args = ["--store", str(tmp_path), *TINY, "--methods", "HB-EM", "--set", "histogram_binning.num_bins=5",
            "--set", "method.num_bins=7"]
    code, err = run_refused("posthoc.py", args, monkeypatch, capsys)
    # histogram_binning is the former name of histogram_binning_equal_mass (HB-EM): the message names it now
    assert code == 2 and "both set histogram_binning_equal_mass's num_bins: give one" in err, err
    code, err = run_refused("posthoc.py", [*args[:-4], "--set", "histogram_binning.bins=5"], monkeypatch, capsys)
    assert code == 2 and err == ("error: `--set histogram_binning.bins=5`: histogram_binning_equal_mass has no field "
                                 "'bins'; its fields: calibration_size, calibration_draw, num_bins.\n"), err
    # posthoc.py's --param, --set's former name there: the same setting, after one line saying it is renamed
    code, err = run_refused("posthoc.py", [*args[:-4], "--param", "histogram_binning.bins=5"], monkeypatch, capsys)
    assert code == 2 and err.splitlines() == [
        "warning: posthoc.py --param METHOD.FIELD=VALUE is renamed posthoc.py --set METHOD.FIELD=VALUE; the old name "
        "is read until calib 0.2",
        "error: `--set histogram_binning.bins=5`: histogram_binning_equal_mass has no field 'bins'; its fields: "
        "calibration_size, calibration_draw, num_bins."], err


@pytest.mark.ray
def test_a_study_run_with_set_and_stage2_seeds_stores_them(tmp_path):
    store = tmp_path / "results"
    common = ["--store", str(store), *TINY, "--methods", "Vanilla (CE)", "MaC-Cal", "--stage2-seeds", "1", "7",
              "--set", "stage1.milestones=[1]", "--set", "method.accuracy_weight=0.9"]
    first = run_study("compare_methods.py", *common, "--set", "stage1.scheduler_step=epoch_start")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "· seeds 1 · Stage-II seeds 1 7 ·" in first.stdout
    assert ("[compare_methods] --set stage1.milestones=[1]: every trial; --set method.accuracy_weight=0.9: 2 of 3 "
            "trials (mac_cal); --set stage1.scheduler_step=epoch_start: every trial") in first.stdout
    trials = pd.read_parquet(store / "trials")
    assert len(trials) == 3 and (trials["status"] == "ok").all()  # the uncalibrated row runs once
    assert (trials["stage1_scheduler_step"] == "epoch_start").all()
    assert all(list(milestones) == [1] for milestones in trials["stage1_milestones"])
    assert sorted(trials["stage2_seed"]) == [1, 1, 7] and (trials["seed"] == 1).all()
    assert trials["stage1_id"].nunique() == 1 and (~trials["stage1_cache_hit"]).sum() == 1, "one Stage I"
    mac_cal = trials[trials["method"] == "mac_cal"].set_index("stage2_seed")
    assert (mac_cal["method_accuracy_weight"] == 0.9).all()
    assert trials.loc[trials["method"] == "vanilla", "method_accuracy_weight"].isna().all(), "vanilla has no γ"
    assert mac_cal.loc[1, "test_ece"] != mac_cal.loc[7, "test_ece"]
    vanilla = trials[trials["method"] == "vanilla"]
    assert len(vanilla) == 1 and vanilla["stage2_seed"].tolist() == [1], \
        "the uncalibrated model draws nothing in Stage II: one trial per seed, its Stage II seeded by the seed"
    # FOCAL-R's schedule steps at each epoch's start: the decay of milestone 1 applies from epoch 0 (epoch_end: 1)
    history = pd.read_parquet(store / "history")
    lrs = history[history["stage"] == "stage1"].drop_duplicates("epoch").sort_values("epoch")["lr"].tolist()
    assert lrs == pytest.approx([0.01, 0.01])

    # The same study without the scheduler setting changes a shared setting: refused with the name to use.
    changed = run_study("compare_methods.py", *common)
    assert changed.returncode == 2
    assert changed.stderr.strip().endswith("--study compare_methods--scheduler_step-epoch_end"), changed.stderr
