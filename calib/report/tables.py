"""Aggregating trials over seeds: mean and 95% confidence interval, printed in percent as the papers do."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from calib.methods.vanilla import current_uncalibrated_label
from calib.metrics import METRICS, higher_is_better
from calib.registries import DEFAULT_LOSS, METHODS

__all__ = ["PREDICTION_CHANGE_COLUMNS", "column_higher_is_better", "comparison_values", "format_mean_ci",
           "is_fraction_metric", "latex_escape", "mean_ci", "mixed_trainings", "summarize", "to_markdown",
           "with_current_labels"]

PREDICTION_CHANGE_COLUMNS = {"test_accuracy_change": "ΔAcc", "test_argmax_changed": "changed"}
"""The store's prediction-change columns with their table headers: the test accuracy minus the uncalibrated Stage-I
model's, and the fraction of test samples whose predicted class the method changed (both fractions, in percent)."""


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval (NaN half-width for one value).

    half-width = t_{(1+confidence)/2, n−1} · s / √n, with s the sample standard deviation.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan"), float("nan")
    if x.size == 1:
        return float(x[0]), float("nan")
    half = stats.t.ppf((1 + confidence) / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return float(x.mean()), float(half)


def summarize(df: pd.DataFrame, by: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per group of ``by``: ``n``, ``<metric>_mean``, ``<metric>_ci`` (95% CI half-width) and
    ``<metric>_std`` (sample standard deviation) for every metric.

    The unit of replication is the seed: where ``df`` has a ``seed`` column (and ``by`` does not group by it), the
    trials of one seed (its Stage-II seeds, its calibration-set draws) are averaged first, ``n`` counts the distinct
    seeds and the mean, CI and std are over the per-seed values."""
    per_seed = "seed" in df and "seed" not in by
    rows = []
    for key, group in df.groupby(list(by), sort=True, dropna=False, observed=True):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        if per_seed:
            group = group.groupby("seed", sort=True, observed=True)[list(metrics)].mean()
        row["n"] = len(group)
        for m in metrics:
            values = group[m].to_numpy(dtype=float)
            row[f"{m}_mean"], row[f"{m}_ci"] = mean_ci(values)
            row[f"{m}_std"] = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def format_mean_ci(mean: float, ci: float, *, percent: bool = True) -> str:
    """``"7.21 ± 1.05"``: a fraction shown in percent (0.0721 ± 0.0105), or as is with ``percent=False``
    (NLL, Brier: ``"0.512 ± 0.031"``); no ± part without an interval."""
    if not np.isfinite(mean):
        return "–"
    if percent:
        return f"{100 * mean:.2f}" + (f" ± {100 * ci:.2f}" if np.isfinite(ci) else "")
    return f"{mean:.3f}" + (f" ± {ci:.3f}" if np.isfinite(ci) else "")


def column_higher_is_better(column: str) -> bool:
    """Direction of a metric column: ``test_ece`` → False, ``val_accuracy`` → True, ``ood_auroc`` → True."""
    for prefix, higher in (("ood_auroc", True), ("ood_fpr95", False), ("corrupted_accuracy", True),
                           ("corrupted_ece", False), ("test_accuracy_change", True), ("test_argmax_changed", False),
                           ("method_seconds", False)):
        if column.startswith(prefix):
            return higher
    return higher_is_better(_metric_of(column))


def _metric_of(column: str) -> str:
    """The metric of a split's column: ``test_ece`` and the rescored ``test_ece_bins10`` → ``ece``."""
    return re.sub(r"_bins\d+$", "", column.split("_", 1)[-1])


def comparison_values(column: str, values: pd.Series | np.ndarray) -> pd.Series | np.ndarray:
    """The values by which a column's rows are compared (bold, ranks, tests): the values themselves, or their
    distance to 0 for an error whose estimate can be negative (``test_nll_calibration``: −0.3 is not better
    than 0)."""
    spec = METRICS.get(_metric_of(column))
    return abs(values) if spec is not None and spec.zero_is_best else values


def is_fraction_metric(column: str) -> bool:
    """Whether a metric column (``test_ece``) is a fraction in [0, 1], shown in percent."""
    if column.startswith(("ood_auroc", "ood_fpr95", "corrupted_ece", "corrupted_accuracy", *PREDICTION_CHANGE_COLUMNS)):
        return True
    name = _metric_of(column)
    return name in METRICS and METRICS[name].bounds == (0.0, 1.0)


def to_markdown(summary: pd.DataFrame, labels: Sequence[str], metrics: dict[str, str],
                marks: Mapping[tuple[str, str], str] | None = None) -> str:
    """A Markdown table: the ``labels`` columns, then ``mean ± 95% CI`` per metric (fractions in percent);
    ``marks``: a marker after the cell of (the first label column's value, metric)."""
    marks = marks or {}
    header = [*labels, "n", *metrics.values()]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in summary.iterrows():
        cells = [str(row[c]) for c in labels] + [str(int(row["n"]))]
        cells += [format_mean_ci(row[f"{m}_mean"], row[f"{m}_ci"], percent=is_fraction_metric(m))
                  + (f" {marks[(str(row[labels[0]]), m)]}" if (str(row[labels[0]]), m) in marks else "")
                  for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mixed_trainings(trials: pd.DataFrame) -> str | None:
    """A one-line warning when ``trials`` use two trainings of one Stage I (two ``stage1_writer`` values
    for one ``stage1_id``: a store written before calib trained each Stage I once), else None."""
    if "stage1_writer" not in trials or trials.empty:
        return None
    writers = trials.dropna(subset=["stage1_writer"]).groupby("stage1_id", observed=True)["stage1_writer"].nunique()
    mixed = sorted(str(s) for s in writers[writers > 1].index)
    if not mixed:
        return None
    return (f"warning: this table mixes two or more trainings of the same Stage I for {len(mixed)} stage1_id"
            f"{'s' if len(mixed) > 1 else ''} ({', '.join(mixed[:4])}{', ...' if len(mixed) > 4 else ''}): "
            f"their rows name different stage1_writer values, so rows of one seed come from different weights")


_EQUAL_MASS_HB = re.compile(r"(^|\+)HB(?= · |$)")


def with_current_labels(trials: pd.DataFrame) -> pd.DataFrame:
    """``trials`` with their methods and labels as calib names them now: a method stored under its former name
    reads as its name (``histogram_binning`` is ``histogram_binning_equal_mass``: ``METHODS.canonical``); the
    uncalibrated model's former labels (on the vanilla CE model, or a method on it) are ``Vanilla``; an equal-mass
    histogram binning trial stored as "HB", "CE+HB" or "HB · n=…" before HB came to mean equal width is HB-EM."""
    if trials.empty or "method" not in trials:
        return trials
    methods = trials["method"].map(lambda name: METHODS.canonical(name) if isinstance(name, str) else name)
    trials = trials.assign(method=methods) if not methods.equals(trials["method"]) else trials
    if "label" not in trials:
        return trials
    labels = trials["label"].astype(object)
    mixing = [column for column in ("stage1_mixup_alpha", "stage1_mit_alpha") if column in trials]
    ce = trials["loss"].isin([DEFAULT_LOSS, None]) if "loss" in trials else methods == "vanilla"
    ce &= trials[mixing].isna().all(axis=1)
    renamed = labels.where(~ce, labels.map(current_uncalibrated_label))
    if not renamed.equals(labels):
        trials = trials.assign(label=renamed)
        labels = renamed
    legacy = (methods == "histogram_binning_equal_mass") & labels.map(
        lambda label: isinstance(label, str) and bool(_EQUAL_MASS_HB.search(label)))
    if not legacy.any():
        return trials
    renamed = labels.copy()
    renamed[legacy] = labels[legacy].map(lambda label: _EQUAL_MASS_HB.sub(r"\1HB-EM", label))
    return trials.assign(label=renamed)


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "–": "--", "—": "---",
          "−": "$-$", "∞": r"$\infty$", "≥": r"$\geq$", "≤": r"$\leq$", "×": r"$\times$", "·": r"$\cdot$",
          "→": r"$\rightarrow$", "←": r"$\leftarrow$", "↑": r"$\uparrow$", "↓": r"$\downarrow$", "≈": r"$\approx$",
          "√": r"$\surd$", "°": r"$^{\circ}$", "²": r"$^2$", "³": r"$^3$", "†": r"$^{\dagger}$", "…": r"\ldots{}",
          "‘": "`", "’": "'", "“": "``", "”": "''", "Δ": r"$\Delta$", "α": r"$\alpha$", "β": r"$\beta$",
          "γ": r"$\gamma$", "δ": r"$\delta$", "ε": r"$\varepsilon$", "η": r"$\eta$", "θ": r"$\theta$",
          "κ": r"$\kappa$", "λ": r"$\lambda$", "μ": r"$\mu$", "π": r"$\pi$", "ρ": r"$\rho$", "σ": r"$\sigma$",
          "τ": r"$\tau$", "φ": r"$\phi$", "χ": r"$\chi$", "ω": r"$\omega$", "χ²_F": r"$\chi^2_F$", "F_F": r"$F_F$",
          "▲": r"$^{\blacktriangle}$", "▼": r"$^{\blacktriangledown}$"}
_LATEX_TOKEN = re.compile("|".join(re.escape(token) for token in sorted(_LATEX, key=len, reverse=True)))
_ACCENTS = {"\u0301": "'", "\u0300": "`", "\u0308": '"', "\u0302": "^", "\u0303": "~", "\u0327": "c", "\u030c": "v"}


def _ascii(char: str) -> str:
    """A character :data:`_LATEX` does not name, as ASCII LaTeX: an accented letter with its accent command
    (``é`` → ``\\'{e}``), anything else as its code point in text (``[U+2713]``), so the output is pure ASCII."""
    if char.isascii():
        return char
    base, *marks = unicodedata.normalize("NFD", char)
    if base.isascii() and len(marks) == 1 and marks[0] in _ACCENTS:
        return rf"\{_ACCENTS[marks[0]]}{{{base}}}"
    return f"[U+{ord(char):04X}]"


def latex_escape(text: str) -> str:
    """``text`` for a LaTeX table, in pure ASCII: its special characters escaped, ±, Δ, γ, χ²_F, ▲/▼ (amssymb) …
    as math, an accented letter with its accent, any other non-ASCII character as its code point."""
    escaped = _LATEX_TOKEN.sub(lambda match: _LATEX[match.group(0)], text)
    return escaped if escaped.isascii() else "".join(map(_ascii, escaped))
