"""The flags every study shares and the parser of a study script; the defaults a preset decides are listed
per preset in ``--help``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from calib._config import field_types
from calib._help import CommandParser, HelpFormatter
from calib.config import Stage1Config
from calib.methods import METHODS
from calib.plugins import use_plugin
from calib.report.figure_options import add_figure_args, figure_options_of, use_figure_options
from calib.report.significance import PAIRED_TESTS
from calib.run.execution import DEFAULT_CONFIGS_PER_TRIAL
from calib.study.presets import PRESETS, Preset
from calib.study.sources import DEFAULT_CALIBRATION_FRACTION, DEFAULT_SPLITS

__all__ = [
    "StudyParser",
    "add_common_args",
    "add_own_model_args",
    "add_predictions_args",
    "add_set_args",
    "add_table_args",
    "study_parser",
]


def study_parser(description: str | None, *, study: str | None, study_default: str | None = None,
                 figures: bool = False) -> argparse.ArgumentParser:
    """The argument parser of a study script: its docstring as description, the common flags, and with
    ``figures`` (a study that draws) ``--format``, ``--dpi`` and ``--figure-width``, in use once parsed.
    ``study_default`` describes the study name when ``study`` is None (derived from other flags)."""
    parser = StudyParser(description=description, formatter_class=HelpFormatter)
    add_common_args(parser, study=study, study_default=study_default)
    if figures:
        add_figure_args(parser)
    return parser


class StudyParser(CommandParser):
    """A study's parser: it imports the ``--plugin`` modules of the command line before it reads any other flag, so
    the methods, losses and datasets they register are valid in every flag and listed in ``--help``, wherever
    ``--plugin`` stands on the command line; a bad flag is one ``error:`` line and exit 2. The figure flags, where
    the study has them, are in use once parsed (:func:`~calib.report.figure_options.use_figure_options`)."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        for i, arg in enumerate(argv):
            if arg == "--plugin" and i + 1 < len(argv):
                use_plugin(argv[i + 1])
            elif arg.startswith("--plugin="):
                use_plugin(arg.removeprefix("--plugin="))
        args, rest = super().parse_known_args(argv, namespace)
        if hasattr(args, "figure_format"):
            use_figure_options(figure_options_of(args))
        return args, rest


def _per_preset(value_of: Callable[[Preset], object]) -> str:
    """``"quick: 60; paper: 350"`` (or the one value when every preset agrees), for ``--help``."""
    values = {name: value_of(PRESETS.get(name)) for name in PRESETS.names()}
    shown = {name: f"{v:g}" if isinstance(v, float) else str(v) for name, v in values.items()}
    if len(set(shown.values())) == 1:
        return next(iter(shown.values()))
    return "; ".join(f"{name}: {text}" for name, text in shown.items())


def _words(values: Sequence[object]) -> str:
    return " ".join(map(str, values))


def _archs_of(preset: Preset) -> str:
    special = [f"{d}: {_words(a)}" for d, a in preset.dataset_archs.items()]
    return _words(preset.archs) + (f" ({', '.join(special)})" if special else "")


def _epochs_of(preset: Preset) -> str:
    epochs = preset.stage1.get("epochs", Stage1Config.epochs)
    special = [f"{d}: {s['epochs']}" for d, s in preset.dataset_stage1.items() if "epochs" in s]
    return f"{epochs}" + (f" ({', '.join(special)})" if special else "")


def _stage2_epochs_of(preset: Preset) -> str:
    if "epochs" in preset.stage2:
        return str(preset.stage2["epochs"])
    defaults = sorted({METHODS.get(name).config.epochs for name in METHODS.names()
                       if "epochs" in field_types(METHODS.get(name).config)})
    return "/".join(map(str, defaults)) + " (the method's own)"


def _resource_of(name: str, fallback: str | None = None) -> Callable[[Preset], object]:
    def value_of(preset: Preset) -> object:
        value = getattr(preset, name)
        value = getattr(preset, fallback) if value is None and fallback else value
        return f"{value} (0 without a GPU)" if name.startswith("gpus") and preset.gpus_if_available else value
    return value_of


