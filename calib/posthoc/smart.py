"""SMART: Sample Margin-Aware Recalibration of Temperature (arXiv 2506.23492), docs/methods.md §5.2.

A per-sample temperature T(g) from the logit margin g = z_(1) − z_(2) (top-1 minus top-2 logit):

    ĝ = (g − mean_fit(g)) / max(std_fit(g), 1e-8)           population std of the fit set, stored
    T(g) = softplus(MLP(ĝ)) + 0.1 ≥ 0.1                     MLP: 1 → 16 → 16 → 1 with ReLU (defaults)
    calibrated logits = z / T(g)                            the argmax, hence accuracy, is unchanged

fitted by minimising a soft-binned ECE (:func:`soft_binned_ece`) of the calibrated confidences with
Adam (lr 5e-3), full batch, up to 2000 epochs, early stopping (patience 200, min_delta 1e-4) on the
fit loss, the best state restored. Defaults: the official code (SMART-R ``smart.py``, ``losses.py``).
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from calib import progress
from calib._config import check_values, checked_field, integer, number
from calib.posthoc._base import POSTHOC, PostHocCalibrator, check_logits, check_logits_labels
from calib.posthoc._method import CALIBRATION_FIELDS, PostHocConfig, register_posthoc_method

__all__ = ["SMART", "SMARTConfig", "logit_margin", "soft_binned_ece"]

MARGIN_STD_FLOOR = 1e-8
"""Floor of the stored margin std, so a constant margin does not divide by zero."""


def logit_margin(logits: torch.Tensor) -> torch.Tensor:
    """g_i = z_(1) − z_(2), the top-1 minus the top-2 logit of each row of z (N, C >= 2); shape (N,)."""
    top2 = logits.topk(2, dim=1).values
    return top2[:, 0] - top2[:, 1]


def soft_binned_ece(
    confidences: torch.Tensor,
    correct: torch.Tensor,
    *,
    num_bins: int = 15,
    bandwidth: float = 0.05,
    charbonnier_delta: float | None = 1e-3,
) -> torch.Tensor:
    """SoftECE: ECE with Gaussian soft bin assignments, differentiable in the confidences.

    Bin centres c_b = (b + 0.5)/M, b = 0..M−1 (M = ``num_bins``). Each sample's assignment
    w_ib ∝ exp(−(conf_i − c_b)² / (2σ²)), σ = ``bandwidth``, is normalised over the bins. With bin
    mass m_b = Σ_i w_ib and the w-weighted means conf_b of conf_i and acc_b of correct_i:

        SoftECE = Σ_b (m_b / N) · ρ(conf_b − acc_b),   ρ(x) = sqrt(x² + δ²) (Charbonnier, δ =
        ``charbonnier_delta``, SMART's "smooth_soft_ece") or ρ(x) = |x| (δ = None, "soft_ece").

    Args:
        confidences: conf_i, the max-softmax of each sample, shape (N,).
        correct: 1[ŷ_i = y_i] as 0/1 floats, shape (N,); no gradient flows through it.

    Returns:
        A 0-dim tensor; ≥ δ with the Charbonnier penalty (each bin pays at least δ·m_b/N).
    """
    centres = (torch.arange(num_bins, dtype=confidences.dtype, device=confidences.device) + 0.5) / num_bins
    weights = (-(confidences.unsqueeze(1) - centres).square() / (2 * bandwidth**2)).softmax(dim=1)
    mass = weights.sum(dim=0)
    gap = (weights * (confidences - correct.to(confidences.dtype)).unsqueeze(1)).sum(dim=0)
    gap = gap / mass.clamp_min(torch.finfo(mass.dtype).tiny)
    penalty = gap.abs() if charbonnier_delta is None else (gap.square() + charbonnier_delta**2).sqrt()
    return (mass / confidences.shape[0] * penalty).sum()


@dataclass(frozen=True, kw_only=True)
class SMARTConfig(PostHocConfig):
    """SMART as a method, fitted on the cached validation logits (docs/methods.md §5.2; SMART-R defaults).

    The trial's validation metrics are therefore in-sample; read the test metrics. Fixed, not
    configurable here: M = 15 bins, σ = 0.05, δ = 1e-3, min_delta = 1e-4, T ≥ 0.1 (see :class:`SMART`).

    Attributes:
        hidden_size: width of the temperature network's hidden layers, >= 1 (16).
        num_hidden_layers: its hidden layers, >= 1 (2).
        objective: "smooth_soft_ece" (Charbonnier SoftECE, δ = 1e-3) or "soft_ece" (|·|).
        lr: Adam learning rate, > 0 (5e-3).
        max_epochs: full-batch epochs at most, >= 1 (2000).
        patience: early-stopping patience in epochs on the fit loss (min_delta 1e-4), >= 1 (200).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).

    The network is initialised from the trial seed.
    """

    hidden_size: int = checked_field(16, integer(at_least=1))
    num_hidden_layers: int = checked_field(2, integer(at_least=1))
    objective: Literal["smooth_soft_ece", "soft_ece"] = "smooth_soft_ece"
    lr: float = checked_field(5e-3, number(above=0))
    max_epochs: int = checked_field(2000, integer(at_least=1))
    patience: int = checked_field(200, integer(at_least=1))


@POSTHOC.register("smart")
class SMART(PostHocCalibrator):
    """Per-sample temperature T(g) ≥ 0.1 from the standardised logit margin g.

    Args:
        hidden_size: width of the temperature network's hidden layers (16).
        num_hidden_layers: hidden layers of the temperature network, >= 1 (2: 1 → H → H → 1).
        objective: "smooth_soft_ece" (Charbonnier SoftECE, default) or "soft_ece" (|·|).
        lr: Adam learning rate (5e-3).
        max_epochs: full-batch epochs at most (2000).
        patience: epochs without an improvement > ``min_delta`` of the fit loss before stopping (200).
        min_delta: the improvement that counts (1e-4).
        num_bins: M, the SoftECE's bins (15).
        bandwidth: σ, the SoftECE's bin-membership bandwidth (0.05).
        charbonnier_delta: δ of the Charbonnier |·| (1e-3).
        min_temperature: the floor added after the softplus (0.1).
        seed: seeds the network's initialisation (1, SMART-R).

    After :meth:`fit`: ``margin_mean`` and ``margin_std`` (buffers), ``loss_history`` (fit loss of each
    epoch, before that epoch's step), ``best_epoch`` and ``best_loss`` (the restored state's loss).
    """

    def __init__(
        self,
        *,
        hidden_size: int = SMARTConfig.hidden_size,
        num_hidden_layers: int = SMARTConfig.num_hidden_layers,
        objective: Literal["smooth_soft_ece", "soft_ece"] = SMARTConfig.objective,
        lr: float = SMARTConfig.lr,
        max_epochs: int = SMARTConfig.max_epochs,
        patience: int = SMARTConfig.patience,
        min_delta: float = 1e-4,
        num_bins: int = 15,
        bandwidth: float = 0.05,
        charbonnier_delta: float = 1e-3,
        min_temperature: float = 0.1,
        seed: int = 1,
    ) -> None:
        super().__init__()
        check_values(SMARTConfig, locals())
        integer(at_least=1).check("num_bins", num_bins)
        for name, value in (("bandwidth", bandwidth), ("charbonnier_delta", charbonnier_delta),
                            ("min_temperature", min_temperature)):
            number(above=0).check(name, value)
        number(at_least=0).check("min_delta", min_delta)
        self.objective, self.lr, self.max_epochs, self.patience, self.min_delta = (
            objective, lr, max_epochs, patience, min_delta)
        self.num_bins, self.bandwidth, self.charbonnier_delta = num_bins, bandwidth, charbonnier_delta
        self.min_temperature = min_temperature
        widths = [1] + [hidden_size] * num_hidden_layers
        layers: list[nn.Module] = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for width_in, width_out in itertools.pairwise(widths):
                layers += [nn.Linear(width_in, width_out), nn.ReLU()]
            layers.append(nn.Linear(hidden_size, 1))
        self.network = nn.Sequential(*layers).double()
        self.register_buffer("margin_mean", torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("margin_std", torch.tensor(1.0, dtype=torch.float64))
        self.loss_history: list[float] = []
        self.best_epoch: int | None = None
        self.best_loss = math.inf

    def temperatures(self, logits: torch.Tensor) -> torch.Tensor:
        """T(g_i) = softplus(MLP(ĝ_i)) + 0.1 for each row of z (N, C); shape (N,), float64."""
        z = logits.to(torch.float64)
        margin = (logit_margin(z) - self.margin_mean) / self.margin_std
        return F.softplus(self.network(margin.unsqueeze(1))).squeeze(1) + self.min_temperature

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """z_i / T(g_i)."""
        self.check_fitted()
        check_logits(logits, min_classes=2)
        return logits / self.temperatures(logits).to(logits.dtype).unsqueeze(1)

    def fit_loss(self, logits: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        """The objective: SoftECE of the calibrated confidences max_k softmax(z_i / T(g_i))_k."""
        confidences = (logits / self.temperatures(logits).unsqueeze(1)).softmax(1).max(1).values
        delta = self.charbonnier_delta if self.objective == "smooth_soft_ece" else None
        return soft_binned_ece(confidences, correct, num_bins=self.num_bins, bandwidth=self.bandwidth,
                               charbonnier_delta=delta)

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> SMART:
        """Fit the temperature network on logits z (N, C >= 2) and labels y (N,); returns ``self``."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        margin = logit_margin(z)
        self.margin_mean.fill_(float(margin.mean()))
        self.margin_std.fill_(max(float(margin.std(correction=0)), MARGIN_STD_FLOOR))
        correct = (z.argmax(1) == y).double()
        optimizer = torch.optim.Adam(self.network.parameters(), lr=self.lr)
        self.loss_history, self.best_epoch, self.best_loss = [], None, math.inf
        best_state, epochs_without_improvement = None, 0
        for epoch in range(self.max_epochs):
            progress.record("stage2", epoch)
            loss = self.fit_loss(z, correct)
            value = loss.item()
            if not math.isfinite(value):
                raise FloatingPointError(f"SMART's fit loss became {value} at epoch {epoch}.")
            self.loss_history.append(value)
            if value < self.best_loss - self.min_delta:
                self.best_loss, self.best_epoch = value, epoch
                best_state = copy.deepcopy(self.network.state_dict())
                epochs_without_improvement = 0
            else:
                epochs_without_improvement += 1
                if epochs_without_improvement >= self.patience:
                    break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        self.network.load_state_dict(best_state)
        reasons = []
        if float(margin.std(correction=0)) < MARGIN_STD_FLOOR:
            reasons.append(f"the {len(y)} calibration margins have no spread (one sample, or equal top-two logit "
                           f"gaps), so the temperature network sees a single input and fits one temperature")
        with torch.no_grad():
            temperatures = self.temperatures(z)
        if bool((temperatures < self.min_temperature + 1e-6).all()):
            reasons.append(f"every calibration temperature sits at the floor T = {self.min_temperature:g}: the "
                           f"objective wants sharper predictions than the network can give")
        self._finish_fit(reasons)
        return self


register_posthoc_method(
    "smart", SMARTConfig, SMART,
    "SMART: margin-aware per-sample temperature",
    label="SMART", order=2, added_fields=CALIBRATION_FIELDS,  # added after their first results
)
