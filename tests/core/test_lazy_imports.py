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


def test_the_callback_count_is_rays_without_importing_its_integrations():
    """Tune counts a run's callbacks for Ray's usage statistics by importing its W&B and MLflow integrations (and
    wandb and mlflow with them); calib's count gives Ray's numbers by the same names, and a driver that builds its
    run config and counts its callbacks imports neither."""
    import subprocess
    import sys

    code = """
import sys
from ray.tune import Callback
from ray.tune.logger import CSVLoggerCallback, LoggerCallback
from calib.run.execution import ExecutionOptions
from calib.run.tuner import count_callbacks_by_name, run_config

class Progress(Callback): pass
class Lines(LoggerCallback): pass
class WandbLoggerCallback(Callback): pass  # counted by its name, as Ray does
callbacks = [Progress(), Progress(), Lines(), CSVLoggerCallback(), WandbLoggerCallback(), object()]
config = run_config("/tmp/store", "s", ExecutionOptions(), callbacks[:3])
from ray.air._internal import usage
assert usage._count_callbacks is count_callbacks_by_name
print(count_callbacks_by_name(callbacks), count_callbacks_by_name(None))
print(sorted(m for m in ("wandb", "mlflow", "ray.air.integrations.wandb") if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    counts, imported = proc.stdout.splitlines()
    expected = {"CustomCallback": 2, "CustomLoggerCallback": 1, "CSVLoggerCallback": 1, "WandbLoggerCallback": 1}
    assert counts == f"{expected} {{}}" and imported == "[]", proc.stdout
    # Ray's own count, for the same callbacks (it imports the integrations to learn their names)
    rays = "from ray.air._internal.usage import _count_callbacks as count_callbacks_by_name"
    code = code.replace("from calib.run.tuner import count_callbacks_by_name, run_config", rays)
    code = code.split("config = run_config")[0] + "print(dict(count_callbacks_by_name(callbacks)))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(expected)
