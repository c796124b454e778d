"""TST: two-stage training of new classification layers (Jordahn & Olmos, ICML 2024), docs/methods.md §2.2.

Stage II discards the Stage-I linear classifier and trains a new, randomly initialised head on the
frozen extractor's cached TRAIN features h ∈ R^d (no backbone forward):

    h → Linear(d, 3Z) → ReLU → Linear(3Z, Z) = z (the "last hidden layer") → Linear(Z, C) = logits

with cross-entropy. Z is ``latent_dim``. TST trains with :func:`fit_tst_population` (its heads
stacked, a lone run being a population of one); V-TST (``vtst.py``) with :func:`train_stage_two_head`,
which trains any :class:`StageTwoHead` (training loss and predictive probabilities) the same way.
Both evaluate on the cached validation features after every epoch (``checkpoint="best_val_loss"``
keeps the epoch with the lowest NLL).
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

from calib import progress
from calib._config import check
from calib.methods._base import MethodOutcome, MethodSpec, check_population, guarded
from calib.methods._registry import METHODS
from calib.methods.heads import StackedLinears
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
    "make_optimizer",
    "population_key",
    "run_on_artifact",
    "run_tst",
    "run_tst_population",
    "train_stage_two_head",
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
    if params.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=params.lr, weight_decay=params.weight_decay)
    return torch.optim.SGD(parameters, lr=params.lr, momentum=params.momentum, weight_decay=params.weight_decay)


def _nll(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean −log max(p_{i,y_i}, smallest float64), as :func:`calib.metrics.negative_log_likelihood`."""
    p_true = probs.gather(1, labels.unsqueeze(1)).squeeze(1)
    return float(-p_true.clamp(min=NLL_FLOOR, max=1.0).log().mean())


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
    """Train ``head`` on cached training features with ``params``; evaluate on validation every epoch.

    Minibatch order and training noise come from a CPU generator seeded with ``seed``. History rows
    (stage "stage2") carry lr, train_loss (the head's objective), train_accuracy and train_confidence
    over the epoch's minibatches, and val_accuracy and val_loss (validation NLL) after the epoch.
    """
    generator = torch.Generator().manual_seed(seed)
    head = head.to(device)
    optimizer = make_optimizer(params, head.parameters())
    features, labels = train_features.to(device, torch.float32), train_labels.to(device)
    val_h, val_y = val_features.to(device, torch.float32), val_labels.to(device)
    fitted = FittedStageTwoHead(head, eval_seed=seed, device=device, best_epoch=params.epochs - 1)
    best_loss, best_state = math.inf, None
    n = features.shape[0]
    for epoch in range(params.epochs):
        progress.record("stage2", epoch)
        head.train()
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss·B, correct, confidence, summed on device
        for idx in torch.randperm(n, generator=generator).split(params.batch_size):
            idx = idx.to(device)
            y = labels[idx]
            loss, logits = head.training_loss(features[idx], y, generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                confidences, predictions = logits.detach().softmax(1).max(1)
                sums += torch.stack([loss.detach() * y.shape[0], (predictions == y).sum(), confidences.sum()]).double()
        total_loss, correct, confidence = sums.tolist()
        if not math.isfinite(total_loss):
            raise FloatingPointError(f"Stage-II training loss became {total_loss} at epoch {epoch}.")
        val_probs = fitted.device_probs(val_h)
        val_loss = _nll(val_probs, val_y)
        fitted.history.append({
            "stage": "stage2", "epoch": epoch, "lr": params.lr, "train_loss": total_loss / n,
            "train_accuracy": correct / n, "train_confidence": confidence / n,
            "val_accuracy": float((val_probs.argmax(1) == val_y).double().mean()), "val_loss": val_loss,
        })
        if params.checkpoint == "best_val_loss" and val_loss < best_loss:
            best_loss, best_state, fitted.best_epoch = val_loss, copy.deepcopy(head.state_dict()), epoch
    if best_state is not None:
        head.load_state_dict(best_state)
    return fitted


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
    (fitted,) = fit_tst_population([(params, seed)], train_features, train_labels, val_features, val_labels,
                                   num_classes=num_classes, device=device)
    if isinstance(fitted, BaseException):
        raise fitted
    return fitted


POPULATION_FIELDS = ("epochs", "optimizer", "lr", "momentum", "weight_decay", "batch_size", "latent_dim")
"""What configs training in one TST population share; ``checkpoint`` and the seed may differ."""


def population_key(params: TSTConfig) -> tuple:
    """Configs with equal keys can train in one population (:func:`fit_tst_population`)."""
    return tuple(getattr(params, name) for name in POPULATION_FIELDS)


def _tst_layers(head: TSTHead) -> list[nn.Linear]:
    return [head.encoder[0], head.encoder[2], head.decoder]


def fit_tst_population(
    members: Sequence[tuple[TSTConfig, int]],
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    val_features: torch.Tensor,
    val_labels: torch.Tensor,
    *,
    num_classes: int,
    device: torch.device,
) -> list[FittedStageTwoHead | FloatingPointError]:
    """One TST head per ``(params, seed)`` member, trained side by side as :func:`train_stage_two_head`
    trains one: each member's initialisation (``seed``), minibatch order (its own CPU generator),
    validation NLL after every epoch and checkpoint choice are its own. Members share
    :func:`population_key`. A member whose loss becomes non-finite gets a ``FloatingPointError`` (with its
    ``epoch``); the others go on.
    """
    if not members:
        return []
    first = members[0][0]
    check_population([p for p, _ in members], population_key, POPULATION_FIELDS)
    size = len(members)
    heads = []
    for _, seed in members:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            heads.append(TSTHead(train_features.shape[1], first.latent_dim, num_classes))
    generators = [torch.Generator().manual_seed(seed) for _, seed in members]
    stack = StackedLinears([_tst_layers(h) for h in heads], relu_after={0}).to(device)
    optimizer = make_optimizer(first, stack.parameters())
    features, labels = train_features.to(device, torch.float32), train_labels.to(device)
    val_h = val_features.to(device, torch.float32).unsqueeze(0).expand(size, -1, -1)
    val_y = val_labels.to(device)
    fitted = [FittedStageTwoHead(h, eval_seed=seed, device=device, best_epoch=first.epochs - 1)
              for h, (_, seed) in zip(heads, members, strict=True)]
    best_loss = [math.inf] * size
    best_state: list[list[torch.Tensor] | None] = [None] * size
    failures: dict[int, FloatingPointError] = {}
    n = features.shape[0]
    for epoch in range(first.epochs):
        progress.record("stage2", epoch)
        stack.train()
        order = torch.stack([torch.randperm(n, generator=g) for g in generators]).to(device)
        sums = torch.zeros(size, 3, dtype=torch.float64, device=device)  # loss·B, correct, confidence
        for idx in order.split(first.batch_size, dim=1):
            y = labels[idx]
            logits = stack(features[idx])
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(size, -1).mean(1)
            optimizer.zero_grad(set_to_none=True)
            loss.sum().backward()
            optimizer.step()
            with torch.no_grad():
                confidences, predictions = logits.detach().softmax(2).max(2)
                sums += torch.stack([loss.detach().double() * y.shape[1], (predictions == y).sum(1).double(),
                                     confidences.sum(1).double()], dim=1)
        total_loss, correct, confidence = sums.T.tolist()
        stack.eval()
        with torch.no_grad():
            val_probs = stack(val_h).double().softmax(2)
        for k, ((params, _), member) in enumerate(zip(members, fitted, strict=True)):
            if k in failures:
                continue
            if not math.isfinite(total_loss[k]):
                failures[k] = FloatingPointError(f"Stage-II training loss became {total_loss[k]} at epoch {epoch}.")
                failures[k].epoch = epoch  # type: ignore[attr-defined]
                continue
            val_loss = _nll(val_probs[k], val_y)
            member.history.append({
                "stage": "stage2", "epoch": epoch, "lr": params.lr, "train_loss": total_loss[k] / n,
                "train_accuracy": correct[k] / n, "train_confidence": confidence[k] / n,
                "val_accuracy": float((val_probs[k].argmax(1) == val_y).double().mean()), "val_loss": val_loss,
            })
            if params.checkpoint == "best_val_loss" and val_loss < best_loss[k]:
                best_loss[k], member.best_epoch = val_loss, epoch
                best_state[k] = [t[k].detach().clone() for t in (*stack.weights, *stack.biases)]
        if len(failures) == size:
            break
    for k, member in enumerate(fitted):
        stack.copy_member_into(k, _tst_layers(member.head))
        if best_state[k] is not None:
            depth = len(stack.weights)
            with torch.no_grad():
                for i, layer in enumerate(_tst_layers(member.head)):
                    layer.weight.copy_(best_state[k][i])
                    layer.bias.copy_(best_state[k][depth + i])
        member.head.to(device)
    return [failures.get(k, member) for k, member in enumerate(fitted)]


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


def run_tst_population(
    params: Sequence[TSTConfig], artifact: Stage1Artifact, *, seeds: Sequence[int], device: torch.device
) -> list[MethodOutcome | BaseException]:
    """TST's Stage II of several configs sharing :func:`population_key`, trained together on the artifact."""
    train, val = artifact.splits["train"], artifact.splits["val"]
    fitted = fit_tst_population(list(zip(params, seeds, strict=True)), train.features, train.labels,
                                val.features, val.labels, num_classes=artifact.num_classes, device=device)
    return [f if isinstance(f, BaseException) else guarded(MethodOutcome.from_predictor, f.predict, artifact, f.history)
            for f in fitted]


METHODS.register("tst")(MethodSpec(TSTConfig, run_tst, "TST: new d→3Z→Z→C head retrained on frozen features",
                                   run_population=run_tst_population, population_key=population_key))