def add_common_args(parser: argparse.ArgumentParser, *, study: str | None, study_default: str | None = None) -> None:
    """Flags every study shares: preset, paths, seeds, and where/how trials run. Defaults that the
    preset decides are listed per preset in ``--help``."""
    parser.add_argument("--preset", default="quick", choices=PRESETS.names(),
                        help="study setup: quick = offline CPU minutes; medium = real images (Fashion-MNIST × "
                             "ResNet-20), GPU minutes; full-cpu = all of Fashion-MNIST × LeNet-5, CPU minutes per "
                             "Stage I; paper = the papers' protocol on GPUs")
    parser.add_argument("--study", default=study, help="study name: the store partition (study=<name>)"
                        + (f" (default: {study_default})" if study_default else ""))
    parser.add_argument("--store", default="results", help="result-store directory or s3:// URI")
    parser.add_argument("--artifacts", default=None,
                        help="Stage-I artifact directory or s3:// URI (default: <store>/artifacts)")
    parser.add_argument("--data-root", default="data", help="directory holding the datasets")
    parser.add_argument("--download", action="store_true", help="download missing datasets into --data-root")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help=f"seeds (default: {_per_preset(lambda p: _words(p.seeds_of(study)))})")
    parser.set_defaults(script_study=study)  # the study the script declares: its preset's seeds (Preset.seeds_of)
    parser.add_argument("--datasets", nargs="+", default=None,
                        help=f"datasets (default: {_per_preset(lambda p: _words(p.datasets))})")
    parser.add_argument("--archs", "--arch", nargs="+", default=None,
                        help=f"architectures, applied to every dataset (default: {_per_preset(_archs_of)})")
    parser.add_argument("--device", default=None,
                        help=f"auto, cpu, cuda or cuda:N (default: {_per_preset(lambda p: p.device)})")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join ('auto' or host:port) (default: start Ray on this machine)")
    for name, fallback, what in (
            ("cpus_per_trial", None, "CPUs of a trial that trains its Stage I"),
            ("gpus_per_trial", None, "GPUs of a trial that trains its Stage I, fractions allowed"),
            ("cpus_per_cached_trial", "cpus_per_trial", "CPUs of a trial whose Stage I is already trained"),
            ("gpus_per_cached_trial", "gpus_per_trial",
             "GPUs of a trial whose Stage I is already trained, fractions allowed")):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=None,
                            help=f"{what} (default: {_per_preset(_resource_of(name, fallback))})")
    parser.add_argument("--max-failures", type=int, default=0,
                        help="retries of a failed trial; a trial training Stage I resumes from its last checkpoint")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help=f"Stage-I epochs between the checkpoints a retry resumes from (default: "
                             f"{_per_preset(lambda p: p.checkpoint_every)})")
    parser.add_argument("--checkpoint-min-seconds", type=float, default=60.0,
                        help="least seconds between two Stage-I checkpoints of a trial; 0 checkpoints every "
                             "--checkpoint-every epochs however fast they are")
    parser.add_argument("--storage", default=None,
                        help="Ray Tune's experiment storage, a path or s3:// URI (default: <store>/_ray)")
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="cap on trials running at once (default: as many as the resources allow)")
    parser.add_argument("--configs-per-trial", type=int, default=None,
                        help=f"trials on an already trained Stage I that one Ray trial runs, their Stage II "
                             f"trained together as one population; 1 runs each alone (default: "
                             f"{DEFAULT_CONFIGS_PER_TRIAL}, and 1 in a search whose space changes Stage I)")
    parser.add_argument("--check-only", action="store_true",
                        help="check the command (names, values, datasets, the store and the study's fixed config) "
                             "and say how many trials would run, without starting Ray; resources are checked "
                             "against the cluster when the study runs there (python -m calib.cluster slurm does this "
                             "before it submits)")
    parser.add_argument("--compact-every", type=int, default=1000, metavar="N",
                        help="compact the study's result store in the background every N finished trials (its "
                             "rows moved from one file per trial into a few large Parquet files), and once when "
                             "the run ends; 0: only at the end")
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"Stage-I epochs, every dataset (default: {_per_preset(_epochs_of)})")
    parser.add_argument("--train-size", type=int, default=None,
                        help="Stage I trains on a stratified sample of this many training images, the same for "
                             "every seed (default: the whole training split)")
    parser.add_argument("--stage2-epochs", type=int, default=None,
                        help=f"Stage-II epochs of two-stage methods (default: {_per_preset(_stage2_epochs_of)})")
    parser.add_argument("--log-to", action="append", default=[], choices=["mlflow", "tensorboard", "wandb"],
                        help="also log the study to this tracker (repeatable): a parent per study, a child run per "
                             "trial; where to comes from MLFLOW_TRACKING_URI, WANDB_MODE/WANDB_PROJECT, "
                             "CALIB_TENSORBOARD_DIR (default <store>/tensorboard)")
    parser.add_argument("--keep-predictions", default=None, choices=["on", "float32", "float16", "off"],
                        help="keep each trial's val and test probabilities in the store, for `python -m calib.store "
                             "rescore` and the report's bootstrap: on = float64, as the metrics were computed; "
                             "float32 / float16 round them (bounds: docs/how-to/result-store.md); the settings line "
                             f"says the size (default: {_per_preset(lambda p: p.keep_predictions)})")
    add_set_args(parser)
    add_own_model_args(parser)


def add_table_args(parser: argparse.ArgumentParser) -> None:
    """``--control`` and ``--test`` of a study that prints a table with ▲ / ▼ (calib.report.policy: the same markers
    ``report.py`` gives on the same store)."""
    parser.add_argument("--control", default=None, metavar="LABEL",
                        help="the row the table's ▲ / ▼ compare against (default: the study's own: its TS row, an "
                             "ablation's first rung, a confirm table's default row)")
    parser.add_argument("--test", default="t-test", choices=PAIRED_TESTS,
                        help="the paired test over seeds where a setup has >= 3 seeds (fewer: a bootstrap over seeds "
                             "and kept test predictions)")


