"""Every import inside a function says why it is not at the top of its module: its start-up cost, an optional
dependency, or the circle it avoids. A comment on the import's line, or on the line above its block of imports
(blank lines inside the block allowed), is the reason."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def unexplained_imports(source: str) -> list[int]:
    """The lines of ``source``'s function-level imports that have no reason."""
    lines = source.splitlines()
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or "#" in lines[node.lineno - 1]:
                continue
            above = node.lineno - 2
            while above >= 0 and (not lines[above].strip() or lines[above].strip().startswith(("import ", "from "))):
                above -= 1
            if above < 0 or not lines[above].strip().startswith("#"):
                found.append(node.lineno)
    return found


def test_every_function_level_import_says_why():
    found = [f"{path.relative_to(ROOT)}:{line}" for path in sorted((ROOT / "calib").rglob("*.py"))
             for line in unexplained_imports(path.read_text())]
    assert found == [], "give these imports a reason comment or move them to the top:\n" + "\n".join(found)


def test_the_check_reads_a_reason_above_the_block_or_on_the_line():
    source = ("def a():\n    # lazy: ray takes seconds\n    import ray\n\n    from calib import x\n\n"
              "def b():\n    import optuna  # optional\n\n"
              "def c():\n    value = 1\n    import numpy\n")
    assert unexplained_imports(source) == [12]


def test_the_mailbox_actor_imports_no_torch():
    """Ray imports an actor's module in the worker it starts for it: the driver's mailbox (one per study run)
    costs that worker the standard library, not torch's, pandas' and scikit-learn's seconds of CPU; and
    ``calib.run``'s public names still import on first use."""
    import subprocess
    import sys

    heavy = ("torch", "pandas", "sklearn", "ray", "calib.run.execution")
    code = ("import sys, calib.run.mailbox\n"
            f"print(sorted(m for m in {heavy} if m in sys.modules))\n"
            "from calib.run import run_grid, TuneRun\n"
            "print(run_grid.__module__, TuneRun.__module__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "calib.run.grid calib.run.skeleton"]
    import calib.run

    assert not hasattr(calib.run, "no_such_name")
