"""Stage I: train backbone and linear head jointly with SGD (docs/methods.md §7.2), with the training procedures
its config turns on (Mixup, MIT, PLP, BalCAL, a plugin's: :mod:`calib.training.procedures`) called at their hooks."""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from calib import progress
from calib.config import TrialConfig
from calib.datasets import DatasetSplits, TensorSplit
from calib.losses import LOSSES, TrainingStateLoss
from calib.metrics import expected_calibration_error, softmax64
from calib.models import CalibModel, create_model
from calib.training.batches import DeviceBatches, LoaderBatches, eval_batches, resolve_pipeline
from calib.training.compile import CUDA_GRAPH_MODES, enable_compile_caches, resolve_compile_mode
from calib.training.device import autocast, configure_backend, seed_everything
from calib.training.procedures import BatchStep, ProcedureSetup, TrainingProcedure

__all__ = ["EXTRACT_BATCH_SIZE", "Stage1Training", "precision_of", "predict", "prepare_model", "train_stage1"]


@dataclass
class Stage1Training:
    """A trained Stage-I model with its per-epoch history, training wall time and throughput, and how
    it ran.

    ``images_per_second`` counts training images (each mixed image once) over the time spent in
    training steps, validation and compilation excluded. ``pipeline`` is "device" or "loader",
    ``precision`` "fp32", "bf16" or "fp16", ``compile_mode`` the ``torch.compile`` mode or "off";
    ``compile_seconds`` is the time compilation added to the first epoch's steps;
    ``peak_memory_bytes`` the peak GPU memory allocated by this training (None on the CPU).
    """

    model: CalibModel
    history: list[dict[str, Any]] = field(default_factory=list)
    train_seconds: float = 0.0
    images_per_second: float = 0.0
    best_epoch: int = -1
    pipeline: str = "loader"
    precision: str = "fp32"
    compile_mode: str = "off"
    compile_seconds: float = 0.0
    peak_memory_bytes: int | None = None


EXTRACT_BATCH_SIZE = {"cuda": 1024, "cpu": 512}
"""Batch size of feature extraction (no gradients, so larger than training's) by device type."""


def precision_of(device: torch.device, amp: str) -> str:
    """The precision a forward pass runs in: ``amp`` on CUDA ("fp16", "bf16"), "fp32" otherwise."""
    return amp if device.type == "cuda" and amp != "off" else "fp32"