def add_set_args(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (any trial-config field, repeatable) and ``--stage2-seeds`` (Stage II's own seeds):
    :mod:`calib.study.settings` applies them to the study's trial configs."""
    group = parser.add_argument_group("any trial-config field (docs/studies/index.md#set-any-config-field)")
    group.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="set a trial-config field on every trial of the run, after the preset, the other flags "
                            "and the study's rows: stage1.FIELD, method.FIELD (the trials whose method has it), "
                            "loss.FIELD (likewise), METHOD.FIELD (the trials of that registered method alone, e.g. "
                            "histogram_binning_equal_mass.num_bins=10), or a top-level field such as num_bins, "
                            "cifar100_test_norm, stage2_seed; the value is typed and checked against the field (e.g. "
                            "stage1.scheduler_step=epoch_start, method.accuracy_weight=0.9, "
                            "stage1.milestones=[20,40]); "
                            "repeatable (default: none)")
    group.add_argument("--stage2-seeds", type=int, nargs="+", default=None, metavar="S",
                       help="run every trial once per Stage-II seed S: the method's random draws (MaC-Cal's masks, "
                            "the heads' initialisation and minibatch order, a random post-hoc fit) use S while Stage I "
                            "keeps its --seeds seed, so each Stage I is trained once (default: each trial's seed)")


class _LoadPlugin(argparse.Action):
    """``--plugin NAME``: imported as soon as it is parsed, so its names are valid in every other flag."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        use_plugin(str(values))
        getattr(namespace, self.dest).append(str(values))


def add_predictions_args(parser: argparse.ArgumentParser) -> None:
    """``--predictions FILE [FILE ...]``, ``--splits``, ``--calibration-fraction``: post-hoc calibration of given
    predictions (the studies that run only post-hoc methods: posthoc.py, calibrate.py)."""
    group = parser.add_argument_group("a model's predictions (calibrated by the post-hoc methods)")
    group.add_argument("--predictions", nargs="+", default=None, metavar="FILE",
                       help="files of a model's predictions and labels: .npz (netcal's predictions and ground_truth, "
                            "or logits/probs and labels), a .npy pair written PREDICTIONS.npy,LABELS.npy, or "
                            ".parquet with a labels column; logits or probabilities (detected); one setup per file, "
                            "named by its stem")
    group.add_argument("--splits", type=int, default=None, metavar="R",
                       help=f"random stratified calibration/test splits of each file, seeded 0..R-1 (default: "
                            f"{DEFAULT_SPLITS}; --seeds names the splits instead)")
    group.add_argument("--calibration-fraction", type=float, default=None, metavar="F",
                       help=f"the share of each file in a split's calibration part, in (0, 1) (default: "
                            f"{DEFAULT_CALIBRATION_FRACTION:g}); the rest is the test split")


def add_own_model_args(parser: argparse.ArgumentParser) -> None:
    """Flags for a user's model, data and code (docs/how-to/own-model.md)."""
    own = parser.add_argument_group("your own model, data and code")
    own.add_argument("--checkpoint", default=None, metavar="FILE",
                     help="Stage I from this trained model's weights (a path or s3:// URI; a state_dict) instead of "
                          "training: --archs names its architecture (calib's, torchvision:NAME or timm:NAME), "
                          "--datasets its data; loss-based rows do not apply")
    own.add_argument("--head", default=None, metavar="MODULE",
                     help="the checkpoint architecture's final linear layer (e.g. fc, classifier.3) where it is not "
                          "found automatically")
    own.add_argument("--features", default=None, metavar="FILE",
                     help="Stage I from a file of precomputed features, labels and the final linear layer or the "
                          "logits (.pt or .npz, docs/extending.md): no model, no dataset")
    own.add_argument("--features-name", default=None, metavar="NAME",
                     help="the dataset name of --features in the store and tables (default: the file's stem)")
    own.add_argument("--image-size", type=int, default=None,
                     help="imagefolder: side of the square crop the model sees (default: the images' own size)")
    own.add_argument("--resize", type=int, default=None,
                     help="imagefolder: resize the shorter side to this before cropping (default: --image-size)")
    own.add_argument("--mean", type=float, nargs="+", default=None,
                     help="imagefolder: per-channel normalisation mean (default: computed from the training images)")
    own.add_argument("--std", type=float, nargs="+", default=None,
                     help="imagefolder: per-channel normalisation std (default: computed from the training images)")
    own.add_argument("--val-fraction", type=float, default=None,
                     help="imagefolder without val/: the stratified share of train/ held out for validation "
                          "(default: 0.1)")
    own.add_argument("--plugin", action=_LoadPlugin, default=[], metavar="MODULE",
                     help="import this module (a dotted name or a .py file) on the driver and every Ray worker: "
                          "the datasets, models, losses and methods it registers become valid names; repeatable")
