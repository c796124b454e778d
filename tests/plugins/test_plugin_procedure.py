"""A Stage-I training procedure as one ``--plugin`` file (docs/extending.md §1.1, its code block as the page writes
it): its row is a ``compare_methods.py --methods`` choice that passes ``--check-only`` (every trial config of the
row parsed and validated), a bad value of its ``stage1`` key is one ``error:`` line naming key and value, and its
row's trial trains with the procedure's hooks, resumes from a checkpoint to the same training, is stored with the
procedure's column and the plugin's name, and leaves the ids of the other rows as they were. (The same block as a
module of calib runs as a compare_methods row through Ray in tests/plugins/test_one_file_extensions.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from trial_fixtures import tiny_config

from calib.config import config_hash, parse_trial_config, stage1_identity, trial_id

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def plugin(tmp_path) -> Path:
    """docs/extending.md §1.1's procedure, written as a --plugin file."""
    text = (REPO / "docs" / "extending.md").read_text()
    section = text[text.index("### 1.1 A Stage-I training procedure"):]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    path = tmp_path / "input_noise_plugin.py"
    path.write_text(block.group(1))
    return path


def _check_only(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "studies" / script), *args, "--seeds", "1",
                           "--epochs", "2", "--check-only"], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_its_row_is_a_methods_choice_and_its_key_is_checked(plugin, tmp_path):
    store = str(tmp_path / "results")
    out = _check_only("compare_methods.py", "--plugin", str(plugin), "--methods", "Vanilla", "InputNoise",
                      "--store", store, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "nothing was started (--check-only)" in out.stdout
    # the key set on a study whose rows do not vary it (compare_methods refuses a --set of a key its rows vary)
    bad = _check_only("sensitivity_gamma.py", "--plugin", str(plugin), "--set", "stage1.input_noise_std=-1",
                      "--store", store, cwd=tmp_path)
    errors = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(errors) == 1, bad.stderr[-3000:]
    assert errors[0].startswith("error: ") and "`stage1.input_noise_std` must be > 0, or null to train without input " \
        "noise, got stage1.input_noise_std=-1.0." in errors[0]
    assert not Path(store).exists()


TRIAL = """
import copy, json, sys
from pathlib import Path
import torch
sys.path.insert(0, {tests!r})
from trial_fixtures import tiny_config
from calib.config import config_hash, parse_trial_config, stage1_identity, trial_id
from calib.datasets import load_dataset
from calib.plugins import use_plugin
from calib.store import read_history, read_trials, write_result
from calib.training import train_stage1
from calib.trial import run_trial

use_plugin({plugin!r})
from calib.study.rows import METHOD_ROWS

tmp = Path({tmp!r})
row = METHOD_ROWS["InputNoise"]
config = {{**tiny_config(tmp, method={{"name": "vanilla"}}, **row.stage1), "label": "InputNoise"}}
states = []
result = run_trial(config, on_checkpoint=lambda state: states.append(copy.deepcopy(state)))
write_result(tmp / "results", result)
stored = read_trials(tmp / "results").iloc[0]
cfg = parse_trial_config(config)
digits = load_dataset("digits-noisy", "")
resumed = train_stage1(cfg, digits, torch.device("cpu"), resume=states[0])
history = read_history(tmp / "results")
history = history[history["stage"] == "stage1"].sort_values("epoch")
vanilla = parse_trial_config(tiny_config(tmp, method={{"name": "vanilla"}}))
print(json.dumps({{
    "row_stage1": row.stage1, "status": stored["status"], "label": stored["label"],
    "column": float(stored["stage1_input_noise_std"]), "plugins": list(stored["plugins"]),
    "batches": [state["procedures"]["input_noise"]["batches"] for state in states],
    "generator": states[-1]["procedures"]["input_noise"]["generator"].tolist(),
    "train": len(digits.train), "input_shape": list(digits.input_shape),
    "stored": [history[key].tolist() for key in ("train_loss", "val_accuracy", "val_ece")],
    "resumed": [[r[key] for r in resumed.history] for key in ("train_loss", "val_accuracy", "val_ece")],
    "vanilla_ids": [trial_id(vanilla), config_hash(stage1_identity(vanilla))],
}}))
"""


def test_its_row_trains_resumes_and_is_stored(plugin, tmp_path):
    code = textwrap.dedent(TRIAL).format(tests=str(REPO / "tests"), plugin=str(plugin), tmp=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env={**os.environ, "CALIB_PLUGINS": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["row_stage1"] == {"input_noise_std": 0.1}
    assert (got["status"], got["label"], got["column"]) == ("ok", "InputNoise", 0.1)
    assert len(got["plugins"]) == 1 and got["plugins"][0].startswith("input_noise_plugin sha256:")
    # the batch hook ran once a batch (64 images, the last one shorter), and its generator drew one noise tensor of
    # each batch's shape: the state a fresh generator of the seed reaches by the same draws
    train, shape = got["train"], got["input_shape"]
    sizes = [64] * (train // 64) + ([train % 64] if train % 64 else [])
    assert got["batches"] == [len(sizes), 2 * len(sizes)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        for size in sizes:
            torch.randn((size, *shape), generator=generator)
    assert got["generator"] == generator.get_state().tolist()
    # a run resumed after its first epoch is the uninterrupted one (the checkpoint keeps the procedure's generator):
    # the same training losses and validation scores, to the last bit
    assert got["resumed"] == got["stored"] and len(got["stored"][0]) == 2
    # the plugin's key is left out of the other rows' ids at its default: they are those of a process without it
    vanilla = parse_trial_config(tiny_config(tmp_path, method={"name": "vanilla"}))
    assert got["vanilla_ids"] == [trial_id(vanilla), config_hash(stage1_identity(vanilla))]

