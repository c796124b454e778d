"""BBQ, Bayesian binning into quantiles (Naeini, Cooper, Hauskrecht, AAAI 2015), docs/methods.md §5.

A binary calibrator, applied one-vs-rest: for each class k, scores x_i = softmax(z_i)_k and targets
1[y_i = k]; the calibrated scores are then renormalised, p̂_k = f_k(p_k) / Σ_j f_j(p_j).

For N calibration samples, BBQ averages the equal-frequency binning models M_B with
B = ⌊N^(1/3)/C⌋ ∨ 1, …, ⌈C·N^(1/3)⌉ ∧ ⌈N/5⌉ bins (C = 10). Model M_B sorts the scores and cuts them
at ⌊jN/B⌋, j = 1..B−1 (a cut in a run of ties moves to its start: fewer bins then); bin b spans [lo_b, hi_b], the
cuts halfway between neighbouring scores, lo = 0 for the first and hi = 1 for the last bin. Each bin
has a Beta(α_b, β_b) prior with α_b = a·p_b, β_b = a·(1 − p_b), p_b = (lo_b + hi_b)/2 clipped to
[0.005, 0.995], a = N'/B = 2 prior samples per bin. The score of M is its (BDeu) marginal likelihood

    P(D | M) = Π_b Γ(a)/Γ(n_b + a) · Γ(m_b + α_b)/Γ(α_b) · Γ(n_b − m_b + β_b)/Γ(β_b)

(n_b samples, m_b positives in bin b), with a uniform prior over the models; so

    f(x) = Σ_M P(M | D) θ_M(x),   P(M | D) = P(D | M) / Σ_M' P(D | M'),   θ_M(x) = (m_b + α_b)/(n_b + a)

where b is x's bin in M and θ its posterior mean. Source: the authors' Matlab code pakdaman/calibration
``BBQ/build.m`` (default scoring "BDeu2": N' = 2B, p_b the bin midpoint clipped to [0.005, 0.995];
the bin range; midpoint cuts) and ``predict.m`` (model averaging). Two differences, both documented
in docs/methods.md §5: the bin estimate is the posterior mean above (the Matlab code smooths with
its own prior, (m_b + p0)/(n_b + 1)), and all models are averaged, as in the paper's formula (the
Matlab code first keeps only the best models by an elbow rule on their sorted relative likelihoods,
``elbow.m``, α = 0.001).
``forward`` returns log p̂; the argmax can change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.special import gammaln

from calib._config import check_values, checked_field, number
from calib.metrics import softmax64
from calib.posthoc._base import POSTHOC, PostHocCalibrator, check_logits, check_logits_labels
from calib.posthoc._method import PostHocConfig, register_posthoc_method
from calib.posthoc.histogram_binning import log_of_normalised, midpoint_cuts

__all__ = ["BBQ", "MIDPOINT_CLIP", "BBQBinaryFit", "BBQConfig", "bbq_bin_range", "fit_bbq_binary"]

MIDPOINT_CLIP = 5e-3
"""p_b is clipped to [MIDPOINT_CLIP, 1 − MIDPOINT_CLIP] (the authors' ``getBDeuScore2_local``)."""


def bbq_bin_range(num_samples: int, range_factor: float = 10.0) -> tuple[int, int]:
    """The smallest and largest bin counts B of the averaged models for N samples and factor C.

    max(1, ⌊N^(1/3)/C⌋) and min(⌈N/5⌉, ⌈C·N^(1/3)⌉) (at least the smallest), as in the authors'
    ``build.m``; N^(1/3) is ``np.cbrt``, exact for cubes (N = 8000, C = 10: 2, where N**(1/3)/10 gives 1).

    >>> bbq_bin_range(10_000)
    (2, 216)
    """
    root = float(np.cbrt(num_samples))
    smallest = max(1, int(np.floor(root / range_factor)))
    largest = min(int(np.ceil(num_samples / 5)), int(np.ceil(range_factor * root)))
    return smallest, max(smallest, largest)


@dataclass
class BBQBinaryFit:
    """A fitted binary BBQ: the averaged step function f and the models behind it.

    ``nominal_bins[m]``/``bins[m]``: the requested and the actual (after merging ties) bin count of
    model m; ``log_evidence[m]``: log P(D | M_m); ``weights[m]``: P(M_m | D). f(x) is
    ``values[searchsorted(cut_points, x, side="right")]`` (a score on a cut goes to the upper bin).
    """

    nominal_bins: np.ndarray
    bins: np.ndarray
    log_evidence: np.ndarray
    weights: np.ndarray
    cut_points: np.ndarray
    values: np.ndarray = field(repr=False)

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        """f(x) for scores x."""
        return self.values[np.searchsorted(self.cut_points, scores, side="right")]


def fit_bbq_binary(
    scores: np.ndarray, targets: np.ndarray, *, range_factor: float = 10.0, prior_count: float = 2.0
) -> BBQBinaryFit:
    """Fit BBQ on scores x (N,) in [0, 1] and binary targets (N,); all models at once, vectorised."""
    order = np.argsort(scores, kind="stable")
    x = np.asarray(scores, dtype=np.float64)[order]
    positives_before = np.concatenate([[0.0], np.cumsum(np.asarray(targets, dtype=np.float64)[order])])
    n = len(x)
    smallest, largest = bbq_bin_range(n, range_factor)
    nominal = np.arange(smallest, largest + 1, dtype=np.int64)
    num_models = len(nominal)

    # Nominal interior starts ⌊jN/B⌋ (j = 1..B−1) of every model, moved down to the first of their tie group.
    inner = nominal - 1
    model_of_start = np.repeat(np.arange(num_models), inner)
    j = np.arange(inner.sum()) - np.repeat(np.cumsum(inner) - inner, inner) + 1
    starts = np.searchsorted(x, x[(j * n) // nominal[model_of_start]], side="left")
    # Every model's boundaries: 0, the kept starts (not 0, not repeated), N; sorted by model then position.
    repeated = np.zeros(len(starts), dtype=bool)
    repeated[1:] = (starts[1:] == starts[:-1]) & (model_of_start[1:] == model_of_start[:-1])
    keep = (starts > 0) & ~repeated
    model_of_edge = np.concatenate([np.arange(num_models), model_of_start[keep], np.arange(num_models)])
    edges = np.concatenate([np.zeros(num_models, dtype=np.int64), starts[keep], np.full(num_models, n)])
    by_model = np.lexsort((edges, model_of_edge))
    model_of_edge, edges = model_of_edge[by_model], edges[by_model]
    is_bin = model_of_edge[1:] == model_of_edge[:-1]
    lo_index, hi_index, model_of_bin = edges[:-1][is_bin], edges[1:][is_bin], model_of_edge[:-1][is_bin]

    count = (hi_index - lo_index).astype(np.float64)
    positive = positives_before[hi_index] - positives_before[lo_index]
    inner_lo, inner_hi = lo_index > 0, hi_index < n
    lower, upper = np.zeros(len(count)), np.ones(len(count))
    lower[inner_lo] = midpoint_cuts(x, np.concatenate([[0], lo_index[inner_lo]]))
    upper[inner_hi] = midpoint_cuts(x, np.concatenate([[0], hi_index[inner_hi]]))
    midpoint = np.clip((lower + upper) / 2, MIDPOINT_CLIP, 1 - MIDPOINT_CLIP)
    alpha, beta = prior_count * midpoint, prior_count * (1 - midpoint)
    log_evidence_per_bin = (gammaln(prior_count) - gammaln(count + prior_count)
                            + gammaln(positive + alpha) - gammaln(alpha)
                            + gammaln(count - positive + beta) - gammaln(beta))
    log_evidence = np.bincount(model_of_bin, log_evidence_per_bin, minlength=num_models)
    weights = np.exp(log_evidence - log_evidence.max())
    weights /= weights.sum()
    estimate = (positive + alpha) / (count + prior_count)

    # f = Σ_M w_M θ_M: the first bins' weighted estimates, then a jump w_M (θ_b − θ_{b−1}) at each cut of M.
    first = np.ones(len(model_of_bin), dtype=bool)
    first[1:] = model_of_bin[1:] != model_of_bin[:-1]
    base = float(np.sum(weights[model_of_bin[first]] * estimate[first]))
    cut_order = np.argsort(lower[~first], kind="stable")
    jumps = (weights[model_of_bin] * (estimate - np.roll(estimate, 1)))[~first][cut_order]
    values = np.clip(np.concatenate([[base], base + np.cumsum(jumps)]), 0.0, 1.0)
    return BBQBinaryFit(nominal_bins=nominal, bins=np.bincount(model_of_bin, minlength=num_models),
                        log_evidence=log_evidence, weights=weights, cut_points=lower[~first][cut_order],
                        values=values)


@dataclass(frozen=True, kw_only=True)
class BBQConfig(PostHocConfig):
    """BBQ as a method, fitted on the cached validation logits (docs/methods.md §5).

    Attributes:
        range_factor: C of the bin range ⌊N^(1/3)/C⌋ … ⌈C·N^(1/3)⌉, >= 1 (10).
        prior_count: prior samples per bin a = N'/B, > 0 (2).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    range_factor: float = checked_field(10.0, number(at_least=1))
    prior_count: float = checked_field(2.0, number(above=0))


@POSTHOC.register("bbq")
class BBQ(PostHocCalibrator):
    """BBQ one-vs-rest: p̂_k ∝ f_k(p_k), f_k the Bayesian average of equal-frequency binnings of class k.

    Args:
        range_factor: C >= 1 of the bin range ⌊N^(1/3)/C⌋ … ⌈C·N^(1/3)⌉ (10, the paper).
        prior_count: a = N'/B > 0, the prior samples per bin of the Beta(a·p_b, a·(1 − p_b)) bin prior
            (2: the authors' default "BDeu2", N' = 2B).

    After :meth:`fit`, ``class_fits[k]`` is class k's :class:`BBQBinaryFit`.
    """

    def __init__(self, range_factor: float = BBQConfig.range_factor,
                 prior_count: float = BBQConfig.prior_count) -> None:
        super().__init__()
        check_values(BBQConfig, locals())
        self.range_factor, self.prior_count = float(range_factor), float(prior_count)
        self.class_fits: list[BBQBinaryFit] = []

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> BBQ:
        """Fit one binary BBQ per class on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        probs, targets = softmax64(z), y.numpy()
        self.class_fits = [fit_bbq_binary(probs[:, k], targets == k, range_factor=self.range_factor,
                                          prior_count=self.prior_count) for k in range(probs.shape[1])]
        self._finish_fit()
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """log p̂, p̂_k = f_k(p_k) / Σ_j f_j(p_j)."""
        self.check_fitted()
        z = check_logits(logits, fitted_classes=len(self.class_fits))
        probs = softmax64(z.cpu())
        calibrated = np.stack([f(probs[:, k]) for k, f in enumerate(self.class_fits)], axis=1)
        return log_of_normalised(calibrated).to(logits.device)


register_posthoc_method(
    "bbq", BBQConfig, BBQ,
    "BBQ: Bayesian binning into quantiles, one-vs-rest, renormalised",
    label="BBQ", order=15,
)
