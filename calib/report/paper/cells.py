"""The cells of a paper table: the store's ok rows of the spec's studies, per setup, through calib's significance
policy (:mod:`calib.report.policy`): one line per (setup, row, metric) with mean, CI, std, n (seeds), test, p,
adjusted p, marker and the paired difference from the control."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from calib.report import policy
from calib.report.paper.spec import SetupSpec, TableSpec
from calib.report.published import published_ece
from calib.report.tables import with_current_labels

__all__ = ["CSV_COLUMNS", "TableCells", "table_cells"]

CSV_COLUMNS = ["study", "setup", "dataset", "arch", "row", "label", "metric", "mean", "ci_low", "ci_high", "std", "n",
               "test", "p", "p_adjusted", "marker", "difference", "difference_low", "difference_high"]
"""The columns of a table's CSV, one line per cell; values as the store holds them (fractions stay fractions)."""


@dataclass(frozen=True)
class TableCells:
    """Everything a paper table shows: ``cells`` (:data:`CSV_COLUMNS`), the ``setups`` in column order, the rows
    present in the store (stored labels, in the spec's order), the ``control`` label (or None), the legend lines,
    and MaC-Cal Table 1's ECE per (setup header, label) where the spec asks for it and it is published."""

    cells: pd.DataFrame
    setups: tuple[SetupSpec, ...]
    control: str | None
    legend: list[str]
    published: dict[tuple[str, str], float]


def _setups(spec: TableSpec, trials: pd.DataFrame, log: Callable[[str], None]) -> tuple[SetupSpec, ...]:
    """The spec's setups the store has, else (none of them) every setup the store has for the spec's rows."""
    held = set(trials[["dataset", "arch"]].astype(str).itertuples(index=False, name=None))
    chosen = tuple(s for s in spec.setups if (s.dataset, s.arch) in held)
    if chosen:
        if missing := [f"{s.dataset}/{s.arch}" for s in spec.setups if s not in chosen]:
            log(f"[{spec.name}] not in the store, left out: {', '.join(missing)}")
        return chosen
    return tuple(SetupSpec(d, a, f"{d} · {a}") for d, a in sorted(held))


def _setup_trials(spec: TableSpec, trials: pd.DataFrame, setup: SetupSpec) -> pd.DataFrame:
    """The ok trials of one setup, each row from the first of the spec's studies that has it there."""
    here = trials[(trials["dataset"].astype(str) == setup.dataset) & (trials["arch"].astype(str) == setup.arch)]
    parts = []
    for row in spec.rows:
        of_row = here[here["label"] == row.label]
        for study in spec.studies:
            if (of_study := of_row[of_row["study"] == study]).shape[0]:
                parts.append(of_study)
                break
    return pd.concat(parts, ignore_index=True) if parts else here.iloc[:0]


def _control(spec: TableSpec, control: str | None, present: list[str], log: Callable[[str], None]) -> str | None:
    chosen = control or spec.control or policy.default_control(spec.studies[0], present)
    if chosen is not None and chosen not in present:
        log(f"[{spec.name}] no significance markers: the control {chosen!r} is not a row of this table in the store")
        return None
    return chosen


def _legend(legends: dict[str, list[str]]) -> list[str]:
    """The lines under the table: a line every setup has once, any other after its setup's header."""
    shared = [line for line in next(iter(legends.values()), []) if all(line in lines for lines in legends.values())]
    return shared + [f"{header}: {line}" for header, lines in legends.items() for line in lines if line not in shared]


def _pairs_tested(spec: TableSpec, group: pd.DataFrame, comparison: policy.SetupComparison,
                  pairs: dict[str, str], *, alpha: float, store: str | None, study: str,
                  test: str) -> policy.SetupComparison:
    """``comparison`` (no control) with each row of ``pairs`` tested against its own row under the policy (the
    paired test over seeds of the two rows alone), then Holm over the pairs of each column."""
    cells = comparison.cells.copy()
    held = set(group["label"].astype(str))
    legend: list[str] = []
    for label, against in pairs.items():
        if label not in held or against not in held:
            continue
        pair = group[group["label"].astype(str).isin([label, against])]
        tested = policy.compare_setup(pair, spec.metrics, against, alpha=alpha, store=store, study=study, test=test)
        ours = tested.cells[tested.cells["label"] == label].set_index("metric")
        if not tested.test:
            legend += [line.replace(f"the control {against}", against) for line in tested.legend]
        for metric in spec.metrics:
            index = cells.index[(cells["label"] == label) & (cells["metric"] == metric)][0]
            for column in ("test", "p", "difference", "difference_low", "difference_high"):
                cells.at[index, column] = ours.at[metric, column]
    for metric in spec.metrics:  # Holm over the pairs of the column
        index = cells.index[cells["metric"] == metric]
        adjusted = policy.adjust_across(cells.loc[index], alpha)
        cells.loc[index, ["p_adjusted", "marker"]] = adjusted[["p_adjusted", "marker"]].to_numpy()
    used = {t for t in cells["test"] if t}
    kind = {"t-test": "paired t-test on seed", "wilcoxon": "Wilcoxon signed-rank test on seed",
            "bootstrap": "paired bootstrap over seeds and test samples"}
    labels = [row.label for row in spec.rows]
    above = all(labels.index(b) == labels.index(a) + 1 for b, a in pairs.items())
    partner = "the row above it" if above else "the row it is paired with (" + "; ".join(
        f"{spec.name_of(b)} against {spec.name_of(a)}" for b, a in pairs.items()) + ")"
    legend.insert(0, f"▲ / ▼: significantly better / worse than {partner}: "
                     f"{', '.join(kind[t] for t in sorted(used)) or 'no test'} of the two rows, Holm over the pairs "
                     f"of each column, α = {alpha:g}; n: seeds, each seed's trials averaged first.")
    return policy.SetupComparison(cells, legend, None, ", ".join(sorted(used)))


