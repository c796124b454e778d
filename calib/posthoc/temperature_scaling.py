"""Temperature scaling (Guo, Pleiss, Sun, Weinberger, ICML 2017), METHODS.md §5.1.

p = softmax(z / T) with one scalar T > 0 fitted on validation logits; the argmax, hence accuracy,
is unchanged. Two fitting recipes:

- ``objective="nll", optimizer="lbfgs"`` (gpleiss style, TST-R): minimise the NLL over log T with
  LBFGS (lr 0.01, max_iter 50) from T = 1.5; optimising log T keeps T > 0.
- ``optimizer="grid"`` (FOCAL-R / FeDLaS "CE+TS"): T ∈ {0.1, 0.2, …, 10.0}, the first T with the
  lowest ECE (15 equal-width bins, ``objective="ece"``) or NLL (``objective="nll"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn
from torch.nn import functional as F

from calib._config import ConfigError, check
from calib.methods._base import MethodOutcome, MethodSpec
from calib.methods._registry import METHODS
from calib.metrics import expected_calibration_error, negative_log_likelihood, softmax64
from calib.posthoc._base import POSTHOC, PostHocCalibrator, PostHocPredictor, check_logits_labels

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact

__all__ = ["TEMPERATURE_GRID", "TemperatureScaling", "TemperatureScalingConfig", "run_temperature_scaling"]

TEMPERATURE_GRID = tuple(k / 10 for k in range(1, 101))
"""FOCAL-R's grid of temperatures: 0.1, 0.2, …, 10.0 (100 values)."""


