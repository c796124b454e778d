"""The typed columns of the result store, derived from the registries (docs/architecture.md contract 4).

``trials``: one row per trial. ``history``: one row per (trial, stage, epoch). Every registered
loss's and method's config field is a column (``loss_<field>``, ``method_<field>``), null where it
does not apply, so every file carries the same schema and readers never drop a column.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Literal, Union, get_args, get_origin

import pyarrow as pa

from calib._config import field_types
from calib.config import Stage1Config
from calib.losses import LOSSES
from calib.methods import METHODS
from calib.metrics import METRICS
from calib.registries import PROCEDURES

__all__ = ["HISTORY_COLUMNS", "SPLIT_METRICS", "history_schema", "trial_columns", "trial_schema"]

SPLIT_METRICS = [f"{split}_{name}" for split in ("val", "test") for name in METRICS]

IDENTITY = [
    ("trial_id", pa.string(), "hash of the trial config (without paths); the file name"),
    ("method", pa.string(), "registered method name"),
    ("dataset", pa.string(), "registered dataset name"),
    ("arch", pa.string(), "registered architecture name"),
    ("seed", pa.int64(), "trial seed: Stage I's and the data splits', and Stage II's unless stage2_seed differs"),
    ("stage2_seed", pa.int64(), "the seed of Stage II (the method's random draws: masks, head initialisation, "
                                "minibatch order, a random post-hoc fit); equal to seed unless a study set it "
                                "(--stage2-seeds, --set stage2_seed=N); null in rows stored before it existed "
                                "(their Stage II used seed)"),
    ("loss", pa.string(), "registered Stage-I loss name"),
    ("stage1_id", pa.string(), "hash of the Stage-I config: the artifact directory name"),
    ("cifar100_test_norm", pa.string(), "CIFAR-100 test normalisation: cifar, or focal_bug (FOCAL-R's ImageNet stats)"),
    ("source_kind", pa.string(),
     "where Stage I came from: train (calib trained it), checkpoint (a given model's weights), features (a "
     "given file of features) or predictions (a given file of predictions and labels; seed is then the index of "
     "the calibration/test split); dataset and arch of a file are the study's names for it"),
    ("source_path", pa.string(), "the checkpoint, features or predictions file (path or s3:// URI), null when trained"),
    ("source_sha256", pa.string(), "SHA-256 of that file: part of stage1_id, null when trained"),
    ("source_head", pa.string(), "the checkpoint architecture's final linear layer, when given with --head"),
    ("source_labels_path", pa.string(), "the labels .npy of a .npy pair of predictions, else null"),
    ("source_labels_sha256", pa.string(), "SHA-256 of that labels file: part of stage1_id, else null"),
    ("source_calibration_fraction", pa.float64(),
     "a predictions file's share of samples in each split's calibration part (the rest is the test split)"),
    ("dataset_options", pa.string(), "the dataset's options as JSON (imagefolder: image_size, resize, mean, std, "
                                     "val_fraction), null for a dataset without options"),
    ("plugins", pa.list_(pa.string()),
     "the plugins whose components (dataset, arch, loss, method, OOD sets) the trial used: \"<module> <version>\""),
]
PREDICTION_CHANGE = [
    ("test_argmax_changed", pa.float64(),
     "fraction of test samples whose predicted class (argmax) differs from the uncalibrated Stage-I model's (its test "
     "logits): 0 for a method that keeps the class"),
    ("test_accuracy_change", pa.float64(),
     "test accuracy minus the uncalibrated Stage-I model's (its test logits' argmax) on the same test split"),
]
OOD = [
    ("ood_datasets", pa.list_(pa.string()), "OOD sets the trial was evaluated against (empty: none)"),
    ("ood_auroc", pa.float64(), "MSP AUROC, in-distribution positive, mean over the OOD sets"),
    ("ood_fpr95", pa.float64(), "FPR of OOD samples at 95% TPR of in-distribution ones, mean over OOD sets"),
    ("ood_auroc_per_dataset", pa.list_(pa.float64()), "AUROC per OOD set, in the order of ood_datasets"),
    ("ood_fpr95_per_dataset", pa.list_(pa.float64()), "FPR95 per OOD set, in the order of ood_datasets"),
]
CORRUPTED = [
    ("corruptions", pa.list_(pa.string()), "corruptions the trial was evaluated under (empty: none)"),
    ("corrupted_ece", pa.float64(), "ECE on the corrupted test sets, mean over corruptions and severities"),
    ("corrupted_accuracy", pa.float64(), "accuracy on the corrupted test sets, mean over corruptions and severities"),
    ("corrupted_ece_by_severity", pa.list_(pa.float64()), "ECE per severity 1..5, mean over corruptions (Fig. 5)"),
    ("corrupted_accuracy_by_severity", pa.list_(pa.float64()), "accuracy per severity 1..5, mean over corruptions"),
    ("corrupted_ece_all", pa.list_(pa.float64()), "ECE per (corruption, severity), corruption-major"),
    ("corrupted_accuracy_all", pa.list_(pa.float64()), "accuracy per (corruption, severity), corruption-major"),
]
FIT = [
    ("fit_degenerate", pa.bool_(),
     "post-hoc methods: whether the calibrator's fit was degenerate (no finite optimum, a parameter held at a bound, "
     "a class without calibration samples, an unconverged fit: docs/methods.md §5.13); null for other methods"),
    ("fit_degenerate_reason", pa.string(), "why the fit was degenerate and what the calibrator returned (null if not)"),
    ("fitted_off_diagonal_weight", pa.float64(),
     "MS-ODIR, Dir-ODIR: the λ the fit used, chosen by 5-fold cross-validation where method_off_diagonal_weight is "
     "null (null for other methods)"),
    ("fitted_intercept_weight", pa.float64(),
     "MS-ODIR, Dir-ODIR: the μ the fit used, chosen by 5-fold cross-validation where method_intercept_weight is null"),
    ("cv_nll", pa.float64(),
     "MS-ODIR, Dir-ODIR: the mean held-out NLL (nats) of the cross-validated choice over the folds (null when both "
     "λ and μ were given)"),
    ("fitted_temperature", pa.float64(),
     "SMS, SVS: the temperature T of the temperature-scaling preprocessing, fitted on the calibration set"),
    ("fitted_mixture_weight", pa.float64(),
     "SMS, SVS: the preprocessing's Laplace-smoothing weight ε = 1/(n + 1) of the uniform distribution"),
    ("fitted_intercept_penalty", pa.float64(),
     "SMS, SVS: the ridge coefficient c_b = λ_b K^ρ / n^τ of the intercepts the fit used"),
    ("fitted_diagonal_penalty", pa.float64(),
     "SMS, SVS: the ridge coefficient c_v = λ_v K^ρ / n^τ of the diagonal deviations the fit used"),
    ("fitted_off_diagonal_penalty", pa.float64(),
     "SMS: the ridge coefficient c_M = λ_M (K(K−1))^ρ / n^τ of the off-diagonal entries the fit used (null for SVS)"),
    ("fitted_beta_a", pa.list_(pa.float64()),
     "Beta: the fitted a of each binary problem (class 1's at K = 2, else one per class in class order)"),
    ("fitted_beta_b", pa.list_(pa.float64()), "Beta: the fitted b of each binary problem, as fitted_beta_a"),
    ("fitted_beta_c", pa.list_(pa.float64()), "Beta: the fitted c of each binary problem, as fitted_beta_a"),
]
RUN = [
    ("label", pa.string(), "the study's name for this trial's variant (a table row), empty if none"),
    ("label_rank", pa.int64(), "position of the label in the study's table"),
    ("test_bin_count", pa.list_(pa.int64()), "test reliability diagram: samples per equal-width bin"),
    ("test_bin_confidence", pa.list_(pa.float64()), "test reliability diagram: mean confidence per bin"),
    ("test_bin_accuracy", pa.list_(pa.float64()), "test reliability diagram: accuracy per bin"),
    ("test_bin_accuracy_lower", pa.list_(pa.float64()),
     "test reliability diagram: lower end of the Clopper-Pearson 95% interval of each bin's accuracy (0 if empty)"),
    ("test_bin_accuracy_upper", pa.list_(pa.float64()),
     "test reliability diagram: upper end of the Clopper-Pearson 95% interval of each bin's accuracy (1 if empty)"),
    ("num_bins", pa.int64(), "bins of the binned calibration metrics"),
    ("status", pa.string(), "ok, failed, or pruned (a search's scheduler stopped it during Stage I)"),
    ("error", pa.string(), "the exception of a failed trial, null when ok"),
    ("failed_stage", pa.string(), "stage1 or stage2: where a failed trial stopped (null when ok)"),
    ("failed_epoch", pa.int64(), "the 0-based epoch of failed_stage a failed trial had reached (null when ok)"),
    ("pruned_epoch", pa.int64(),
     "the last 0-based Stage-I epoch a pruned trial completed; its val_ece / val_accuracy are the Stage-I "
     "model's there (null unless pruned)"),
    ("search_trial", pa.int64(),
     "the number of the Optuna trial of a search that ran this trial: a search with --replicates K stores K rows "
     "(K seeds × its setups) per Optuna trial, each with its number (null outside a search)"),
    ("population_size", pa.int64(),
     "how many configs trained their Stage II together with this one in one process (1: alone)"),
    ("stage1_resumed_from_epoch", pa.int64(),
     "when this trial continued an interrupted Stage-I training (a retry's checkpoint, or the handover state of a "
     "claim it took over): the 0-based epoch, as in history, of the last epoch that training had completed; it "
     "went on at the next one. The log's 'left at epoch N' counts completed epochs: N is this plus 1. Null when "
     "Stage I started from its first epoch or another trial trained it"),
    ("stage1_cache_hit", pa.bool_(), "false exactly when this trial trained Stage I itself"),
    ("stage1_writer", pa.string(),
     "the one training of stage1_id this trial used: the writer id (<host>-<pid>-<hex>) of its record.json"),
    ("stage1_train_seconds", pa.float64(), "wall time of the Stage-I training (whoever trained it)"),
    ("stage1_load_seconds", pa.float64(), "time this trial spent obtaining the Stage-I artifact"),
    ("method_seconds", pa.float64(), "wall time of the method (Stage II / post-hoc)"),
    ("eval_seconds", pa.float64(), "wall time of the metric computation"),
    ("total_seconds", pa.float64(), "wall time of run_trial"),
    ("stage1_images_per_second", pa.float64(),
     "Stage-I training throughput (images/s, validation excluded) of whoever trained it"),
    ("stage1_device", pa.string(), "device that trained Stage I (this trial's when stage1_cache_hit is false)"),
    ("stage1_pipeline", pa.string(), "where Stage I's batches came from: device (tensors on the GPU) or loader"),
    ("stage1_precision", pa.string(), "precision of Stage I's forward passes: fp32, bf16 or fp16"),
    ("stage1_compile_mode", pa.string(), "torch.compile mode of Stage I's training step, or off"),
    ("stage1_compile_seconds", pa.float64(),
     "time compiling added to Stage I's first epoch (excluded from stage1_images_per_second)"),
    ("stage1_peak_memory_bytes", pa.int64(), "peak GPU memory allocated by the Stage-I training (null on the CPU)"),
    ("started_at", pa.timestamp("ms", tz="UTC"), "trial start"),
    ("finished_at", pa.timestamp("ms", tz="UTC"), "trial end"),
    ("calib_version", pa.string(), "calib package version"),
    ("torch_version", pa.string(), "torch version"),
    ("git_commit", pa.string(), "git commit of the calib checkout, null outside git"),
    ("python_version", pa.string(), "Python version"),
    ("host", pa.string(), "host name of the worker"),
    ("device", pa.string(), "torch device the trial ran on, with the GPU model on CUDA"),
    ("cuda_visible_devices", pa.string(), "CUDA_VISIBLE_DEVICES the trial's process saw (Ray's GPU assignment)"),
    ("node_id", pa.string(), "Ray node id, null outside Ray"),
    ("config_json", pa.string(), "the full trial config as JSON (paths included)"),
    ("mlflow_run_id", pa.string(), "the trial's MLflow run (--log-to mlflow), a child of its study's run"),
    ("tensorboard_run", pa.string(), "the trial's TensorBoard run folder (--log-to tensorboard)"),
    ("wandb_run_id", pa.string(), "the trial's Weights & Biases run id (--log-to wandb), in its study's group"),
]
HISTORY_COLUMNS = [
    ("trial_id", pa.string(), "the trial"),
    ("method", pa.string(), "registered method name"),
    ("seed", pa.int64(), "trial seed"),
    ("stage", pa.string(), "stage1 or stage2"),
    ("epoch", pa.int64(), "0-based epoch"),
    ("lr", pa.float64(), "learning rate of the epoch"),
    ("train_loss", pa.float64(), "mean training loss of the epoch"),
    ("train_accuracy", pa.float64(), "training accuracy over the epoch's minibatches (Acc_t)"),
    ("train_confidence", pa.float64(), "mean max-softmax over the epoch's minibatches (Conf_t)"),
    ("val_accuracy", pa.float64(), "validation accuracy after the epoch"),
    ("val_ece", pa.float64(), "validation ECE after the epoch (Stage I)"),
    ("val_loss", pa.float64(), "validation NLL after the epoch (TST / V-TST checkpoint selection)"),
    ("update_accuracy", pa.float64(), "MaC-Cal Acc_t that the q update read (method.stats_source's images)"),
    ("update_confidence", pa.float64(), "MaC-Cal Conf_t that the q update read"),
    ("accuracy_weight", pa.float64(), "MaC-Cal γ of the q update (the estimate, under accuracy_weight_source "
                                      "'estimated')"),
    ("retention_prob", pa.float64(), "MaC-Cal q_t, the mask retention probability of the epoch"),
    ("clip_threshold", pa.float64(), "MaC-Cal θ_t, the clip of the q update after the epoch"),
]


def _arrow_type(tp: Any) -> pa.DataType:
    origin = get_origin(tp)
    if origin is Literal:
        return pa.string()
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        return _arrow_type(inner)
    if origin is tuple:
        return pa.list_(_arrow_type(get_args(tp)[0]))
    return {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}[tp]


def _section_columns(prefix: str, configs: list[type]) -> list[tuple[str, pa.DataType, str]]:
    columns: dict[str, pa.DataType] = {}
    for cls in configs:
        for name, tp in field_types(cls).items():
            column, arrow = f"{prefix}_{name}", _arrow_type(tp)
            if columns.setdefault(column, arrow) != arrow:
                raise TypeError(f"{cls.__name__}.{name} is {arrow}, but another config has {columns[column]}")
    return [(c, t, f"{prefix} hyperparameter") for c, t in columns.items()]


def trial_columns() -> list[tuple[str, pa.DataType, str]]:
    """(name, arrow type, description) of every ``trials`` column, in file order."""
    stage1 = [(f"stage1_{n}", _arrow_type(t), "Stage-I hyperparameter") for n, t in field_types(Stage1Config).items()]
    metrics = [(c, pa.float64(), f"{c.split('_', 1)[0]} split: {METRICS[c.split('_', 1)[1]].description}")
               for c in SPLIT_METRICS]
    return (IDENTITY + stage1
            + _section_columns("loss", [LOSSES.get(n).config for n in LOSSES.names()])
            + _section_columns("method", [METHODS.get(n).config for n in METHODS.names()])
            + metrics + PREDICTION_CHANGE + OOD + CORRUPTED + FIT + RUN)


def trial_schema() -> pa.Schema:
    """The ``trials`` schema of the losses, methods and training procedures registered now (plugins add columns)."""
    return _trial_schema(tuple(LOSSES.names()), tuple(METHODS.names()), tuple(PROCEDURES.names()))


@functools.lru_cache(maxsize=8)
def _trial_schema(losses: tuple[str, ...], methods: tuple[str, ...], procedures: tuple[str, ...]) -> pa.Schema:
    return pa.schema([pa.field(n, t, metadata={"description": d}) for n, t, d in trial_columns()])


@functools.cache
def history_schema() -> pa.Schema:
    return pa.schema([pa.field(n, t, metadata={"description": d}) for n, t, d in HISTORY_COLUMNS])

