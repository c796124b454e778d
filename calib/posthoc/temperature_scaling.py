"""Temperature scaling (Guo, Pleiss, Sun, Weinberger, ICML 2017), docs/methods.md §5.1.

p = softmax(z / T) with one scalar T > 0 fitted on validation logits; the argmax, hence accuracy,
is unchanged. Fitting recipes:

- ``objective="nll", optimizer="lbfgs"`` (default): minimise the NLL over log T (which keeps T > 0)
  from T = 1.5 with float64 LBFGS, lr 1 and the strong-Wolfe line search, repeating ``step`` until
  |dNLL/d log T| < 1e-6 (:data:`GRAD_TOLERANCE`): the exact NLL optimum.
- ``lbfgs_line_search=False``: gpleiss's TST-R recipe, plain LBFGS (lr 0.01, max_iter 50), which stops
  short of the optimum; where it ends at a worse NLL than at T = 1.5 (it can run away towards
  T → 0) the fit falls back to the default with a ``RuntimeWarning``.
- ``optimizer="brent"``: the same NLL optimum by a bounded scalar (Brent) search over log T in
  :data:`TEMPERATURE_RANGE`, to 1e-10 in log T, without a torch optimizer (whose first use in a process imports
  ``torch._dynamo``, about 2 s): what the calibration / refinement metric fits five times per evaluation.
- ``optimizer="grid"`` (FOCAL-R / FeDLaS "CE+TS"): T ∈ {0.1, 0.2, …, 10.0}, the first T with the
  lowest ECE (15 equal-width bins, ``objective="ece"``) or NLL (``objective="nll"``).

A fitted T lies in :data:`TEMPERATURE_RANGE`. Where the NLL has no finite optimum (every label has its row's
top logit: T → 0; the labels' logits no higher than their rows' mean: T → ∞) or its optimum lies outside the
range, T is the bound on that side and the fit is degenerate (``degenerate_reason``, a
``DegenerateFitWarning``); a grid fit at either end of its grid is degenerate too.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import nn

from calib._config import ConfigError, check_values, integer, number
from calib._deprecation import warn_renamed
from calib.metrics import expected_calibration_error, negative_log_likelihood, softmax64
from calib.posthoc import _lbfgs
from calib.posthoc._base import POSTHOC, DegenerateFitWarning, PostHocCalibrator, check_logits_labels
from calib.posthoc._lbfgs import GRAD_TOLERANCE, fit_lbfgs
from calib.posthoc._method import CALIBRATION_FIELDS, PostHocConfig, register_posthoc_method

__all__ = [
    "TEMPERATURE_GRID",
    "TEMPERATURE_RANGE",
    "TemperatureScaling",
    "TemperatureScalingConfig",
    "fit_first_temperature",
]

TEMPERATURE_GRID = tuple(k / 10 for k in range(1, 101))
"""FOCAL-R's grid of temperatures: 0.1, 0.2, …, 10.0 (100 values)."""

Objective = Literal["nll", "ece"]
Optimizer = Literal["lbfgs", "brent", "grid"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)


def _check_combination(objective: Objective, optimizer: Optimizer, lbfgs_line_search: bool) -> None:
    """The rules that join TS's fields (each field's own is its type's, :func:`~calib._config.check_fields`)."""
    if objective == "ece" and optimizer != "grid":
        raise ConfigError(f"`objective`='ece' needs `optimizer`='grid' (ECE has no useful gradient), "
                          f"got optimizer={optimizer!r}.")
    if optimizer != "lbfgs" and not lbfgs_line_search:
        raise ConfigError("`lbfgs_line_search`=false applies to `optimizer`='lbfgs' only, "
                          f"got optimizer={optimizer!r}.")


TEMPERATURE_RANGE = (0.05, 20.0)
"""Bounds of a fitted NLL temperature. The lower bound is Mix-n-Match's for ETS (a 20-fold sharpening); the upper
one leaves room for logits far more over-confident than the 1.5–4 that TS finds on CIFAR networks. A fit that
would leave the range is held at the bound and flagged degenerate."""


