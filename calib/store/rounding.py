"""What rounding kept predictions to float32 or float16 can do to a metric: a bound computed from the kept values.

A probability p stored in a format of unit roundoff u (2⁻¹¹ for float16, 2⁻²⁴ for float32) reads back as p̃ with
|p̃ − p| ≤ e = max(u·p̃ / (1 − u), η), η half the smallest subnormal (2⁻²⁵, 2⁻¹⁵⁰). The reader divides each row by
its sum s (the metrics need rows summing to 1): q = p̃ / s, so |q − p| ≤ δ = q·|1 − s| + e, computed per entry from
the kept values alone. Per sample, the confidence moves by at most Δ = maxₖ δₖ; the predicted class may differ only
where another class's q + δ reaches the top class's q − δ (a "flip"); and the sample may sit in another bin only where
[ĉ − Δ, ĉ + Δ] meets a bin edge (a "crossing"; equal-mass edges themselves move by at most maxᵢ Δᵢ). Then, N samples:

- ECE, AECE: |Δ| ≤ (Σ Δᵢ over samples that cross no edge + #flips among them + 2·#crossings) / N;
- MCE: |Δ| ≤ max over bins b of (D_b + F_b + L_b + E_b + max(L_b, E_b)) / (n_b − L_b), with n_b the bin's samples,
  D_b and F_b the Δ-sum and flips of those that stay, L_b those that may leave, E_b those that may enter (1 when
  n_b ≤ L_b);
- NLL: |Δ| ≤ mean over samples of ln(q_y / (q_y − δ_y)) (744.44, the NLL's cap, for a sample with q_y ≤ δ_y).

Kept in float64 the values are those the metrics were computed from: every bound is 0. Other metrics have no
stated bound (None).
"""

from __future__ import annotations

import numpy as np

from calib.metrics._binning import equal_mass_edges, equal_width_edges
from calib.metrics.nll import NLL_MAX

__all__ = ["BOUNDED_METRICS", "ROUNDOFF", "rounding_bound"]

ROUNDOFF = {"float64": (0.0, 0.0), "float32": (2.0 ** -24, 2.0 ** -150), "float16": (2.0 ** -11, 2.0 ** -25)}
"""dtype -> (unit roundoff u, half the smallest subnormal η)."""
BOUNDED_METRICS = ("ece", "aece", "mce", "nll")
_SLACK = 1e-12  # the float64 arithmetic of the bound itself


def _perturbations(stored: np.ndarray, probs: np.ndarray, precision: str) -> np.ndarray:
    """δ: per entry, the most |q − p| can be (module docstring)."""
    u, eta = ROUNDOFF[precision]
    e = np.maximum(u * stored / (1 - u), eta)
    return probs * np.abs(1 - stored.sum(axis=1, keepdims=True)) + e + _SLACK * probs


def _uncertain(probs: np.ndarray, delta: np.ndarray, edges: np.ndarray, edge_shift: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per sample: Δ, whether its class may flip, and the lowest and highest bin it may be in."""
    top = probs.argmax(axis=1)
    rows = np.arange(probs.shape[0])
    confidence, spread = probs[rows, top], delta.max(axis=1)
    others = probs + delta
    others[rows, top] = -np.inf
    flip = others.max(axis=1) >= confidence - delta[rows, top]
    reach = spread + edge_shift
    lowest = np.searchsorted(edges, confidence - reach, side="left") - 1
    highest = np.searchsorted(edges, confidence + reach, side="left") - 1
    return spread, flip, lowest, highest


def _binned_bound(metric: str, probs: np.ndarray, delta: np.ndarray, num_bins: int) -> float:
    confidence = probs.max(axis=1)
    if metric == "aece":
        edges = equal_mass_edges(confidence, num_bins)
        spread, flip, lowest, highest = _uncertain(probs, delta, edges, float(delta.max(axis=1).max()))
    else:
        edges = equal_width_edges(num_bins)
        spread, flip, lowest, highest = _uncertain(probs, delta, edges, 0.0)
    crossing = lowest != highest
    n = probs.shape[0]
    if metric != "mce":
        return float((spread[~crossing].sum() + flip[~crossing].sum() + 2 * crossing.sum()) / n)
    home = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, num_bins - 1)
    worst = 0.0
    for b in range(num_bins):
        here, stay = home == b, (home == b) & ~crossing
        leave = int((here & crossing).sum())
        enter = int((~here & (lowest <= b) & (highest >= b)).sum())
        if not here.any() and not enter:
            continue
        if here.sum() <= leave:
            return 1.0
        change = spread[stay].sum() + flip[stay].sum() + leave + enter + max(leave, enter)
        worst = max(worst, float(change / (here.sum() - leave)))
    return min(worst, 1.0)


def rounding_bound(metric: str, stored: np.ndarray, probs: np.ndarray, labels: np.ndarray, precision: str,
                   num_bins: int = 15) -> float | None:
    """The most rounding to ``precision`` can have moved ``metric`` (module docstring): ``stored`` the kept values
    (as float64), ``probs`` them renormalised (what the metric is computed from). None: no stated bound."""
    if precision == "float64":
        return 0.0
    if metric not in BOUNDED_METRICS:
        return None
    delta = _perturbations(stored, probs, precision)
    if metric == "nll":
        rows = np.arange(labels.size)
        q, d = probs[rows, labels], delta[rows, labels]
        safe = q > d
        terms = np.full(q.shape, NLL_MAX)
        terms[safe] = np.log(q[safe] / (q[safe] - d[safe]))
        return float(terms.mean())
    return _binned_bound(metric, probs, delta, num_bins)
