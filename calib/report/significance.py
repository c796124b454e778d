"""Which differences are real: ranks over setups and paired tests over seeds.

Over the setups (dataset × architecture) of a study, per metric (Demšar 2006, JMLR 7):

- the average rank R_j of each method (rank 1 = best in a setup; ties share the average of their ranks),
  ranking each method's mean over seeds;
- Friedman's χ²_F = 12N / (k(k+1)) · [Σ_j R_j² − k(k+1)²/4] (his Eq. for N setups and k methods), computed by
  scipy with the correction for ties (χ²_F divided by 1 − Σ(t³ − t) / (N k (k² − 1)) over the groups of t tied
  values; the same number when nothing ties), and Iman and Davenport's
  F_F = (N − 1) χ²_F / (N(k − 1) − χ²_F) ~ F(k − 1, (k − 1)(N − 1)), which Demšar recommends over χ²_F;
- Nemenyi's critical difference CD = q_α √(k(k+1) / (6N)), q_α the studentized range quantile for k
  groups and infinite degrees of freedom divided by √2: two average ranks that differ by at least CD differ
  significantly;
- against a control c (Demšar §3.2.2): z_j = (R_j − R_c) / √(k(k+1) / (6N)), two-sided normal p-values,
  Holm's step-down procedure over the k − 1 comparisons.

Per setup, each method against the control over seeds: a paired test on the seeds both have (each seed's
value: the mean over its trials), Holm-adjusted over the methods of the setup. Pairing on seed pairs the
runs that share a Stage I, data split and initialisation. A t-test by default because nothing distribution-free can
reject with the few seeds studies run: the exact Wilcoxon signed-rank (or sign-flip) test of n seeds has its
smallest two-sided p-value at 2 / 2ⁿ, 0.25 for 3 seeds and 0.0625 for 5, so it never reaches p < 0.05 below
6 seeds. The t-test's price is its assumption: seed-to-seed differences roughly normal, which 3 seeds cannot
check; ``test="wilcoxon"`` trades it for that floor. Which test a table uses, and when: :mod:`calib.report.policy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from calib.report.tables import column_higher_is_better, comparison_values

__all__ = [
    "CONTROL_CANDIDATES",
    "PAIRED_TESTS",
    "Friedman",
    "RankComparison",
    "average_ranks",
    "default_control",
    "friedman_test",
    "holm",
    "holm_against_control",
    "iman_davenport",
    "nemenyi_critical_difference",
    "not_different_groups",
    "paired_against_control",
    "rank_comparison",
    "setup_means",
]

CONTROL_CANDIDATES = ("CE+TS", "TS", "TS · all")
"""The temperature-scaling rows the studies label (compare_methods, calibrate, posthoc): the default control."""


def default_control(labels: Sequence[str]) -> str | None:
    """The first of :data:`CONTROL_CANDIDATES` among ``labels``, else None."""
    return next((label for label in CONTROL_CANDIDATES if label in set(labels)), None)


def average_ranks(values: pd.DataFrame, *, higher_is_better: bool) -> pd.Series:
    """R_j: the mean over setups (rows) of each method's (column's) rank in its setup; 1 = best, ties share
    the average of the ranks they span."""
    signed = -values.to_numpy(dtype=float) if higher_is_better else values.to_numpy(dtype=float)
    return pd.Series(stats.rankdata(signed, axis=1).mean(axis=0), index=values.columns, name="average rank")


@dataclass(frozen=True)
class Friedman:
    """Friedman's test over ``n`` setups and ``k`` methods, and its Iman–Davenport F form."""

    n: int
    k: int
    chi2: float
    chi2_p: float
    f: float
    f_p: float


def iman_davenport(chi2: float, n: int, k: int) -> tuple[float, float]:
    """F_F = (N − 1) χ²_F / (N(k − 1) − χ²_F) and its p-value under F(k − 1, (k − 1)(N − 1)). When every setup
    ranks the methods alike, χ²_F = N(k − 1): F_F is infinite and p is 0."""
    denominator = n * (k - 1) - chi2
    if denominator <= 0:
        return float("inf"), 0.0
    f = (n - 1) * chi2 / denominator
    return float(f), float(stats.f.sf(f, k - 1, (k - 1) * (n - 1)))


