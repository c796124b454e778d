"""The one significance policy of every table calib prints or writes: a study's printout, ``report.py``, the paper
tables of ``report.py --table`` and their CSV all come from :func:`compare_setup`.

**Unit of replication: the seed.** A cell's n is the number of distinct seeds of its row. The trials of one seed
(its Stage-II seeds, its calibration-set draws) are averaged first; the mean, the 95% interval and the std are over
those per-seed values (:func:`calib.report.tables.summarize`, which every table calls).

**Which test**, per setup (dataset × architecture), each row against the control, per metric column:

- the control has :data:`MIN_SEEDS` (3) seeds or more: a paired test over the seeds the row shares with it
  (Student's t-test; the Wilcoxon signed-rank test with ``test="wilcoxon"``), :func:`~calib.report.significance.
  paired_against_control`; the paired difference's interval is the Student-t interval of the per-seed differences;
- fewer seeds, and every trial of the setup kept its test predictions on one test set: the two-level bootstrap over
  seeds and test samples (:mod:`calib.report.bootstrap`), whose draws give the p-value, the cells' intervals and the
  difference's interval alike;
- otherwise no marker, and the legend says why.

Holm's step-down procedure over the rows of each column; ▲ / ▼ where it rejects at α (by the metric's direction).
Descriptive columns (:data:`DESCRIPTIVE_COLUMNS`: ΔAcc, changed, fit seconds) are never tested. ``adjust_across``
applies Holm over every tested cell of a whole table instead (``--correct-across``).

**The control** is the study's own (:func:`default_control`): a search's ``_confirm`` study and an ablation compare
against their first row (the method's default row; the ladder's first rung); every other study against its
temperature-scaling row (CE+TS, TS, TS · all) or, lacking one, the default row of its tuned ``--row`` rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from calib.report import bootstrap
from calib.report.significance import PAIRED_TESTS, holm, paired_against_control
from calib.report.significance import default_control as ts_control
from calib.report.tables import PREDICTION_CHANGE_COLUMNS, column_higher_is_better, summarize

__all__ = ["DESCRIPTIVE_COLUMNS", "MIN_SEEDS", "PAIRED_TESTS", "SetupComparison", "adjust_across", "compare_setup",
           "default_control", "row_order"]

MIN_SEEDS = 3
"""Setups whose control has fewer seeds than this are tested by the two-level bootstrap, or not at all."""
DESCRIPTIVE_COLUMNS = frozenset({*PREDICTION_CHANGE_COLUMNS, "method_seconds"})
"""Columns that describe a row rather than score it: never tested, never marked."""
CELL_COLUMNS = ["label", "metric", "mean", "ci_low", "ci_high", "std", "n", "test", "p", "p_adjusted", "marker",
                "difference", "difference_low", "difference_high"]

def row_order(trials: pd.DataFrame) -> list[str]:
    """The labels of ``trials`` in the study's order (``label_rank``, then label), each once."""
    if "label_rank" not in trials:
        return list(dict.fromkeys(trials["label"].astype(str)))
    first = trials.groupby("label", observed=True)["label_rank"].min().reset_index()
    return [str(label) for label in first.sort_values(["label_rank", "label"], kind="stable")["label"]]


def default_control(study: str, labels: Sequence[str]) -> str | None:
    """The row a study's cells are compared against: the first of ``labels`` (in the study's order) for a search's
    ``<study>_confirm`` (the method's default row) and an ablation (its first rung); else the temperature-scaling
    row, or the default row ``X`` of a tuned row ``X (tuned: …)``; None when there is none."""
    labels = list(labels)
    if not labels:
        return None
    if study.endswith("_confirm") or study.startswith("ablation"):
        return labels[0]
    if (control := ts_control(labels)) is not None:
        return control
    return next((label.split(" (tuned: ")[0] for label in labels
                 if " (tuned: " in label and label.split(" (tuned: ")[0] in labels), None)


