"""Paper tables from table specs (``tables/*.yaml``): ``python studies/report.py --table FILE`` writes
``<name>.tex``, ``<name>.md`` and ``<name>.csv`` (docs/studies/paper-tables.md).

:mod:`~calib.report.paper.spec` reads and checks a spec, :mod:`~calib.report.paper.cells` computes its cells through
:mod:`calib.report.policy`, :mod:`~calib.report.paper.render` writes them as Markdown and LaTeX.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path

import pyarrow.dataset as pads

from calib.report.paper.cells import CSV_COLUMNS, TableCells, table_cells
from calib.report.paper.render import latex, markdown
from calib.report.paper.spec import RowCatalog, RowSpec, SetupSpec, TableSpec, load_spec
from calib.report.tables import with_current_labels
from calib.store import read_trials

__all__ = ["CSV_COLUMNS", "RowCatalog", "RowSpec", "SetupSpec", "TableCells", "TableSpec", "load_spec",
           "missing_lines", "table_cells", "write_table"]


def missing_lines(spec: TableSpec, stored: Mapping[str, set[str]], commands: Mapping[str, str],
                  store: str) -> list[str]:
    """One line when none of the spec's studies is in the store, else one naming the rows none of them holds, each
    with the command that runs them (``commands``: study -> its command; ``{rows}`` in it stands for the rows' option,
    e.g. ``--methods {rows}``, left out for a study). ``stored``: study -> the labels it holds."""
    def command(study: str, rows: str = "") -> str:
        text = commands.get(study, f"studies/{study}.py")
        return f"python {text.format(rows=rows) if rows else re.sub(r' ?--[a-z-]+ [{]rows[}]', '', text)} " \
               f"--store {store}"

    held = [study for study in spec.studies if stored.get(study)]
    if not held:
        return [f"[{spec.name}] no trial of {' / '.join(spec.studies)} in {store}; run: {command(spec.studies[0])}"]
    missing = [row.label for row in spec.rows if not any(row.label in stored[study] for study in held)]
    if not missing:
        return []
    rows = " ".join(map(shlex.quote, missing))
    return [f"[{spec.name}] {'rows' if len(missing) > 1 else 'row'} {', '.join(missing)} not in the store; run: "
            f"{command(held[0], rows)}"]


def write_table(spec: TableSpec, store: str | os.PathLike, out: str | os.PathLike, *,
                commands: Mapping[str, str] | None = None, control: str | None = None, alpha: float = 0.05,
                correct_across: bool = False, test: str = "t-test", shown_store: str | None = None,
                log: Callable[[str], None] = print) -> tuple[list[Path], str | None]:
    """Write ``<out>/<name>.{tex,md,csv}`` of ``spec`` from ``store``; returns the files and the Markdown, or no
    file and None (with the line saying which command to run) when none of its studies is in the store.
    ``shown_store``: the store as the commands in those lines name it (default: ``store``)."""
    trials = read_trials(store, study=list(spec.studies), filters=pads.field("status") == "ok")
    labelled = with_current_labels(trials)
    stored = {study: set(labelled.loc[labelled["study"] == study, "label"].astype(str)) for study in spec.studies}
    for line in missing_lines(spec, stored, commands or {}, shown_store or str(store)):
        log(line)
    if not any(stored.values()):
        return [], None
    table = table_cells(spec, trials, control=control, alpha=alpha, correct_across=correct_across,
                        store=str(store), test=test, log=log)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(spec, table)
    written = []
    for suffix, content in ((".md", text), (".tex", latex(spec, table))):
        path = out / f"{spec.name}{suffix}"
        path.write_text(content)
        written.append(path)
    path = out / f"{spec.name}.csv"
    table.cells.to_csv(path, index=False)
    written.append(path)
    return written, text