@torch.inference_mode()
def predict(
    model: CalibModel, source: Dataset | TensorSplit, device: torch.device, *, batch_size: int | None = None,
    num_workers: int | None = 0, amp: str = "off", channels_last: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features, logits and labels of ``source`` (a Dataset, or a split's tensors) in eval mode and
    inference mode, as float32/int64 CPU tensors; forward passes under ``amp`` autocast on CUDA, in
    batches of :data:`EXTRACT_BATCH_SIZE` unless ``batch_size`` is given."""
    model.eval()
    batch_size = batch_size or EXTRACT_BATCH_SIZE.get(device.type, 512)
    feats, logits, labels = [], [], []
    for x, y in eval_batches(source, device, batch_size=batch_size, num_workers=num_workers,
                             channels_last=channels_last and device.type == "cuda"):
        with autocast(device, amp):
            h = model.features(x)
            z = model.head(h)
        feats.append(h.float().cpu())
        logits.append(z.float().cpu())
        labels.append(y)
    return torch.cat(feats), torch.cat(logits), torch.cat(labels).long()


def prepare_model(model: CalibModel, device: torch.device, channels_last: bool) -> CalibModel:
    """``model`` on ``device``, in channels_last memory format on CUDA when asked (NHWC convolutions)."""
    model = model.to(device)
    if channels_last and device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return model


def _compiled_forward(model: CalibModel, mode: str, batch_size: int
                      ) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """``x -> (features, logits)``, compiled with ``torch.compile(mode=mode)`` unless ``mode`` is "off".

    Only full batches of ``batch_size`` run the compiled graph; a shorter one (an epoch's last) runs eagerly.
    Compiling a second graph for it took as long as the first (22 s for ResNet-20, 89-94 s for ResNet-110 on
    an H200: the GPU sat idle at the end of the first epoch) and made the next full batches re-record their
    CUDA graphs; one eager step per epoch costs milliseconds.
    """

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = model.features(x)
        return features, model.head(features)

    if mode == "off":
        return forward
    enable_compile_caches()
    compiled = torch.compile(forward, mode=mode)

    def full_batches_compiled(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return compiled(x) if x.shape[0] == batch_size else forward(x)

    return full_batches_compiled


def _excess_seconds(step_seconds: list[float]) -> float:
    """Time the slow steps of an epoch took beyond its median step: what compiling (and recording CUDA
    graphs) added."""
    if not step_seconds:
        return 0.0
    typical = float(np.median(step_seconds))
    return float(sum(max(0.0, t - typical) for t in step_seconds))


@dataclass
class _Stage1Run:
    """What one Stage-I training carries from epoch to epoch: the model, its loss, optimiser, schedule
    and loss scaler, the data-order generator, the training procedures that are on (by name; ``batch_procedure``
    the one that computes the batch loss, if any), the batches, the (compiled) forward pass, and the best-so-far
    and throughput counters that a checkpoint saves with them."""

    cfg: TrialConfig
    device: torch.device
    model: CalibModel
    loss_fn: nn.Module
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.MultiStepLR
    generator: torch.Generator
    procedures: dict[str, TrainingProcedure]
    pipeline: str
    batches: DeviceBatches | LoaderBatches
    val_source: Dataset | TensorSplit
    channels_last: bool
    compile_mode: str
    forward: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    cuda_graphs: bool
    scaler: torch.amp.GradScaler
    indexed: bool = False
    batch_procedure: TrainingProcedure | None = None
    best_state: dict[str, torch.Tensor] | None = None
    best_val: float = -1.0
    step_seconds: float = 0.0
    images: int = 0


def _start_run(cfg: TrialConfig, data: DatasetSplits, device: torch.device) -> _Stage1Run:
    """Seed everything and build the model, loss, optimiser, schedule, generators, batches and forward pass
    (in this order: the model's initialisation draws from the seeded global generator)."""
    s1 = cfg.stage1
    seed_everything(cfg.seed)
    configure_backend(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    channels_last = s1.channels_last and device.type == "cuda"
    model = create_model(cfg.arch, num_classes=data.num_classes, in_channels=data.input_shape[0])
    setup = ProcedureSetup(arch=cfg.arch, epochs=s1.epochs, seed=cfg.seed)
    procedures = {name: spec.procedure(s1.procedures[name], setup) for name, spec in s1.on()}
    for procedure in procedures.values():
        model = procedure.wrap_model(model)
    model = prepare_model(model, device, channels_last)
    loss_fn = LOSSES.get(cfg.loss.name).create(
        cfg.loss.params, num_classes=data.num_classes, reduction=s1.loss_reduction
    ).to(device)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(
        params + list(loss_fn.parameters()), lr=s1.lr, momentum=s1.momentum, weight_decay=s1.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(s1.milestones), gamma=s1.lr_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    pipeline = resolve_pipeline(s1.data_pipeline, data, device)
    if pipeline == "device":
        augment_generator = torch.Generator().manual_seed(cfg.seed + 1_000_003)  # independent of the order
        batches: DeviceBatches | LoaderBatches = DeviceBatches(data, s1.batch_size, generator, device,
                                                               augment_generator, channels_last, augment=s1.augment)
    else:
        batches = LoaderBatches(data.train if s1.augment else data.train_eval, s1.batch_size, generator, device,
                                cfg.num_workers, channels_last)
    if isinstance(loss_fn, TrainingStateLoss):
        loss_fn.start_training(batches.num_samples)
    val_source = data.tensors.val if pipeline == "device" and data.tensors is not None else data.val
    compile_mode = resolve_compile_mode(s1.compile, cfg.arch, device)
    forward = _compiled_forward(model, compile_mode, s1.batch_size)
    # fp16 needs loss scaling; bf16 has float32's range. A disabled scaler is a no-op (CPU, off, bf16).
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda" and s1.amp == "fp16")
    for procedure in procedures.values():
        procedure.start(model)
    batch_procedure = next((procedures[name] for name, spec in s1.on() if spec.computes_batch_loss), None)
    return _Stage1Run(cfg, device, model, loss_fn, params, optimizer, scheduler, generator, procedures, pipeline,
                      batches, val_source, channels_last, compile_mode, forward, compile_mode in CUDA_GRAPH_MODES,
                      scaler, isinstance(loss_fn, TrainingStateLoss) and loss_fn.needs_sample_indices, batch_procedure)


def _resume(run: _Stage1Run, resume: dict[str, Any], result: Stage1Training) -> int:
    """Load a checkpoint's state (:func:`_checkpoint_state`) into ``run`` and ``result``; the epoch to go on at."""
    run.model.load_state_dict(resume["model"])
    run.loss_fn.load_state_dict(resume["loss_fn"])
    run.optimizer.load_state_dict(resume["optimizer"])
    run.scheduler.load_state_dict(resume["scheduler"])
    run.scaler.load_state_dict(resume["scaler"])
    run.generator.set_state(resume["generator"])
    run.batches.load_state_dict(resume.get("batches", {}))
    # a checkpoint of calib before the procedures' registry holds only Mixup's (and MIT's) generator, "mixup_rng"
    states = resume["procedures"] if "procedures" in resume else {name: {"rng": resume["mixup_rng"]}
                                                                  for name in run.procedures}
    for name, procedure in run.procedures.items():
        procedure.load_state_dict(states.get(name, {}))
    torch.set_rng_state(resume["torch_rng"])
    result.history = list(resume["history"])
    run.best_state, run.best_val, result.best_epoch = resume["best_state"], resume["best_val"], resume["best_epoch"]
    run.step_seconds, run.images = resume["step_seconds"], resume["images"]
    return resume["epoch"] + 1


def _checkpoint_state(run: _Stage1Run, epoch: int, result: Stage1Training) -> dict[str, Any]:
    """Everything needed to continue after ``epoch``: what ``on_checkpoint`` receives and ``resume`` takes."""
    return {
        "epoch": epoch, "model": run.model.state_dict(), "loss_fn": run.loss_fn.state_dict(),
        "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(), "generator": run.generator.get_state(),
        "batches": run.batches.state_dict(),
        "procedures": {name: procedure.state_dict() for name, procedure in run.procedures.items()},
        "torch_rng": torch.get_rng_state(),
        "history": result.history, "best_state": run.best_state, "best_val": run.best_val,
        "best_epoch": result.best_epoch, "step_seconds": run.step_seconds, "images": run.images,
    }


def _batch_loss(run: _Stage1Run, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of one minibatch (by the procedure that computes it, or as it is) and the logits it is scored by.
    A loss that needs the samples' positions gets ``indices=index``."""
    step = BatchStep(x, y, index, run.loss_fn, run.forward, run.generator, run.device, run.cfg.stage1.amp,
                     run.indexed, run.cuda_graphs)
    return (run.batch_procedure or _PLAIN).batch_loss(step)


_PLAIN = TrainingProcedure(None, ProcedureSetup(arch="", epochs=0, seed=0))
"""The batch loss without a procedure: the model's outputs of the batch scored by the loss."""


def _train_epoch(run: _Stage1Run, timed_steps: list[float] | None) -> tuple[float, float, float, int]:
    """One pass over the training batches, a step each: the sums of loss, correct and confidence, and the
    images seen. ``timed_steps`` (a compiled run's first epoch) gets each step's seconds."""
    s1, device = run.cfg.stage1, run.device
    # Running sums stay on the device: one host sync per epoch instead of three per step.
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, correct, confidence
    seen = 0
    for x, y, index in run.batches.indexed():
        step_start = time.perf_counter()
        if run.cuda_graphs:  # a new training step: earlier graph outputs may be overwritten from here on
            torch.compiler.cudagraph_mark_step_begin()
        loss, logits = _batch_loss(run, x, y, index)
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()
        if s1.grad_clip is not None:
            run.scaler.unscale_(run.optimizer)
            nn.utils.clip_grad_norm_(run.params, s1.grad_clip)
        run.scaler.step(run.optimizer)
        run.scaler.update()
        with torch.no_grad():
            probs = logits.detach().softmax(dim=1)
            batch = y.shape[0]
            confidence, predicted = probs.max(1)
            sums += torch.stack([
                loss.detach().double() * (1 if s1.loss_reduction == "sum" else batch),
                (predicted == y).sum().double(),  # against the unpermuted label, as BALCAL-R
                confidence.sum().double(),
            ])
            seen += batch
        if timed_steps is not None:
            torch.cuda.synchronize(device)
            timed_steps.append(time.perf_counter() - step_start)
    total_loss, correct, confidence_sum = sums.tolist()  # waits for the device
    return total_loss, correct, confidence_sum, seen


def _validate(run: _Stage1Run, epoch: int) -> tuple[float, float]:
    """Validation accuracy and ECE of the model after ``epoch``; a loss that learns from the validation split
    (:class:`~calib.losses.TrainingStateLoss`: AdaFocal) sees its logits."""
    cfg = run.cfg
    _, val_logits, val_labels = predict(run.model, run.val_source, run.device, num_workers=cfg.num_workers,
                                        amp=cfg.stage1.amp, channels_last=run.channels_last)
    if not torch.isfinite(val_logits).all():
        raise FloatingPointError(f"Stage-I validation logits became non-finite at epoch {epoch}.")
    if isinstance(run.loss_fn, TrainingStateLoss):
        run.loss_fn.observe_validation(val_logits.to(run.device), val_labels.to(run.device))
    val_probs = softmax64(val_logits)
    val_acc = float((val_probs.argmax(1) == val_labels.numpy()).mean())
    return val_acc, expected_calibration_error(val_probs, val_labels.numpy(), num_bins=cfg.num_bins)


def train_stage1(
    cfg: TrialConfig,
    data: DatasetSplits,
    device: torch.device,
    *,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
    resume: dict[str, Any] | None = None,
) -> Stage1Training:
    """Train ``cfg.arch`` on ``data.train`` with ``cfg.loss`` under ``cfg.stage1``; seeded by ``cfg.seed``.

    ``on_checkpoint(state)`` receives, after every epoch, everything needed to continue the run
    (weights, optimiser, schedule, scaler, loss state, the data-order and augmentation generators, the training
    procedures' states such as Mixup's generator, history, best-so-far); ``resume=state`` continues from it and
    gives the same model as an uninterrupted run.
    """
    s1 = cfg.stage1
    run = _start_run(cfg, data, device)
    model = run.model
    result = Stage1Training(model=model, pipeline=run.pipeline, precision=precision_of(device, s1.amp),
                            compile_mode=run.compile_mode)
    start = time.perf_counter()
    first_epoch = 0 if resume is None else _resume(run, resume, result)
    for epoch in range(first_epoch, s1.epochs):
        progress.record("stage1", epoch)
        if s1.scheduler_step == "epoch_start":  # FOCAL-R: at epoch e the schedule is already at e + 1
            with warnings.catch_warnings():  # stepping before the first optimizer step is the point here
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
                run.scheduler.step()
        model.train()
        run.loss_fn.train()
        for procedure in run.procedures.values():
            procedure.start_epoch(epoch)
        lr = run.optimizer.param_groups[0]["lr"]
        # The first epoch of a compiled run times each step (one sync per step) to tell compiling apart.
        timed_steps: list[float] | None = [] if run.compile_mode != "off" and epoch == first_epoch else None
        epoch_start = time.perf_counter()
        total_loss, correct, confidence_sum, seen = _train_epoch(run, timed_steps)
        if not np.isfinite(total_loss):
            raise FloatingPointError(f"Stage-I training loss became {total_loss / seen} at epoch {epoch}.")
        epoch_seconds = time.perf_counter() - epoch_start
        if timed_steps is not None:
            result.compile_seconds = _excess_seconds(timed_steps)
            epoch_seconds -= result.compile_seconds
        run.step_seconds += epoch_seconds
        run.images += seen
        if isinstance(run.loss_fn, TrainingStateLoss):
            run.loss_fn.end_epoch(epoch)
        for procedure in run.procedures.values():
            procedure.end_epoch(epoch)
        if s1.scheduler_step == "epoch_end":
            run.scheduler.step()
        val_acc, val_ece = _validate(run, epoch)
        row = {
            "stage": "stage1", "epoch": epoch, "lr": lr,
            "train_loss": total_loss / seen, "train_accuracy": correct / seen,
            "train_confidence": confidence_sum / seen, "val_accuracy": val_acc, "val_ece": val_ece,
        }
        result.history.append(row)
        if on_epoch is not None:
            on_epoch(row)
        if s1.checkpoint == "best_val" and val_acc > run.best_val:
            run.best_val, run.best_state, result.best_epoch = val_acc, copy.deepcopy(model.state_dict()), epoch
        if on_checkpoint is not None:
            on_checkpoint(_checkpoint_state(run, epoch, result))
    for procedure in run.procedures.values():
        procedure.end_training()
    result.train_seconds = time.perf_counter() - start
    result.images_per_second = run.images / run.step_seconds if run.step_seconds > 0 else 0.0
    if device.type == "cuda":
        result.peak_memory_bytes = int(torch.cuda.max_memory_allocated(device))
    if run.best_state is not None:
        model.load_state_dict(run.best_state)
    else:
        result.best_epoch = s1.epochs - 1
    model.eval()
    return result
