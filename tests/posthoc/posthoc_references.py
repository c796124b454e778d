"""The post-hoc calibrators' references for tests/posthoc/test_posthoc_references.py, restated from each paper (and
the official code where it fixes a convention) in this file's own numpy/scipy code; none of it is copied from, or
calls, calib or the published code. docs/how-to/reference-checks.md lists each with its tolerance.

The objectives come with their gradients by hand, minimised by scipy; the non-parametric fits bin, pool and average
in the papers' terms in plain numpy (a pool-adjacent-violators loop, a loop over BBQ's models).
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.interpolate import CubicSpline
from scipy.optimize import minimize, minimize_scalar
from scipy.special import gammaln, log_softmax, softmax


def mean_nll(logits: np.ndarray, labels: np.ndarray) -> float:
    """−(1/N) Σ_i log softmax(logits_i)_{y_i}."""
    return float(-log_softmax(logits, axis=1)[np.arange(len(labels)), labels].mean())


def _nll_and_logit_gradient(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean NLL and its gradient in the logits, (softmax − onehot)/N."""
    log_p = log_softmax(logits, axis=1)
    rows = np.arange(len(labels))
    gradient = np.exp(log_p)
    gradient[rows, labels] -= 1.0
    return float(-log_p[rows, labels].mean()), gradient / len(labels)


def _lbfgs(fun, start: np.ndarray, curvature: np.ndarray) -> np.ndarray:
    """argmin of a (loss, gradient) function by scipy L-BFGS-B, iterated to no relative progress (ftol 1e-15) or
    |∂L/∂u|_∞ < 1e-9 in the variables u = θ·sqrt(curvature): a diagonal change of variables by the objective's
    curvature at the start (Jacobi), which leaves the optimum where it is and makes the logits' scale (|z| up to
    ~100 here) well conditioned."""
    scale = 1.0 / np.sqrt(np.maximum(curvature, 1e-12))

    def scaled(u: np.ndarray) -> tuple[float, np.ndarray]:
        loss, gradient = fun(u * scale)
        return loss, gradient * scale

    result = minimize(scaled, start / scale, jac=True, method="L-BFGS-B",
                      options={"maxiter": 50_000, "maxfun": 100_000, "maxcor": 30, "ftol": 1e-15, "gtol": 1e-9})
    return result.x * scale


def _logit_curvature(logits: np.ndarray) -> np.ndarray:
    """p_ik(1 − p_ik) of softmax(logits): the NLL's second derivative in each logit, per sample."""
    p = softmax(logits, axis=1)
    return p * (1.0 - p)


# --- Vector scaling (Guo et al., ICML 2017, §4.2) --------------------------------------------------------------------


