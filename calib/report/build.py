"""The report: every table and figure regenerated from whatever the store holds.

Tables (Markdown and LaTeX, mean ± 95% CI or ± std over seeds, the best mean of each metric in bold)
go to ``<out>/tables/<study>_<dataset>_<arch>.{md,tex}``; figures (reliability diagrams with per-bin counts
and Clopper–Pearson intervals, and each study's own figure) to ``<out>/figures/``. Rows are the studies'
labels in their order.
Tables depend only on the stored rows, so regenerating them from the same store gives the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow.dataset as pads

from calib.datasets import DATASETS
from calib.metrics import clopper_pearson
from calib.registries import STUDIES
from calib.report import figures
from calib.report.policy import compare_setup, default_control, row_order
from calib.report.published import published_ece
from calib.report.rescored import rescored_headers, with_rescored
from calib.report.significance import RankComparison, rank_comparison
from calib.report.significance_tables import LATEX_MARKS, MARKS, rank_latex, rank_markdown
from calib.report.steps import report_step
from calib.report.tables import (
    PREDICTION_CHANGE_COLUMNS,
    column_higher_is_better,
    comparison_values,
    format_mean_ci,
    is_fraction_metric,
    latex_escape,
    mixed_trainings,
    summarize,
    with_current_labels,
)
from calib.report.win_rates import win_rates
from calib.store import read_history, read_trials

__all__ = ["CALIBRATION_SIZE_METRICS", "FULL", "STUDY_FIGURES", "build_report", "calibration_size_summary",
           "plot_calibration_sizes", "pooled_bins"]

FULL = {"test_accuracy": "Acc", **PREDICTION_CHANGE_COLUMNS, "test_ece": "ECE", "test_aece": "AECE", "test_mce": "MCE",
        "test_smece": "smECE", "test_ece_sweep": "ECE-sweep", "test_l2ce_debiased": "dL2-CE", "test_nll": "NLL",
        "test_brier": "Brier", "test_oece": "O-ECE", "test_uece": "U-ECE", "test_aurc": "AURC", "test_augrc": "AUGRC"}
"""The full table's metrics (compare_methods, calibrate): column -> header. ΔAcc and "changed" compare each trial with
the uncalibrated Stage-I model it started from (:data:`~calib.report.tables.PREDICTION_CHANGE_COLUMNS`)."""
CALIBRATION_SIZE_METRICS = {"test_ece": "ECE", "test_smece": "smECE", "test_nll": "NLL", "test_brier": "Brier",
                            "test_accuracy": "Acc", **PREDICTION_CHANGE_COLUMNS, "test_ks_ce": "KS",
                            "test_nll_calibration": "NLL cal", "test_nll_refinement": "NLL ref",
                            "test_brier_calibration": "Brier cal", "test_brier_refinement": "Brier ref",
                            "method_seconds": "fit s"}
"""The metrics of the calibration-set size study (studies/posthoc.py): those of its figure, NLL and Brier, the accuracy
and prediction change, the KS error, the calibration / refinement split of NLL and Brier (docs/methods.md §6.14,
§6.15) and the fit's wall seconds."""
UNRANKED = {**PREDICTION_CHANGE_COLUMNS, "method_seconds": "fit s"}
"""Table columns the rank table leaves out: the accuracy column ranks the prediction changes, and fit time is cost."""
Spread = Literal["ci", "std"]


def _labelled(trials: pd.DataFrame) -> pd.DataFrame:
    """Rows without a study label (stores written before labels existed) are labelled by method; equal-mass histogram
    binning stored as "HB" is "HB-EM" (:func:`~calib.report.tables.with_current_labels`). A search's trials are one
    row per config, never a pool of configs: ``<study> #<Optuna trial>`` (its replicates are that row's seeds)."""
    trials = with_current_labels(trials)
    labels = trials["label"].replace("", None).fillna(trials["method"]).astype(str)
    ranks = trials["label_rank"].fillna(0).astype("int64")
    if "search_trial" in trials and trials["search_trial"].notna().any():
        searched = trials["search_trial"].notna()
        number = trials["search_trial"].fillna(-1).astype("int64")
        labels = labels.where(~searched, trials["study"].astype(str) + " #" + number.astype(str))
        ranks = ranks.where(~searched, number)
    return trials.assign(label=labels, label_rank=ranks)


