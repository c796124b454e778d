"""MaC-Cal: mask-based classifier calibration (Ni, Zhao, Yang, Guo; arXiv 2508.09116), docs/methods.md §1.

Stage II freezes the Stage-I feature extractor and retrains a randomly initialised bottleneck head
on the cached training features. Every epoch t draws Bernoulli weight masks with retention
probability q_t (Eq. 8), trains with masked weights (Eq. 9-10), restricts the whole SGD update to
the kept weights (Eq. 11), and adapts q from the training accuracy and confidence (Eq. 12) within a
clip threshold θ_t that decays over the epochs (Eq. 13). Every component is a config switch, so each
row of the paper's Table 5 ablation is a config (docs/methods.md §1.4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.nn import functional as F

from calib import progress
from calib._config import ConfigError, check
from calib.methods._base import MethodOutcome, MethodSpec
from calib.methods._registry import METHODS

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact
from calib.methods.heads import MaskableHead

__all__ = [
    "FittedMacCal",
    "MacCalConfig",
    "clip_threshold",
    "fit_mac_cal",
    "restricted_sgd_step",
    "retention_update",
    "run_mac_cal",
    "sample_weight_masks",
]


@dataclass(frozen=True, kw_only=True)
class MacCalConfig:
    """MaC-Cal's Stage II. Defaults: docs/methods.md §1.3 (the papers' protocol and the reconstructed values).

    Attributes:
        epochs: Stage-II epochs T (40).
        lr, momentum, weight_decay, batch_size: SGD of the head (0.1, 0.9, 5e-4, 128; constant lr).
        head: "bottleneck" (d → r → C, the paper's "classifier restructure") or "linear" (d → C).
        bottleneck_width: r, the hidden width of the bottleneck (256).
        head_init: "random" (the paper) or "stage1" (linear head only: start from the Stage-I head,
            Table 5 "+Masked Retraining").
        masked_forward: train with Bernoulli-masked weights M ⊙ W (Eq. 8-9).
        gradient_restriction: mask the whole SGD update, weight decay and momentum included (Eq. 11).
        adaptive_retention: "none" keeps q_t = q_0; "static" adapts q with θ_t = θ_0; "decay" adapts
            with θ_t = θ_0·exp(−β·t/T) (Eq. 12-13).
        retention_init: q_0, the initial retention probability, in (0, 1] (0.9).
        retention_min: q_min, the floor of q_t (0.1).
        accuracy_weight: γ, the down-weighting of the training accuracy in Eq. 12, > 0 (0.95).
        clip_init: θ_0, the initial clip threshold of the q update, >= 0 (0.05).
        clip_decay: β, the decay rate of the clip threshold, >= 0 (3.0).
        mask_resample: draw masks once per "epoch" (the paper) or every "step" (pitfall P4).
        stats_pass: Acc_t and Conf_t accumulated "online" over the epoch's masked minibatches, or
            from a "clean" pass over the training features after the epoch.
        train_mask_scaling: "none" (M ⊙ W) or "inverted" ((M ⊙ W)/q_t, as inverted dropout).
        inference_weights: "expected" (E[training weight]: q_T·W, or W under inverted scaling),
            "full" (W), or "last_mask" (the last epoch's masked weights); docs/methods.md §1.6.
    """

    epochs: int = 40
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    batch_size: int = 128
    head: Literal["bottleneck", "linear"] = "bottleneck"
    bottleneck_width: int = 256
    head_init: Literal["random", "stage1"] = "random"
    masked_forward: bool = True
    gradient_restriction: bool = True
    adaptive_retention: Literal["none", "static", "decay"] = "decay"
    retention_init: float = 0.9
    retention_min: float = 0.1
    accuracy_weight: float = 0.95
    clip_init: float = 0.05
    clip_decay: float = 3.0
    mask_resample: Literal["epoch", "step"] = "epoch"
    stats_pass: Literal["online", "clean"] = "online"
    train_mask_scaling: Literal["none", "inverted"] = "none"
    inference_weights: Literal["expected", "full", "last_mask"] = "expected"

    def __post_init__(self) -> None:
        check(self.epochs >= 1, "epochs", self.epochs, "be an integer >= 1",
              "It is T, the number of Stage-II epochs, which a study's --stage2-epochs sets.")
        check(self.lr > 0, "lr", self.lr, "be > 0")
        check(0 <= self.momentum < 1, "momentum", self.momentum, "be in [0, 1)")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "be >= 0")
        check(self.batch_size >= 1, "batch_size", self.batch_size, "be an integer >= 1")
        check(self.bottleneck_width >= 1, "bottleneck_width", self.bottleneck_width, "be an integer >= 1")
        check(0 < self.retention_init <= 1, "retention_init", self.retention_init, "be in (0, 1] (it is q_0)")
        if self.adaptive_retention == "none":  # q_t stays q_0: the floor q_min is never used
            check(0 < self.retention_min <= 1, "retention_min", self.retention_min, "be in (0, 1] (it is q_min)")
        else:
            check(0 < self.retention_min <= self.retention_init, "retention_min", self.retention_min,
                  f"be in (0, retention_init] = (0, {self.retention_init}] (it is q_min, the floor of q_t, "
                  f"which starts at q_0 = retention_init)")
        check(self.accuracy_weight > 0, "accuracy_weight", self.accuracy_weight, "be > 0 (it is γ)")
        check(self.clip_init >= 0, "clip_init", self.clip_init, "be >= 0 (it is θ_0)")
        check(self.clip_decay >= 0, "clip_decay", self.clip_decay, "be >= 0 (it is β)")
        if self.head_init == "stage1" and self.head != "linear":
            raise ConfigError("`head_init`='stage1' needs `head`='linear': only a linear head has Stage-I weights.")
        if not self.masked_forward and (self.gradient_restriction or self.adaptive_retention != "none"):
            raise ConfigError(
                "`masked_forward`=false leaves nothing to restrict or adapt: set `gradient_restriction`=false "
                f"and `adaptive_retention`='none' (got {self.gradient_restriction}, {self.adaptive_retention!r})."
            )


def clip_threshold(epoch: int, params: MacCalConfig) -> float:
    """Eq. 13: θ_t = θ_0 · exp(−β · t / T) ("decay"), or θ_0 ("static")."""
    if params.adaptive_retention == "decay":
        return params.clip_init * math.exp(-params.clip_decay * epoch / params.epochs)
    return params.clip_init


def retention_update(q: float, accuracy: float, confidence: float, threshold: float, params: MacCalConfig) -> float:
    """Eq. 12: q_{t+1} = clamp(q_t + clip(γ·Acc_t − Conf_t, −θ_t, θ_t), q_min, 1).

    An overconfident head (Conf_t > γ·Acc_t) lowers q, i.e. masks more weights, which lowers confidence.
    """
    delta = params.accuracy_weight * accuracy - confidence
    step = max(-threshold, min(threshold, delta))
    return min(1.0, max(params.retention_min, q + step))


def sample_weight_masks(
    head: MaskableHead, retention_prob: float, generator: torch.Generator
) -> list[torch.Tensor]:
    """Eq. 8: i.i.d. Bernoulli(q) masks, one per weight matrix (1 keeps a weight, 0 drops it)."""
    return [
        torch.bernoulli(torch.full(w.shape, retention_prob), generator=generator).to(w.device)
        for w in head.weights
    ]


def restricted_sgd_step(
    optimizer: torch.optim.Optimizer, weights: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
) -> None:
    """Eq. 11, W ← W − η·(M ⊙ update): an SGD step in which dropped weights and their momentum stay put.

    Autograd already gives dropped weights a zero gradient, but weight decay and momentum would still
    move them (pitfall P2); this restores them, and their momentum buffers, after the step.
    """
    saved = []
    for w in weights:
        buffer = optimizer.state.get(w, {}).get("momentum_buffer")
        saved.append((w.detach().clone(), None if buffer is None else buffer.clone()))
    optimizer.step()
    with torch.no_grad():
        for w, mask, (old_w, old_buffer) in zip(weights, masks, saved, strict=True):
            keep = mask.bool()
            w.copy_(torch.where(keep, w, old_w))
            buffer = optimizer.state.get(w, {}).get("momentum_buffer")
            if buffer is not None:
                buffer.copy_(torch.where(keep, buffer, torch.zeros_like(buffer) if old_buffer is None else old_buffer))


@dataclass
class FittedMacCal:
    """A trained Stage-II head and how it is evaluated (``inference_weights``)."""

    head: MaskableHead
    params: MacCalConfig
    last_masks: list[torch.Tensor] | None
    last_retention: float
    history: list[dict[str, Any]] = field(default_factory=list)

    def _train_scale(self, retention_prob: float) -> float:
        return 1.0 / retention_prob if self.params.train_mask_scaling == "inverted" else 1.0

    @torch.inference_mode()
    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Deterministic logits for features (N, d) with the configured inference weights."""
        self.head.eval()
        features = features.to(self.head.weights[0].device)
        if not self.params.masked_forward or self.params.inference_weights == "full":
            return self.head(features)
        q = self.last_retention
        if self.params.inference_weights == "expected":
            return self.head(features, weight_scale=q * self._train_scale(q))
        return self.head(features, masks=self.last_masks, weight_scale=self._train_scale(q))


def fit_mac_cal(
    params: MacCalConfig,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_features: int,
    num_classes: int,
    seed: int,
    device: torch.device,
    head_state: dict[str, torch.Tensor] | None = None,
    feature_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> FittedMacCal:
    """Train MaC-Cal's head on ``inputs`` (cached features, or images when ``feature_fn`` is given).

    ``feature_fn`` maps a minibatch of inputs to features, e.g. a frozen backbone's ``features``;
    ``run_trial`` never passes one (Stage II runs on cached features), the benchmark does.
    """
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    widths = [num_features, params.bottleneck_width, num_classes] if params.head == "bottleneck" \
        else [num_features, num_classes]
    head = MaskableHead(widths)
    if params.head_init == "stage1":
        if head_state is None:
            raise ValueError("head_init='stage1' needs the Stage-I head weights (head_state).")
        head.layers[0].load_state_dict(head_state)
    head = head.to(device)
    optimizer = torch.optim.SGD(head.parameters(), lr=params.lr, momentum=params.momentum,
                                weight_decay=params.weight_decay)
    features_of = feature_fn if feature_fn is not None else (lambda batch: batch)
    n = inputs.shape[0]
    q = params.retention_init
    fitted = FittedMacCal(head, params, None, q)
    for epoch in range(params.epochs):
        progress.record("stage2", epoch)
        head.train()
        masks = sample_weight_masks(head, q, generator) if params.masked_forward else None
        scale = fitted._train_scale(q) if params.masked_forward else 1.0
        total_loss, correct, confidence = 0.0, 0, 0.0
        for idx in torch.randperm(n, generator=generator).split(params.batch_size):
            if params.masked_forward and params.mask_resample == "step":
                masks = sample_weight_masks(head, q, generator)
            with torch.no_grad():
                h = features_of(inputs[idx].to(device, non_blocking=True))
            y = labels[idx].to(device, non_blocking=True)
            logits = head(h, masks=masks, weight_scale=scale)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if params.gradient_restriction and masks is not None:
                restricted_sgd_step(optimizer, head.weights, masks)
            else:
                optimizer.step()
            with torch.no_grad():
                probs = logits.detach().softmax(1)
                total_loss += float(loss) * y.shape[0]
                correct += int((probs.argmax(1) == y).sum())
                confidence += float(probs.max(1).values.sum())
        accuracy, mean_conf = correct / n, confidence / n
        if params.stats_pass == "clean":
            accuracy, mean_conf = _clean_stats(head, inputs, labels, features_of, masks, scale, params, device)
        threshold = clip_threshold(epoch, params)
        fitted.history.append({
            "stage": "stage2", "epoch": epoch, "lr": params.lr, "train_loss": total_loss / n,
            "train_accuracy": accuracy, "train_confidence": mean_conf,
            "retention_prob": q if params.masked_forward else None,
            "clip_threshold": threshold if params.adaptive_retention != "none" else None,
        })
        if not math.isfinite(total_loss):
            raise FloatingPointError(f"MaC-Cal training loss became {total_loss} at Stage-II epoch {epoch}.")
        fitted.last_masks, fitted.last_retention = masks, q
        if params.masked_forward and params.adaptive_retention != "none":
            q = retention_update(q, accuracy, mean_conf, threshold, params)
    return fitted


@torch.no_grad()
def _clean_stats(head, inputs, labels, features_of, masks, scale, params, device) -> tuple[float, float]:
    head.eval()
    correct, confidence = 0, 0.0
    for idx in torch.arange(inputs.shape[0]).split(max(params.batch_size, 1024)):
        probs = head(features_of(inputs[idx].to(device)), masks=masks, weight_scale=scale).softmax(1)
        correct += int((probs.argmax(1) == labels[idx].to(device)).sum())
        confidence += float(probs.max(1).values.sum())
    return correct / inputs.shape[0], confidence / inputs.shape[0]


def run_mac_cal(
    params: MacCalConfig, artifact: Stage1Artifact, *, seed: int, device: torch.device
) -> MethodOutcome:
    """Stage II of MaC-Cal on the artifact's cached training features; evaluated on val and test."""
    train = artifact.splits["train"]
    fitted = fit_mac_cal(
        params, train.features, train.labels, num_features=artifact.num_features,
        num_classes=artifact.num_classes, seed=seed, device=device,
        head_state=artifact.head_state() if params.head_init == "stage1" else None,
    )
    return MethodOutcome.from_predictor(
        lambda features, logits: fitted.logits(features).double().softmax(1).cpu(), artifact, fitted.history
    )


METHODS.register("mac_cal")(MethodSpec(MacCalConfig, run_mac_cal, "MaC-Cal: masked bottleneck head retraining"))
