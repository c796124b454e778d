"""The README stays true: it documents every store column and names files that exist."""

import re
from pathlib import Path

from calib.store import HISTORY_COLUMNS, trial_columns

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_trials_column_is_documented():
    documented = set(re.findall(r"`([a-z0-9_]+)`", README))
    missing = [name for name, _, _ in trial_columns() if name not in documented]
    assert missing == [], f"README does not document the trials columns {missing}"


def test_every_history_column_is_documented():
    section = README.split("`history` columns:")[1].split("##")[0]
    assert [n for n, _, _ in HISTORY_COLUMNS if f"`{n}`" not in section] == []


def test_referenced_files_exist():
    root = Path(__file__).resolve().parents[2]
    for path in re.findall(r"((?:studies|benchmarks|search_spaces)/[\w./]+\.(?:py|yaml))", README):
        assert (root / path).exists(), path


def test_test_command_is_the_one_ci_runs():
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    command = 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" && python -m pytest'
    assert command in README and command in ci
