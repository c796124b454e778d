"""The small base every post-hoc calibrator shares: ``fit(logits, labels)`` and ``forward(logits)``."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
from torch import nn

from calib._registry import Registry

__all__ = ["POSTHOC", "PostHocCalibrator", "PostHocPredictor", "check_logits", "check_logits_labels"]


def check_logits(logits: torch.Tensor, *, min_classes: int = 1) -> torch.Tensor:
    """``logits`` as a float64 tensor after checking it is finite and of shape (N, C), C >= min_classes."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"`logits` must be a torch.Tensor, got {type(logits).__name__}.")
    if logits.ndim != 2 or logits.shape[1] < min_classes:
        raise ValueError(f"`logits` must have shape (N, C) with C >= {min_classes}, got shape {tuple(logits.shape)}.")
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

    Subclasses implement :meth:`fit` (which must end with ``self.is_fitted = True``) and
    :meth:`forward`. Fitting runs on the CPU in float64: the problems are small and the results
    reproducible across machines.
    """

    def __init__(self) -> None:
        super().__init__()
        self.is_fitted = False

    @abc.abstractmethod
    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> PostHocCalibrator:
        """Fit on logits z (N, C) and integer labels y (N,); returns ``self``."""

    @abc.abstractmethod
    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """Calibrated logits (N, C); the softmax of these is the calibrated p."""

    def check_fitted(self) -> None:
        if not self.is_fitted:
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(logits, labels) first.")

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


POSTHOC: Registry[type[PostHocCalibrator]] = Registry("post-hoc calibrator")
"""Post-hoc calibrator classes by name: ``POSTHOC.create("temperature_scaling", objective="nll")``."""
