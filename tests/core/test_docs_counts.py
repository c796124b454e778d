"""The counts the README and the docs state are the registries' counts: a method, loss or calibrator added to a
registry without its count changing in the prose fails here, not in a reader's hands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from calib.study.rows import GIVEN_STAGE1_ROWS, METHOD_ROWS, POSTHOC_METHODS, PROCEDURE_ROWS, STAGE1_ROWS

ROOT = Path(__file__).resolve().parents[2]

STAGE2_ROWS = [label for label in GIVEN_STAGE1_ROWS if label not in POSTHOC_METHODS][1:]  # the first: Vanilla

# (file, a pattern whose one group is the stated count, the registries' count)
COUNTS = [
    ("README.md", r"\*\*(\d+) methods, one row each in the studies' tables\*\*", len(METHOD_ROWS)),
    ("README.md", r"(\d+) Stage-I trainings", len(STAGE1_ROWS) + len(PROCEDURE_ROWS)),
    ("README.md", r"and the (\d+) post-hoc\s+calibrators below", len(POSTHOC_METHODS)),
    ("README.md", r"\*\*(\d+) post-hoc calibrators\*\*", len(POSTHOC_METHODS)),
    ("docs/index.md", r"\*\*(\d+) methods on a trained Stage I\*\*", len(GIVEN_STAGE1_ROWS)),
    ("docs/how-to/own-model.md", r"the table of its (\d+) rows", len(GIVEN_STAGE1_ROWS)),
    ("docs/how-to/own-model.md", r"the (\d+) post-hoc methods and", len(POSTHOC_METHODS)),
    ("docs/how-to/own-model.md", r"the (\d+) Stage-II methods\)", len(STAGE2_ROWS)),
    ("docs/architecture.md", r"post-hoc \(the (\d+) calibrators of", len(POSTHOC_METHODS)),
]


@pytest.mark.parametrize(("file", "pattern", "count"), COUNTS, ids=[f"{f}:{p[:30]}" for f, p, _ in COUNTS])
def test_a_stated_count_is_the_registries(file, pattern, count):
    found = re.findall(pattern, (ROOT / file).read_text())
    assert found, f"{file} no longer says {pattern!r}: update COUNTS with the sentence that replaced it"
    assert [int(n) for n in found] == [count] * len(found)