def no_finite_optimum(z: torch.Tensor, y: torch.Tensor) -> tuple[float, str] | None:
    """(the T to hold, why) when the NLL of softmax(z / T) has no finite optimum over T > 0; None when it has one.

    With β = 1/T the NLL is convex in β, and its slope at β = 0 is (1/N) Σ_i (mean_k z_ik − z_iy_i): if that slope
    is >= 0 the NLL falls as β → 0 (T → ∞: held at the upper bound of :data:`TEMPERATURE_RANGE`). If every label's
    logit is its row's maximum (and some row is not constant) the slope is < 0 everywhere and the NLL falls as
    β → ∞ (T → 0: held at the lower bound). If every row is constant the NLL does not depend on T (held at 1).
    """
    low, high = TEMPERATURE_RANGE
    label_logits = z[torch.arange(len(y)), y]
    if bool((z.max(1).values == z.min(1).values).all()):
        return 1.0, "every calibration row has equal logits, so the NLL does not depend on T"
    if bool((label_logits >= z.max(1).values).all()):
        return low, ("no finite optimum: every calibration sample's label has its row's top logit (a separable "
                     "set), so the NLL keeps falling as T → 0")
    if float((z.mean(1) - label_logits).mean()) >= 0:
        return high, ("no finite optimum: the labels' logits are on average no higher than their rows' mean, so "
                      "the NLL keeps falling as T → ∞")
    return None


class _TemperatureNLL:
    """NLL(T) = mean_n [logsumexp(z_n / T) − z_{n,y_n} / T] of float64 logits z (N, C) and labels y, and its
    derivative dNLL/d log T = −(1/T)·mean_n (E_{p_n}[z_n] − z_{n,y_n}), from one exp pass in numpy (no autograd)."""

    def __init__(self, z: torch.Tensor, y: torch.Tensor) -> None:
        logits = z.numpy()
        row_max = logits.max(axis=1)
        self.shifted = logits - row_max[:, None]  # <= 0: exp(β·shifted) cannot overflow for β > 0
        self.label_gap = float(np.mean(self.shifted[np.arange(len(y)), y.numpy()]))  # mean_n (z_ny − max_k z_nk)
        self.buffer = np.empty_like(self.shifted)

    def __call__(self, log_temperature: float) -> tuple[float, float]:
        """(NLL, dNLL/d log T) at T = exp(``log_temperature``)."""
        inverse = math.exp(-log_temperature)
        exps = np.multiply(self.shifted, inverse, out=self.buffer)
        np.exp(exps, out=exps)
        total = exps.sum(axis=1)
        expected = float(np.mean(np.einsum("nk,nk->n", exps, self.shifted) / total))  # E_p[z] − max z, averaged
        nll = float(np.mean(np.log(total))) - inverse * self.label_gap
        return nll, -inverse * (expected - self.label_gap)


class _LogTemperatureNLL(torch.autograd.Function):
    """The NLL of a :class:`_TemperatureNLL` as a function of a log T tensor, with its derivative as the backward:
    what torch's LBFGS steps on, with no graph of the (N, C) logits."""

    @staticmethod
    def forward(ctx: Any, log_temperature: torch.Tensor, objective: _TemperatureNLL) -> torch.Tensor:
        nll, ctx.derivative = objective(float(log_temperature))
        return log_temperature.new_tensor(nll)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad_output * ctx.derivative, None


def _bound_beyond(nll: _TemperatureNLL, temperature: float) -> float | None:
    """The bound of :data:`TEMPERATURE_RANGE` where a bounded search stopped (within 1e-6 in log T) with the NLL
    still falling beyond it; None when the search found an optimum inside the range."""
    for bound, outward in ((TEMPERATURE_RANGE[0], -1.0), (TEMPERATURE_RANGE[1], 1.0)):
        near = abs(math.log(temperature) - math.log(bound)) < 1e-6
        if near and outward * nll(math.log(bound))[1] < 0:
            return bound
    return None