def vector_scaling(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(w, b) minimising the mean NLL of softmax(w ⊙ z + b), from w = 1, b = 0, with Σ_k b_k = 0 imposed afterwards
    (the NLL does not change when a constant is added to b)."""
    num_classes = logits.shape[1]

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:num_classes], theta[num_classes:]
        loss, g = _nll_and_logit_gradient(logits * w + b, labels)
        return loss, np.concatenate([(g * logits).sum(0), g.sum(0)])

    v = _logit_curvature(logits)
    curvature = np.concatenate([(v * logits**2).mean(0), v.mean(0)])
    theta = _lbfgs(fun, np.concatenate([np.ones(num_classes), np.zeros(num_classes)]), curvature)
    w, b = theta[:num_classes], theta[num_classes:]
    return w, b - b.mean()


# --- Matrix scaling and Dirichlet calibration with ODIR (Kull et al., NeurIPS 2019, §3–§5) ------------------------


def odir_objective(weight: np.ndarray, bias: np.ndarray, features: np.ndarray, labels: np.ndarray,
                   off_diagonal_weight: float, intercept_weight: float) -> float:
    """NLL(softmax(x Wᵀ + b)) + λ/(C(C−1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² (features x: z for MS, log p for Dir)."""
    c = len(bias)
    off_diagonal = weight * (1.0 - np.eye(c))
    return (mean_nll(features @ weight.T + bias, labels) + off_diagonal_weight * (off_diagonal**2).sum() / (c * (c - 1))
            + intercept_weight * (bias**2).sum() / c)


def odir_fit(features: np.ndarray, labels: np.ndarray, off_diagonal_weight: float,
             intercept_weight: float) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) minimising :func:`odir_objective`, from W = I, b = 0."""
    c = features.shape[1]
    off = 1.0 - np.eye(c)

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[: c * c].reshape(c, c), theta[c * c:]
        nll, g = _nll_and_logit_gradient(features @ w.T + b, labels)
        loss = nll + off_diagonal_weight * ((w * off) ** 2).sum() / (c * (c - 1)) + intercept_weight * (b**2).sum() / c
        grad_w = g.T @ features + 2 * off_diagonal_weight * w * off / (c * (c - 1))
        return loss, np.concatenate([grad_w.ravel(), g.sum(0) + 2 * intercept_weight * b / c])

    v = _logit_curvature(features)  # at W = I, b = 0
    weight_curvature = v.T @ features**2 / len(labels) + 2 * off_diagonal_weight * off / (c * (c - 1))
    curvature = np.concatenate([weight_curvature.ravel(), v.mean(0) + 2 * intercept_weight / c])
    theta = _lbfgs(fun, np.concatenate([np.eye(c).ravel(), np.zeros(c)]), curvature)
    return theta[: c * c].reshape(c, c), theta[c * c:]


# --- Structured matrix and vector scaling (Berta, Holzmüller, Jordan, Bach, AISTATS 2026, arXiv 2511.03685) -------


def ts_mix_log_probabilities(logits: np.ndarray, temperature: float, num_samples: int) -> np.ndarray:
    """x = log((1 − ε)·softmax(z/T) + ε/K), ε = 1/(n + 1): temperature scaling, then Laplace smoothing."""
    weight = 1.0 / (num_samples + 1)
    return np.log((1 - weight) * softmax(logits / temperature, axis=1) + weight / logits.shape[1])


def structured_penalties(num_classes: int, num_samples: int, strengths: tuple[float, float, float] = (1.0, 1.0, 1.0),
                         rho: float = 1.0, tau: float = 1.0) -> tuple[float, float, float]:
    """(c_b, c_v, c_M) = (λ_b K^ρ, λ_v K^ρ, λ_M (K(K−1))^ρ) / n^τ for strengths (λ_b, λ_v, λ_M)."""
    k, n = num_classes, num_samples
    return strengths[0] * k**rho / n**tau, strengths[1] * k**rho / n**tau, strengths[2] * (k * (k - 1))**rho / n**tau


def _structured_logits(deviation: np.ndarray, bias: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x + (diag(v) + M) x + b (deviation (K, K)) or (1 + v) ⊙ x + b (deviation v (K,))."""
    return x + (x @ deviation.T if deviation.ndim == 2 else x * deviation) + bias


def _deviation_penalties(deviation: np.ndarray, penalties: tuple[float, float, float]) -> np.ndarray:
    """Each weight deviation's ridge coefficient: c_v on the diagonal (every v_k), c_M off it."""
    if deviation.ndim == 1:
        return np.full(deviation.shape, penalties[1])
    return np.where(np.eye(len(deviation), dtype=bool), penalties[1], penalties[2])


def structured_objective(deviation: np.ndarray, bias: np.ndarray, x: np.ndarray, labels: np.ndarray,
                         penalties: tuple[float, float, float]) -> float:
    """NLL of the map + c_b ‖b‖² + c_v ‖v‖² (+ c_M ‖M‖²_F for SMS)."""
    return (mean_nll(_structured_logits(deviation, bias, x), labels)
            + float((_deviation_penalties(deviation, penalties) * deviation**2).sum()) + penalties[0] * (bias**2).sum())


def structured_gradient(deviation: np.ndarray, bias: np.ndarray, x: np.ndarray, labels: np.ndarray,
                        penalties: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(∂L/∂deviation, ∂L/∂b) by hand: G = (softmax − onehot)/N; ∂/∂(diag(v) + M) = Gᵀx + 2C⊙(diag(v) + M),
    ∂/∂v = Σ_i G_i ⊙ x_i + 2 c_v v; ∂/∂b = Σ_i G_i + 2 c_b b."""
    _, g = _nll_and_logit_gradient(_structured_logits(deviation, bias, x), labels)
    raw = g.T @ x if deviation.ndim == 2 else (g * x).sum(0)
    return raw + 2 * _deviation_penalties(deviation, penalties) * deviation, g.sum(0) + 2 * penalties[0] * bias


# --- Class-wise temperature scaling (Frenkel & Goldberger, EUSIPCO 2021, fitted by NLL as docs/methods.md §5.3) ------


def classwise_temperatures(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """T_k minimising the mean NLL of softmax(z_k / T_k). The NLL is convex in the inverse temperatures s_k = 1/T_k
    (the logits are linear in s), so scipy minimises over s from s = 1 (no temperature-scaling start needed)."""

    def fun(inverse: np.ndarray) -> tuple[float, np.ndarray]:
        loss, g = _nll_and_logit_gradient(logits * inverse, labels)
        return loss, (g * logits).sum(0)

    return 1.0 / _lbfgs(fun, np.ones(logits.shape[1]), (_logit_curvature(logits) * logits**2).mean(0))


# --- Ensemble temperature scaling (Zhang, Kailkhura, Han, ICML 2020, Mix-n-Match §3, official ets_calibrate) --------


def brier_per_entry(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mix-n-Match's "mse" loss: the mean over samples and classes of (p_ik − 1[y_i = k])²."""
    return float(((probs - np.eye(probs.shape[1])[labels]) ** 2).mean())


def ensemble_probs(logits: np.ndarray, temperature: float, weights: np.ndarray) -> np.ndarray:
    """w1 softmax(z/T) + w2 softmax(z) + w3/C."""
    return (weights[0] * softmax(logits / temperature, axis=1) + weights[1] * softmax(logits, axis=1)
            + weights[2] / logits.shape[1])


def ensemble_ts(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """(T, w) of ETS with the "mse" loss of both stages.

    Stage 1: T ∈ [0.05, 5] (the official bounds) minimising the loss of softmax(z/T): the best of a 200-point log grid,
    refined by bounded Brent between its neighbours. Stage 2: w on the simplex minimising the loss of
    w1 softmax(z/T) + w2 softmax(z) + w3/C. That loss is the convex quadratic wᵀGw − 2hᵀw + const with
    G_jl = mean(c_j c_l), h_j = mean(c_j onehot): solved exactly by trying every face of the simplex (the
    equality-constrained minimum on each face, kept if it lies in the simplex) and taking the lowest.
    """
    grid = np.exp(np.linspace(np.log(0.05), np.log(5.0), 200))
    losses = [brier_per_entry(softmax(logits / t, axis=1), labels) for t in grid]
    best = int(np.argmin(losses))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    temperature = minimize_scalar(lambda t: brier_per_entry(softmax(logits / t, axis=1), labels), method="bounded",
                                  bounds=(low, high), options={"xatol": 1e-12}).x
    components = np.stack([softmax(logits / temperature, axis=1), softmax(logits, axis=1),
                           np.full(logits.shape, 1.0 / logits.shape[1])]).reshape(3, -1)
    target = np.eye(logits.shape[1])[labels].reshape(-1)
    gram, linear = components @ components.T / target.size, components @ target / target.size

    def quadratic(w: np.ndarray) -> float:
        return float(w @ gram @ w - 2 * linear @ w)

    candidates = []
    for size in (1, 2, 3):
        for face in itertools.combinations(range(3), size):
            idx = list(face)
            # KKT of min wᵀGw − 2hᵀw subject to Σ w = 1 on the face: [2G 1; 1ᵀ 0][w; ν] = [2h; 1]
            system = np.zeros((size + 1, size + 1))
            system[:size, :size] = 2 * gram[np.ix_(idx, idx)]
            system[:size, size] = system[size, :size] = 1.0
            solution = np.linalg.lstsq(system, np.append(2 * linear[idx], 1.0), rcond=None)[0][:size]
            if (solution >= -1e-12).all():
                w = np.zeros(3)
                w[idx] = np.clip(solution, 0.0, None)
                candidates.append(w / w.sum())
    return float(temperature), min(candidates, key=quadratic)


# --- Isotonic regression (Zadrozny & Elkan, KDD 2002) and IRM (Mix-n-Match §3, official mir_calibrate) -------------


def piecewise_linear(knots: np.ndarray, values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The function through (knots_j, values_j) (knots ascending, distinct), linear in between and constant beyond
    the ends: at x in [k_{j−1}, k_j], ((k_j − x)·v_{j−1} + (x − k_{j−1})·v_j) / (k_j − k_{j−1})."""
    if len(knots) == 1:
        return np.full(x.shape, values[0], dtype=np.float64)
    x = np.clip(x, knots[0], knots[-1])
    upper = np.clip(np.searchsorted(knots, x, side="left"), 1, len(knots) - 1)
    lower = upper - 1
    span = knots[upper] - knots[lower]
    return ((knots[upper] - x) * values[lower] + (x - knots[lower]) * values[upper]) / span


def pool_adjacent_violators(scores: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares non-decreasing fit of targets on scores: (distinct scores, fitted value at each).

    Tied scores are first replaced by one point, their mean target weighted by their count; adjacent blocks whose
    means decrease are then pooled (weighted means) until the sequence is non-decreasing.
    """
    distinct, group, counts = np.unique(scores, return_inverse=True, return_counts=True)
    sums = np.bincount(group, weights=targets.astype(np.float64))
    means, weights, lengths = [], [], []
    for total, count in zip(sums, counts, strict=True):
        means.append(total / count)
        weights.append(float(count))
        lengths.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            mean, weight, length = means.pop(), weights.pop(), lengths.pop()
            means[-1] = (means[-1] * weights[-1] + mean * weight) / (weights[-1] + weight)
            weights[-1] += weight
            lengths[-1] += length
    return distinct, np.repeat(means, lengths)


def renormalise(scores: np.ndarray) -> np.ndarray:
    """Each row divided by its sum; a row of zeros becomes uniform."""
    totals = scores.sum(axis=1, keepdims=True)
    safe = np.where(totals > 0, totals, 1.0)
    return np.where(totals > 0, scores / safe, 1.0 / scores.shape[1])


def isotonic_irm(calibration_probs: np.ndarray, labels: np.ndarray, test_probs: np.ndarray,
                 epsilon: float = 1e-9) -> np.ndarray:
    """IRM: one isotonic g on the N·C pairs (p_ik, 1[y_i = k]) pooled over the classes, then g(p_k) + ε·p_k,
    renormalised (the official code returns the unnormalised g(p) + εp; calib normalises, as here)."""
    onehot = np.eye(calibration_probs.shape[1])[labels]
    knots, values = pool_adjacent_violators(calibration_probs.ravel(), onehot.ravel())
    mapped = piecewise_linear(knots, values, test_probs.ravel()).reshape(test_probs.shape)
    return renormalise(mapped + epsilon * test_probs)


# --- Histogram binning (Zadrozny & Elkan, ICML 2001), equal-frequency bins as docs/methods.md §5.9 -------------------


def equal_frequency_bins(sorted_scores: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi): index ranges [lo, hi) of the bins of ascending scores cut at ⌊jN/B⌋, j = 1..B−1, each cut moved down
    to the first index of its run of equal scores (so equal scores share a bin), repeated and zero cuts dropped."""
    n = len(sorted_scores)
    nominal = np.arange(1, num_bins) * n // num_bins
    moved = np.searchsorted(sorted_scores, sorted_scores[nominal], side="left")  # the first of each tie group
    edges = np.unique(np.concatenate([[0], moved, [n]]))
    return edges[:-1], edges[1:]


def bin_cuts(sorted_scores: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The cut before each bin start: halfway between the two neighbouring scores (the upper score where rounding
    puts the midpoint on the lower)."""
    lower, upper = sorted_scores[starts - 1], sorted_scores[starts]
    middle = lower + (upper - lower) / 2
    return np.where(middle > lower, middle, upper)


def histogram_binning(calibration_probs: np.ndarray, labels: np.ndarray, test_probs: np.ndarray,
                      num_bins: int) -> np.ndarray:
    """One-vs-rest: for class k the bins' fractions of positives θ_kb; a test score takes the θ of the bin whose
    interval holds it (at or above a cut: the upper bin); rows renormalised."""
    mapped = np.empty_like(test_probs)
    for k in range(calibration_probs.shape[1]):
        order = np.argsort(calibration_probs[:, k], kind="stable")
        scores, positive = calibration_probs[order, k], (labels[order] == k).astype(np.float64)
        lo, hi = equal_frequency_bins(scores, num_bins)
        fractions = np.array([positive[a:b].mean() for a, b in zip(lo, hi, strict=True)])
        cuts = bin_cuts(scores, lo[1:])
        mapped[:, k] = fractions[(test_probs[:, k, None] >= cuts[None, :]).sum(axis=1)]
    return renormalise(mapped)


# --- BBQ (Naeini, Cooper, Hauskrecht, AAAI 2015, §3; conventions of docs/methods.md §5.10) ------------------------


def bbq_binary(scores: np.ndarray, targets: np.ndarray, test_scores: np.ndarray, range_factor: float = 10.0,
               prior_count: float = 2.0) -> np.ndarray:
    """f(x) = Σ_M P(M | D) θ_M(x) over the equal-frequency binnings M_B, B = max(1, ⌊N^⅓/C⌋) … min(⌈N/5⌉, ⌈C·N^⅓⌉).

    Bin b of M spans [lo_b, hi_b] (cuts halfway between neighbouring scores, 0 and 1 at the ends) and has the prior
    Beta(a·p_b, a·(1 − p_b)), p_b = (lo_b + hi_b)/2 clipped to [0.005, 0.995], a = ``prior_count``; the model's
    BDeu marginal likelihood is Π_b Γ(a)/Γ(n_b + a) · Γ(m_b + α_b)/Γ(α_b) · Γ(n_b − m_b + β_b)/Γ(β_b), the model
    prior uniform, and θ_M(x) = (m_b + α_b)/(n_b + a), the posterior mean of x's bin (at or above a cut: the upper).
    """
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    positives_before = np.concatenate([[0.0], np.cumsum(targets[order].astype(np.float64))])
    n = len(s)
    root = np.cbrt(n)
    smallest = max(1, int(np.floor(root / range_factor)))
    largest = max(smallest, min(int(np.ceil(n / 5)), int(np.ceil(range_factor * root))))
    log_evidences, predictions = [], []
    for num_bins in range(smallest, largest + 1):
        lo, hi = equal_frequency_bins(s, num_bins)
        cuts = bin_cuts(s, lo[1:])
        lower, upper = np.concatenate([[0.0], cuts]), np.concatenate([cuts, [1.0]])
        midpoint = np.clip((lower + upper) / 2, 0.005, 0.995)
        alpha, beta = prior_count * midpoint, prior_count * (1 - midpoint)
        count = (hi - lo).astype(np.float64)
        positive = positives_before[hi] - positives_before[lo]
        log_evidences.append(np.sum(gammaln(prior_count) - gammaln(count + prior_count) + gammaln(positive + alpha)
                                    - gammaln(alpha) + gammaln(count - positive + beta) - gammaln(beta)))
        estimates = (positive + alpha) / (count + prior_count)
        predictions.append(estimates[np.searchsorted(cuts, test_scores, side="right")])
    weights = np.exp(np.array(log_evidences) - max(log_evidences))
    return (weights / weights.sum()) @ np.array(predictions)


def bbq(calibration_probs: np.ndarray, labels: np.ndarray, test_probs: np.ndarray) -> np.ndarray:
    """One-vs-rest BBQ, renormalised: p̂_k ∝ f_k(p_k)."""
    mapped = np.stack([bbq_binary(calibration_probs[:, k], labels == k, test_probs[:, k])
                       for k in range(calibration_probs.shape[1])], axis=1)
    return renormalise(mapped)


# --- Spline calibration (Gupta et al., ICLR 2021, §4; official recalibrate.py for the conventions) ------------------


def spline_confidence(calibration_probs: np.ndarray, labels: np.ndarray, test_top_scores: np.ndarray,
                      num_knots: int = 6) -> np.ndarray:
    """ĉ = clip(a(s), 0, 1) of the test top scores s.

    Sorted calibration top scores s_i (stable within ties) with correctness c_i; t_i = (i − 1)/(N − 1);
    A − S = (1/N)·cumsum(c − s) fitted by least squares with a natural cubic spline σ on K equally spaced knots
    (scipy's natural CubicSpline through each unit knot vector as the basis); a_i = σ'(t_i) + s_i; tied s_i take
    their mean a_i; a(s) is the linear interpolation through the (s_i, a_i), constant beyond them. The official
    ``interpolated_function`` swaps the two interpolation weights; the paper's piecewise-linear map is used here.
    """
    top, correct = calibration_probs.max(axis=1), (calibration_probs.argmax(axis=1) == labels).astype(np.float64)
    order = np.argsort(top, kind="stable")
    s, c = top[order], correct[order]
    n = len(s)
    fraction = np.linspace(0.0, 1.0, n)
    knots = np.linspace(0.0, 1.0, num_knots)
    bases = [CubicSpline(knots, unit, bc_type="natural") for unit in np.eye(num_knots)]
    values = np.stack([basis(fraction) for basis in bases], axis=1)
    slopes = np.stack([basis(fraction, 1) for basis in bases], axis=1)
    knot_values = np.linalg.lstsq(values, np.cumsum(c - s) / n, rcond=None)[0]
    calibrated = slopes @ knot_values + s
    distinct, group = np.unique(s, return_inverse=True)
    tied_mean = np.bincount(group, calibrated) / np.bincount(group)
    return np.clip(piecewise_linear(distinct, tied_mean, test_top_scores), 0.0, 1.0)


# --- SMART (arXiv 2506.23492, §3; official losses.py: the Charbonnier SoftECE) ----------------------------------------


def smooth_soft_ece(confidences: np.ndarray, correct: np.ndarray, num_bins: int = 15, bandwidth: float = 0.05,
                    charbonnier_delta: float = 1e-3) -> float:
    """Σ_b (m_b/N)·sqrt((conf_b − acc_b)² + δ²) with Gaussian soft bins: centres (b + ½)/M, memberships
    w_ib ∝ exp(−(conf_i − c_b)²/(2σ²)) normalised over b, m_b = Σ_i w_ib, conf_b and acc_b the w-weighted means."""
    centres = (np.arange(num_bins) + 0.5) / num_bins
    exponent = -((confidences[:, None] - centres[None, :]) ** 2) / (2 * bandwidth**2)
    membership = np.exp(exponent - exponent.max(axis=1, keepdims=True))
    membership /= membership.sum(axis=1, keepdims=True)
    mass = membership.sum(axis=0)
    confidence_b = (membership * confidences[:, None]).sum(axis=0) / mass
    accuracy_b = (membership * correct[:, None]).sum(axis=0) / mass
    return float((mass / len(confidences) * np.sqrt((confidence_b - accuracy_b) ** 2 + charbonnier_delta**2)).sum())


def best_constant_temperature_soft_ece(logits: np.ndarray, labels: np.ndarray) -> float:
    """min over one shared T ∈ [0.1, 100] of :func:`smooth_soft_ece` of softmax(z/T): a 400-point log grid, refined
    by bounded Brent between the best point's neighbours. A constant T ≥ 0.1 is a temperature SMART's network can
    output (zero weights, a bias b with softplus(b) + 0.1 = T)."""
    correct = (logits.argmax(axis=1) == labels).astype(np.float64)

    def objective(log_t: float) -> float:
        return smooth_soft_ece(softmax(logits / np.exp(log_t), axis=1).max(axis=1), correct)

    grid = np.linspace(np.log(0.1), np.log(100.0), 400)
    best = int(np.argmin([objective(g) for g in grid]))
    bounds = (grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)])
    return float(minimize_scalar(objective, method="bounded", bounds=bounds, options={"xatol": 1e-10}).fun)