def friedman_test(values: pd.DataFrame) -> Friedman:
    """Friedman's χ²_F (scipy, tie-corrected) and Iman–Davenport's F_F of ``values`` (setups × methods, no
    missing value; ranks do not depend on the metric's direction here). Every setup tied throughout: χ²_F = 0,
    p = 1 (nothing differs; the tie-corrected statistic is 0/0 there)."""
    n, k = values.shape
    if n < 2 or k < 3:
        raise ValueError(f"the Friedman test needs >= 2 setups and >= 3 methods, got {n} setups and {k} methods")
    data = values.to_numpy(dtype=float)
    if not np.isfinite(data).all():
        raise ValueError("the Friedman test needs a value for every (setup, method); leave incomplete methods out")
    if (data == data[:, :1]).all():
        return Friedman(n, k, 0.0, 1.0, 0.0, 1.0)
    chi2, p = stats.friedmanchisquare(*data.T)
    return Friedman(n, k, float(chi2), float(p), *iman_davenport(float(chi2), n, k))


def nemenyi_critical_difference(k: int, n: int, alpha: float) -> tuple[float, float]:
    """(q_α, CD): q_α = studentized range quantile(1 − α; k groups, ∞ df) / √2, CD = q_α √(k(k+1) / (6N))."""
    q_alpha = float(stats.studentized_range.ppf(1 - alpha, k, np.inf)) / np.sqrt(2)
    return q_alpha, q_alpha * float(np.sqrt(k * (k + 1) / (6 * n)))


