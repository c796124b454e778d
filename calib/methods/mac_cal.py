"""MaC-Cal: mask-based classifier calibration (Ni, Zhao, Yang, Guo; arXiv 2508.09116), docs/methods.md §1.

Stage II freezes the Stage-I feature extractor and retrains a randomly initialised bottleneck head
on the cached training features. Every epoch t draws Bernoulli weight masks with retention
probability q_t (Eq. 8), trains with masked weights (Eq. 9-10), restricts the whole SGD update to
the kept weights (Eq. 11), and adapts q from the training accuracy and confidence (Eq. 12) within a
clip threshold θ_t that decays over the epochs (Eq. 13). Every component is a config switch, so each
row of the paper's Table 5 ablation is a config (docs/methods.md §1.4).

Two options read the statistics of the q update elsewhere: ``stats_source`` (training images Stage I
did not train on, or augmented views, instead of the memorised training features) and
``accuracy_weight_source="estimated"`` (calib's extension: γ from the Stage-I model's accuracy on the
validation split and on the statistics' images). docs/methods.md §1.8 gives the reasons and the measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from calib._config import ConfigError, check
from calib.methods.heads import MaskableHead

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact

__all__ = [
    "POPULATION_FIELDS",
    "STATS_SPLITS",
    "FittedMacCal",
    "MacCalConfig",
    "clip_threshold",
    "estimated_accuracy_weight",
    "population_key",
    "retention_update",
    "sample_weight_masks",
    "stats_splits",
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
        mask_mode: how a drawn mask acts (docs/methods.md §1.9; readings of Eq. 9-11):
            "forward" (default): the forward pass multiplies W by M, so autograd gives dropped weights
            no gradient and gradient restriction removes only their weight decay and momentum;
            "in_place": dropped weights are set to zero when the mask is drawn and the forward pass
            uses W itself, so without restriction they regrow through their gradients during the
            epoch and with it they stay zero until a later mask keeps them (q sets how much of the
            head is reset each epoch); "straight_through": the forward pass uses M ⊙ W but the
            gradient reaches every weight as if unmasked, and restriction multiplies it by M.
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
            from a "clean" pass over the training features after the epoch (``stats_source="train"``
            only; the other sources are always a pass after the epoch).
        stats_source: the images Acc_t and Conf_t are measured on: the "train" features the head
            trains on (the paper), the "heldout" training images Stage I did not train on (needs
            ``stage1.train_size`` below the training split's size), or one "augmented" view of each
            training image (the training transform, drawn once per Stage I); the last two by a pass
            with the epoch's masks after the epoch. The paper's text asks for training-set statistics
            and no validation data; both options stay within that.
        accuracy_weight_source: "fixed" uses ``accuracy_weight``; "estimated" (calib's extension, not
            the paper's method) sets γ = Acc_val / Acc_stats of the Stage-I model, Acc_stats its
            accuracy on the statistics' images (the training features for ``stats_source="train"``:
            the generalisation gap the fixed γ stands for); ``accuracy_weight`` then stays at its default.
        train_mask_scaling: "none" (M ⊙ W) or "inverted" ((M ⊙ W)/q_t, as inverted dropout).
        inference_weights: "expected" (E[training weight]: q_T·W, or W under inverted scaling),
            "full" (W; under ``mask_mode="in_place"`` the weights as trained, the current sparse ones),
            or "last_mask" (the last epoch's masked weights); docs/methods.md §1.6.
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
    mask_mode: Literal["forward", "in_place", "straight_through"] = "forward"
    gradient_restriction: bool = True
    adaptive_retention: Literal["none", "static", "decay"] = "decay"
    retention_init: float = 0.9
    retention_min: float = 0.1
    accuracy_weight: float = 0.95
    clip_init: float = 0.05
    clip_decay: float = 3.0
    mask_resample: Literal["epoch", "step"] = "epoch"
    stats_pass: Literal["online", "clean"] = "online"
    stats_source: Literal["train", "heldout", "augmented"] = "train"
    accuracy_weight_source: Literal["fixed", "estimated"] = "fixed"
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
        # Settings another one makes unused are refused: they would give one computation two trial ids.
        if self.stats_pass != "online" and self.stats_source != "train":
            raise ConfigError(f"`stats_pass`={self.stats_pass!r} applies to `stats_source`='train' only (the "
                              f"{self.stats_source!r} statistics always come from a pass after the epoch): leave "
                              f"`stats_pass` at 'online'.")
        default_gamma = MacCalConfig.accuracy_weight
        if self.accuracy_weight_source == "estimated" and self.accuracy_weight != default_gamma:
            raise ConfigError(f"`accuracy_weight`={self.accuracy_weight!r} is unused under "
                              f"`accuracy_weight_source`='estimated' (γ is estimated from the data): leave "
                              f"`accuracy_weight` at its default {default_gamma}.")
        if not self.masked_forward and self.mask_mode != "forward":
            raise ConfigError(f"`mask_mode`={self.mask_mode!r} needs `masked_forward`=true: without masks there is "
                              f"nothing to apply; leave `mask_mode` at 'forward'.")
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


POPULATION_FIELDS = ("epochs", "lr", "momentum", "weight_decay", "batch_size", "head", "bottleneck_width",
                     "head_init", "masked_forward", "mask_mode", "mask_resample", "stats_pass", "stats_source")
"""The fields that configs training in one population share (the loop's shape, the optimiser and where
the statistics come from); the others (γ and its source, β, θ_0, q_0, q_min, the adaptation, the
restriction, scaling, inference weights) and the seed may differ from member to member."""

STATS_SPLITS = {"train": None, "heldout": "train_heldout", "augmented": "train_augmented"}
"""``stats_source`` → the artifact split (calib.artifacts.METHOD_SPLITS) the statistics are measured on."""


def population_key(params: MacCalConfig) -> tuple:
    """Configs with equal keys can train in one population
    (:func:`calib.methods.mac_cal_training.fit_mac_cal_population`)."""
    return tuple(getattr(params, name) for name in POPULATION_FIELDS)


def estimated_accuracy_weight(artifact: Stage1Artifact, stats_split: str = "train") -> float:
    """calib's γ estimate (``accuracy_weight_source="estimated"``): Acc_val / Acc_stats of the Stage-I model,
    Acc_stats its accuracy on the images the statistics come from (``stats_split``: "train" by default).

    The update's fixed point is Conf = γ·Acc on the statistics' images, so γ stands for the ratio of
    the accuracy a prediction will have to the accuracy measured there; on the training features of
    Stage I that is the generalisation gap, which the validation split measures (on held-out training
    images it is about 1).
    """
    def accuracy(split: str) -> float:
        cache = artifact.splits[split]
        return float((cache.logits.argmax(1) == cache.labels).double().mean())

    stats_accuracy, val_accuracy = accuracy(stats_split), accuracy("val")
    if stats_accuracy == 0 or val_accuracy == 0:
        raise ValueError(f"accuracy_weight_source='estimated' needs a Stage-I model with some correct predictions: "
                         f"its accuracy is {val_accuracy:.4f} on the validation split and {stats_accuracy:.4f} on "
                         f"the split {stats_split!r}, so γ = {val_accuracy:.4f} / {stats_accuracy:.4f} is not > 0.")
    return val_accuracy / stats_accuracy


def stats_splits(params: MacCalConfig) -> tuple[str, ...]:
    """The artifact splits beyond train/val/test that ``params`` reads (``MethodSpec.splits``)."""
    split = STATS_SPLITS[params.stats_source]
    return () if split is None else (split,)