@POSTHOC.register("temperature_scaling")
class TemperatureScaling(PostHocCalibrator):
    """Divide the logits by one fitted temperature T > 0.

    Args:
        objective: "nll" (negative log-likelihood) or "ece" (ECE with ``num_bins`` equal-width bins;
            needs ``optimizer="grid"``).
        optimizer: "lbfgs" (gradient fit of log T) or "grid" (search over :data:`TEMPERATURE_GRID`).
        init_temperature: T at the start of the LBFGS fit, > 0 (1.5, gpleiss).
        lr, max_iter: LBFGS step size and iterations (0.01, 50, gpleiss).
        line_search: use LBFGS's strong-Wolfe line search (default). gpleiss has none: with lr 0.01
            each iteration then moves 1% of the quasi-Newton step, and 50 iterations stop short of the
            optimum (T ≈ 1.7 where the NLL optimum is 2.5); False reproduces that.
        num_bins: bins of the ECE objective (15).

    After :meth:`fit`, ``temperature`` (a 0-dim float64 buffer) holds T.
    """

    def __init__(
        self,
        objective: Literal["nll", "ece"] = "nll",
        optimizer: Literal["lbfgs", "grid"] = "lbfgs",
        *,
        init_temperature: float = 1.5,
        lr: float = 0.01,
        max_iter: int = 50,
        line_search: bool = True,
        num_bins: int = 15,
    ) -> None:
        super().__init__()
        if objective not in ("nll", "ece"):
            raise ValueError(f"`objective` must be one of 'nll', 'ece', got objective={objective!r}.")
        if optimizer not in ("lbfgs", "grid"):
            raise ValueError(f"`optimizer` must be one of 'lbfgs', 'grid', got optimizer={optimizer!r}.")
        if objective == "ece" and optimizer != "grid":
            raise ValueError(f"`objective`='ece' needs `optimizer`='grid' (ECE has no useful gradient), "
                             f"got optimizer={optimizer!r}.")
        if not init_temperature > 0:
            raise ValueError(f"`init_temperature` must be > 0 (it is T), got init_temperature={init_temperature}.")
        if not lr > 0 or max_iter < 1 or num_bins < 1:
            raise ValueError(f"`lr` must be > 0 and `max_iter`, `num_bins` >= 1, got {lr=}, {max_iter=}, {num_bins=}.")
        self.objective, self.optimizer = objective, optimizer
        self.init_temperature, self.lr, self.max_iter = init_temperature, lr, max_iter
        self.line_search, self.num_bins = line_search, num_bins
        self.register_buffer("temperature", torch.tensor(init_temperature, dtype=torch.float64))

    def _grid_score(self, logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> float:
        probs = softmax64(logits / temperature)
        if self.objective == "ece":
            return expected_calibration_error(probs, labels, num_bins=self.num_bins)
        return negative_log_likelihood(probs, labels)

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> TemperatureScaling:
        """Fit T on logits z (N, C) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels)
        if self.optimizer == "grid":
            scores = [self._grid_score(z, y, t) for t in TEMPERATURE_GRID]
            temperature = TEMPERATURE_GRID[min(range(len(scores)), key=scores.__getitem__)]
        else:
            log_temperature = nn.Parameter(torch.tensor(math.log(self.init_temperature), dtype=torch.float64))
            lbfgs = torch.optim.LBFGS([log_temperature], lr=self.lr, max_iter=self.max_iter,
                                      line_search_fn="strong_wolfe" if self.line_search else None)

            def closure() -> torch.Tensor:
                lbfgs.zero_grad()
                loss = F.cross_entropy(z / log_temperature.exp(), y)
                loss.backward()
                return loss

            lbfgs.step(closure)
            temperature = float(log_temperature.detach().exp())
            if not math.isfinite(temperature) or temperature <= 0:
                raise FloatingPointError(f"The LBFGS temperature fit diverged to T={temperature}.")
        self.temperature.fill_(temperature)
        self.is_fitted = True
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """z / T."""
        self.check_fitted()
        return logits / self.temperature.to(logits.dtype)


@dataclass(frozen=True, kw_only=True)
class TemperatureScalingConfig:
    """Temperature scaling as a method: T fitted on the cached validation logits (METHODS.md §5.1).

    The trial's validation metrics are therefore in-sample; read the test metrics. The fitted T is
    ``outcome.predict.calibrator.temperature.item()`` (the history stays empty).

    Attributes:
        objective: "nll" (default; gpleiss / TST-R) or "ece" (FOCAL-R / FeDLaS "CE+TS"; needs "grid").
        optimizer: "lbfgs" (default) or "grid" (T ∈ {0.1, …, 10.0}).
        lbfgs_line_search: strong-Wolfe line search in the LBFGS fit (default true, so the fit
            converges); false is gpleiss's plain LBFGS (lr 0.01, 50 iterations), which stops short.
            Must stay true with "grid".
    """

    objective: Literal["nll", "ece"] = "nll"
    optimizer: Literal["lbfgs", "grid"] = "lbfgs"
    lbfgs_line_search: bool = True

    def __post_init__(self) -> None:
        check(self.objective in ("nll", "ece"), "objective", self.objective, "be one of 'nll', 'ece'")
        check(self.optimizer in ("lbfgs", "grid"), "optimizer", self.optimizer, "be one of 'lbfgs', 'grid'")
        if self.objective == "ece" and self.optimizer != "grid":
            raise ConfigError(f"`objective`='ece' needs `optimizer`='grid' (ECE has no useful gradient), "
                              f"got optimizer={self.optimizer!r}.")
        if self.optimizer == "grid" and not self.lbfgs_line_search:
            raise ConfigError("`lbfgs_line_search`=false applies to `optimizer`='lbfgs' only, "
                              "got optimizer='grid'.")


def run_temperature_scaling(
    params: TemperatureScalingConfig, artifact: Stage1Artifact, *, seed: int, device: torch.device
) -> MethodOutcome:
    """Fit T on the artifact's cached validation logits; apply it to the validation and test logits.

    The validation metrics are in-sample (T was fitted on that split); the test metrics are not.
    The history is empty; the fitted T is ``outcome.predict.calibrator.temperature.item()``.
    Fitting runs on the CPU whatever ``device`` is (a one-parameter problem).
    """
    val = artifact.splits["val"]
    calibrator = TemperatureScaling(params.objective, params.optimizer, line_search=params.lbfgs_line_search)
    return MethodOutcome.from_predictor(PostHocPredictor(calibrator.fit(val.logits, val.labels)), artifact)


METHODS.register("temperature_scaling")(MethodSpec(
    TemperatureScalingConfig, run_temperature_scaling, "temperature scaling fitted on the validation logits"
))
