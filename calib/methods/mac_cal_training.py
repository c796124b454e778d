"""MaC-Cal's Stage II (docs/methods.md §1.3): its members in Stage II's one loop, the method's fit and run.

The equations and the config are :mod:`calib.methods.mac_cal`'s; here they train. Every config,
alone or beside others sharing :func:`~calib.methods.mac_cal.population_key`, is a member of a
population trained by :func:`calib.methods.population.train_population`: the members' heads stacked
in one :class:`~calib.methods.heads.StackedLinears`, updated by one
:class:`~calib.methods.restricted_sgd.RestrictedSGD`, each with its own masks, q_t and statistics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch.nn import functional as F

from calib._config import ConfigError
from calib.methods._base import MethodOutcome, MethodSpec, check_population, guarded
from calib.methods._registry import METHODS
from calib.methods.heads import MaskableHead, StackedLinears
from calib.methods.mac_cal import (
    POPULATION_FIELDS,
    STATS_SPLITS,
    FittedMacCal,
    MacCalConfig,
    clip_threshold,
    estimated_accuracy_weight,
    population_key,
    retention_update,
    sample_weight_masks,
    stats_splits,
)
from calib.methods.population import EpochSums, Population, TrainingDiverged, alone, train_population
from calib.methods.restricted_sgd import RestrictedSGD

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact
    from calib.config import TrialConfig

__all__ = ["fit_mac_cal", "fit_mac_cal_population", "run_mac_cal", "run_mac_cal_population"]


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
    return alone(fit_mac_cal_population([(params, seed)], inputs, labels, num_features=num_features,
                                        num_classes=num_classes, device=device, head_state=head_state,
                                        feature_fn=feature_fn, stats_inputs=stats_inputs))


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


class _MacCalPopulation(Population):
    """MaC-Cal's members for :func:`~calib.methods.population.train_population`: their stacked heads,
    one :class:`~calib.methods.restricted_sgd.RestrictedSGD`, and per member its generator (masks
    first, then minibatch order, as a lone run draws them), q_t and fitted head."""

    def __init__(self, members: Sequence[tuple[MacCalConfig, int]], widths: list[int],
                 head_state: dict[str, torch.Tensor] | None, device: torch.device, data: tuple[
                     torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor] | None,
                     tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        self.members = [p for p, _ in members]
        self.first = first = self.members[0]
        self.heads = [_initial_head(p, seed, widths, head_state) for p, seed in members]
        super().__init__([torch.Generator().manual_seed(seed) for _, seed in members], epochs=first.epochs,
                         batch_size=first.batch_size, device=device)
        self.inputs, self.labels, self.feature_fn, self.stats_inputs = data
        self.stack = StackedLinears([h.layers for h in self.heads], relu_after=range(len(widths) - 2)).to(device)
        self.optimizer = RestrictedSGD([*self.stack.weights, *self.stack.biases], lr=first.lr,
                                       momentum=first.momentum, weight_decay=first.weight_decay)
        self.restrict = torch.tensor([p.gradient_restriction for p in self.members], device=device).view(-1, 1, 1)
        self.retention = [p.retention_init for p in self.members]
        self.fitted = [FittedMacCal(head, p, None, q)
                       for head, p, q in zip(self.heads, self.members, self.retention, strict=True)]
        self.unmasked: list[torch.Tensor | None] = [None] * (len(self.stack.weights) + len(self.stack.biases))
        self.masks: list[torch.Tensor] | None = None
        self.keep = self.unmasked
        self.scale: torch.Tensor | None = None

    @property
    def in_place(self) -> bool:
        return self.first.mask_mode == "in_place"

    def draw(self) -> None:
        """The members' masks (Eq. 8) and where the update may move weights (one list per draw: see
        RestrictedSGD); ``in_place`` zeroes the dropped weights now. Biases are never masked."""
        drawn = _population_masks(self.heads, self.retention, self.generators, self.device)
        if self.in_place:
            with torch.no_grad():
                for weight, mask in zip(self.stack.weights, drawn, strict=True):
                    weight.mul_(mask)
        self.masks = drawn
        self.keep = [*_kept(drawn, self.restrict, len(self.stack.weights)), *([None] * len(self.stack.biases))]

    def start_epoch(self, epoch: int) -> None:
        """The epoch's masks and the per-member training scale of the masked weights (q_t as it is now)."""
        self.stack.train()
        if self.first.masked_forward:
            self.draw()
        if self.first.masked_forward and any(p.train_mask_scaling == "inverted" for p in self.members):
            self.scale = torch.tensor([f._train_scale(q) for f, q in zip(self.fitted, self.retention, strict=True)],
                                      device=self.device)

    def losses(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        first, device = self.first, self.device
        if first.masked_forward and first.mask_resample == "step":
            self.draw()
        with torch.no_grad():
            if self.feature_fn is None:
                h = self.inputs[indices].to(device, non_blocking=True)
            else:
                h = torch.stack([self.feature_fn(self.inputs[i].to(device, non_blocking=True)) for i in indices])
        y = self.labels[indices].to(device, non_blocking=True)
        logits = self.stack(h, masks=None if self.in_place else self.masks, weight_scale=self.scale,
                            straight_through=first.mask_mode == "straight_through")
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(self.size, -1).mean(1)
        return loss, logits, y

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        self.optimizer.step(self.keep)

    def divergence_message(self, epoch: int, total_loss: float, n: int) -> str:
        return f"MaC-Cal training loss became {total_loss / n} at Stage-II epoch {epoch}."

    def statistics(self, sums: EpochSums) -> tuple[list[float], list[float], int]:
        """Acc_t and Conf_t sums per member and their count, for the q update: the epoch's online ones, or
        from a pass after the epoch over ``stats_inputs`` or (``stats_pass="clean"``) the training inputs."""
        features_of = self.feature_fn if self.feature_fn is not None else (lambda batch: batch)
        pass_masks = None if self.in_place else self.masks  # in place: the weights as they are now
        if self.stats_inputs is not None:
            inputs, labels = self.stats_inputs
        elif self.first.stats_pass == "clean":
            inputs, labels = self.inputs, self.labels
        else:
            return sums.correct, sums.confidence, sums.n
        correct, confidence = _clean_stats(self.stack, inputs, labels, features_of, pass_masks, self.scale,
                                           self.first, self.device)
        return correct, confidence, inputs.shape[0]

    def end_epoch(self, epoch: int, sums: EpochSums, active: Sequence[int]) -> None:
        """Per member still training: its history row, its last masks and q_t, and the q update (Eq. 12-13)."""
        if not active:
            return
        stats_correct, stats_confidence, stats_n = self.statistics(sums)
        n = sums.n
        for k in active:
            params, member, q = self.members[k], self.fitted[k], self.retention[k]
            accuracy, mean_conf = stats_correct[k] / stats_n, stats_confidence[k] / stats_n
            threshold = clip_threshold(epoch, params)
            member.history.append({
                "stage": "stage2", "epoch": epoch, "lr": params.lr, "train_loss": sums.loss[k] / n,
                "train_accuracy": sums.correct[k] / n, "train_confidence": sums.confidence[k] / n,
                "update_accuracy": accuracy, "update_confidence": mean_conf,
                "accuracy_weight": params.accuracy_weight,
                "retention_prob": q if params.masked_forward else None,
                "clip_threshold": threshold if params.adaptive_retention != "none" else None,
            })
            member.last_masks = None if self.masks is None else [m[k] for m in self.masks]
            member.last_retention = q
            if params.masked_forward and params.adaptive_retention != "none":
                self.retention[k] = retention_update(q, accuracy, mean_conf, threshold, params)

    def results(self) -> list[FittedMacCal]:
        for k, member in enumerate(self.fitted):
            self.stack.copy_member_into(k, member.head.layers)
            member.head.to(self.device)
        return self.fitted


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
) -> list[FittedMacCal | TrainingDiverged]:
    """Train one MaC-Cal head per ``(params, seed)`` member, all at once, on the same inputs.

    ``stats_inputs`` (inputs, labels): where Acc_t and Conf_t of the q update are measured, by a pass
    with the epoch's masks after the epoch; None measures them on the training inputs (``stats_pass``).

    The heads are stacked (:class:`~calib.methods.heads.StackedLinears`) and trained by Stage II's one
    loop (:func:`~calib.methods.population.train_population`); each member keeps its own
    initialisation (``torch.manual_seed(seed)``), CPU generator (masks and minibatch order, drawn in
    the order a lone run draws them), q_t, θ_t and statistics, so each result equals the member's own
    run up to floating-point reassociation. Members must share :func:`population_key`. A member whose
    loss becomes non-finite gets a :class:`~calib.methods.population.TrainingDiverged` (with its
    ``epoch``) instead of a result; the others go on.
    """
    if not members:
        return []
    first = members[0][0]
    check_population([p for p, _ in members], population_key, POPULATION_FIELDS)
    widths = [num_features, first.bottleneck_width, num_classes] if first.head == "bottleneck" \
        else [num_features, num_classes]
    population = _MacCalPopulation(members, widths, head_state, device, (inputs, labels, feature_fn, stats_inputs))
    return train_population(population, inputs.shape[0])


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
    return alone(run_mac_cal_population([params], artifact, seeds=[seed], device=device))


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


def check_heldout_statistics(params: MacCalConfig, config: TrialConfig) -> None:
    """``stats_source`` 'heldout' reads the training images Stage I did not train on: there must be some."""
    if params.stats_source == "heldout" and config.stage1.train_size is None:
        raise ConfigError(
            f"`method.stats_source`='heldout' reads the training images Stage I did not train on, but "
            f"stage1.train_size is null (Stage I trains on all of them): set stage1.train_size (--train-size) below "
            f"the size of {config.dataset}'s training split.")


METHODS.register("mac_cal")(MethodSpec(
    MacCalConfig, run_mac_cal, "MaC-Cal: masked bottleneck head retraining",
    run_population=run_mac_cal_population, population_key=population_key, splits=stats_splits,
    label="MaC-Cal", order=3, check=check_heldout_statistics,
    # fields added after results were stored: at these defaults the earlier trials keep their ids
    added_fields={"stats_source": "train", "accuracy_weight_source": "fixed", "mask_mode": "forward"}))
