"""Argument errors of every command calib ships (each script in studies/, ``python -m calib.store``,
``python -m calib.cluster``, ``python -m calib.cluster.mps``): exactly one stderr line, starting ``error:`` and naming
the bad value, exit 2, no usage block, and nothing written. ``--help`` still prints the usage."""

from __future__ import annotations

import pytest

from tests.in_process import ROOT, run_refused

SCRIPTS = sorted(p.name for p in (ROOT / "studies").glob("*.py"))
DRAWS = {"ablation.py", "calibrate.py", "corruption.py", "mixup_alpha.py", "posthoc.py", "report.py", "search.py",
         "sensitivity_gamma.py"}
SPACE = str(ROOT / "search_spaces" / "focal.yaml")


def _cases() -> list[tuple[str, list[str], str]]:
    cases = []
    for script in SCRIPTS:
        needs = ["--space", SPACE] if script == "search.py" else []
        if script == "report.py":
            cases.append((script, ["--alpha", "x"], "argument --alpha: invalid float value: 'x'"))
        else:
            cases.append((script, [*needs, "--seeds", "4,5"], "argument --seeds: invalid int value: '4,5'"))
        if script in DRAWS:
            cases.append((script, [*needs, "--format", "gif"], "argument --format: invalid choice: 'gif'"))
            cases.append((script, [*needs, "--dpi", "0"], "argument --dpi: invalid value '0': a positive integer"))
    cases.append(("search.py", ["--space", SPACE, "--replicates", "many"],
                  "argument --replicates: invalid int value: 'many'"))
    cases.append(("search.py", ["--num-trials", "3"], "the following arguments are required: --space"))
    cases.append(("search.py", ["--space", SPACE, "--replicates", "0"], "--replicates"))
    return cases


def test_every_script_is_covered():
    assert {case[0] for case in _cases()} == set(SCRIPTS) and len(SCRIPTS) >= 13
    assert DRAWS <= set(SCRIPTS)


def _one_error_line(err: str, message: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert "usage:" not in err and "--help" in lines[0]


@pytest.mark.parametrize(("script", "argv", "message"), _cases(), ids=lambda v: v if isinstance(v, str) else None)
def test_a_study_argument_error_is_one_line(script, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = run_refused(script, [*argv, "--store", str(tmp_path / "results")], monkeypatch, capsys)
    assert code == 2
    _one_error_line(err, message)
    assert list(tmp_path.iterdir()) == []  # nothing written: no store, no figures, no Ray folder


def _module_main(module: str):
    import importlib

    return importlib.import_module(module).main


@pytest.mark.parametrize(("module", "argv", "message"), [
    ("calib.store.__main__", ["compact", "--wait", "soon"], "argument --wait: invalid float value: 'soon'"),
    ("calib.store.__main__", ["rescore", "--metric", "ece", "--bins", "ten"], "argument --bins: invalid int value"),
    ("calib.store.__main__", ["tidy"], "argument command: invalid choice: 'tidy'"),
    ("calib.cluster", [], "the following arguments are required: command"),
    ("calib.cluster", ["slurm", "--nodes", "two"], "argument --nodes: invalid int value: 'two'"),
    ("calib.cluster.mps", ["begin"], "argument action: invalid choice: 'begin'"),
])
def test_a_cli_argument_error_is_one_line(module, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        _module_main(module)(argv)
    assert done.value.code == 2
    _one_error_line(capsys.readouterr().err, message)
    assert list(tmp_path.iterdir()) == []


def test_help_still_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as done:
        _module_main("calib.store.__main__")(["compact", "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m calib.store compact")


def test_the_figure_flags_are_in_use_once_parsed():
    from calib.report.figure_options import FigureOptions, figure_options, use_figure_options
    from calib.study.flags import study_parser

    try:
        study_parser(None, study="x", figures=True).parse_args(["--format", "svg", "--dpi", "300",
                                                                 "--figure-width", "column"])
        assert figure_options() == FigureOptions("svg", 300, "column")
        assert not hasattr(study_parser(None, study="x").parse_args([]), "figure_format")
    finally:
        use_figure_options(FigureOptions())