@dataclass(frozen=True, kw_only=True)
class TemperatureScalingConfig(PostHocConfig):
    """Temperature scaling as a method: T fitted on the cached validation logits (docs/methods.md §5.1).

    The trial's validation metrics are therefore in-sample; read the test metrics. The fitted T is
    ``outcome.predict.calibrator.temperature.item()`` (the history stays empty).

    Attributes:
        objective: "nll" (default; gpleiss / TST-R) or "ece" (FOCAL-R / FeDLaS "CE+TS"; needs "grid").
        optimizer: "lbfgs" (default), "brent" (the same NLL optimum by a bounded scalar search) or "grid"
            (T ∈ {0.1, …, 10.0}).
        lbfgs_line_search: true (default): float64 LBFGS on log T from T = 1.5, lr 1, strong-Wolfe
            line search, ``step`` repeated until |dNLL/d log T| < 1e-6, so T is the NLL optimum (a
            RuntimeError if it is not reached). false: gpleiss's plain LBFGS (lr 0.01, 50
            iterations, one step), which stops short; if it ends at a higher NLL than at T = 1.5
            (a runaway towards T → 0) the default fit replaces it with a RuntimeWarning
            (``calibrator.fit_fallback``). Must stay true with "grid".
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    objective: Objective = "nll"
    optimizer: Optimizer = "lbfgs"
    lbfgs_line_search: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_combination(self.objective, self.optimizer, self.lbfgs_line_search)


@POSTHOC.register("temperature_scaling")
class TemperatureScaling(PostHocCalibrator):
    """Divide the logits by one fitted temperature T > 0.

    The default (``"nll"``, ``"lbfgs"``, ``lbfgs_line_search=True``) minimises NLL(T) over log T from
    ``init_temperature`` with the full-batch float64 LBFGS fit the scaling family shares
    (:func:`calib.posthoc._lbfgs.fit_lbfgs`: lr 1, strong-Wolfe line search, ``max_iter`` iterations per step
    and LBFGS's own gradient tolerance 1e-10 within it,
    ``step`` called again, at most :data:`~calib.posthoc._lbfgs.MAX_LBFGS_STEPS` times, until |dNLL/d log T| <
    1e-6 (:data:`~calib.posthoc._lbfgs.GRAD_TOLERANCE`) or no progress is possible); a gradient still >= 1e-6
    then is a ``RuntimeError``. So T is the NLL optimum, to ~1e-6 in log T.

    Args:
        objective: "nll" (negative log-likelihood) or "ece" (ECE with ``num_bins`` equal-width bins;
            needs ``optimizer="grid"``).
        optimizer: "lbfgs" (gradient fit of log T), "brent" (bounded scalar search of log T: the same optimum,
            no torch optimizer) or "grid" (search over :data:`TEMPERATURE_GRID`).
        init_temperature: T at the start of the LBFGS fit, > 0 (1.5, gpleiss).
        lr: LBFGS step size, > 0; None (default) is 1 with the line search and 0.01 without (gpleiss).
        max_iter: LBFGS iterations per ``step`` (50, gpleiss).
        lbfgs_line_search: use LBFGS's strong-Wolfe line search and iterate to convergence (default).
            False is gpleiss's plain LBFGS, a single ``step`` of ``max_iter`` iterations: with lr 0.01
            each iteration moves 1% of the quasi-Newton step, so it stops short of the optimum
            (T ≈ 1.7 where the NLL optimum is 2.5); False reproduces that. It can also run away
            (T → 0): if it ends at a non-finite T or a higher NLL than at ``init_temperature``, the
            fit falls back to the default fit and warns (``RuntimeWarning``).
        num_bins: bins of the ECE objective (15).
        line_search: the former name of ``lbfgs_line_search`` (``DeprecationWarning``).

    After :meth:`fit`, ``temperature`` (a 0-dim float64 buffer) holds T, ``grad_log_temperature``
    dNLL/d log T at T (any optimizer; ~0 at the NLL optimum) and ``fit_fallback`` whether the
    ``lbfgs_line_search=False`` fit was replaced by the default fit.
    """

    def __init__(
        self,
        objective: Objective = TemperatureScalingConfig.objective,
        optimizer: Optimizer = TemperatureScalingConfig.optimizer,
        *,
        init_temperature: float = 1.5,
        lr: float | None = None,
        max_iter: int = 50,
        lbfgs_line_search: bool = TemperatureScalingConfig.lbfgs_line_search,
        num_bins: int = 15,
        line_search: bool | None = None,
    ) -> None:
        super().__init__()
        if line_search is not None:  # the former name of lbfgs_line_search
            warn_renamed("TemperatureScaling(line_search=...)")
            lbfgs_line_search = line_search
        check_values(TemperatureScalingConfig, locals())
        _check_combination(objective, optimizer, lbfgs_line_search)
        number(above=0).check("init_temperature", init_temperature)
        if lr is None:
            lr = 1.0 if lbfgs_line_search else 0.01
        number(above=0).check("lr", lr)
        integer(at_least=1).check("max_iter", max_iter)
        integer(at_least=1).check("num_bins", num_bins)
        self.objective, self.optimizer = objective, optimizer
        self.init_temperature, self.lr, self.max_iter = init_temperature, lr, max_iter
        self.lbfgs_line_search, self.num_bins = lbfgs_line_search, num_bins
        self.register_buffer("temperature", torch.tensor(init_temperature, dtype=torch.float64))
        self.grad_log_temperature = math.nan
        self.fit_fallback = False

    def _grid_score(self, logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> float:
        probs = softmax64(logits / temperature)
        if self.objective == "ece":
            return expected_calibration_error(probs, labels, num_bins=self.num_bins)
        return negative_log_likelihood(probs, labels)

    def _lbfgs(self, nll: _TemperatureNLL, *, lr: float, converge: bool) -> float:
        """log T after LBFGS from log(init_temperature): gpleiss's single plain step, or converged."""
        log_temperature = nn.Parameter(torch.tensor(math.log(self.init_temperature), dtype=torch.float64))

        def closure() -> torch.Tensor:
            log_temperature.grad = None
            loss = _LogTemperatureNLL.apply(log_temperature, nll)
            loss.backward()
            return loss

        if not converge:
            torch.optim.LBFGS([log_temperature], lr=lr, max_iter=self.max_iter).step(closure)
            return float(log_temperature.detach())

        result = fit_lbfgs([log_temperature], lambda: _LogTemperatureNLL.apply(log_temperature, nll),
                           what="temperature", max_iter=self.max_iter, max_steps=_lbfgs.MAX_LBFGS_STEPS, lr=lr,
                           step_tolerance=1e-10, warn=False)
        log_t = float(log_temperature.detach())
        if not result.converged:
            raise RuntimeError(
                f"The LBFGS temperature fit did not converge: |dNLL/d log T|={result.grad_max_abs:.3g} at "
                f"T={math.exp(log_t):.6g} after {result.steps} LBFGS steps of up to {self.max_iter} iterations; "
                f"it must be < {GRAD_TOLERANCE:g}."
            )
        return log_t

    def _fit_log_temperature(self, z: torch.Tensor, y: torch.Tensor, nll: _TemperatureNLL) -> float:
        """log T of the configured recipe (grid, converged LBFGS, or gpleiss's plain LBFGS with its fallback)."""
        if self.optimizer == "grid":
            scores = [self._grid_score(z, y, t) for t in TEMPERATURE_GRID]
            return math.log(TEMPERATURE_GRID[min(range(len(scores)), key=scores.__getitem__)])
        if self.optimizer == "brent":
            low, high = (math.log(t) for t in TEMPERATURE_RANGE)
            found = minimize_scalar(lambda log_t: nll(log_t)[0], bounds=(low, high), method="bounded",
                                    options={"xatol": 1e-10})
            return float(found.x)
        if self.lbfgs_line_search:
            return self._lbfgs(nll, lr=self.lr, converge=True)
        log_t = self._lbfgs(nll, lr=self.lr, converge=False)
        start_nll = nll(math.log(self.init_temperature))[0]
        end_nll = nll(log_t)[0] if math.isfinite(log_t) else math.nan
        if not end_nll <= start_nll:  # also catches a NaN NLL or log T
            self.fit_fallback = True
            bad_t = math.exp(log_t) if math.isfinite(log_t) else log_t
            log_t = self._lbfgs(nll, lr=1.0, converge=True)
            warnings.warn(
                f"The gpleiss LBFGS fit (no line search, lr {self.lr}, max_iter {self.max_iter}) ran away to "
                f"T={bad_t:.4g} with NLL {end_nll:.6g}, worse than NLL {start_nll:.6g} at the start "
                f"T={self.init_temperature}; fell back to the converged strong-Wolfe fit, "
                f"T={math.exp(log_t):.6g} with NLL {nll(log_t)[0]:.6g}.",
                RuntimeWarning, stacklevel=3,
            )
        return log_t

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> TemperatureScaling:
        """Fit T on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        self.fit_fallback = False
        low, high = TEMPERATURE_RANGE
        reasons, nll = [], _TemperatureNLL(z, y)
        unbounded = no_finite_optimum(z, y) if self.optimizer in ("lbfgs", "brent") else None
        if unbounded is not None:
            temperature, why = unbounded
            reasons.append(f"{why}; T is held at {temperature:g}")
        else:
            temperature = math.exp(self._fit_log_temperature(z, y, nll))
            if not math.isfinite(temperature) or temperature <= 0:
                raise FloatingPointError(f"The temperature fit ended at T={temperature}; T must be > 0.")
            at_an_end = any(math.isclose(temperature, end) for end in (TEMPERATURE_GRID[0], TEMPERATURE_GRID[-1]))
            if self.optimizer == "grid" and at_an_end:
                reasons.append(f"the {self.objective.upper()}-best grid temperature T = {temperature:g} is at the "
                               f"end of the grid {TEMPERATURE_GRID[0]:g} … {TEMPERATURE_GRID[-1]:g}: the optimum "
                               f"may lie beyond it")
            elif self.optimizer == "lbfgs" and not low <= temperature <= high:
                bound = low if temperature < low else high
                reasons.append(f"the NLL optimum T = {temperature:.4g} lies outside the range [{low:g}, {high:g}]; "
                               f"T is held at {bound:g}")
                temperature = bound
            elif self.optimizer == "brent" and (bound := _bound_beyond(nll, temperature)) is not None:
                reasons.append(f"the NLL optimum lies beyond {bound:g}, outside the range [{low:g}, {high:g}]; "
                               f"T is held at {bound:g}")
                temperature = bound
        self.grad_log_temperature = nll(math.log(temperature))[1]
        self.temperature.fill_(temperature)
        self._finish_fit(reasons)
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """z / T."""
        self.check_fitted()
        return logits / self.temperature.to(logits.dtype)


def fit_first_temperature(z: torch.Tensor, y: torch.Tensor) -> TemperatureScaling:
    """TS fitted as another calibrator's first step (CTS's start, SMS/SVS's preprocessing): a degenerate fit does not
    warn, the caller reports it among its own reasons (from ``degenerate_reason``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        return TemperatureScaling().fit(z, y)


register_posthoc_method(
    "temperature_scaling", TemperatureScalingConfig, TemperatureScaling,
    "temperature scaling fitted on the validation logits",
    label="TS", order=1, added_fields=CALIBRATION_FIELDS,  # added after their first results
)
