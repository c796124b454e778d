"""``--help`` of every study shows each flag's default once, and the real one (the preset's where the
preset decides)."""

import importlib.util
import re
from pathlib import Path

import pytest

from calib.study.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]
STUDIES = sorted(p.name for p in (ROOT / "studies").glob("*.py"))


def help_text(script: str, capsys) -> str:
    spec = importlib.util.spec_from_file_location(f"_help_{Path(script).stem}", ROOT / "studies" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    return re.sub(r"\s+", " ", capsys.readouterr().out)


def flag_help(text: str, flag: str) -> str:
    """The help of ``flag`` (up to the next option)."""
    return re.search(rf" {flag} [A-Z_]* ?(.*?)(?= --[a-z]|$)", text.split("options:")[1]).group(1)


@pytest.mark.parametrize("script", STUDIES)
def test_each_default_once_and_never_none(script, capsys):
    text = help_text(script, capsys)
    assert "(default: None)" not in text
    options = text.split("options:")[1]
    for flag in re.findall(r"(?<=\s)(--[a-z][a-z0-9-]*)", options):
        assert flag_help(text, flag).count("(default") <= 1, f"{script} {flag}: {flag_help(text, flag)}"


def test_preset_defaults_are_the_presets_values(capsys):
    text = help_text("sensitivity_gamma.py", capsys)
    quick, paper, full = PRESETS.get("quick"), PRESETS.get("paper"), PRESETS.get("full-cpu")
    assert (f"(default: full-cpu: {full.stage1['epochs']}; medium: 60; paper: 350 (tiny-imagenet: 100); "
            f"quick: {quick.stage1['epochs']})" in flag_help(text, "--epochs"))
    assert ("(default: full-cpu: 1 2 3 4 5; medium: 1 2 3; paper: 1; quick: 1 2 3 4 5)"
            in flag_help(text, "--seeds"))
    assert (f"(default: full-cpu: 0; medium: 0.125 (0 without a GPU); paper: {paper.gpus_per_cached_trial:g}; quick: 0)"
            in flag_help(text, "--gpus-per-cached-trial"))
    assert "(default: full-cpu: 5; medium: 5; paper: 10; quick: 1)" in flag_help(text, "--checkpoint-every")
    assert "(default: the whole training split)" in flag_help(text, "--train-size")
    assert "(default: 40 (the method's own))" in flag_help(text, "--stage2-epochs")
    assert "(default: 0.8 0.85 0.9 0.95 1.0)" in flag_help(text, "--gammas")
    assert "(default: sensitivity_gamma)" in flag_help(text, "--study")
    assert "(default: search_<name of the space file>)" in flag_help(help_text("search.py", capsys), "--study")