def table_cells(spec: TableSpec, trials: pd.DataFrame, *, control: str | None = None, alpha: float = 0.05,
                correct_across: bool = False, store: str | None = None, test: str = "t-test",
                log: Callable[[str], None] = print) -> TableCells:
    """The cells of ``spec`` from the store's ok ``trials`` (every study; those of the spec's studies and rows are
    used). ``control``: the row to compare against (default: the spec's, else the study's own,
    :func:`calib.report.policy.default_control`); ``correct_across``: Holm over every tested cell of the table
    (:func:`calib.report.policy.adjust_across`) instead of over the rows of each column; ``test``: the paired test
    over seeds (``t-test`` or ``wilcoxon``)."""
    trials = with_current_labels(trials[trials["study"].astype(str).isin(spec.studies)])
    trials = trials[trials["label"].isin([row.label for row in spec.rows])]
    setups = _setups(spec, trials, log)
    present = [row.label for row in spec.rows if (trials["label"] == row.label).any()]
    # rows tested against their own row (`against`), unless --control names one row for all
    pairs = {row.label: row.against for row in spec.rows if row.against} if control is None else {}
    control = None if pairs else _control(spec, control, present, log)
    frames, legends, published = [], {}, {}
    for setup in setups:
        group = _setup_trials(spec, trials, setup)
        if group.empty:
            continue
        study = str(group["study"].iloc[0])
        here_control = control if control in set(group["label"]) else None
        comparison = policy.compare_setup(group, spec.metrics, here_control, alpha=alpha, store=store, study=study,
                                            test=test)
        if pairs:
            comparison = _pairs_tested(spec, group, comparison, pairs, alpha=alpha, store=store, study=study,
                                       test=test)
        studies = group.groupby("label")["study"].first()
        labels = comparison.cells["label"]
        frames.append(comparison.cells.assign(study=labels.map(studies).astype(str),
                                              setup=f"{setup.dataset}/{setup.arch}", dataset=setup.dataset,
                                              arch=setup.arch, row=labels.map(spec.name_of)))
        named = spec.name_of(here_control) if here_control is not None else ""
        # the legend names the control as the table does
        legends[setup.header] = [line.replace(f" {here_control} ", f" {named} ") if here_control else line
                                 for line in comparison.legend]
        if spec.published and "test_ece" in spec.metrics:
            for label in group["label"].unique():
                if (value := published_ece(setup.dataset, setup.arch, str(label))) is not None:
                    published[(setup.header, str(label))] = value
    cells = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=CSV_COLUMNS)
    legend = _legend(legends)
    if correct_across and not cells.empty:
        cells = policy.adjust_across(cells, alpha)
        tests = int(cells["p"].notna().sum())
        across = f"Holm over every tested cell of this table ({tests} tests: setups × metrics × rows)"
        legend = [line.replace("Holm over the rows of each column", across) for line in legend]
        if not any(across in line for line in legend):
            legend.append(f"p adjusted by {across}, α = {alpha:g}.")
    order = {row.label: i for i, row in enumerate(spec.rows)}
    columns = {column: i for i, column in enumerate(spec.metrics)}
    setup_order = {f"{s.dataset}/{s.arch}": i for i, s in enumerate(setups)}
    cells = cells.assign(_key=[(setup_order[s], order[label], columns[m]) for s, label, m
                               in zip(cells["setup"], cells["label"], cells["metric"], strict=True)])
    cells = cells.sort_values("_key", kind="stable")[CSV_COLUMNS].reset_index(drop=True)
    return TableCells(cells, setups, control, legend, published)
