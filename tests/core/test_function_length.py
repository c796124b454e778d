"""No function of calib is longer than a reader can hold at once: at most 120 lines, from its ``def`` to its
last line (a nested function counts toward its parent too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 120
KNOWN_LONGER: set[str] = set()
"""Functions allowed over the limit for now (none)."""


def function_lengths(source: str) -> dict[str, int]:
    """The lines of every function and method of ``source``, by name (``Class.method`` for a method, and
    ``outer.inner`` for a nested function)."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                lengths[prefix + child.name] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def test_no_function_is_over_the_limit():
    longer = {f"{path.relative_to(ROOT).as_posix()}:{name}": lines
              for path in sorted((ROOT / "calib").rglob("*.py"))
              for name, lines in function_lengths(path.read_text()).items() if lines > LIMIT}
    unexpected = {name: lines for name, lines in longer.items() if name not in KNOWN_LONGER}
    assert unexpected == {}, f"functions over {LIMIT} lines: split them into steps whose names say what they do"
    split = KNOWN_LONGER - set(longer)
    assert split == set(), f"no longer over {LIMIT} lines (or gone): remove them from KNOWN_LONGER"


def test_lengths_are_counted_from_def_to_the_last_line():
    source = ("class A:\n    def f(self):\n        def g():\n            return 1\n\n        return g\n\n\n"
              "async def h():\n    pass\n")
    assert function_lengths(source) == {"A.f": 5, "A.f.g": 2, "h": 2}


MODULE_LIMIT = 500


def test_no_module_is_over_the_limit():
    """A module of calib is one concern a reader can read in one sitting: at most 500 lines."""
    longer = {path.relative_to(ROOT).as_posix(): n for path in sorted((ROOT / "calib").rglob("*.py"))
              if (n := len(path.read_text().splitlines())) > MODULE_LIMIT}
    assert longer == {}, f"modules over {MODULE_LIMIT} lines: split them by concern"
