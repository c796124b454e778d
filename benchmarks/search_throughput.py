"""Configs per second of a MaC-Cal Stage-II search, one config per Ray trial against populations.

Both arms search ``search_spaces/mac_cal_head.yaml`` (γ, β, θ0, bottleneck width) on the quick
preset's Stage I, trained once beforehand, with Optuna's random sampler and the same seed, so they
run the same configs; they share one Ray instance and run side by side in this process. Prints the
configs per second of each arm, their ratio, and the largest difference of any validation or test
metric between the two runs of a config:

    python benchmarks/search_throughput.py                      # 256 configs on the CPU
    python benchmarks/search_throughput.py --device cuda --gpus-per-trial 0.25
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from calib._help import HelpFormatter
from calib.config import set_dotted
from calib.run import ExecutionOptions, init_ray
from calib.run.execution import DEFAULT_CONFIGS_PER_TRIAL
from calib.search import load_search_space, run_search
from calib.store import read_trials
from calib.study.presets import PRESETS, base_config
from calib.trial import run_trial

SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "mac_cal_head.yaml"


def _params(row: pd.Series) -> str:
    method = json.loads(row["config_json"])["method"]
    return json.dumps(method, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--num-configs", type=int, default=256, help="configs each arm runs")
    parser.add_argument("--configs-per-trial", type=int, default=DEFAULT_CONFIGS_PER_TRIAL,
                        help="population size of the batched arm")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per Ray trial on a GPU")
    parser.add_argument("--workdir", default=None, help="store and artifacts here (default: a temporary folder)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.workdir or scratch)
        store = str(root / "store")
        preset = PRESETS.get("quick")
        base = base_config(preset, study="stage1", dataset="digits-noisy", seed=1, method={"name": "mac_cal"},
                           data_root=str(root / "data"), artifact_root=str(root / "artifacts"), device=args.device)
        start = time.perf_counter()
        run_trial(base)  # trains the shared Stage I
        print(f"Stage I trained in {time.perf_counter() - start:.1f} s; {args.num_configs} configs per arm, "
              f"device {args.device}", flush=True)
        start = time.perf_counter()
        init_ray()
        print(f"Ray started in {time.perf_counter() - start:.1f} s", flush=True)
        space = load_search_space(SPACE)
        rates, studies = {}, {}
        for size in (1, args.configs_per_trial):
            study = f"throughput_{size}"
            options = ExecutionOptions(cpus_per_trial=1, gpus_per_trial=args.gpus_per_trial,
                                       configs_per_trial=size, verbose=False)
            start = time.perf_counter()
            run = run_search(set_dotted(base, "study", study), space, store=store, study=study,
                             num_trials=args.num_configs, sampler="random", seed=0, options=options)
            seconds = time.perf_counter() - start
            rates[size], studies[size] = args.num_configs / seconds, study
            print(f"{size:>3} config(s) per Ray trial: {len(run.trial_ids)} ok in {seconds:.1f} s, "
                  f"{rates[size]:.2f} configs/s", flush=True)
        one, many = (read_trials(store, study=studies[s]) for s in (1, args.configs_per_trial))
        one.index, many.index = one.apply(_params, axis=1), many.apply(_params, axis=1)
        common = one.index.intersection(many.index)
        metrics = [c for c in one.columns if c.startswith(("val_", "test_")) and one[c].dtype.kind == "f"]
        gap = float(np.nanmax(np.abs(one.loc[common, metrics].to_numpy() - many.loc[common, metrics].to_numpy())))
        print(f"batched / one per trial: ×{rates[args.configs_per_trial] / rates[1]:.2f} configs/s · "
              f"{len(common)} configs in both runs · largest metric difference {gap:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
