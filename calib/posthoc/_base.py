"""The small base every post-hoc calibrator shares: ``fit(logits, labels)`` and ``forward(logits)``."""

from __future__ import annotations

import abc
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from calib.metrics.nll import NLL_FLOOR
from calib.registries import POSTHOC

__all__ = [
    "POSTHOC",
    "PROBABILITY_FLOOR",
    "DegenerateFitWarning",
    "PostHocCalibrator",
    "PostHocPredictor",
    "absent_classes",
    "check_logits",
    "check_logits_labels",
    "describe_classes",
    "log_probabilities",
]

PROBABILITY_FLOOR = NLL_FLOOR
"""The one floor of every calibrator that outputs probabilities: an exact 0 becomes the smallest positive
float64 (~4.94e-324), the floor of calib's NLL, so a sample whose true class gets p̂ = 0 costs the NLL's
maximum, −log(4.94e-324) ~= 744.44 nats, whichever method produced it."""


class DegenerateFitWarning(RuntimeWarning):
    """A post-hoc fit whose data do not determine it: no finite optimum, a parameter at a bound, a class
    without calibration samples. The calibrator still returns its documented fallback (docs/methods.md §5)."""


def log_probabilities(probs: np.ndarray | torch.Tensor) -> torch.Tensor:
    """log p of probabilities (N, C) as float64, with p floored at :data:`PROBABILITY_FLOOR` (finite)."""
    probs = torch.as_tensor(probs, dtype=torch.float64)
    return probs.clamp_min(PROBABILITY_FLOOR).log()


def absent_classes(labels: torch.Tensor, num_classes: int) -> list[int]:
    """The classes in [0, num_classes) with no sample in ``labels``."""
    counts = torch.bincount(labels, minlength=num_classes)
    return [int(k) for k in torch.nonzero(counts == 0).flatten()]


def describe_classes(classes: Sequence[int], num_classes: int) -> str:
    """``"class 4"``, ``"classes 1, 3 (2 of 10)"`` or ``"classes 0, 1, 2, … (57 of 100)"``."""
    shown = ", ".join(map(str, classes[:8])) + (", …" if len(classes) > 8 else "")
    if len(classes) == 1:
        return f"class {shown}"
    return f"classes {shown} ({len(classes)} of {num_classes})"


def check_logits(logits: torch.Tensor, *, min_classes: int = 1, fitted_classes: int | None = None) -> torch.Tensor:
    """``logits`` as a float64 tensor after checking it is finite and of shape (N, C), C >= min_classes, and
    C = ``fitted_classes`` when a fitted calibrator passes the number of classes it was fitted on."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"`logits` must be a torch.Tensor, got {type(logits).__name__}.")
    if logits.ndim != 2 or logits.shape[1] < min_classes:
        raise ValueError(f"`logits` must have shape (N, C) with C >= {min_classes}, got shape {tuple(logits.shape)}.")
    if fitted_classes is not None and logits.shape[1] != fitted_classes:
        raise ValueError(f"`logits` must have the {fitted_classes} classes of the fit, got {logits.shape[1]}.")
    if not torch.isfinite(logits).all():
        raise ValueError("`logits` must be finite (no NaN or inf).")
    return logits.detach().double()


def check_logits_labels(
    logits: torch.Tensor, labels: torch.Tensor, *, min_classes: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked fit inputs: float64 logits (N, C) with N >= 1 and int64 labels (N,) in [0, C), on the CPU."""
    z = check_logits(logits, min_classes=min_classes).cpu()
    if not isinstance(labels, torch.Tensor) or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise TypeError(f"`labels` must be an integer torch.Tensor, got {getattr(labels, 'dtype', type(labels))}.")
    if labels.shape != (z.shape[0],) or z.shape[0] < 1:
        raise ValueError(f"`labels` must have shape (N,) = ({z.shape[0]},) with N >= 1, got {tuple(labels.shape)}.")
    y = labels.detach().long().cpu()
    if int(y.min()) < 0 or int(y.max()) >= z.shape[1]:
        raise ValueError(f"`labels` must be in [0, {z.shape[1]}), got values in [{int(y.min())}, {int(y.max())}].")
    return z, y


class PostHocCalibrator(nn.Module, abc.ABC):
    """A map from logits to calibrated logits, fitted on held-out (validation) logits and labels.

    Subclasses implement :meth:`fit` (which must end with ``self._finish_fit(reasons)``) and
    :meth:`forward`. Fitting runs on the CPU in float64: the problems are small and the results
    reproducible across machines.

    After :meth:`fit`, ``degenerate_reason`` is None for a fit the data determine, else why it is
    degenerate (the fit then returned its documented fallback and warned, :class:`DegenerateFitWarning`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.is_fitted = False
        self.degenerate_reason: str | None = None

    @property
    def degenerate(self) -> bool:
        """Whether the last :meth:`fit` was degenerate (``degenerate_reason`` says why)."""
        return self.degenerate_reason is not None

    def _finish_fit(self, reasons: Sequence[str] = ()) -> None:
        """Mark the fit done; non-empty ``reasons`` make it degenerate: ``degenerate_reason`` joins them and
        a :class:`DegenerateFitWarning` names the calibrator and the reasons."""
        self.degenerate_reason = "; ".join(reasons) or None
        self.is_fitted = True
        if self.degenerate_reason:
            warnings.warn(f"{type(self).__name__}: degenerate fit: {self.degenerate_reason}", DegenerateFitWarning,
                          stacklevel=3)

    def fit_details(self) -> dict[str, Any]:
        """The store's fit columns of the last fit: ``fit_degenerate``, ``fit_degenerate_reason`` (subclasses add
        the values they chose, e.g. ODIR's cross-validated λ and μ)."""
        self.check_fitted()
        return {"fit_degenerate": self.degenerate, "fit_degenerate_reason": self.degenerate_reason}

    @abc.abstractmethod
    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> PostHocCalibrator:
        """Fit on logits z (N, C) and integer labels y (N,); returns ``self``."""

    @abc.abstractmethod
    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """Calibrated logits (N, C); the softmax of these is the calibrated p."""

    def check_fitted(self) -> None:
        if not self.is_fitted:
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(logits, labels) first.")

    def fitted_logits(self, logits: torch.Tensor, num_classes: int) -> torch.Tensor:
        """New logits for the fitted calibrator, float64: :meth:`check_fitted`, then :func:`check_logits` with the
        ``num_classes`` classes of the fit."""
        self.check_fitted()
        return check_logits(logits, fitted_classes=num_classes)

    @torch.no_grad()
    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Calibrated probabilities, float64 on the CPU."""
        return self(check_logits(logits).cpu()).softmax(1)


@dataclass
class PostHocPredictor:
    """A post-hoc method's :data:`~calib.methods.Predictor`: ``predict(features, logits)`` uses the logits.

    The fitted calibrator stays readable: ``outcome.predict.calibrator``.
    """

    calibrator: PostHocCalibrator

    def __call__(self, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return self.calibrator.probs(logits)