@dataclass(frozen=True)
class SetupComparison:
    """One setup's table under the policy: a row per (label, metric) in :attr:`cells` (columns
    :data:`CELL_COLUMNS`; fractions stay fractions), the lines under the table, the control and the test used."""

    cells: pd.DataFrame
    legend: list[str]
    control: str | None
    test: str

    def summary(self) -> pd.DataFrame:
        """The cells as :func:`~calib.report.tables.summarize` lays them out: a row per label (in order) with ``n``
        and ``<metric>_mean`` / ``_ci`` (the interval's half-width) / ``_std``."""
        rows = []
        for label, cells in self.cells.groupby("label", sort=False):
            row = {"label": label, "n": int(cells["n"].max())}
            for cell in cells.itertuples(index=False):
                row[f"{cell.metric}_mean"] = cell.mean
                row[f"{cell.metric}_ci"] = (cell.ci_high - cell.ci_low) / 2
                row[f"{cell.metric}_std"] = cell.std
            rows.append(row)
        return pd.DataFrame(rows)

    def markers(self) -> dict[tuple[str, str], str]:
        """(label, metric) -> "better" / "worse" for the marked cells."""
        marked = self.cells[self.cells["marker"] != ""]
        return {(str(c.label), str(c.metric)): str(c.marker) for c in marked.itertuples(index=False)}


def compare_setup(trials: pd.DataFrame, metrics: Mapping[str, str], control: str | None, *, alpha: float = 0.05,
                  store: str | None = None, study: str | None = None, test: str = "t-test") -> SetupComparison:
    """The cells of one setup's table (``trials``: its ok rows with ``label`` and ``seed``; ``metrics``: column ->
    header) under the policy of this module: each row's mean, 95% interval, std and n over seeds, and against
    ``control`` the paired difference, its interval, p, Holm's p and the marker. ``store`` and ``study`` let a setup
    with fewer than :data:`MIN_SEEDS` seeds be bootstrapped from its kept test predictions."""
    if test not in PAIRED_TESTS:
        raise ValueError(f"unknown paired test {test!r}; allowed: {', '.join(PAIRED_TESTS)}")
    order = row_order(trials)
    summary = summarize(trials.assign(label=trials["label"].astype(str)), ["label"], list(metrics)).set_index("label")
    cells = pd.DataFrame([{"label": label, "metric": metric, "mean": summary.at[label, f"{metric}_mean"],
                           "ci_low": summary.at[label, f"{metric}_mean"] - summary.at[label, f"{metric}_ci"],
                           "ci_high": summary.at[label, f"{metric}_mean"] + summary.at[label, f"{metric}_ci"],
                           "std": summary.at[label, f"{metric}_std"], "n": int(summary.at[label, "n"]), "test": "",
                           "p": np.nan, "p_adjusted": np.nan, "marker": "", "difference": np.nan,
                           "difference_low": np.nan, "difference_high": np.nan}
                          for label in order for metric in metrics], columns=CELL_COLUMNS)
    if control is None:
        return SetupComparison(cells, [], None, "")
    if control not in order:
        return SetupComparison(cells, [f"No markers: the control {control} has no trial in this setup."], control, "")
    tested = {m: h for m, h in metrics.items() if m not in DESCRIPTIVE_COLUMNS}
    seeds = trials.loc[trials["label"].astype(str) == control, "seed"].nunique()
    if seeds >= MIN_SEEDS:
        legend = _paired(cells, trials, tested, control, alpha, test)
        used = test
    else:
        samples = None if store is None or study is None else bootstrap.setup_samples(store, study, trials)
        if samples is None:
            return SetupComparison(cells, [
                f"No markers: {control} has {seeds} seed{'s' * (seeds != 1)} here (a paired test over seeds needs >= "
                f"{MIN_SEEDS}) and not every trial kept its test predictions (--keep-predictions) for the "
                "bootstrap over seeds and test samples."], control, "")
        legend = _bootstrapped(cells, samples, tested, control, alpha, int(trials["num_bins"].iloc[0])
                               if "num_bins" in trials else 15)
        used = "bootstrap"
    if DESCRIPTIVE_COLUMNS & metrics.keys():
        descriptive = [header for metric, header in metrics.items() if metric in DESCRIPTIVE_COLUMNS]
        legend.append(f"Not tested (descriptive): {', '.join(descriptive)}.")
    return SetupComparison(cells, legend, control, used)


def _mark(cells: pd.DataFrame, rows: pd.Index, alpha: float) -> None:
    """Holm over the ``rows`` of ``cells`` (one metric column, p set) and their markers, in place."""
    if rows.empty:
        return
    rejected, adjusted = holm(cells.loc[rows, "p"].to_numpy(float), alpha)
    cells.loc[rows, "p_adjusted"] = adjusted
    for index, reject in zip(rows, rejected, strict=True):
        if reject:
            difference, metric = cells.at[index, "difference"], cells.at[index, "metric"]
            better = difference > 0 if column_higher_is_better(metric) else difference < 0
            cells.at[index, "marker"] = "better" if better else "worse"


