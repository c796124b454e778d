"""TST: two-stage training of new classification layers (Jordahn & Olmos, ICML 2024), docs/methods.md §2.2.

Stage II discards the Stage-I linear classifier and trains a new, randomly initialised head on the
frozen extractor's cached TRAIN features h ∈ R^d (no backbone forward):

    h → Linear(d, 3Z) → ReLU → Linear(3Z, Z) = z (the "last hidden layer") → Linear(Z, C) = logits

with cross-entropy. Z is ``latent_dim``. Both TST and V-TST (``vtst.py``) train in Stage II's one loop
(:func:`calib.methods.population.train_population`), a lone run being a population of one: TST with
:func:`fit_tst_population` (its heads stacked in one :class:`~calib.methods.heads.StackedLinears`),
V-TST with :func:`train_stage_two_heads`, which trains any :class:`StageTwoHead` (training loss and
predictive probabilities) side by side. Both evaluate on the cached validation features after every
epoch (``checkpoint="best_val_loss"`` keeps the epoch with the lowest NLL).
"""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.nn import functional as F

from calib._config import check
from calib.methods._base import MethodOutcome, MethodSpec, check_population, guarded
from calib.methods._registry import METHODS
from calib.methods.heads import StackedLinears
from calib.methods.population import EpochSums, Population, TrainingDiverged, alone, train_population
from calib.metrics.nll import NLL_FLOOR

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact

__all__ = [
    "FittedStageTwoHead",
    "StageTwoHead",
    "TSTConfig",
    "TSTHead",
    "fit_tst",
    "fit_tst_population",
    "latent_encoder",
    "make_member_optimizer",
    "make_optimizer",
    "population_key",
    "register_head_method",
    "run_on_artifact",
    "run_population_on_artifact",
    "run_tst",
    "train_stage_two_head",
    "train_stage_two_heads",
]


@dataclass(frozen=True, kw_only=True)
class TSTConfig:
    """TST's Stage II. Defaults: MaC-Cal's re-run inside the FOCAL-R protocol (docs/methods.md §1.1).

    Attributes:
        epochs: Stage-II epochs (40 in both protocols).
        optimizer: "sgd" (FOCAL-R re-run: lr 0.1, momentum 0.9, weight decay 5e-4, batch 128) or
            "adam" (TST-R's own protocol: use lr 1e-4, batch 256, weight_decay 0; momentum is unused).
        lr: learning rate, constant over Stage II, > 0.
        momentum: SGD momentum in [0, 1) (ignored by Adam).
        weight_decay: L2 weight decay of the optimizer, >= 0.
        batch_size: minibatch size over the cached training features, >= 1.
        latent_dim: Z, the width of the last hidden layer; the head is d → 3Z → Z → C (TST-R: 256).
        checkpoint: "last" (the final epoch, FOCAL-R style) or "best_val_loss" (TST-R: the epoch
            with the lowest validation NLL on the cached validation features).
    """

    epochs: int = 40
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    batch_size: int = 128
    latent_dim: int = 256
    checkpoint: Literal["last", "best_val_loss"] = "last"

    def __post_init__(self) -> None:
        check(self.epochs >= 1, "epochs", self.epochs, "be an integer >= 1",
              "It is the number of Stage-II epochs, which a study's --stage2-epochs sets.")
        check(self.optimizer in ("sgd", "adam"), "optimizer", self.optimizer, "be one of 'sgd', 'adam'")
        check(self.lr > 0, "lr", self.lr, "be > 0")
        check(0 <= self.momentum < 1, "momentum", self.momentum, "be in [0, 1)")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "be >= 0")
        check(self.batch_size >= 1, "batch_size", self.batch_size, "be an integer >= 1")
        check(self.latent_dim >= 1, "latent_dim", self.latent_dim, "be an integer >= 1 (it is Z)")
        check(self.checkpoint in ("last", "best_val_loss"), "checkpoint", self.checkpoint,
              "be one of 'last', 'best_val_loss'")


def latent_encoder(num_features: int, latent_dim: int) -> nn.Sequential:
    """d → 3Z (ReLU) → Z, linear output: TST's encoder of the last hidden layer (and V-TST's μ / log σ² heads)."""
    if num_features < 1 or latent_dim < 1:
        raise ValueError(f"`num_features` and `latent_dim` must be >= 1, got {num_features=}, {latent_dim=}.")
    return nn.Sequential(nn.Linear(num_features, 3 * latent_dim), nn.ReLU(), nn.Linear(3 * latent_dim, latent_dim))