def holm(p: Sequence[float] | np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down procedure (Holm 1979, Scand. J. Statist. 6, 65–70) over m p-values: with
    p_(1) ≤ … ≤ p_(m), reject H_(i) while p_(j) ≤ α / (m − j + 1) for every j ≤ i. Returns (rejected, adjusted
    p-values p̃_(i) = max_{j≤i} min(1, (m − j + 1) p_(j))), in the input's order; H_i is rejected iff p̃_i ≤ α.
    (statsmodels' ``multipletests(method="holm")`` gives the same numbers, but runs ``gc.collect()`` on every
    call: seconds in a report of many tables.)"""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p, kind="stable")
    steps = p.size - np.arange(p.size)  # m, m − 1, …, 1
    adjusted = np.empty(p.size)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(steps * p[order]))
    return adjusted <= alpha, adjusted


def holm_against_control(ranks: pd.Series, n: int, control: str, alpha: float) -> pd.DataFrame:
    """Each method's average rank against the control's: z = (R_j − R_c) / √(k(k+1) / (6N)), two-sided normal
    p, Holm's adjusted p (:func:`holm`), and ``verdict`` "better" (significantly lower rank),
    "worse" or "". Index: the methods other than the control, in ``ranks``' order."""
    k = len(ranks)
    others = ranks.drop(control)
    z = (others - ranks[control]) / np.sqrt(k * (k + 1) / (6 * n))
    p = 2 * stats.norm.sf(np.abs(z.to_numpy(dtype=float)))
    rejected, adjusted = holm(p, alpha)
    verdict = np.where(rejected, np.where(z < 0, "better", "worse"), "")
    return pd.DataFrame({"z": z.to_numpy(dtype=float), "p": p, "p_holm": adjusted, "verdict": verdict},
                        index=others.index)


def not_different_groups(ranks: pd.Series, cd: float) -> list[list[str]]:
    """The maximal runs of methods (by average rank) whose ranks all differ by less than CD, two or more
    methods each: the bars of a critical-difference diagram, best first."""
    ordered = ranks.sort_values(kind="stable")
    names, values = list(ordered.index), ordered.to_numpy(dtype=float)
    groups, last_end = [], -1
    for i in range(len(values)):
        end = int(np.searchsorted(values, values[i] + cd, side="left")) - 1  # last j with R_j − R_i < CD
        if end > i and end > last_end:
            groups.append(names[i:end + 1])
            last_end = end
    return groups


def _seed_values(trials: pd.DataFrame, metric: str, by: list[str]) -> pd.Series:
    """Each (``by`` …, seed)'s value as compared (:func:`comparison_values`): the mean over its trials (draws of
    a calibration subset), NaN dropped."""
    means = trials.dropna(subset=[metric]).groupby([*by, "seed"], observed=True, sort=False)[metric].mean()
    return comparison_values(metric, means)


def setup_means(trials: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The mean over seeds of each (setup, label): setups ("dataset · arch", sorted) × labels (NaN where a label
    has no finite value in a setup)."""
    seeds = _seed_values(trials, metric, ["dataset", "arch", "label"])
    means = seeds.groupby(level=["dataset", "arch", "label"], observed=True).mean().unstack("label")
    means.index = [f"{dataset} · {arch}" for dataset, arch in means.index]
    return means.sort_index()


@dataclass(frozen=True)
class RankComparison:
    """One metric of one study over its setups: the average ranks and what they support."""

    metric: str
    alpha: float
    setups: list[str]
    ranks: pd.Series
    """Average rank of each method ranked (every setup has its value), in the study's row order."""
    left_out: dict[str, list[str]] = field(default_factory=dict)
    """Methods not ranked -> the setups without a value of theirs."""
    friedman: Friedman | None = None
    q_alpha: float | None = None
    cd: float | None = None
    groups: list[list[str]] = field(default_factory=list)
    control: str | None = None
    holm: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)
    """Why a test is missing (too few setups or methods, the control not ranked) or trivial (all equal)."""
    all_equal: bool = False
    """Every ranked method has the same value in every setup."""


def rank_comparison(trials: pd.DataFrame, metric: str, order: Sequence[str], *, control: str | None,
                    alpha: float) -> RankComparison:
    """Average ranks of ``metric`` over the setups of ``trials`` (rows with ``dataset``, ``arch``, ``label``,
    ``seed``), the Friedman test, Nemenyi's CD and Holm against ``control``. ``order``: the labels in the
    study's row order. A method without a value in some setup is left out of the ranks; with fewer than 2
    setups or 3 methods there is no Friedman test (the notes say why)."""
    means = setup_means(trials, metric)
    setups = list(means.index)
    present = [label for label in order if label in means.columns]
    missing = {label: [s for s in setups if not np.isfinite(means.at[s, label])] for label in present}
    left_out = {label: where for label, where in missing.items() if where}
    ranked = [label for label in present if label not in left_out]
    values = means[ranked]
    notes = []
    if left_out:
        notes.append("left out of the ranks (no value in every setup): " + "; ".join(
            f"{label} (none in {', '.join(where)})" for label, where in left_out.items()))
    if not ranked:
        notes += [] if left_out else ["no value in any setup"]
        return RankComparison(metric, alpha, setups, pd.Series(dtype=float), left_out, notes=notes)
    ranks = average_ranks(values, higher_is_better=column_higher_is_better(metric))
    n, k = len(setups), len(ranked)
    if n < 2 or k < 3:
        notes.append(f"no Friedman test: {n} setup{'s' * (n != 1)} and {k} method{'s' * (k != 1)} ranked; "
                     "it needs >= 2 setups and >= 3 methods")
        return RankComparison(metric, alpha, setups, ranks, left_out, control=control, notes=notes)
    data = values.to_numpy(dtype=float)
    all_equal = bool((data == data[:, :1]).all())
    if all_equal:
        notes.append(f"every method has the same value in every setup: all ranks are {(k + 1) / 2:g}, "
                     "nothing to test")
    friedman = friedman_test(values)
    q_alpha, cd = nemenyi_critical_difference(k, n, alpha)
    holm = None
    if control is not None and control in ranks.index:
        holm = holm_against_control(ranks, n, control, alpha)
    elif control is not None:
        notes.append(f"no Holm test against {control}: it is not ranked "
                     f"({'left out' if control in left_out else 'no value of it'})")
    return RankComparison(metric, alpha, setups, ranks, left_out, friedman, q_alpha, cd,
                          not_different_groups(ranks, cd), control, holm, notes, all_equal)


PAIRED_TESTS = ("t-test", "wilcoxon")
"""The paired tests over seeds: Student's t-test (the default) and the Wilcoxon signed-rank test (exact p)."""


def _paired_difference_interval(d: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The Student-t interval of the mean of the paired differences ``d`` (a point when they are all equal)."""
    half = stats.t.ppf((1 + confidence) / 2, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)
    return float(d.mean() - half), float(d.mean() + half)


def paired_against_control(trials: pd.DataFrame, metric: str, control: str, *, alpha: float, min_seeds: int = 3,
                           test: str = "t-test") -> pd.DataFrame:
    """Each label of one setup's ``trials`` against ``control`` over the seeds both have a value for: a paired
    test of the per-seed values (``test``: :data:`PAIRED_TESTS`), Holm-adjusted over the labels tested.

    Index: the labels other than the control (those of ``trials``). Columns: ``seeds`` (common seeds),
    ``difference`` (mean of label − control) with ``difference_low`` / ``difference_high`` (its 95% Student-t
    interval), ``t`` (the t or Wilcoxon statistic), ``p``, ``p_holm`` and ``verdict`` ("better", "worse" or "" by
    the metric's direction), and ``reason`` when untested ("fewer than ``min_seeds`` common seeds") or trivially
    so ("equal on every seed": p = 1). Under the t-test, differences identical on every seed give t = ±∞, p = 0.
    """
    if test not in PAIRED_TESTS:
        raise ValueError(f"unknown paired test {test!r}; allowed: {', '.join(PAIRED_TESTS)}")
    values = _seed_values(trials, metric, ["label"]).unstack("label")
    higher = column_higher_is_better(metric)
    rows = {}
    for label in dict.fromkeys(trials["label"]):
        if label == control:
            continue
        both = values[[label, control]].dropna() if control in values and label in values else pd.DataFrame()
        row = {"seeds": len(both), "difference": np.nan, "difference_low": np.nan, "difference_high": np.nan,
               "t": np.nan, "p": np.nan, "reason": ""}
        if len(both) < min_seeds:
            row["reason"] = f"fewer than {min_seeds} common seeds"
        else:
            d = (both[label] - both[control]).to_numpy(dtype=float)
            row["difference"] = float(d.mean())
            row["difference_low"], row["difference_high"] = _paired_difference_interval(d)
            if (d == 0).all():
                row.update(t=0.0, p=1.0, reason="equal on every seed")
            elif test == "wilcoxon":
                result = stats.wilcoxon(d)
                row.update(t=float(result.statistic), p=float(result.pvalue))
            elif np.allclose(d, d[0], rtol=1e-9, atol=0):
                row.update(t=float(np.copysign(np.inf, d[0])), p=0.0)
            else:
                result = stats.ttest_rel(both[label], both[control])
                row.update(t=float(result.statistic), p=float(result.pvalue))
        rows[label] = row
    columns = ["seeds", "difference", "difference_low", "difference_high", "t", "p", "reason"]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns).astype({"seeds": int})
    table["p_holm"], table["verdict"] = np.nan, ""
    tested = table["p"].notna()
    if tested.any():
        rejected, adjusted = holm(table.loc[tested, "p"].to_numpy(float), alpha)
        table.loc[tested, "p_holm"] = adjusted
        good = table.loc[tested, "difference"] > 0 if higher else table.loc[tested, "difference"] < 0
        table.loc[tested, "verdict"] = np.where(rejected, np.where(good, "better", "worse"), "")
    return table[["seeds", "difference", "difference_low", "difference_high", "t", "p", "p_holm", "verdict",
                  "reason"]]