def _paired(cells: pd.DataFrame, trials: pd.DataFrame, metrics: Mapping[str, str], control: str, alpha: float,
            test: str) -> list[str]:
    untested: dict[str, list[str]] = {}
    equal: dict[str, list[str]] = {}
    for metric, header in metrics.items():
        tests = paired_against_control(trials.assign(label=trials["label"].astype(str)), metric, control,
                                       alpha=alpha, min_seeds=MIN_SEEDS, test=test)
        rows = []
        for label, result in tests.iterrows():
            index = cells.index[(cells["label"] == label) & (cells["metric"] == metric)][0]
            if np.isnan(result["p"]):
                untested.setdefault(str(label), []).append(header)
                continue
            cells.loc[index, ["test", "p", "difference", "difference_low", "difference_high"]] = [
                test, result["p"], result["difference"], result["difference_low"], result["difference_high"]]
            rows.append(index)
            if result["reason"] == "equal on every seed":
                equal.setdefault(str(label), []).append(header)
        _mark(cells, pd.Index(rows), alpha)
    legend = [f"▲ / ▼: significantly better / worse than {control} over the seeds of this setup (paired "
              f"{'t-test' if test == 't-test' else 'Wilcoxon signed-rank test'} on seed, Holm over the rows of each "
              f"column, α = {alpha:g}); n: seeds, each seed's trials averaged first."]
    others = [label for label in cells["label"].drop_duplicates() if label != control]
    if untested:
        legend.append(f"Not tested (fewer than {MIN_SEEDS} seeds in common with {control}): "
                      f"{_rows_with(untested, others, len(metrics))}.")
    if equal:
        legend.append(f"Equal to {control} on every seed (p = 1): {_rows_with(equal, others, len(metrics))}.")
    return legend


def _bootstrapped(cells: pd.DataFrame, samples: tuple[dict, int], metrics: Mapping[str, str], control: str,
                  alpha: float, num_bins: int) -> list[str]:
    by_label, size = samples
    seeds = len(by_label[control])
    unmarked, lacking = [], set()
    for metric, header in metrics.items():
        result = bootstrap.two_level_bootstrap(by_label, control, metric, num_bins=num_bins)
        if result is None:
            unmarked.append(header)
            continue
        rows = []
        for label, row in result.iterrows():
            index = cells.index[(cells["label"] == label) & (cells["metric"] == metric)][0]
            if row["reason"]:
                lacking.add(str(label))
                continue
            cells.loc[index, ["ci_low", "ci_high"]] = [row["low"], row["high"]]
            if label == control:
                continue
            cells.loc[index, ["test", "p", "difference", "difference_low", "difference_high"]] = [
                "bootstrap", row["p"], row["difference"], row["difference_low"], row["difference_high"]]
            rows.append(index)
        _mark(cells, pd.Index(rows), alpha)
    level = (f"the {seeds} seeds and the {size} test samples" if seeds > 1
             else f"the {size} test samples (1 seed: the seeds' own variation is not in the test)")
    legend = [f"▲ / ▼: significantly better / worse than {control} by a paired bootstrap over {level} "
              f"({bootstrap.RESAMPLES} draws, seed {bootstrap.SEED}, the same for every row; Holm over the rows of "
              f"each column, α = {alpha:g}); fewer than {MIN_SEEDS} seeds, so the intervals are the draws' 2.5-97.5 "
              "percentiles (± half their width); n: seeds."]
    if unmarked:
        legend.append(f"Not resampled (Student-t interval over seeds, not tested): {', '.join(unmarked)}.")
    if lacking:
        legend.append(f"Not tested (not on every seed of {control}): {', '.join(sorted(lacking))}.")
    return legend


def _rows_with(columns: dict[str, list[str]], others: list[str], count: int) -> str:
    """"every row (Acc)" when every row has the same columns, else "A (Acc, ECE); B" (B in every column)."""
    if set(columns) == set(others) and len({tuple(c) for c in columns.values()}) == 1:
        shared = next(iter(columns.values()))
        return "every row" + ("" if len(shared) == count else f" ({', '.join(shared)})")
    return "; ".join(label if len(c) == count else f"{label} ({', '.join(c)})" for label, c in columns.items())


def adjust_across(cells: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """``cells`` (of several setups and metrics: one table) with Holm over every tested cell together: ``p_adjusted``
    and ``marker`` recomputed from ``p``; the untested cells as they were."""
    cells = cells.copy().reset_index(drop=True)
    cells["marker"] = np.where(cells["p"].notna(), "", cells["marker"])
    _mark(cells, cells.index[cells["p"].notna()], alpha)
    return cells

