"""The methods page's tables list what the registries hold: each post-hoc method's row label and name as registered,
each registered loss, each labelled Stage-II method, and nothing else (docs/methods.md §4, §5)."""

from __future__ import annotations

import re
from pathlib import Path

from calib.registries import LOSSES, METHODS

METHODS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def _table_after(header: str) -> list[list[str]]:
    lines = METHODS_PAGE.read_text().splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_posthoc_table_is_the_registry():
    table = _table_after("| row label | method | section | keeps the predicted class | hyperparameters (defaults) |")
    documented = {(label, name.strip("`")) for label, name, *_ in table}
    registered = {(spec.label, name) for name, spec in METHODS.items() if spec.posthoc}
    assert documented == registered


def test_the_loss_table_names_every_registered_loss():
    table = _table_after("| name | formula (per sample, or batch-mean form) | defaults (`loss.*`) | section |")
    documented = {name for cell, *_ in table for name in re.findall(r"`(\w+)`", cell)}
    assert documented == set(LOSSES.names())


def test_every_labelled_method_and_loss_is_on_the_page():
    text = METHODS_PAGE.read_text()
    labels = [spec.label for _, spec in [*METHODS.items(), *LOSSES.items()] if spec.label is not None]
    assert [label for label in labels if label not in text] == []
