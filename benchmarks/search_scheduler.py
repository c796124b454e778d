"""Early stopping in a Stage-I search: ASHA against no scheduler, over several search seeds.

Both arms run the same Mixup α search (``search_spaces/mixup.yaml``, vanilla evaluation, quick
preset, TPE) once per search seed, side by side in this process on one Ray instance. Prints per
arm the Stage-I epochs the search trained (a pruned trial counts the epochs it completed) and the
best validation ECE per seed with its mean and 95% CI over the seeds, then the ratio of epochs and
whether ASHA's mean best ECE lies inside the no-scheduler CI:

    python benchmarks/search_scheduler.py                  # 24 trials × 3 seeds per arm, 2 cores: ~25 min
    python benchmarks/search_scheduler.py --num-trials 8 --seeds 0 --epochs 20
    python benchmarks/search_scheduler.py --workdir w --grace-period 15   # reuses w's no-scheduler searches
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from calib._help import HelpFormatter
from calib.config import set_dotted
from calib.report import format_mean_ci
from calib.report.tables import mean_ci
from calib.run import ExecutionOptions, init_ray
from calib.search import SchedulerSettings, load_search_space, run_search
from calib.store import read_trials
from calib.study.presets import PRESETS, base_config

SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "mixup.yaml"


def stage1_epochs(store: str, study: str) -> tuple[int, float, int]:
    """(Stage-I epochs trained, best validation ECE of the ok trials, pruned trials) of one search."""
    rows = read_trials(store, study=study)
    ok, pruned = rows[rows["status"] == "ok"], rows[rows["status"] == "pruned"]
    trained = int(ok.loc[~ok["stage1_cache_hit"].astype(bool), "stage1_epochs"].sum())
    return trained + int((pruned["pruned_epoch"] + 1).sum()), float(ok["val_ece"].min()), len(pruned)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--num-trials", type=int, default=24, help="trials per search")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sampler seeds (one search each)")
    parser.add_argument("--epochs", type=int, default=None, help="Stage-I epochs (default: the quick preset's 60)")
    parser.add_argument("--grace-period", type=int, default=None, help="ASHA grace period (default: a quarter)")
    parser.add_argument("--reduction-factor", type=float, default=3.0, help="ASHA η")
    parser.add_argument("--workdir", default=None, help="store and artifacts here (default: a temporary folder)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.workdir or scratch)
        store = str(root / "store")
        preset = PRESETS.get("quick")
        space = load_search_space(SPACE)
        init_ray()
        results: dict[str, list[tuple[int, float, int]]] = {"none": [], "asha": []}
        for seed in args.seeds:
            for name in ("none", "asha"):
                # ASHA's studies are named by their settings, so a rerun with other settings is a new search
                label = "none" if name == "none" else f"asha_g{args.grace_period or 'auto'}_r{args.reduction_factor:g}"
                study = f"mixup_{label}_{seed}"
                # Each arm its own artifacts: the arms propose the same first α values, and a Stage I the
                # other arm trained would be a cache hit, neither trained nor prunable here.
                base = base_config(preset, study=study, dataset="digits-noisy", seed=1, method={"name": "vanilla"},
                                   data_root=str(root / "data"), artifact_root=str(root / "artifacts" / label))
                if args.epochs:
                    base = set_dotted(base, "stage1.epochs", args.epochs)
                    base = set_dotted(base, "stage1.milestones", [args.epochs // 2, args.epochs * 3 // 4])
                start = time.perf_counter()
                run_search(base, space, store=store, study=study, num_trials=args.num_trials, seed=seed,
                           options=ExecutionOptions(verbose=False, configs_per_trial=1),
                           scheduler=SchedulerSettings(name, args.grace_period, args.reduction_factor))
                results[name].append(stage1_epochs(store, study))
                epochs, best, pruned = results[name][-1]
                print(f"seed {seed} · scheduler {name}: {time.perf_counter() - start:.0f} s · {epochs} Stage-I "
                      f"epochs · {pruned} pruned · best val_ece {best:.2%}", flush=True)
        summary = {}
        for name, rows in results.items():
            epochs = sum(r[0] for r in rows)
            mean, ci = mean_ci([r[1] for r in rows]) if len(rows) > 1 else (rows[0][1], float("nan"))
            summary[name] = (epochs, mean, ci)
            print(f"{name}: {epochs} Stage-I epochs over {len(rows)} searches · best val_ece "
                  f"{format_mean_ci(mean, ci)}%")
        (none_epochs, none_mean, none_ci), (asha_epochs, asha_mean, _) = summary["none"], summary["asha"]
        inside = abs(asha_mean - none_mean) <= none_ci
        print(f"ASHA spent {asha_epochs / none_epochs:.0%} of the Stage-I epochs; its mean best val_ece is "
              f"{'inside' if inside else 'outside'} the no-scheduler 95% CI")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
