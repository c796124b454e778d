"""V-TST: TST with a variational last hidden layer (Jordahn & Olmos, ICML 2024), docs/methods.md §2.3.

An amortised Gaussian posterior q(z | h) = N(μ(h), diag σ²(h)) over the last hidden layer z ∈ R^Z:

    μ(h)      = d → 3Z (ReLU) → Z
    log σ²(h) = log-sigmoid(d → 3Z (ReLU) → Z), so σ² ∈ (0, 1)      (TST-R ``bound_qzx_var=True``)
    z = μ + σ·ε, ε ~ N(0, I);   logits = Linear(Z → C)(z)

Loss per minibatch: CE(logits(z), y) + mean_i KL(q(z | h_i) ‖ N(0, I)) / Z, one Monte-Carlo sample
per step. At test time z is still sampled: ``num_samples`` M = 1 draws one sample (TST-R's default),
M > 1 averages the softmax over M samples. Training is Stage II's one loop
(:func:`calib.methods.population.train_population`) through TST's :func:`~calib.methods.tst.train_stage_two_heads`:
configs on one Stage I that share the loop (:func:`population_key`) train side by side, each exactly as alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from calib._config import check
from calib.methods._base import MethodOutcome
from calib.methods.population import TrainingDiverged, alone
from calib.methods.tst import (
    LOOP_FIELDS,
    FittedStageTwoHead,
    StageTwoHead,
    TSTConfig,
    latent_encoder,
    register_head_method,
    run_on_artifact,
    train_stage_two_heads,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from calib.artifacts import Stage1Artifact

__all__ = ["VTSTConfig", "VTSTHead", "fit_vtst", "fit_vtst_population", "kl_to_standard_normal", "population_key",
           "run_vtst"]


@dataclass(frozen=True, kw_only=True)
class VTSTConfig(TSTConfig):
    """V-TST's Stage II: :class:`~calib.methods.tst.TSTConfig`'s fields plus the test-time samples.

    Attributes:
        num_samples: M, Monte-Carlo samples of z at evaluation, >= 1. M = 1 still samples (TST-R);
            M > 1 averages the M softmaxes (TST-REPRO also reports M = 10). The evaluation noise is
            seeded with the trial seed.
    """

    num_samples: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_samples >= 1, "num_samples", self.num_samples, "be an integer >= 1 (it is M)")


def kl_to_standard_normal(mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """KL(N(μ, diag σ²) ‖ N(0, I)) / Z per sample, shape (N,), for μ and log σ² of shape (N, Z).

    KL = ½ · Σ_j (σ_j² + μ_j² − 1 − log σ_j²); V-TST divides it by Z (the mean over dimensions).
    """
    return 0.5 * (log_var.exp() + mean.square() - 1.0 - log_var).mean(dim=1)


class VTSTHead(StageTwoHead):
    """V-TST's classification layers: μ and log σ² encoders (d → 3Z → Z each) and the decoder Z → C."""

    def __init__(self, num_features: int, latent_dim: int, num_classes: int, num_samples: int = 1) -> None:
        super().__init__()
        if num_classes < 1 or num_samples < 1:
            raise ValueError(f"`num_classes` and `num_samples` must be >= 1, got {num_classes=}, {num_samples=}.")
        self.mean_encoder = latent_encoder(num_features, latent_dim)
        self.log_var_encoder = latent_encoder(num_features, latent_dim)
        self.decoder = nn.Linear(latent_dim, num_classes)
        self.num_samples = num_samples

    def posterior(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """μ(h) and log σ²(h) = log-sigmoid(·) ≤ 0 of q(z | h), each (N, Z)."""
        return self.mean_encoder(h), F.logsigmoid(self.log_var_encoder(h))

    def sample_logits(
        self, h: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits of one sample z = μ + σ·ε (ε drawn on the CPU from ``generator``), with μ and log σ²."""
        mean, log_var = self.posterior(h)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype).to(mean.device)
        return self.decoder(mean + (0.5 * log_var).exp() * noise), mean, log_var

    def training_loss(
        self, h: torch.Tensor, labels: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """CE of one sample's logits + the batch mean of KL / Z."""
        logits, mean, log_var = self.sample_logits(h, generator)
        return F.cross_entropy(logits, labels) + kl_to_standard_normal(mean, log_var).mean(), logits

    def sample_probs(self, h: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """softmax of one sample's logits, float64 (N, C)."""
        return self.sample_logits(h, generator)[0].double().softmax(1)

    def predictive_probs(self, h: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(1/M) Σ_m softmax(logits(z_m)), M = ``num_samples`` samples drawn one after another."""
        total = self.sample_probs(h, generator)
        for _ in range(self.num_samples - 1):
            total = total + self.sample_probs(h, generator)
        return total / self.num_samples


def population_key(params: VTSTConfig) -> tuple:
    """Configs with equal keys can train in one population (:func:`fit_vtst_population`): the loop's fields
    (TST's ``LOOP_FIELDS``: epochs, optimizer, batch size); lr, momentum, weight decay, Z, M and the checkpoint
    rule are each member's own."""
    return tuple(getattr(params, name) for name in LOOP_FIELDS)


def _initial_vtst_head(params: VTSTConfig, seed: int, num_features: int, num_classes: int) -> VTSTHead:
    """A new :class:`VTSTHead` initialised from ``seed`` (the global RNG left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return VTSTHead(num_features, params.latent_dim, num_classes, params.num_samples)


def fit_vtst_population(members: Sequence[tuple[VTSTConfig, int]], train_features: torch.Tensor,
                        train_labels: torch.Tensor, val_features: torch.Tensor, val_labels: torch.Tensor, *,
                        num_classes: int, device: torch.device) -> list[FittedStageTwoHead | TrainingDiverged]:
    """One new :class:`VTSTHead` per ``(params, seed)`` member (initialised from ``seed``), trained side by
    side in one loop (:func:`~calib.methods.tst.train_stage_two_heads`): each member's minibatch order,
    sampling noise, validation predictive and checkpoint are its own, so each result is its lone run.
    Members share :func:`population_key`. With ``checkpoint="best_val_loss"`` the validation NLL is that of
    the M-sample predictive, with the same evaluation noise every epoch. A member whose loss becomes
    non-finite gets a :class:`~calib.methods.population.TrainingDiverged`; the others go on.
    """
    heads = [(_initial_vtst_head(params, seed, train_features.shape[1], num_classes), params, seed)
             for params, seed in members]
    return train_stage_two_heads(heads, train_features, train_labels, val_features, val_labels, device=device)


def fit_vtst(params: VTSTConfig, train_features: torch.Tensor, train_labels: torch.Tensor, val_features: torch.Tensor,
             val_labels: torch.Tensor, *, num_classes: int, seed: int, device: torch.device) -> FittedStageTwoHead:
    """A new :class:`VTSTHead` (initialised from ``seed``) trained as a population of one
    (:func:`fit_vtst_population`; a non-finite loss raises its ``TrainingDiverged``)."""
    return alone(fit_vtst_population([(params, seed)], train_features, train_labels, val_features, val_labels,
                                     num_classes=num_classes, device=device))


def run_vtst(params: VTSTConfig, artifact: Stage1Artifact, *, seed: int, device: torch.device) -> MethodOutcome:
    """V-TST's Stage II on the artifact's cached training features; evaluated on val and test."""
    return run_on_artifact(fit_vtst, params, artifact, seed=seed, device=device)


register_head_method("vtst", VTSTConfig, run_vtst, fit_vtst_population, population_key,
                     "V-TST: TST with a Gaussian last hidden layer", label="V-TST", order=2)
