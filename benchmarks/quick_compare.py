"""Where the quick preset's ``compare_methods`` spends its time, at its former 5 seeds and its 3 (issue 62).

    python benchmarks/quick_compare.py          # the parts, in this process (about a minute on 2 cores)
    python benchmarks/quick_compare.py --run    # and then the default γ study and compare_methods end to end

The parts: the study's plan at both sizes (trials, Stage-I trainings, Tune trials: a Stage I's cached configs
share Tune trials, ``calib.run.grid.batch_roles``); one Stage I of the Vanilla row (seed 1, one torch thread, as
a 1-CPU Ray trial) split into training steps, validation passes and the rest (data, model, the cached splits'
extraction, the artifact); every row on that Stage I's artifact in one process (Stage II, post-hoc fit,
evaluation). The estimate: the Stage Is and the cached rows over 2 cores, plus a second of Ray per Tune trial.
``--run`` times ``studies/sensitivity_gamma.py`` and ``studies/compare_methods.py`` as the README gives them,
each into a fresh store, and prints their wall times side by side.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from calib._help import HelpFormatter
from calib.config import config_hash, parse_trial_config, stage1_identity
from calib.datasets import load_dataset
from calib.registries import LOSSES
from calib.run.execution import DEFAULT_CONFIGS_PER_TRIAL
from calib.run.grid import assign_roles, batch_roles
from calib.study.presets import PRESETS, base_config
from calib.study.rows import METHOD_ROWS
from calib.trial import run_trial, run_trials

ROOT = Path(__file__).resolve().parents[1]
STUDY = "compare_methods"
BEFORE_SEEDS = (1, 2, 3, 4, 5)
"""The quick compare_methods' seeds before issue 62: the preset's."""
CORES = 2
RAY_SECONDS_PER_TRIAL = 1.0
"""Ray's start, report and store write per Tune trial on 2 loaded cores (0.3-0.5 s between trial starts measured)."""


def study_configs(artifact_root: str, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """compare_methods' trial configs on the quick preset, as ``run_rows`` builds them (a row's Stage-I settings
    over the preset's), each with its row's label."""
    preset = PRESETS.get("quick")
    configs = []
    for label, row in METHOD_ROWS.items():
        loss = {**row.loss, **LOSSES.get(row.loss["name"]).dataset_defaults.get("digits-noisy", {})}
        for seed in seeds:
            config = base_config(preset, study="quick_compare", dataset="digits-noisy", arch="small_cnn", seed=seed,
                                 method=dict(row.method), loss=loss, data_root=str(Path(artifact_root).parent),
                                 artifact_root=artifact_root)
            config["stage1"] = {**config["stage1"], **row.stage1}
            configs.append({**config, "label": label})
    return configs


def plan(configs: list[dict[str, Any]]) -> dict[str, int]:
    """Trials, Stage-I trainings and Tune trials of ``configs`` (none stored)."""
    parsed = [parse_trial_config(c) for c in configs]
    roles = assign_roles(configs, parsed)
    return {"trials": len(configs), "stage1s": len({config_hash(stage1_identity(p)) for p in parsed}),
            "tune_trials": len(batch_roles(roles, DEFAULT_CONFIGS_PER_TRIAL))}


def stage1_parts(artifact_root: str) -> dict[str, float]:
    """One Vanilla Stage I (seed 1) trained here: seconds in training steps, validation (and per-epoch
    bookkeeping) and the rest; the test ECE and accuracy of the model."""
    config = study_configs(artifact_root, [1])[0]
    start = time.perf_counter()
    result = run_trial(config)
    total = time.perf_counter() - start
    images = config["stage1"]["epochs"] * len(load_dataset("digits-noisy", str(Path(artifact_root).parent)).train)
    train = result.timings["stage1_train_seconds"]
    steps = images / result.timings["stage1_images_per_second"]
    return {"total": total, "steps": steps, "validation": train - steps, "rest": total - train,
            "ece": result.metrics["test_ece"], "accuracy": result.metrics["test_accuracy"]}


def cached_rows(artifact_root: str) -> tuple[float, dict[str, float]]:
    """Every cached row of seed 1 on the Vanilla artifact, in one process: total seconds and each row's method +
    evaluation seconds (those over a second)."""
    configs = study_configs(artifact_root, [1])
    vanilla = config_hash(stage1_identity(parse_trial_config(configs[0])))
    shared = [c for c in configs[1:] if config_hash(stage1_identity(parse_trial_config(c))) == vanilla]
    start = time.perf_counter()
    results = run_trials(shared)
    total = time.perf_counter() - start
    seconds = {r.config.label: r.timings["method_seconds"] + r.timings["eval_seconds"] for r in results}
    return total, {label: s for label, s in seconds.items() if s > 1.0}


def timed_study(script: str, store: Path) -> float:
    """Wall seconds of ``studies/<script>.py`` (quick preset, its defaults) into ``store``."""
    start = time.perf_counter()
    run = subprocess.run([sys.executable, str(ROOT / "studies" / f"{script}.py"), "--store", str(store)],
                         capture_output=True, text=True, cwd=store.parent)
    if run.returncode != 0:
        print(run.stdout[-3000:], run.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"error: {script}.py exited {run.returncode}")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--run", action="store_true", help="also time both studies end to end")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a 1-CPU Ray trial's
    arms = {"before": BEFORE_SEEDS, "now": PRESETS.get("quick").seeds_of(STUDY)}
    with tempfile.TemporaryDirectory() as tmp:
        root = str(Path(tmp) / "artifacts")
        parts = stage1_parts(root)
        cached_total, slow = cached_rows(root)
        print(f"one Vanilla Stage I {parts['total']:.1f} s: steps {parts['steps']:.1f} s, validation "
              f"{parts['validation']:.1f} s, rest {parts['rest']:.1f} s · test ECE {parts['ece']:.2%}, accuracy "
              f"{parts['accuracy']:.2%}")
        print(f"a seed's cached rows {cached_total:.1f} s in one process; over 1 s: "
              + ", ".join(f"{label} {s:.1f} s" for label, s in slow.items()))
        for name, seeds in arms.items():
            counts = plan(study_configs(root, seeds))
            core_seconds = (counts["stage1s"] * parts["total"] + len(seeds) * cached_total
                            + counts["tune_trials"] * RAY_SECONDS_PER_TRIAL)
            print(f"{name}: seeds {' '.join(map(str, seeds))} · {counts['trials']} trials · {counts['stage1s']} "
                  f"Stage Is · {counts['tune_trials']} Tune trials · estimate on {CORES} cores "
                  f"{core_seconds / CORES / 60:.1f} min")
        if args.run:
            gamma = timed_study("sensitivity_gamma", Path(tmp) / "gamma")
            compare = timed_study(STUDY, Path(tmp) / "compare")
            print(f"end to end: sensitivity_gamma {gamma / 60:.1f} min · compare_methods {compare / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
