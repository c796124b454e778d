"""Every study is declared once, by its script (calib.study.declaration): each script of studies/ declares one, each
declared study has its page under docs/studies/, and a declaration is checked when it is made."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from calib import plugins
from calib._config import ConfigError
from calib._registry import Registry
from calib.registries import STUDIES
from calib.report.build import STUDY_FIGURES
from calib.study import declaration
from calib.study.declaration import StudyDeclaration, declare_study

ROOT = Path(__file__).resolve().parents[2]

NOT_A_STUDY = {
    "report.py": "reads the store; runs no study",
    "cost.py": "the wall times of compare_methods' trials (it runs that study)",
    "search.py": "one study per search space, search_<space> (and its _confirm table), named by the run",
}
"""The scripts of studies/ that declare no study of their own, and why."""


def missing_pages(root: Path, names: list[str]) -> list[str]:
    """The studies of ``names`` (declared) without their page under ``root``'s docs/studies/."""
    return [name for name in names if not (root / f"docs/studies/{name.replace('_', '-')}.md").is_file()]


def test_every_script_declares_its_study_once():
    declared = sorted(STUDIES)
    scripts = sorted(p.name for p in (ROOT / "studies").glob("*.py"))
    assert set(NOT_A_STUDY) <= set(scripts)
    for script in sorted(set(scripts) - set(NOT_A_STUDY)):
        module = sys.modules[f"calib_studies_{Path(script).stem}"]
        study = module.STUDY
        # equal, not the same object: another test may have imported the script first under another name
        assert isinstance(study, StudyDeclaration) and STUDIES.get(study.name) == study, script
        assert study.command.split()[0] == f"studies/{script}"
        assert study.question == module.__doc__.strip().splitlines()[0]
        assert study.metrics and all(isinstance(h, str) and h for h in study.metrics.values())
    for script in NOT_A_STUDY:
        assert not hasattr(sys.modules[f"calib_studies_{Path(script).stem}"], "STUDY"), script
    assert len(declared) == len(scripts) - len(NOT_A_STUDY)


def test_every_declared_study_has_its_page():
    assert missing_pages(ROOT, sorted(STUDIES)) == []
    for name in STUDIES:
        study = STUDIES.get(name)
        assert study.docs_page == f"docs/studies/{name.replace('_', '-')}.md"
        script = study.command.split()[0]
        assert script in (ROOT / study.docs_page).read_text(), f"{study.docs_page} does not name {script}"


def test_the_metrics_agree_where_they_used_to_differ():
    """The γ study's table and the report's: one set of headers (its printed table, docs/getting-started.md)."""
    gamma = STUDIES.get("sensitivity_gamma")
    assert list(gamma.metrics.values()) == ["ECE (%)", "Acc (%)", "AECE (%)", "MCE (%)"]
    printed = "| method | γ | n | ECE (%) | Acc (%) | AECE (%) | MCE (%) |"
    assert printed in (ROOT / "docs/getting-started.md").read_text()
    assert {STUDIES.get(name).figure for name in STUDIES} - {None} == set(STUDY_FIGURES)


def test_a_declaration_is_checked(monkeypatch):
    monkeypatch.setattr(declaration, "STUDIES", Registry("study"))
    doc = """Does it work? One line of question.\n\nMore text."""
    study = declare_study("my_study", doc, metrics={"test_ece": "ECE"})
    assert (study.name, study.question, study.command, study.figure) == (
        "my_study", "Does it work? One line of question.", "studies/my_study.py", None)
    assert declaration.STUDIES.get("my_study") is study
    # the same script imported twice (run as __main__, read by the report): the same declaration, a no-op
    assert declare_study("my_study", doc, metrics={"test_ece": "ECE"}) == study
    with pytest.raises(ValueError, match=r"Two scripts declare the study 'my_study' \(studies/my_study.py and "
                                         r"studies/other.py\)"):
        declare_study("my_study", doc, metrics={"test_ece": "ECE"}, command="studies/other.py")
    with pytest.raises(ValueError, match=r"The study 'no_doc' has no question"):
        declare_study("no_doc", None, metrics={"test_ece": "ECE"})
    with pytest.raises(ValueError, match=r"declares the figure 'pie'; the report draws gamma, alpha, severity, "
                                         r"sizes, bars"):
        declare_study("pie_study", doc, metrics={"test_ece": "ECE"}, figure="pie")
    assert sorted(declaration.STUDIES) == ["my_study"]


def _recipe(after: str) -> str:
    """The first Python block of docs/extending.md after the text ``after``, as it is there."""
    text = (ROOT / "docs" / "extending.md").read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index(after):], re.S)
    assert block is not None, after
    return block.group(1)


def test_a_new_study_is_its_script_its_page_and_its_test(tmp_path):
    """docs/extending.md §5's study script added to a copy of this checkout, and nothing else edited: report.py names
    it (the run that adds it to a store lacking it), lists it under --help, and the docs check asks for its page
    until it is there."""
    root = tmp_path / "copy"
    for folder in ("calib", "studies"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "docs" / "studies", root / "docs" / "studies")
    (root / "studies" / "my_study.py").write_text(_recipe("studies/my_study.py"))
    env = {**os.environ, "PYTHONPATH": str(root)}

    def python(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=600)

    store = tmp_path / "results"
    report = python(str(root / "studies" / "report.py"), "--store", str(store))
    assert report.returncode == 0, report.stderr[-3000:]
    assert f"skipped my_study: not in the store (run: python studies/my_study.py --store {store})" in report.stdout
    assert "skipped combine: not in the store" in report.stdout  # the shipped studies as before
    shown = python(str(root / "studies" / "report.py"), "--help")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "  my_study: Does my method beat temperature scaling? Vanilla, CE+TS and my method (one table).\n" \
           "    python studies/my_study.py\n" in shown.stdout
    listed = python("-c", "from calib.registries import STUDIES; print(' '.join(STUDIES))")
    names = listed.stdout.split()
    assert set(names) == set(STUDIES) | {"my_study"}, listed.stderr[-3000:]
    assert missing_pages(root, names) == ["my_study"]
    (root / "docs" / "studies" / "my-study.md").write_text("# My study\n\n`python studies/my_study.py`\n")
    assert missing_pages(root, names) == []


def test_a_study_script_that_fails_to_import_is_one_error(tmp_path, monkeypatch):
    (tmp_path / "broken.py").write_text('"""Does it import?"""\n\nraise RuntimeError("no data here")\n')
    monkeypatch.setattr(plugins, "studies_folder", lambda: tmp_path)
    monkeypatch.setitem(plugins._studies_state, "loaded", False)
    with pytest.raises(ConfigError, match=rf"The study script {re.escape(str(tmp_path / 'broken.py'))} failed to "
                                          r"import: RuntimeError: no data here\. Fix it, or move it out of "):
        plugins.load_studies()
    assert "calib_studies_broken" not in sys.modules and not plugins._studies_state["loading"]