def _ordered_summary(trials: pd.DataFrame, metrics: dict[str, str]) -> pd.DataFrame:
    # one row per label: runs that selected different rows may have stored one label at two ranks
    trials = trials.assign(label_rank=trials.groupby("label")["label_rank"].transform("min"))
    table = summarize(trials, ["label_rank", "label"], list(metrics))
    return table.sort_values(["label_rank", "label"], kind="stable").reset_index(drop=True)


def calibration_size_summary(trials: pd.DataFrame, dataset: str, val_images: int | None = None) -> pd.DataFrame:
    """studies/posthoc.py's rows (labels ``"<method> · n=<size>"`` or ``"<method> · all"``) summarised per
    method and size in the study's order: ``method``, ``calibration set``, ``size`` (the number of samples;
    "all" is the validation split's ``val_images``, by default the dataset's registered size, else NaN; NaN for
    the uncalibrated row), ``degenerate`` (how many of the row's fits were degenerate, ``fit_degenerate``) and
    :func:`summarize`'s columns of :data:`CALIBRATION_SIZE_METRICS` over draws and seeds."""
    if val_images is None:
        try:
            val_images = DATASETS.get(dataset).val_images
        except KeyError:  # a plugin's dataset that is not loaded here, or a features file
            val_images = None
    labelled = _labelled(trials)
    parts = labelled["label"].str.split(" · ", n=1)
    frame = labelled.assign(**{"method": parts.str[0], "calibration set": parts.str[1].fillna("–"),
                               "order": labelled.groupby("label")["label_rank"].transform("min")})
    keys = ["order", "method", "calibration set"]
    table = summarize(frame, keys, list(CALIBRATION_SIZE_METRICS))
    flagged = frame["fit_degenerate"] if "fit_degenerate" in frame else pd.Series(False, index=frame.index)
    degenerate = flagged.fillna(False).astype(bool).groupby([frame[k] for k in keys], observed=True).sum()
    table.insert(3, "degenerate", [int(degenerate.get(tuple(row), 0)) for row in table[keys].itertuples(index=False)])
    table = table.sort_values("order", kind="stable").drop(columns="order").reset_index(drop=True)
    sizes = table["calibration set"].str.removeprefix("n=")
    all_size = float("nan") if val_images is None else float(val_images)
    table.insert(2, "size", [all_size if s == "all" else float(s) if s.isdigit() else float("nan") for s in sizes])
    return table


def plot_calibration_sizes(summary: pd.DataFrame, path: Path, name: str) -> Path:
    """Test ECE against calibration-set size, one line per method, from :func:`calibration_size_summary`."""
    return figures.plot_metric_against(
        summary[summary["size"].notna()], "size", "test_ece", "method", path,
        xlabel="calibration-set size (validation samples)", ylabel="test ECE (%)", log_x=True,
        title=f"post-hoc calibration-set size · {name}")


def _best(table: pd.DataFrame, metric: str) -> int | None:
    means = comparison_values(metric, table[f"{metric}_mean"].to_numpy(dtype=float))
    if not np.isfinite(means).any():
        return None
    return int(np.nanargmax(means) if column_higher_is_better(metric) else np.nanargmin(means))


Markers = dict[tuple[str, str], str]
"""(label, metric) -> "better" / "worse": the cells significantly better / worse than the control's."""


def _cells(table: pd.DataFrame, metrics: dict[str, str], spread: Spread,
           markers: Markers | None = None) -> list[list[tuple[str, bool, str]]]:
    best, markers = {m: _best(table, m) for m in metrics}, markers or {}
    return [[(format_mean_ci(row[f"{m}_mean"], row[f"{m}_{spread}"], percent=is_fraction_metric(m)), best[m] == i,
              markers.get((str(row["label"]), m), "")) for m in metrics] for i, row in table.iterrows()]