class StageTwoHead(nn.Module, abc.ABC):
    """A head trained on cached features by :func:`train_stage_two_head`.

    ``generator`` is a CPU generator for the head's noise (V-TST's ε); deterministic heads ignore it.
    """

    @abc.abstractmethod
    def training_loss(
        self, h: torch.Tensor, labels: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(scalar loss to minimise, the logits behind it) for a minibatch of features h (B, d)."""

    @abc.abstractmethod
    def predictive_probs(self, h: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The predictive class probabilities p(y | h), float64 (N, C), on h's device."""


class TSTHead(StageTwoHead):
    """TST's classification layers: encoder d → 3Z (ReLU) → Z, then the linear decoder Z → C."""

    def __init__(self, num_features: int, latent_dim: int, num_classes: int) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"`num_classes` must be >= 1, got {num_classes=}.")
        self.encoder = latent_encoder(num_features, latent_dim)
        self.decoder = nn.Linear(latent_dim, num_classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (N, C) of features h (N, d)."""
        return self.decoder(self.encoder(h))

    def training_loss(
        self, h: torch.Tensor, labels: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(h)
        return F.cross_entropy(logits, labels), logits

    def predictive_probs(self, h: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self(h).double().softmax(1)


@dataclass
class FittedStageTwoHead:
    """A trained head, its per-epoch history and the epoch whose weights it holds.

    Evaluation noise (V-TST) comes from a fresh CPU generator seeded with ``eval_seed`` (the trial
    seed) at every call, so the probabilities of a given input are reproducible.
    """

    head: StageTwoHead
    eval_seed: int
    device: torch.device
    best_epoch: int
    history: list[dict[str, Any]] = field(default_factory=list)

    @torch.no_grad()
    def device_probs(self, features: torch.Tensor) -> torch.Tensor:
        """Predictive probabilities, float64 on the head's device, of cached features (N, d)."""
        self.head.eval()
        generator = torch.Generator().manual_seed(self.eval_seed)
        return self.head.predictive_probs(features.to(self.device, torch.float32), generator)

    def probs(self, features: torch.Tensor) -> torch.Tensor:
        """Predictive probabilities, float64 on the CPU, of cached features (N, d)."""
        return self.device_probs(features).cpu()

    def predict(self, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The method's :data:`~calib.methods.Predictor`: uses the features, ignores the Stage-I logits."""
        return self.probs(features)


def make_optimizer(params: TSTConfig, parameters: Any) -> torch.optim.Optimizer:
    """SGD (lr, momentum, weight decay) or Adam (lr, weight decay), as ``params.optimizer`` says."""
    return make_member_optimizer([(params, parameters)])


def make_member_optimizer(members: Sequence[tuple[TSTConfig, Any]]) -> torch.optim.Optimizer:
    """One optimiser of the members' kind (``optimizer``, shared) with a parameter group per member, holding
    its parameters and its own lr, momentum (SGD) and weight decay: each group's update is the one the
    member's own optimiser would make, as SGD and Adam update every parameter on its own."""
    kind = members[0][0].optimizer
    if kind == "adam":
        groups = [{"params": list(parameters), "lr": p.lr, "weight_decay": p.weight_decay} for p, parameters in members]
        return torch.optim.Adam(groups)
    groups = [{"params": list(parameters), "lr": p.lr, "momentum": p.momentum, "weight_decay": p.weight_decay}
              for p, parameters in members]
    return torch.optim.SGD(groups)


def _nll(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean −log max(p_{i,y_i}, smallest float64), as :func:`calib.metrics.negative_log_likelihood`."""
    p_true = probs.gather(1, labels.unsqueeze(1)).squeeze(1)
    return float(-p_true.clamp(min=NLL_FLOOR, max=1.0).log().mean())


LOOP_FIELDS = ("epochs", "optimizer", "batch_size")
"""What heads trained side by side by :func:`train_stage_two_heads` share: the loop and the optimiser's kind;
lr, momentum and weight decay are each head's own (a parameter group of its own)."""

POPULATION_FIELDS = (*LOOP_FIELDS, "lr", "momentum", "weight_decay", "latent_dim")
"""What configs training in one TST population share (their heads are one stack: one tensor per layer, one lr);
``checkpoint`` and the seed may differ."""


def population_key(params: TSTConfig) -> tuple:
    """Configs with equal keys can train in one population (:func:`fit_tst_population`)."""
    return tuple(getattr(params, name) for name in POPULATION_FIELDS)


class _CheckpointedPopulation(Population):
    """TST's and V-TST's members (:func:`~calib.methods.population.train_population`): after every epoch
    each one's validation NLL and history row, and under ``checkpoint="best_val_loss"`` a copy of its
    weights at its lowest validation NLL so far. Minibatch order and training noise of member k come
    from a CPU generator seeded with its seed."""

    def __init__(self, members: Sequence[tuple[TSTConfig, int]], heads: Sequence[StageTwoHead],
                 data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], device: torch.device) -> None:
        first = members[0][0]
        super().__init__([torch.Generator().manual_seed(seed) for _, seed in members], epochs=first.epochs,
                         batch_size=first.batch_size, device=device, index_device=device)
        train_features, train_labels, val_features, val_labels = data
        self.params = [params for params, _ in members]
        self.fitted = [FittedStageTwoHead(head, eval_seed=seed, device=device, best_epoch=first.epochs - 1)
                       for head, (_, seed) in zip(heads, members, strict=True)]
        self.features, self.labels = train_features.to(device, torch.float32), train_labels.to(device)
        self.val_features, self.val_labels = val_features.to(device, torch.float32), val_labels.to(device)
        self.best_loss = [math.inf] * self.size
        self.best_state: list[Any] = [None] * self.size

    @abc.abstractmethod
    def validation_probs(self, active: Sequence[int]) -> torch.Tensor | dict[int, torch.Tensor]:
        """Member k's predictive probabilities (float64) on the validation features, for k in ``active``."""

    @abc.abstractmethod
    def snapshot(self, k: int) -> Any:
        """A copy of member ``k``'s weights, which :meth:`results` puts back."""

    def divergence_message(self, epoch: int, total_loss: float, n: int) -> str:
        return f"Stage-II training loss became {total_loss} at epoch {epoch}."

    def end_epoch(self, epoch: int, sums: EpochSums, active: Sequence[int]) -> None:
        if not active:
            return
        probs = self.validation_probs(active)
        for k in active:
            params, member = self.params[k], self.fitted[k]
            val_loss = _nll(probs[k], self.val_labels)
            member.history.append({
                "stage": "stage2", "epoch": epoch, "lr": params.lr, "train_loss": sums.loss[k] / sums.n,
                "train_accuracy": sums.correct[k] / sums.n, "train_confidence": sums.confidence[k] / sums.n,
                "val_accuracy": float((probs[k].argmax(1) == self.val_labels).double().mean()), "val_loss": val_loss,
            })
            if params.checkpoint == "best_val_loss" and val_loss < self.best_loss[k]:
                self.best_loss[k], member.best_epoch = val_loss, epoch
                self.best_state[k] = self.snapshot(k)


def _tst_layers(head: TSTHead) -> list[nn.Linear]:
    return [head.encoder[0], head.encoder[2], head.decoder]


class _StackedTSTPopulation(_CheckpointedPopulation):
    """TST heads as one :class:`~calib.methods.heads.StackedLinears` stack (batched matrix products) with
    one optimiser; the member heads get their trained (or checkpointed) weights at the end."""

    def __init__(self, members: Sequence[tuple[TSTConfig, int]], heads: Sequence[TSTHead],
                 data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], device: torch.device) -> None:
        super().__init__(members, heads, data, device)
        self.stack = StackedLinears([_tst_layers(h) for h in heads], relu_after={0}).to(device)
        self.optimizer = make_optimizer(self.params[0], self.stack.parameters())
        self.stacked_val_features = self.val_features.unsqueeze(0).expand(self.size, -1, -1)

    def start_epoch(self, epoch: int) -> None:
        self.stack.train()

    def losses(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        labels = self.labels[indices]
        logits = self.stack(self.features[indices])
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(self.size, -1).mean(1)
        return loss, logits, labels

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.optimizer.step()

    @torch.no_grad()
    def validation_probs(self, active: Sequence[int]) -> torch.Tensor:
        self.stack.eval()
        return self.stack(self.stacked_val_features).double().softmax(2)

    def snapshot(self, k: int) -> list[torch.Tensor]:
        return [t[k].detach().clone() for t in (*self.stack.weights, *self.stack.biases)]

    @torch.no_grad()
    def results(self) -> list[FittedStageTwoHead]:
        depth = len(self.stack.weights)
        for k, member in enumerate(self.fitted):
            layers = _tst_layers(member.head)
            self.stack.copy_member_into(k, layers)
            if self.best_state[k] is not None:
                for i, layer in enumerate(layers):
                    layer.weight.copy_(self.best_state[k][i])
                    layer.bias.copy_(self.best_state[k][depth + i])
            member.head.to(self.device)
        return self.fitted


class _HeadsPopulation(_CheckpointedPopulation):
    """Any :class:`StageTwoHead` members (V-TST's), each its own module computing its own training loss,
    with one optimiser over all of them."""

    def __init__(self, members: Sequence[tuple[TSTConfig, int]], heads: Sequence[StageTwoHead],
                 data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], device: torch.device) -> None:
        heads = [head.to(device) for head in heads]
        super().__init__(members, heads, data, device)
        self.optimizer = make_member_optimizer([(params, head.parameters())
                                                for params, head in zip(self.params, heads, strict=True)])

    def start_epoch(self, epoch: int) -> None:
        for member in self.fitted:
            member.head.train()

    def losses(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        labels = self.labels[indices]
        pairs = [member.head.training_loss(self.features[rows], member_labels, generator) for member, rows,
                 member_labels, generator in zip(self.fitted, indices, labels, self.generators, strict=True)]
        return torch.stack([loss for loss, _ in pairs]), torch.stack([logits for _, logits in pairs]), labels

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.optimizer.step()

    def validation_probs(self, active: Sequence[int]) -> dict[int, torch.Tensor]:
        return {k: self.fitted[k].device_probs(self.val_features) for k in active}

    def snapshot(self, k: int) -> dict[str, torch.Tensor]:
        return copy.deepcopy(self.fitted[k].head.state_dict())

    def results(self) -> list[FittedStageTwoHead]:
        for member, state in zip(self.fitted, self.best_state, strict=True):
            if state is not None:
                member.head.load_state_dict(state)
        return self.fitted


def train_stage_two_heads(
    members: Sequence[tuple[StageTwoHead, TSTConfig, int]],
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    val_features: torch.Tensor,
    val_labels: torch.Tensor,
    *,
    device: torch.device,
) -> list[FittedStageTwoHead | TrainingDiverged]:
    """Train each member's ``(head, params, seed)`` on cached training features, side by side in one
    loop (:func:`~calib.methods.population.train_population`); evaluate on validation every epoch.

    Members share :data:`LOOP_FIELDS`. Minibatch order and training noise of a member come from a CPU
    generator seeded with its ``seed``, so each result is the member's lone run exactly. History rows
    (stage "stage2") carry lr, train_loss (the head's objective), train_accuracy and train_confidence
    over the epoch's minibatches, and val_accuracy and val_loss (validation NLL) after the epoch. A
    member whose loss becomes non-finite gets a :class:`~calib.methods.population.TrainingDiverged`.
    """
    if not members:
        return []
    configs = [(params, seed) for _, params, seed in members]
    check_population([params for params, _ in configs], lambda p: tuple(getattr(p, f) for f in LOOP_FIELDS),
                     LOOP_FIELDS)
    population = _HeadsPopulation(configs, [head for head, _, _ in members],
                                  (train_features, train_labels, val_features, val_labels), device)
    return train_population(population, train_features.shape[0])


def train_stage_two_head(
    head: StageTwoHead,
    params: TSTConfig,
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    val_features: torch.Tensor,
    val_labels: torch.Tensor,
    *,
    seed: int,
    device: torch.device,
) -> FittedStageTwoHead:
    """Train ``head`` on cached training features with ``params``: :func:`train_stage_two_heads` with one
    member (a non-finite loss raises its ``TrainingDiverged``)."""
    return alone(train_stage_two_heads([(head, params, seed)], train_features, train_labels, val_features,
                                       val_labels, device=device))


def _initial_tst_head(seed: int, num_features: int, latent_dim: int, num_classes: int) -> TSTHead:
    """A new :class:`TSTHead` initialised from ``seed`` (the global RNG left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TSTHead(num_features, latent_dim, num_classes)


def fit_tst_population(
    members: Sequence[tuple[TSTConfig, int]],
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    val_features: torch.Tensor,
    val_labels: torch.Tensor,
    *,
    num_classes: int,
    device: torch.device,
) -> list[FittedStageTwoHead | TrainingDiverged]:
    """One TST head per ``(params, seed)`` member (initialised from ``seed``), stacked and trained in one
    loop (:func:`~calib.methods.population.train_population`): each member's minibatch order (its own
    CPU generator), validation NLL after every epoch and checkpoint choice are its own. Members share
    :func:`population_key`. A member whose loss becomes non-finite gets a
    :class:`~calib.methods.population.TrainingDiverged` (with its ``epoch``); the others go on.
    """
    if not members:
        return []
    check_population([p for p, _ in members], population_key, POPULATION_FIELDS)
    latent_dim, num_features = members[0][0].latent_dim, train_features.shape[1]
    heads = [_initial_tst_head(seed, num_features, latent_dim, num_classes) for _, seed in members]
    population = _StackedTSTPopulation(members, heads, (train_features, train_labels, val_features, val_labels),
                                       device)
    return train_population(population, train_features.shape[0])


def fit_tst(
    params: TSTConfig,
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    val_features: torch.Tensor,
    val_labels: torch.Tensor,
    *,
    num_classes: int,
    seed: int,
    device: torch.device,
) -> FittedStageTwoHead:
    """A new :class:`TSTHead` (initialised from ``seed``) trained on cached features: a population of
    one (:func:`fit_tst_population`), so a config's result does not depend on who trained beside it."""
    return alone(fit_tst_population([(params, seed)], train_features, train_labels, val_features, val_labels,
                                    num_classes=num_classes, device=device))


def run_on_artifact(fit: Callable[..., FittedStageTwoHead], params: TSTConfig, artifact: Stage1Artifact, *,
                    seed: int, device: torch.device) -> MethodOutcome:
    """``fit`` (:func:`fit_tst` or V-TST's) on the artifact's cached training features, with its cached
    validation features for checkpointing; evaluated on val and test."""
    train, val = artifact.splits["train"], artifact.splits["val"]
    fitted = fit(params, train.features, train.labels, val.features, val.labels,
                 num_classes=artifact.num_classes, seed=seed, device=device)
    return MethodOutcome.from_predictor(fitted.predict, artifact, fitted.history)


def run_tst(params: TSTConfig, artifact: Stage1Artifact, *, seed: int, device: torch.device) -> MethodOutcome:
    """TST's Stage II on the artifact's cached training features; evaluated on val and test."""
    return run_on_artifact(fit_tst, params, artifact, seed=seed, device=device)


def run_population_on_artifact(
    fit_population: Callable[..., list[FittedStageTwoHead | TrainingDiverged]], params: Sequence[TSTConfig],
    artifact: Stage1Artifact, *, seeds: Sequence[int], device: torch.device
) -> list[MethodOutcome | BaseException]:
    """``fit_population`` (:func:`fit_tst_population` or V-TST's) of several configs on the artifact's cached
    features, as :func:`run_on_artifact` runs one; a member that diverged keeps its exception."""
    train, val = artifact.splits["train"], artifact.splits["val"]
    fitted = fit_population(list(zip(params, seeds, strict=True)), train.features, train.labels,
                            val.features, val.labels, num_classes=artifact.num_classes, device=device)
    return [f if isinstance(f, BaseException) else guarded(MethodOutcome.from_predictor, f.predict, artifact, f.history)
            for f in fitted]


def register_head_method(name: str, config: type, run: Callable[..., MethodOutcome],
                         fit_population: Callable[..., list[FittedStageTwoHead | TrainingDiverged]],
                         grouping: Callable[[Any], tuple], description: str, *, label: str, order: float) -> None:
    """Register a head retrained on cached features (TST, V-TST): ``run`` trains one config, ``fit_population``
    several configs with one ``grouping`` key (the method's ``population_key``) together on the artifact."""

    def run_population(params: Sequence[Any], artifact: Stage1Artifact, *, seeds: Sequence[int],
                       device: torch.device) -> list[MethodOutcome | BaseException]:
        return run_population_on_artifact(fit_population, params, artifact, seeds=seeds, device=device)

    METHODS.register(name)(MethodSpec(config, run, description, run_population=run_population,
                                      population_key=grouping, label=label, order=order))


register_head_method("tst", TSTConfig, run_tst, fit_tst_population, population_key,
                     "TST: new d→3Z→Z→C head retrained on frozen features", label="TST", order=1)
