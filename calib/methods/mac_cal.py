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

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.nn import functional as F

from calib import progress
from calib._config import ConfigError, check
from calib.methods._base import MethodOutcome, MethodSpec, check_population, guarded
from calib.methods._registry import METHODS
from calib.methods.heads import MaskableHead, StackedLinears

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact

__all__ = [
    "FittedMacCal",
    "MacCalConfig",
    "RestrictedSGD",
    "clip_threshold",
    "estimated_accuracy_weight",
    "fit_mac_cal",
    "fit_mac_cal_population",
    "population_key",
    "retention_update",
    "run_mac_cal",
    "run_mac_cal_population",
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


class RestrictedSGD:
    """SGD with momentum and weight decay whose whole update can be masked: Eq. 11, W ← W − η·(M ⊙ update).

    ``step(keep)`` takes one 0/1 float tensor per parameter (None: no restriction): where it is 0 the
    weight and its momentum buffer stay exactly as they were. Autograd already gives dropped weights a
    zero gradient, but weight decay and momentum would still move them (pitfall P2). Elsewhere the
    update is ``torch.optim.SGD``'s (dampening 0, no Nesterov): d = g + λ·W, b ← μ·b + d (b = d at
    the first step), W ← W − η·b. Written with multiplications by the mask, not ``torch.where``
    (several times slower on the CPU); pass the same ``keep`` list object for as long as the masks hold.
    """

    def __init__(self, params: Sequence[torch.Tensor], *, lr: float, momentum: float, weight_decay: float) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)
        self._keep: Sequence[torch.Tensor | None] | None = None
        self._decay: list[torch.Tensor | None] = []

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _momentum_factors(self, keep: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """μ where the mask keeps a weight, exactly 1 where it drops it (its buffer stays)."""
        if keep is not self._keep:
            self._keep = keep
            self._decay = [None if k is None else torch.where(k.bool(), self.momentum, 1.0).to(k.dtype) for k in keep]
        return self._decay

    @torch.no_grad()
    def step(self, keep: Sequence[torch.Tensor | None]) -> None:
        factors = self._momentum_factors(keep) if self.momentum else [None] * len(keep)
        for i, (p, mask, factor) in enumerate(zip(self.params, keep, factors, strict=True)):
            update = p.grad if p.grad is not None else torch.zeros_like(p)
            if self.weight_decay:
                update = update.add(p, alpha=self.weight_decay)
            if mask is not None:
                update = update * mask  # dropped: no gradient, no weight decay
            if self.momentum:
                old = self.buffers[i]
                if old is None:
                    update = update.clone() if mask is None else update
                elif factor is None:
                    update = old.mul(self.momentum).add_(update)
                else:
                    update = update.addcmul_(old, factor)  # μ·b + d where kept, b + 0 where dropped
                self.buffers[i] = update
            if mask is None:
                p.add_(update, alpha=-self.lr)
            else:
                p.addcmul_(update, mask, value=-self.lr)


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
    """Configs with equal keys can train in one population (:func:`fit_mac_cal_population`)."""
    return tuple(getattr(params, name) for name in POPULATION_FIELDS)


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
    stats_inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> FittedMacCal:
    """Train MaC-Cal's head on ``inputs`` (cached features, or images when ``feature_fn`` is given).

    ``feature_fn`` maps a minibatch of inputs to features, e.g. a frozen backbone's ``features``;
    ``run_trial`` never passes one (Stage II runs on cached features), the benchmark does. This is a
    population of one: the same loop as :func:`fit_mac_cal_population`, so a config's result does not
    depend on whether it trained alone or with others.
    """
    (fitted,) = fit_mac_cal_population([(params, seed)], inputs, labels, num_features=num_features,
                                       num_classes=num_classes, device=device, head_state=head_state,
                                       feature_fn=feature_fn, stats_inputs=stats_inputs)
    if isinstance(fitted, BaseException):
        raise fitted
    return fitted


def _initial_head(params: MacCalConfig, seed: int, widths: list[int],
                  head_state: dict[str, torch.Tensor] | None) -> MaskableHead:
    torch.manual_seed(seed)
    head = MaskableHead(widths)
    if params.head_init == "stage1":
        if head_state is None:
            raise ValueError("head_init='stage1' needs the Stage-I head weights (head_state).")
        head.layers[0].load_state_dict(head_state)
    return head


def _population_masks(heads: Sequence[MaskableHead], retention: Sequence[float],
                      generators: Sequence[torch.Generator], device: torch.device) -> list[torch.Tensor]:
    """Eq. 8 per member, from the member's own generator, stacked: one (K, out, in) mask per layer
    (``heads`` give the shapes; they stay on the CPU while the stack trains)."""
    per_member = [sample_weight_masks(h, q, g) for h, q, g in zip(heads, retention, generators, strict=True)]
    return [torch.stack([m[i] for m in per_member]).to(device) for i in range(len(per_member[0]))]


def _kept(masks: list[torch.Tensor] | None, restrict: torch.Tensor, depth: int) -> list[torch.Tensor | None]:
    """Per weight matrix, where the update may move it (Eq. 11): the mask, for members with gradient
    restriction; everywhere (None) when no member restricts."""
    if masks is None or not bool(restrict.any()):
        return [None] * depth
    return [torch.maximum(m, (~restrict).to(m.dtype)) for m in masks]


@dataclass
class _Population:
    """The members of a population training together: their stacked heads, one optimiser, and per member
    its generator, q_t, fitted head and failure (if its loss became non-finite)."""

    members: list[MacCalConfig]
    first: MacCalConfig
    heads: list[MaskableHead]
    generators: list[torch.Generator]
    stack: StackedLinears
    optimizer: RestrictedSGD
    restrict: torch.Tensor
    retention: list[float]
    fitted: list[FittedMacCal]
    device: torch.device
    failures: dict[int, FloatingPointError] = field(default_factory=dict)

    @property
    def in_place(self) -> bool:
        return self.first.mask_mode == "in_place"

    def draw(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """The members' masks (Eq. 8) and where the update may move weights (one list per draw: see
        RestrictedSGD); ``in_place`` zeroes the dropped weights now. Biases are never masked."""
        drawn = _population_masks(self.heads, self.retention, self.generators, self.device)
        if self.in_place:
            with torch.no_grad():
                for weight, mask in zip(self.stack.weights, drawn, strict=True):
                    weight.mul_(mask)
        return drawn, [*_kept(drawn, self.restrict, len(self.stack.weights)), *([None] * len(self.stack.biases))]


def _start_population(members: Sequence[tuple[MacCalConfig, int]], widths: list[int],
                      head_state: dict[str, torch.Tensor] | None, device: torch.device) -> _Population:
    """Each member's head (seeded by its seed, in member order) and generator, stacked, with one optimiser."""
    params_list = [p for p, _ in members]
    first = params_list[0]
    heads = [_initial_head(p, seed, widths, head_state) for p, seed in members]
    generators = [torch.Generator().manual_seed(seed) for _, seed in members]
    stack = StackedLinears([h.layers for h in heads], relu_after=range(len(widths) - 2)).to(device)
    optimizer = RestrictedSGD([*stack.weights, *stack.biases], lr=first.lr, momentum=first.momentum,
                              weight_decay=first.weight_decay)
    restrict = torch.tensor([p.gradient_restriction for p in params_list], device=device).view(-1, 1, 1)
    retention = [p.retention_init for p in params_list]
    fitted = [FittedMacCal(head, p, None, q) for head, p, q in zip(heads, params_list, retention, strict=True)]
    return _Population(params_list, first, heads, generators, stack, optimizer, restrict, retention, fitted, device)


def _train_epoch(pop: _Population, inputs: torch.Tensor, labels: torch.Tensor,
                 feature_fn: Callable[[torch.Tensor], torch.Tensor] | None
                 ) -> tuple[list[torch.Tensor] | None, torch.Tensor | None, list[list[float]]]:
    """One epoch of minibatch steps of every member at once: the epoch's (last) masks, the per-member
    training scale of the masked weights, and per member the sums of loss·B, correct and confidence."""
    first, stack, device = pop.first, pop.stack, pop.device
    features_of = feature_fn if feature_fn is not None else (lambda batch: batch)
    stack.train()
    masks, keep = pop.draw() if first.masked_forward else (None, [None] * (len(stack.weights) + len(stack.biases)))
    order = torch.stack([torch.randperm(inputs.shape[0], generator=g) for g in pop.generators])  # (K, n)
    scale = None
    if first.masked_forward and any(p.train_mask_scaling == "inverted" for p in pop.members):
        scale = torch.tensor([f._train_scale(q) for f, q in zip(pop.fitted, pop.retention, strict=True)],
                             device=device)
    sums = torch.zeros(len(pop.members), 3, dtype=torch.float64, device=device)  # loss·B, correct, confidence
    for idx in order.split(first.batch_size, dim=1):
        if first.masked_forward and first.mask_resample == "step":
            masks, keep = pop.draw()
        with torch.no_grad():
            if feature_fn is None:
                h = inputs[idx].to(device, non_blocking=True)
            else:
                h = torch.stack([features_of(inputs[i].to(device, non_blocking=True)) for i in idx])
        y = labels[idx].to(device, non_blocking=True)
        logits = stack(h, masks=None if pop.in_place else masks, weight_scale=scale,
                       straight_through=first.mask_mode == "straight_through")
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(len(pop.members), -1).mean(1)
        pop.optimizer.zero_grad()
        loss.sum().backward()
        pop.optimizer.step(keep)
        with torch.no_grad():
            confidence, predicted = logits.detach().softmax(2).max(2)
            sums += torch.stack([loss.detach().double() * y.shape[1], (predicted == y).sum(1).double(),
                                 confidence.sum(1).double()], dim=1)
    return masks, scale, sums.T.tolist()


def _update_statistics(pop: _Population, masks: list[torch.Tensor] | None, scale: torch.Tensor | None,
                       online: tuple[list[float], list[float], int], inputs: torch.Tensor, labels: torch.Tensor,
                       feature_fn: Callable[[torch.Tensor], torch.Tensor] | None,
                       stats_inputs: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[list[float], list[float], int]:
    """Acc_t and Conf_t sums per member and their count, for the q update: the epoch's ``online`` ones, or
    from a pass after the epoch over ``stats_inputs`` or (``stats_pass="clean"``) the training inputs."""
    features_of = feature_fn if feature_fn is not None else (lambda batch: batch)
    pass_masks = None if pop.in_place else masks  # in place: the weights as they are now
    if stats_inputs is not None:
        correct, confidence = _clean_stats(pop.stack, *stats_inputs, features_of, pass_masks, scale, pop.first,
                                           pop.device)
        return correct, confidence, stats_inputs[0].shape[0]
    if pop.first.stats_pass == "clean":
        correct, confidence = _clean_stats(pop.stack, inputs, labels, features_of, pass_masks, scale, pop.first,
                                           pop.device)
        return correct, confidence, inputs.shape[0]
    return online


def _end_epoch(pop: _Population, epoch: int, n: int, sums: list[list[float]], masks: list[torch.Tensor] | None,
               stats: tuple[list[float], list[float], int]) -> None:
    """Per member still training: its history row, a failure if its loss is not finite, else its last masks
    and q_t, and the q update (Eq. 12-13)."""
    total_loss, correct, confidence_sum = sums
    stats_correct, stats_confidence, stats_n = stats
    for k, (params, member) in enumerate(zip(pop.members, pop.fitted, strict=True)):
        if k in pop.failures:
            continue
        q = pop.retention[k]
        accuracy, mean_conf = stats_correct[k] / stats_n, stats_confidence[k] / stats_n
        threshold = clip_threshold(epoch, params)
        member.history.append({
            "stage": "stage2", "epoch": epoch, "lr": params.lr, "train_loss": total_loss[k] / n,
            "train_accuracy": correct[k] / n, "train_confidence": confidence_sum[k] / n,
            "update_accuracy": accuracy, "update_confidence": mean_conf,
            "accuracy_weight": params.accuracy_weight,
            "retention_prob": q if params.masked_forward else None,
            "clip_threshold": threshold if params.adaptive_retention != "none" else None,
        })
        if not math.isfinite(total_loss[k]):
            pop.failures[k] = FloatingPointError(
                f"MaC-Cal training loss became {total_loss[k] / n} at Stage-II epoch {epoch}.")
            pop.failures[k].epoch = epoch  # type: ignore[attr-defined]
            continue
        member.last_masks = None if masks is None else [m[k] for m in masks]
        member.last_retention = q
        if params.masked_forward and params.adaptive_retention != "none":
            pop.retention[k] = retention_update(q, accuracy, mean_conf, threshold, params)


def fit_mac_cal_population(
    members: Sequence[tuple[MacCalConfig, int]],
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_features: int,
    num_classes: int,
    device: torch.device,
    head_state: dict[str, torch.Tensor] | None = None,
    feature_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    stats_inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[FittedMacCal | FloatingPointError]:
    """Train one MaC-Cal head per ``(params, seed)`` member, all at once, on the same inputs.

    ``stats_inputs`` (inputs, labels): where Acc_t and Conf_t of the q update are measured, by a pass
    with the epoch's masks after the epoch; None measures them on the training inputs (``stats_pass``).

    The heads are stacked (:class:`~calib.methods.heads.StackedLinears`); each member keeps its own
    initialisation (``torch.manual_seed(seed)``), CPU generator (masks and minibatch order, drawn in
    the order a lone run draws them), q_t, θ_t and statistics, so each result equals the member's own
    run up to floating-point reassociation. Members must share :func:`population_key`. A member whose
    loss becomes non-finite gets a ``FloatingPointError`` (with its ``epoch``) instead of a result;
    the others go on.
    """
    if not members:
        return []
    first = members[0][0]
    check_population([p for p, _ in members], population_key, POPULATION_FIELDS)
    widths = [num_features, first.bottleneck_width, num_classes] if first.head == "bottleneck" \
        else [num_features, num_classes]
    pop = _start_population(members, widths, head_state, device)
    n = inputs.shape[0]
    for epoch in range(first.epochs):
        progress.record("stage2", epoch)
        masks, scale, sums = _train_epoch(pop, inputs, labels, feature_fn)
        stats = _update_statistics(pop, masks, scale, (sums[1], sums[2], n), inputs, labels, feature_fn,
                                   stats_inputs)
        _end_epoch(pop, epoch, n, sums, masks, stats)
        if len(pop.failures) == len(members):
            break
    for k, member in enumerate(pop.fitted):
        pop.stack.copy_member_into(k, member.head.layers)
        member.head.to(device)
    return [pop.failures.get(k, member) for k, member in enumerate(pop.fitted)]


@torch.no_grad()
def _clean_stats(stack: StackedLinears, inputs: torch.Tensor, labels: torch.Tensor,
                 features_of: Callable[[torch.Tensor], torch.Tensor], masks: list[torch.Tensor] | None,
                 scale: torch.Tensor | None, params: MacCalConfig, device: torch.device
                 ) -> tuple[list[float], list[float]]:
    """Acc_t and Conf_t sums per member from a pass over all training inputs with the epoch's masks."""
    stack.eval()
    size = stack.size
    sums = torch.zeros(size, 2, dtype=torch.float64, device=device)
    for idx in torch.arange(inputs.shape[0]).split(max(params.batch_size, 1024)):
        h = features_of(inputs[idx].to(device))
        probs = stack(h.unsqueeze(0).expand(size, -1, -1), masks=masks, weight_scale=scale).softmax(2)
        confidence, predicted = probs.max(2)
        sums += torch.stack([(predicted == labels[idx].to(device)).sum(1).double(),
                             confidence.sum(1).double()], dim=1)
    correct, confidence_sum = sums.T.tolist()
    return correct, confidence_sum


def _outcome(fitted: FittedMacCal, artifact: Stage1Artifact) -> MethodOutcome:
    return MethodOutcome.from_predictor(
        lambda features, logits: fitted.logits(features).double().softmax(1).cpu(), artifact, fitted.history
    )


def run_mac_cal(
    params: MacCalConfig, artifact: Stage1Artifact, *, seed: int, device: torch.device
) -> MethodOutcome:
    """Stage II of MaC-Cal on the artifact's cached training features; evaluated on val and test."""
    (outcome,) = run_mac_cal_population([params], artifact, seeds=[seed], device=device)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


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


def run_mac_cal_population(
    params: Sequence[MacCalConfig], artifact: Stage1Artifact, *, seeds: Sequence[int], device: torch.device
) -> list[MethodOutcome | BaseException]:
    """Stage II of several configs sharing :func:`population_key`, trained together on the artifact."""
    train = artifact.splits["train"]
    needs_head = any(p.head_init == "stage1" for p in params)
    split = STATS_SPLITS[params[0].stats_source] if params else None
    members: dict[int, MacCalConfig] = dict(enumerate(params))
    failed: dict[int, BaseException] = {}
    if any(p.accuracy_weight_source == "estimated" for p in params):
        try:
            gamma: float | BaseException = estimated_accuracy_weight(artifact, split or "train")
        except ValueError as err:
            gamma = err
        for k, p in list(members.items()):
            if p.accuracy_weight_source != "estimated":
                continue
            if isinstance(gamma, BaseException):  # a failed estimate fails its members only
                del members[k]
                failed[k] = gamma
            else:
                members[k] = dataclasses.replace(p, accuracy_weight=gamma, accuracy_weight_source="fixed")
    stats = None if split is None else (artifact.splits[split].features, artifact.splits[split].labels)
    fitted = dict(zip(members, fit_mac_cal_population(
        [(p, seeds[k]) for k, p in members.items()], train.features, train.labels,
        num_features=artifact.num_features, num_classes=artifact.num_classes, device=device,
        head_state=artifact.head_state() if needs_head else None, stats_inputs=stats,
    ), strict=True))
    return [failed[k] if k in failed else fitted[k] if isinstance(fitted[k], BaseException)
            else guarded(_outcome, fitted[k], artifact) for k in range(len(params))]


METHODS.register("mac_cal")(MethodSpec(MacCalConfig, run_mac_cal, "MaC-Cal: masked bottleneck head retraining",
                                         run_population=run_mac_cal_population, population_key=population_key,
                                         splits=stats_splits))
