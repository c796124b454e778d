"""The README and the result-store page stay true: every store column is documented, the files they name
exist, the README stays a landing page, and its test command is the one CI runs."""

import re
from pathlib import Path

from calib.store import HISTORY_COLUMNS, trial_columns

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
STORE_PAGE = (ROOT / "docs" / "how-to" / "result-store.md").read_text()


def test_every_trials_column_is_documented():
    documented = set(re.findall(r"`([a-z0-9_]+)`", STORE_PAGE))
    missing = [name for name, _, _ in trial_columns() if name not in documented]
    assert missing == [], f"docs/how-to/result-store.md does not document the trials columns {missing}"


def test_every_history_column_is_documented():
    section = STORE_PAGE.split("`history` columns:")[1].split("##")[0]
    assert [n for n, _, _ in HISTORY_COLUMNS if f"`{n}`" not in section] == []


def test_referenced_files_exist():
    pages = [p for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")] if p.name != "extending.md"]
    for page in pages:  # extending.md names the files a new study or space would be (studies/my_study.py)
        text = page.read_text()
        for path in re.findall(r"(?<![\w/.])((?:studies|benchmarks|search_spaces)/[\w./]+\.(?:py|yaml))", text):
            assert (ROOT / path).exists(), f"{page.relative_to(ROOT)} names {path}"


def test_the_readme_is_a_landing_page_of_at_most_250_lines():
    assert len(README.splitlines()) <= 250
    for page in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / page).is_file(), page


def test_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    command = ('python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" && '
               "python -m pytest -n 2 --dist loadfile")
    assert command in README and command in ci
