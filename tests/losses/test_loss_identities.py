"""Every loss's stored trials keep their ids: the config of each loss at its defaults (field names, values, order) and
the trial ids and identity sections of its default row and of its per-dataset rows are those of commit 9d86355, the
last before losses were declared once (``register_loss``). ``golden/loss_identities.json`` was written there by
the same code as :func:`_identities` below."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from calib.config import parse_trial_config, trial_id, trial_identity
from calib.registries import LOSSES

GOLDEN = json.loads((Path(__file__).parent / "golden" / "loss_identities.json").read_text())
BASE = {"study": "compare_methods", "seed": 0, "dataset": "cifar10", "arch": "resnet20", "method": {"name": "vanilla"},
        "data_root": "/data", "artifact_root": "/artifacts"}


def _identities(name: str) -> dict:
    spec = LOSSES.get(name)
    rows = {"default": {"name": name}}
    for dataset, changes in spec.dataset_defaults.items():
        rows[dataset] = {"name": name, **changes}
    return {"config": [list(item) for item in dataclasses.asdict(spec.config()).items()],
            "trial_ids": {row: trial_id({**BASE, "loss": loss}) for row, loss in rows.items()},
            "loss_section": {row: trial_identity(parse_trial_config({**BASE, "loss": loss}))["loss"]
                             for row, loss in rows.items()}}


def test_the_golden_file_lists_every_loss_of_its_commit():
    assert len(GOLDEN) == 15 and set(GOLDEN) <= set(LOSSES.names())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_config_and_trial_ids_are_unchanged(name):
    now = _identities(name)
    assert now == GOLDEN[name]
    assert json.dumps(now["config"]) == json.dumps(GOLDEN[name]["config"])  # the order of the keys too
