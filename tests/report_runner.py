"""``studies/report.py`` run in the test's process: its ``main``, as the command line runs it, without a second
interpreter spending 3 s importing pandas, matplotlib and calib. It starts no Ray and trains nothing."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import subprocess
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_report(*args: str) -> subprocess.CompletedProcess:
    """``python studies/report.py ARGS``: its exit code, stdout and stderr (warnings included, one line each, as
    Python prints them to a terminal)."""
    spec = importlib.util.spec_from_file_location("_report_study", ROOT / "studies" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            code = report.main(list(args))
        except SystemExit as exit_:  # argparse
            code = exit_.code
    for warning in caught:
        stderr.write(f"{warning.filename}:{warning.lineno}: {warning.category.__name__}: {warning.message}\n")
    return subprocess.CompletedProcess(["studies/report.py", *args], code, stdout.getvalue(), stderr.getvalue())
