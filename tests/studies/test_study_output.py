"""What a user sees: calib's progress, tables and one line per failed trial; no Ray or Tune log lines,
no tracebacks; the exit code says whether trials failed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
# A Python log record as Ray prints it: "2026-11-23 13:14:34,612	WARNING experiment_state.py:209 -- ..."
RAY_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")


@pytest.mark.ray
def test_a_search_with_a_failing_trial_prints_one_line_for_it_and_nothing_from_ray(tmp_path):
    """...and a re-run with a changed search space is refused."""
    space = tmp_path / "space.yaml"
    # The grid runs both widths: r = 2^40 cannot be allocated, so that trial fails in Stage II.
    space.write_text("base: {method.name: mac_cal}\nparameters:\n"
                     "  method.bottleneck_width: {distribution: grid, values: [64, 1099511627776]}\n")
    store = tmp_path / "results"
    command = [sys.executable, str(ROOT / "studies" / "search.py"), "--space", str(space), "--num-trials", "2",
               "--sampler", "grid", "--seeds", "1", "--epochs", "3", "--stage2-epochs", "2", "--store", str(store),
               "--data-root", str(tmp_path / "data")]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]  # the search ran, and one of its trials failed
    assert not [line for line in text.splitlines() if RAY_LOG_LINE.match(line)], text
    assert "Traceback" not in text and "Token authentication" not in text and "tune_controller" not in text, text
    failures = [line for line in out.stdout.splitlines() if " failed: " in line]
    assert len(failures) == 1, out.stdout
    assert re.fullmatch(r"\[search_space\] trial [0-9a-f]{16} failed: in stage2 at epoch 0: RuntimeError: .*allocate.* "
                        r"\(traceback: the store's `error` column\)", failures[0]), failures[0]
    assert "[search_space] importances not computed: they need 2 trials with a finite val_ece, got 1" in out.stdout
    assert "[search_space] 1 trial failed; their errors: python -c" in out.stdout
    trials = pd.read_parquet(store / "trials")
    assert sorted(trials["status"]) == ["failed", "ok"]
    assert "Traceback" in trials.loc[trials["status"] == "failed", "error"].item() or \
        "File " in trials.loc[trials["status"] == "failed", "error"].item()  # the full story is in the store
    # Stage I took seconds: under --checkpoint-min-seconds (60) no Tune checkpoint, so no forced snapshot
    assert not list((store / "_ray").glob("*/*/checkpoint_*"))

    # The same search with another space would not be comparable: refused before anything runs.
    space.write_text(space.read_text().replace("[64, ", "[32, "))
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert again.returncode == 2 and "search space" in again.stderr
    assert again.stderr.strip().endswith("--study search_space-2")  # the exact name to run the new space under
    assert "Traceback" not in again.stderr
