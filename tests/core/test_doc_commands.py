"""Every command the README and the documentation site show is one the CLI accepts: each `python studies/...`,
`python benchmarks/...` and `python -m calib....` in their code blocks (also inside `ray exec`/`ray submit`,
after `&&`, and the study after `calib.cluster slurm ... --`) is parsed by that script's own argparse parser,
flags, types and choices included. Nothing runs: parsing stops the script right after its `parse_args`."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SCRIPT = re.compile(r"^(studies|benchmarks)/\w+\.py$")
CODE_LANGUAGES = {"", "sh", "bash", "shell", "console", "text"}


class Parsed(BaseException):
    """Raised by the patched ``parse_args``: the command parsed; the script stops there."""


def code_blocks(text: str) -> list[str]:
    """Shell code of a Markdown page: fenced blocks (sh, bash or none) and indented blocks."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^\s*```\s*(\w*)", lines[i])
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
            if fence.group(1) in CODE_LANGUAGES:
                blocks.append("\n".join(lines[i + 1:end]))
            i = end + 1
        elif lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            blocks.append("\n".join(line[4:] for line in lines[i:end]))
            i = end
        else:
            i += 1
    return blocks


VARIABLE = re.compile(r"\$\{?([A-Z_][A-Z0-9_]*)\}?")


def shell_commands(block: str, variables: dict[str, str] | None = None) -> list[list[str]]:
    """The simple commands of a shell block: continuations joined, comments dropped, split at && || ; |.
    ``$VAR`` is replaced by its value in ``variables``, which collects the page's ``export VAR=...`` lines
    (the values a page tells the reader to set)."""
    variables = {} if variables is None else variables
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line = VARIABLE.sub(lambda m: variables.get(m.group(1), m.group(0)), line)
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:  # not shell (a table, a Python snippet)
            continue
        assignments = tokens[1:] if tokens[:1] == ["export"] else tokens
        if assignments and all(re.match(r"^[A-Z_][A-Z0-9_]*=", t) for t in assignments):
            variables.update(t.split("=", 1) for t in assignments)
            continue
        current: list[str] = []
        for token in [*tokens, "&&"]:
            if token in {"&&", "||", ";", "|"} or token.endswith(";"):
                if token.endswith(";") and token != ";":
                    current.append(token[:-1])
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(token)
    return commands


def calib_commands(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """(program, argv) for each calib command in ``tokens``: a study or benchmark script, or ``-m calib....``."""
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):  # VAR=value before the command
        tokens = tokens[1:]
    if tokens[:2] in (["ray", "exec"], ["ray", "submit"]):
        inner = [t for t in tokens[2:] if not t.startswith("-")]
        if tokens[1] == "exec" and len(inner) >= 2:
            return [c for command in shell_commands(inner[1]) for c in calib_commands(command)]
        rest = tokens[tokens.index(inner[1]):] if len(inner) >= 2 else []
        return [(rest[0], [t for t in rest[1:] if t != "--"])] if rest and SCRIPT.match(rest[0]) else []
    if not tokens or Path(tokens[0]).name not in {"python", "python3"}:
        return []
    if len(tokens) > 1 and SCRIPT.match(tokens[1]):
        return [(tokens[1], tokens[2:])]
    if tokens[1:3] and tokens[1] == "-m" and tokens[2].startswith("calib"):
        found = [(tokens[2], tokens[3:])]
        if "--" in tokens and tokens[3:4] == ["slurm"]:  # the study the Slurm job runs
            found += calib_commands(tokens[tokens.index("--") + 1:])
        return found
    return []


def documented_commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for page in PAGES:
        variables: dict[str, str] = {}
        for block in code_blocks(page.read_text()):
            for tokens in shell_commands(block, variables):
                for program, argv in calib_commands(tokens):
                    found.append((str(page.relative_to(ROOT)), program, argv))
    return found


COMMANDS = documented_commands()


def parse(program: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int | None, str]:
    """Run ``program``'s main up to its ``parse_args``: (SystemExit code or None when it parsed, stderr)."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [program, *argv])
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            if program.startswith("calib"):
                runpy.run_module(program if program.endswith("__main__") else f"{program}.__main__",
                                 run_name="__main__")
            else:
                runpy.run_path(str(ROOT / program), run_name="__main__")
        except Parsed:
            return None, stderr.getvalue()
        except SystemExit as exit_:
            return exit_.code, stderr.getvalue()
    return -1, "the program returned without parsing its arguments"


def test_the_pages_show_commands_of_every_kind():
    programs = {program for _, program, _ in COMMANDS}
    assert {"studies/sensitivity_gamma.py", "studies/search.py", "studies/calibrate.py",
            "calib.cluster", "calib.store"} <= programs
    assert any(page.startswith("docs/") for page, _, _ in COMMANDS) and any(p == "README.md" for p, _, _ in COMMANDS)


@pytest.mark.parametrize(("page", "program", "argv"), COMMANDS,
                         ids=[f"{page}: {program} {' '.join(argv)}"[:150] for page, program, argv in COMMANDS])
def test_a_documented_command_parses(page: str, program: str, argv: list[str], monkeypatch: pytest.MonkeyPatch):
    code, stderr = parse(program, argv, monkeypatch)
    assert code is None, f"{page}: `{program} {shlex.join(argv)}` does not parse:\n{stderr}"


@pytest.mark.parametrize(("program", "argv", "message"), [
    ("studies/sensitivity_gamma.py", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("studies/search.py", ["--sampler", "annealing"], "invalid choice: 'annealing'"),
    ("calib.cluster", ["wait", "--nodes", "three"], "invalid int value: 'three'"),
], ids=["unknown flag", "bad choice", "bad type"])
def test_a_command_the_cli_refuses_is_caught(program: str, argv: list[str], message: str,
                                             monkeypatch: pytest.MonkeyPatch):
    code, stderr = parse(program, argv, monkeypatch)
    assert code == 2 and message in stderr


def test_commands_are_found_in_fenced_indented_chained_and_nested_code():
    page = """Text.

    pip install -e . && python studies/cost.py --methods CE+TS  # a comment

```sh
MLFLOW_TRACKING_URI=sqlite:///m.db python studies/ood.py \\
    --seeds 1 2
ray exec cluster.yaml "python studies/report.py --store results"
python -m calib.cluster slurm --nodes 2 -- python studies/ablation.py --mode factorial
```

```python
python = 3
```

```sh
export STORE=s3://bucket/calib ARGS="--preset paper"  # the reader's values
python studies/report.py --store $STORE ${ARGS}
```
"""
    variables: dict[str, str] = {}
    found = [(program, argv) for block in code_blocks(page) for tokens in shell_commands(block, variables)
             for program, argv in calib_commands(tokens)]
    assert found == [("studies/cost.py", ["--methods", "CE+TS"]), ("studies/ood.py", ["--seeds", "1", "2"]),
                     ("studies/report.py", ["--store", "results"]),
                     ("calib.cluster", ["slurm", "--nodes", "2", "--", "python", "studies/ablation.py", "--mode",
                                        "factorial"]),
                     ("studies/ablation.py", ["--mode", "factorial"]),
                     ("studies/report.py", ["--store", "s3://bucket/calib", "--preset", "paper"])]
    assert variables == {"STORE": "s3://bucket/calib", "ARGS": "--preset paper"}