def _published_column(table: pd.DataFrame, dataset: str, archs: list[str]) -> list[str] | None:
    """MaC-Cal Table 1's ECE per row when the table is on a published (dataset, architecture)."""
    if len(archs) != 1:
        return None
    values = [published_ece(dataset, archs[0], str(label)) for label in table["label"]]
    if all(v is None for v in values):
        return None
    return ["–" if v is None else f"{v:.2f}" for v in values]


def markdown_table(table: pd.DataFrame, metrics: dict[str, str], spread: Spread,
                   published: list[str] | None = None, markers: Markers | None = None) -> str:
    """One row per label: mean ± spread per metric, the best in bold, ▲ / ▼ on the ``markers``' cells."""
    header = ["row", "n", *metrics.values()] + (["ECE (MaC-Cal Table 1)"] if published else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, ((_, row), cells) in enumerate(zip(table.iterrows(), _cells(table, metrics, spread, markers),
                                              strict=True)):
        shown = [(f"**{text}**" if bold else text) + (f" {MARKS[mark]}" if mark else "") for text, bold, mark in cells]
        shown += [published[i]] if published else []
        lines.append("| " + " | ".join([str(row["label"]), str(int(row["n"])), *shown]) + " |")
    return "\n".join(lines) + "\n"


def latex_table(table: pd.DataFrame, metrics: dict[str, str], spread: Spread, caption: str,
                published: list[str] | None = None, markers: Markers | None = None,
                legend: list[str] | None = None) -> str:
    """:func:`markdown_table` in LaTeX (booktabs; the markers need amssymb), the ``legend`` lines under it."""
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(caption)}}}",
             r"\begin{tabular}{l r " + "r " * (len(metrics) + bool(published)) + "}", r"\toprule",
             " & ".join(["Method", "$n$", *(latex_escape(v) for v in metrics.values())]
                        + (["ECE (paper)"] if published else [])) + r" \\", r"\midrule"]
    for i, ((_, row), cells) in enumerate(zip(table.iterrows(), _cells(table, metrics, spread, markers),
                                              strict=True)):
        shown = [(rf"\textbf{{{t}}}" if bold else t).replace("±", r"$\pm$") + (LATEX_MARKS[mark] if mark else "")
                 for t, bold, mark in cells]
        shown += [published[i].replace("–", "--")] if published else []
        lines.append(" & ".join([latex_escape(str(row["label"])), str(int(row["n"])), *shown]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if legend:
        lines.append(r"\par\smallskip{\footnotesize " + " ".join(map(latex_escape, legend)) + "}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def pooled_bins(trials: pd.DataFrame, *, level: float = 0.95) -> pd.DataFrame:
    """Reliability bins pooled over seeds per label: counts summed, means weighted by counts.

    One row per (label, bin) with ``label``, ``bin``, ``count``, ``confidence``, ``accuracy`` and
    ``accuracy_lower`` / ``accuracy_upper``, the Clopper–Pearson ``level`` interval of the pooled
    accuracy: round(Σ_seeds count·accuracy) correct of Σ_seeds count ([0, 1] for an empty bin;
    docs/methods.md §6.10). Every seed predicts the same test images, so the pooled predictions are
    not independent and the interval is narrower than one over independent images would be.
    """
    rows = []
    trials = trials[trials["test_bin_count"].notna()]
    for (_, label), group in trials.groupby(["label_rank", "label"], sort=True):
        counts = np.array(group["test_bin_count"].tolist(), dtype=float)
        conf = np.array(group["test_bin_confidence"].tolist(), dtype=float)
        acc = np.array(group["test_bin_accuracy"].tolist(), dtype=float)
        total = counts.sum(axis=0)
        safe = np.where(total > 0, total, 1)
        correct = np.minimum(np.rint((counts * acc).sum(axis=0)), total)
        lower, upper = clopper_pearson(correct.astype(np.int64), total.astype(np.int64), level=level)
        for b in range(counts.shape[1]):
            rows.append({"label": label, "bin": b, "count": int(total[b]),
                         "confidence": float((counts[:, b] * conf[:, b]).sum() / safe[b]),
                         "accuracy": float((counts[:, b] * acc[:, b]).sum() / safe[b]),
                         "accuracy_lower": float(lower[b]), "accuracy_upper": float(upper[b])})
    return pd.DataFrame(rows)


def cost_table(trials: pd.DataFrame) -> str:
    """Markdown wall-time table per row (MaC-Cal Table 4): Stage I, the method, their sum, and the total
    relative to the first row (vanilla in the method comparison)."""
    frame = trials.assign(total=trials["stage1_train_seconds"] + trials["method_seconds"])
    means = frame.groupby(["label_rank", "label"], sort=True)[["stage1_train_seconds", "method_seconds",
                                                               "total"]].mean()
    reference, first = means["total"].iloc[0], means.index[0][1]
    lines = [f"| row | Stage I (s) | method (s) | total (s) | × {first} |", "|---|---|---|---|---|"]
    for (_, label), row in means.iterrows():
        lines.append(f"| {label} | {row['stage1_train_seconds']:.1f} | {row['method_seconds']:.2f} | "
                     f"{row['total']:.1f} | {row['total'] / reference:.2f} |")
    return "\n".join(lines) + "\n"


Figure = Callable[[str, str, str, pd.DataFrame, Path, Callable[[str], None]], list[Path]]
"""A study's figure of one setup: (store, study, setup as ``<dataset>_<arch>``, its trials, the figures folder, the
log) -> the files written."""


def _gamma_figure(store: str, study: str, setup: str, trials: pd.DataFrame, out: Path,
                  log: Callable[[str], None]) -> list[Path]:
    name = _shown(trials)
    if not (trials["method"] == "mac_cal").any():
        log(f"[{study}] γ figure of {name} not drawn: no MaC-Cal trial in the store")
        return []
    mac = trials[trials["method"] == "mac_cal"]
    vanilla = summarize(trials[trials["method"] == "vanilla"], ["method"], ["test_ece"])
    history = read_history(store, study=study, filters=pads.field("trial_id").isin(list(mac["trial_id"]))
                           & (pads.field("stage") == "stage2"))
    history = history.merge(mac[["trial_id", "method_accuracy_weight"]], on="trial_id")
    return [figures.plot_gamma_sensitivity(
        summarize(mac, ["method_accuracy_weight"], ["test_ece"]), history, out / f"{study}_{setup}_gamma.png",
        vanilla=None if vanilla.empty else (vanilla["test_ece_mean"].iloc[0], vanilla["test_ece_ci"].iloc[0]),
        title=f"γ sensitivity · {name}")]


def _alpha_figure(store: str, study: str, setup: str, trials: pd.DataFrame, out: Path,
                  log: Callable[[str], None]) -> list[Path]:
    frame = trials.assign(family=trials["label"].str.split(" α=").str[0],
                          alpha=trials["stage1_mixup_alpha"].fillna(trials["stage1_mit_alpha"]))
    return [figures.plot_metric_against(
        summarize(frame, ["family", "alpha"], ["test_ece"]), "alpha", "test_ece", "family",
        out / f"{study}_{setup}_alpha.png", xlabel="α of Beta(α, α)", ylabel="test ECE (%)", log_x=True,
        title=f"Mixup α · {_shown(trials)}")]


def _severity_figure(store: str, study: str, setup: str, trials: pd.DataFrame, out: Path,
                     log: Callable[[str], None]) -> list[Path]:
    long = pd.DataFrame([{"label": label, "severity": s + 1, "ece": v}
                         for label, values in zip(trials["label"], trials["corrupted_ece_by_severity"], strict=True)
                         if values is not None for s, v in enumerate(values)])
    if long.empty:
        return []
    return [figures.plot_metric_against(
        summarize(long, ["label", "severity"], ["ece"]), "severity", "ece", "label",
        out / f"{study}_{setup}_severity.png", xlabel="corruption severity",
        ylabel="ECE (%), mean over corruptions", title=f"corruptions · {_shown(trials)}")]


def _sizes_figure(store: str, study: str, setup: str, trials: pd.DataFrame, out: Path,
                  log: Callable[[str], None]) -> list[Path]:
    sizes = calibration_size_summary(trials, str(trials["dataset"].iloc[0]))
    if not sizes["size"].notna().any():  # every fit used the whole calibration set
        return []
    return [plot_calibration_sizes(sizes, out / f"{study}_{setup}_sizes.png", _shown(trials))]


def _bars_figure(store: str, study: str, setup: str, trials: pd.DataFrame, out: Path,
                 log: Callable[[str], None]) -> list[Path]:
    return [figures.plot_bars(_ordered_summary(trials, {"test_ece": "ECE"}), "label", "test_ece",
                              out / f"{study}_{setup}_bars.png", ylabel="test ECE (%)",
                              title=f"{study} · {_shown(trials)}")]


def _shown(trials: pd.DataFrame) -> str:
    """The setup of ``trials`` (one dataset and architecture) as the titles write it."""
    return f"{trials['dataset'].iloc[0]} · {trials['arch'].iloc[0]}"


STUDY_FIGURES: dict[str, Figure] = {"gamma": _gamma_figure, "alpha": _alpha_figure, "severity": _severity_figure,
                                    "sizes": _sizes_figure, "bars": _bars_figure}
"""The figures a study can declare (:class:`calib.study.declaration.StudyDeclaration` ``figure``), by name: γ
sensitivity with q_t, ECE against Mixup's α, against corruption severity and against the calibration-set size, and
the test-ECE bars of the rows (``figures/<study>_<dataset>_<arch>_<name>.png``)."""


def build_report(
    store: str | os.PathLike,
    out: str | os.PathLike,
    *,
    spread: Spread = "ci",
    control: str | None = None,
    alpha: float = 0.05,
    test: str = "t-test",
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Write every table and figure the store supports into ``out``; returns the files written.

    ``control``: the row the significance markers and Holm's test compare against (default: each study's own,
    :func:`~calib.report.policy.default_control`); ``alpha``: their level, and the Nemenyi CD's; ``test``: the
    paired test over seeds (``t-test`` or ``wilcoxon``; :mod:`calib.report.policy` says when each applies)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    out = Path(out)
    trials = with_rescored(read_trials(store, filters=pads.field("status") == "ok"), store)
    present = sorted(set(trials["study"].astype(str))) if not trials.empty else []
    written: list[Path] = []
    for study in sorted(set(STUDIES) | set(present)):
        declared = STUDIES.get(study) if study in STUDIES else None
        script, metrics = (declared.command, declared.metrics) if declared is not None else ("", FULL)
        rows = trials[trials["study"].astype(str) == study] if present else trials
        metrics = {**metrics, **rescored_headers(rows)}
        if rows.empty:
            log(f"skipped {study}: not in the store (run: python {script} --store {store})")
            continue
        rows = _labelled(rows)
        study_control = _study_control(study, row_order(rows), control, log)
        for (dataset, arch), group in rows.groupby(["dataset", "arch"], observed=True, sort=True):
            name = f"{study} · {dataset} · {arch}"
            with report_step(study, f"tables of {dataset} · {arch}", log=log):
                written += _tables(study, str(dataset), str(arch), group, metrics, spread, out / "tables",
                                   control=study_control, alpha=alpha, test=test, log=log, store=str(store))
            if note := mixed_trainings(group):
                log(f"{name}: {note}")
            with report_step(study, f"reliability diagram of {dataset} · {arch}", log=log):
                bins = pooled_bins(group)
                if not bins.empty:
                    written.append(figures.plot_reliability(
                        bins, out / "figures" / f"{study}_{dataset}_{arch}_reliability.png",
                        title=f"{name} (test, pooled over seeds)"))
            with report_step(study, f"figure of {dataset} · {arch}", log=log):
                if declared is not None and declared.figure is not None:
                    written += STUDY_FIGURES[declared.figure](str(store), study, f"{dataset}_{arch}", group,
                                                              out / "figures", log)
            log(f"{name}: {group['label'].nunique()} rows, {len(group)} trials")
        with report_step(study, "rank table over setups", log=log):
            written += _rank_outputs(study, rows, metrics, study_control, alpha, out, log)
    return written


def _study_control(study: str, labels: list[str], control: str | None, log: Callable[[str], None]) -> str | None:
    """The row the study's markers compare against: ``control`` if it is a row of the study, else (no
    ``control``) the study's own (:func:`calib.report.policy.default_control`); None, with one line saying so,
    when there is none."""
    if control is None:
        chosen = default_control(study, labels)
        if chosen is None:
            log(f"[{study}] no significance markers: no control row (a TS row: CE+TS, TS, TS · all; or the default "
                "row of a tuned --row) to compare against; name one with --control LABEL")
        return chosen
    if control not in labels:
        shown = ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else "")
        log(f"[{study}] no significance markers: the control {control!r} is not a row of this study (rows: {shown})")
        return None
    return control


def _tables(study: str, dataset: str, arch: str, group: pd.DataFrame, metrics: dict[str, str], spread: Spread,
            out: Path, *, control: str | None = None, alpha: float = 0.05, test: str = "t-test",
            log: Callable[[str], None] = print, store: str | None = None) -> list[Path]:
    """The study's Markdown and LaTeX tables of one (dataset, architecture), with the markers of the cells
    significantly better / worse than ``control`` over seeds, and the cost table of the method comparison."""
    written = []
    present = control is not None and (group["label"] == control).any()
    if control is not None and not present:
        log(f"{study} · {dataset} · {arch}: no significance markers: the control {control} has no trial here")
    comparison = compare_setup(group, metrics, control if present else None, alpha=alpha, store=store, study=study,
                               test=test)
    table, markers, legend = comparison.summary(), comparison.markers(), comparison.legend
    over = "splits of the predictions file" if _is_predictions_file(group) else "seeds"
    caption = (f"{study} · {dataset} · {arch} · test split · "
               f"mean ± {'95% CI' if spread == 'ci' else 'std'} over {over}; fractions in percent")
    base = out / f"{study}_{dataset}_{arch}"
    base.parent.mkdir(parents=True, exist_ok=True)
    published = _published_column(table, dataset, [arch])
    note = mixed_trainings(group)
    caption += f" · {note}" if note else ""
    markdown = markdown_table(table, metrics, spread, published, markers)
    for suffix, text in ((".md", f"{caption}\n\n{markdown}" + "".join(f"\n{line}" for line in legend)
                          + ("\n" if legend else "")),
                         (".tex", latex_table(table, metrics, spread, caption, published, markers, legend))):
        path = base.with_suffix(suffix)
        path.write_text(text)
        written.append(path)
    if study == "compare_methods":
        path = out / f"cost_{dataset}_{arch}.md"
        hosts = ", ".join(sorted(set(group["host"].astype(str))))
        path.write_text(f"wall seconds per method, mean over seeds · hosts {hosts}\n\n{cost_table(group)}")
        written.append(path)
    return written


def _rank_outputs(study: str, rows: pd.DataFrame, metrics: dict[str, str], control: str | None, alpha: float,
                  out: Path, log: Callable[[str], None]) -> list[Path]:
    """The study's rank table over its setups (``tables/<study>_ranks.{md,tex}``) and a critical-difference
    diagram per metric with a Friedman test (``figures/<study>_<metric>_cd.png``); nothing, with one line
    saying why, for a study of one setup. A study of one predictions file ranks over its calibration/test splits
    instead (the benchmarks' experiments: each split ranks the methods)."""
    setups = [f"{d} · {a}" for d, a in rows[["dataset", "arch"]].drop_duplicates().itertuples(index=False)]
    blocks, unit, each = rows, "setups", "each setup ranks the means over seeds"
    if len(setups) == 1 and _is_predictions_file(rows) and rows["seed"].nunique() >= 2:
        blocks = rows.assign(dataset=rows["dataset"].astype(str) + " · split " + rows["seed"].astype(str))
        unit = f"calibration/test splits of {setups[0]}"
        each = "each split ranks the methods (the splits share samples: not independent)"
        setups = sorted(set(blocks["dataset"] + " · " + blocks["arch"].astype(str)))
    elif len(setups) < 2:
        log(f"[{study}] no rank table: 1 setup ({setups[0]}); average ranks and the Friedman test need >= 2 "
            "setups (datasets × architectures), or a predictions file's >= 2 splits")
        return []
    order = row_order(rows)
    ranked = {m: header for m, header in metrics.items() if m not in UNRANKED}
    comparisons = {m: rank_comparison(blocks, m, order, control=control, alpha=alpha) for m in ranked}
    wins = win_rates(rows, order)
    shown = ", ".join(sorted(setups)) if unit == "setups" else ", ".join(sorted(setups)[:3]) + ", ..."
    caption = (f"{study} · average rank over {len(setups)} {unit} ({shown}) · test split · {each} · "
               f"α = {alpha:g}")
    base = out / "tables" / f"{study}_ranks"
    base.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, text in ((".md", rank_markdown(caption, comparisons, ranked, order, alpha, wins)),
                         (".tex", rank_latex(caption, comparisons, ranked, order, alpha, wins))):
        path = base.with_suffix(suffix)
        path.write_text(text)
        written.append(path)
    for metric, comparison in comparisons.items():
        if comparison.friedman is None or comparison.all_equal:
            continue
        with report_step(study, f"critical-difference diagram of {metrics[metric]}", log=log):
            written.append(_cd_figure(study, metrics[metric], comparison, out / "figures" / f"{study}_{metric}_cd.png",
                                      "setups" if unit == "setups" else "splits"))
    tested = [metrics[m] for m, c in comparisons.items() if c.friedman is not None and not c.all_equal]
    diagrams = f"critical-difference diagrams of {', '.join(tested)}" if tested else "no Friedman test (see its notes)"
    log(f"[{study}] ranks over {len(setups)} {unit}: {base.with_suffix('.md').name}, {diagrams}")
    return written


def _is_predictions_file(rows: pd.DataFrame) -> bool:
    return "source_kind" in rows and bool((rows["source_kind"] == "predictions").all())


def _cd_figure(study: str, header: str, comparison: RankComparison, path: Path, unit: str = "setups") -> Path:
    friedman, holm, alpha = comparison.friedman, comparison.holm, comparison.alpha
    verdicts = holm["verdict"] if holm is not None else pd.Series(dtype=str)
    note = f"bars: average ranks within CD of each other (Nemenyi, α = {alpha:g})"
    if holm is not None:
        note += f" · ▲ / ▼: better / worse than {comparison.control} (Holm, α = {alpha:g})"
    title = (f"{study} · {header} · {friedman.n} {unit} · Friedman $\\chi^2_F$ = {friedman.chi2:.2f} "
             f"(p = {friedman.chi2_p:.3g}), $F_F$ = {friedman.f:.2f} (p = {friedman.f_p:.3g})")
    return figures.plot_critical_difference(
        comparison.ranks, comparison.cd, comparison.groups, path,
        control=comparison.control if holm is not None else None,
        better=tuple(verdicts.index[verdicts == "better"]), worse=tuple(verdicts.index[verdicts == "worse"]),
        title=title, note=note)
