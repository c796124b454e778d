"""Study scripts run in the test's process: their ``main``, as the command line runs it, without a second
interpreter spending seconds importing torch, pandas and matplotlib: a report, bad input a study must refuse
before Ray starts (a started Ray fails the test), and whole studies, which share one local Ray (started by the
first, stopped when the test module ends: ``tests/conftest.py``) instead of starting and stopping their own.
What only a real command line shows (its exit status, a killed or signalled driver, two drivers at once) runs
as one, in the tests of those things."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import subprocess
import warnings
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
_STUDIES: dict[str, ModuleType] = {}


def study_module(script: str) -> ModuleType:
    """The module of ``studies/<script>``, imported once."""
    if script not in _STUDIES:
        spec = importlib.util.spec_from_file_location(f"_in_process_{Path(script).stem}", ROOT / "studies" / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _STUDIES[script] = module
    return _STUDIES[script]


def run_refused(script: str, argv: list[str], monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """``studies/<script> ARGV`` for input it must refuse before Ray starts: its exit code and stderr."""
    import calib.run.skeleton as skeleton  # where every grid and search starts Ray (TuneRun.fit)

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started: the bad input was accepted")

    monkeypatch.setattr(skeleton, "init_ray", no_ray)
    main = study_module(script).main
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse
        code = exit_.code
    return code, capsys.readouterr().err


def run_study(script: str, *args: str) -> subprocess.CompletedProcess:
    """``python studies/<script> ARGS``: its exit code, stdout and stderr (warnings included, one line each, as
    Python prints them to a terminal)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            code = study_module(script).main(list(args))
        except SystemExit as exit_:  # argparse
            code = exit_.code
    for warning in caught:
        stderr.write(f"{warning.filename}:{warning.lineno}: {warning.category.__name__}: {warning.message}\n")
    return subprocess.CompletedProcess([f"studies/{script}", *args], code, stdout.getvalue(), stderr.getvalue())


def run_report(*args: str) -> subprocess.CompletedProcess:
    """``python studies/report.py ARGS``, as :func:`run_study`."""
    return run_study("report.py", *args)
