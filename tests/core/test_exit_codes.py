"""The exit codes the documentation states are calib/exit_codes.py's: the README's sentence and docs/studies/index.md's
list for a study, docs/how-to/result-store.md's sentence and ``python -m calib.store compact --help`` for
compaction, and the Slurm job script's ``INTERRUPTED`` and ``FAILED``."""

from __future__ import annotations

import re
from pathlib import Path

from calib.exit_codes import COMPACT_EXIT_CODES, STUDY_EXIT_CODES, ExitCode

ROOT = Path(__file__).resolve().parents[2]


def sentence_codes(page: Path) -> dict[int, str]:
    """``Exit codes: 0 what, 1 what (why), ...``: code -> what (the words before its parenthesis or comma)."""
    after = re.sub(r" ?\([^()]*\)", "", re.sub(r"\s+", " ", page.read_text()).split("Exit codes: ", 1)[1])
    entries = re.match(r"(.*?)\.(?: |$)", after).group(1).split(", ")
    return {int(code): what.strip() for code, what in (entry.split(" ", 1) for entry in entries)}


def list_codes(page: Path, heading: str) -> dict[int, str]:
    """``- **N**: what ...`` items of the section under ``heading``: code -> its text."""
    section = page.read_text().split(heading, 1)[1].split("\n#", 1)[0]
    return {int(code): text for code, text in re.findall(r"^- \*\*(\d+)\*\*: (.*)$", section, flags=re.MULTILINE)}


def as_numbers(table: dict[ExitCode, str]) -> dict[int, str]:
    return {int(code): what for code, what in table.items()}


def test_the_readme_states_a_studys_exit_codes():
    assert sentence_codes(ROOT / "README.md") == as_numbers(STUDY_EXIT_CODES)


def test_the_studies_page_lists_a_studys_exit_codes():
    listed = list_codes(ROOT / "docs" / "studies" / "index.md", "### Exit codes")
    assert sorted(listed) == sorted(as_numbers(STUDY_EXIT_CODES))
    for code, what in as_numbers(STUDY_EXIT_CODES).items():
        assert listed[code].startswith(what), (code, listed[code])


def test_the_store_page_and_compacts_help_state_its_exit_codes():
    from calib.store.__main__ import EXIT_CODES

    assert sentence_codes(ROOT / "docs" / "how-to" / "result-store.md") == as_numbers(COMPACT_EXIT_CODES)
    helped = {int(code) for code in re.findall(r"^  (\d+)  ", EXIT_CODES, flags=re.MULTILINE)}
    assert helped == set(as_numbers(COMPACT_EXIT_CODES))


def test_the_slurm_job_script_uses_the_codes():
    golden = (ROOT / "tests" / "cluster" / "golden" / "slurm_gpu.sbatch").read_text()
    assert f"\nINTERRUPTED={int(ExitCode.INTERRUPTED)}\nFAILED={int(ExitCode.FAILED)}\n" in golden


def test_the_parsers_read_what_the_pages_write(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("Intro. Exit codes: 0 all done, 1 some\nfailed (see the log, 2 places), 3 stopped. Next one.\n\n"
                    "### Exit codes\n\n- **0**: all done.\n- **2**: bad input: a value.\n    - nested\n\n## Next\n")
    assert sentence_codes(page) == {0: "all done", 1: "some failed", 3: "stopped"}
    assert list_codes(page, "### Exit codes") == {0: "all done.", 2: "bad input: a value."}
