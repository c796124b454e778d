"""How many calibration samples does each post-hoc method need? SMART's data-efficiency experiment.

Fits every post-hoc method (``--methods``) on validation subsets of ``--sizes`` samples (default 50,
100, 500, 1,000 and all of them), ``--draws`` uniform draws per size (a draw's smaller subsets are
nested in its larger ones), on the vanilla (CE) Stage I of each seed: by default only the preset's
first seed, so every fit reads one cached Stage I. Prints test ECE, SmoothECE, NLL, accuracy, its change
from the uncalibrated model and the share of changed predictions, the KS error and the calibration / refinement
split of NLL and Brier per method and size, mean ± 95% CI over draws (and seeds), and draws test ECE against the
calibration-set size. ``studies/report.py`` regenerates the table and the figure from the store.

Sizes above the validation split are an error when given with ``--sizes``; the default sizes that do
not fit a dataset (the digits' split has 269 images) are left out with one line. ``--set`` sets one method's
parameter, e.g. ``--set histogram_binning_equal_mass.num_bins=10``; ``--set method.num_bins=10`` sets it for every
method of the run that has the field (``--param``, its former name, still reads until calib 0.2).

``--predictions FILE [FILE ...]`` calibrates a model's predictions instead of a Stage I: one file of held-out
predictions and labels per setup (netcal's ``.npz`` records, ``logits``/``probs`` + ``labels``, a ``.npy`` pair
``PREDICTIONS.npy,LABELS.npy`` or Parquet; logits or probabilities, detected and said in one line), split as the
public benchmarks do: ``--splits`` (10) seeded, stratified random splits into a calibration and a test part
(``--calibration-fraction``, 0.5), each split × method a trial, the split index as its seed. ``--sizes`` then draws
from the calibration part (default: all of it).

``--synthetic-classes 100`` is the many-class regime of the paper preset (CIFAR-100: 100 classes, 5,000 validation
images) on a CPU: over-confident synthetic logits of 100 classes (:mod:`calib.datasets.synthetic_logits`: true
probabilities from Dirichlet(0.3), logits 2.5·log p + N(0, 0.5²) noise, labels drawn from p) with 5,000 validation
and 10,000 test samples, written once under ``<store>/synthetic/`` and calibrated as a features file
(``--synthetic-seed`` draws another data set). A fit that is degenerate (a class without calibration samples, no
finite optimum, ...) prints a warning line and is counted in the table's ``degenerate`` column.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from calib._config import ConfigError
from calib._deprecation import renamed_message, warn_renamed
from calib.artifacts.features_file import read_features_file
from calib.artifacts.sources import predictions_split
from calib.config import parse_trial_config
from calib.datasets import DATASETS
from calib.datasets.synthetic_logits import write_synthetic_logits
from calib.methods.vanilla import UNCALIBRATED_LABEL
from calib.report import mixed_trainings, report_step, to_markdown
from calib.report.build import CALIBRATION_SIZE_METRICS, calibration_size_summary, plot_calibration_sizes
from calib.run import CheckedOnly, run_grid
from calib.store import read_finished
from calib.study.declaration import declare_study
from calib.study.flags import add_predictions_args, study_parser
from calib.study.main import guarded_main, study_exit_code
from calib.study.paths import study_paths
from calib.study.presets import Preset
from calib.study.resources import execution_options, settings_line
from calib.study.rows import POSTHOC_METHODS
from calib.study.settings import with_settings
from calib.study.sources import preset_of, require_datasets, study_setups, trial_config

DEFAULT_SIZES = ("50", "100", "500", "1000", "all")
DEFAULT_DRAWS = 5
STUDY = declare_study("posthoc", __doc__, metrics=CALIBRATION_SIZE_METRICS, figure="sizes")
RANK_STRIDE = 10**7


def calibration_size(text: str) -> int | None:
    """``--sizes`` entry: an integer >= 2, or ``all`` (None: the whole validation split)."""
    if text == "all":
        return None
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not a calibration-set size: give an integer >= 2 or 'all'")
    return size


class RenamedSet(argparse.Action):
    """``--param METHOD.FIELD=VALUE``, ``--set``'s former name here: a ``--set`` value, with one line (and a
    ``DeprecationWarning``) saying so."""

    OLD = "posthoc.py --param METHOD.FIELD=VALUE"

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if not getattr(namespace, "_param_said", False):
            print(f"warning: {renamed_message(self.OLD)}", file=sys.stderr)
            namespace._param_said = True
        warn_renamed(self.OLD, stacklevel=2)
        namespace.set = [*(namespace.set or ()), values]


def sizes_for(dataset: str, val_images: int | None, sizes: list[int | None], explicit: bool, study: str
              ) -> list[int | None]:
    """``sizes`` that fit ``dataset``'s validation split of ``val_images`` samples (None: not known before its
    Stage I); an explicit size that does not is an error."""
    if val_images is None:
        return sizes
    too_large = [s for s in sizes if s is not None and s > val_images]
    if too_large and explicit:
        raise ConfigError(f"`--sizes` {' '.join(map(str, too_large))} exceed the {val_images} images of {dataset}'s "
                          f"validation split; give sizes from 2 to {val_images}, or all.")
    if too_large:
        print(f"[{study}] {dataset}: sizes {', '.join(map(str, too_large))} left out (its validation split has "
              f"{val_images} images)")
    return [s for s in sizes if s is None or s <= val_images]


def use_synthetic_logits(args: argparse.Namespace) -> None:
    """``--synthetic-classes``: write the data set (once) and calibrate it as ``--features``."""
    if args.synthetic_classes is None:
        if args.synthetic_seed != 0:
            raise ConfigError(f"`--synthetic-seed` draws the data of --synthetic-classes; without it it does not "
                              f"apply, got --synthetic-seed {args.synthetic_seed}.")
        return
    if args.synthetic_classes < 2:
        raise ConfigError(f"`--synthetic-classes` must be an integer >= 2, got --synthetic-classes "
                          f"{args.synthetic_classes}.")
    for flag, value in (("--features", args.features), ("--checkpoint", args.checkpoint),
                        ("--datasets", args.datasets), ("--archs", args.archs), ("--predictions", args.predictions)):
        if value:
            raise ConfigError(f"`--synthetic-classes` is the data set of this run; `{flag}` does not apply with it.")
    name = f"synthetic-logits-{args.synthetic_classes}-seed{args.synthetic_seed}"
    path = study_paths(args).outputs / "synthetic" / f"{name}.npz"
    if not path.exists():
        write_synthetic_logits(path, args.synthetic_classes, seed=args.synthetic_seed)
    args.features, args.features_name = str(path), name


def validation_sizes(args: argparse.Namespace, preset: Preset, datasets: list[str]) -> dict[str, int | None]:
    """The validation-split size of each dataset: of the features file with ``--features``, of a split's
    calibration part with ``--predictions``."""
    if preset.dataset_sources:
        sizes = {}
        for dataset in datasets:
            config = trial_config(args, preset, dataset=dataset, arch=preset.setups([dataset])[0][1], seed=0,
                                  method={"name": "vanilla"}, study="check")
            sizes[dataset] = len(predictions_split(parse_trial_config(config))[1])
        return sizes
    if args.features:
        return {datasets[0]: len(read_features_file(args.features).splits["val"].labels)}
    return {d: DATASETS.get(d).val_images for d in datasets}


def table_rank(label: str, size: int | None) -> int:
    """A row's place in the table, whatever a run selected: by method, then size, "all" last."""
    return (list(POSTHOC_METHODS).index(label) + 1) * RANK_STRIDE + (RANK_STRIDE - 1 if size is None else size)


def posthoc_parser() -> argparse.ArgumentParser:
    """The flags of this study."""
    parser = study_parser(__doc__, study=STUDY.name, figures=True)
    parser.add_argument("--methods", nargs="+", default=None, choices=POSTHOC_METHODS, metavar="METHOD",
                        help="post-hoc methods, from: %(choices)s (default: all)")
    parser.add_argument("--sizes", nargs="+", type=calibration_size, default=None, metavar="N",
                        help=f"calibration-set sizes: integers >= 2 or 'all' (default: {' '.join(DEFAULT_SIZES)}; "
                             "with --predictions: all)")
    parser.add_argument("--draws", type=int, default=DEFAULT_DRAWS,
                        help=f"uniform draws of each size below 'all' (default: {DEFAULT_DRAWS})")
    parser.add_argument("--param", action=RenamedSet, metavar="METHOD.FIELD=VALUE",
                        help="former name of --set METHOD.FIELD=VALUE (read until calib 0.2)")
    parser.add_argument("--synthetic-classes", type=int, default=None, metavar="K",
                        help="calibrate over-confident synthetic logits of K classes (5,000 validation and 10,000 "
                             "test samples) instead of a trained model; 100 is the paper preset's regime")
    parser.add_argument("--synthetic-seed", type=int, default=0,
                        help="the seed of the --synthetic-classes data set (default: 0)")
    add_predictions_args(parser)
    return parser


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    args = posthoc_parser().parse_args(argv)
    if args.draws < 1:
        raise ConfigError(f"`--draws` must be an integer >= 1, got --draws {args.draws}.")
    use_synthetic_logits(args)
    preset = preset_of(args)
    paths = study_paths(args)
    setups = study_setups(args, preset)
    # a Stage I's first seed (every fit reads one cached Stage I); every split of a predictions file
    seeds = args.seeds or list(preset.seeds if preset.dataset_sources else preset.seeds[:1])
    args.methods = args.methods or list(POSTHOC_METHODS)
    names = [POSTHOC_METHODS[label] for label in args.methods]
    explicit = args.sizes is not None
    default_sizes = ("all",) if preset.dataset_sources else DEFAULT_SIZES  # the benchmarks fit on the whole part
    sizes = list(dict.fromkeys(args.sizes if explicit else [calibration_size(s) for s in default_sizes]))
    datasets = list(dict.fromkeys(d for d, _ in setups))
    val_images = validation_sizes(args, preset, datasets)
    sizes_by_dataset = {d: sizes_for(d, val_images[d], sizes, explicit, args.study) for d in datasets}
    if not (args.features or preset.dataset_sources):
        require_datasets(datasets, paths.data_root, args.download)
    options = execution_options(args, preset)

    configs = []
    for dataset, arch in setups:
        for seed in seeds:
            setup = {"dataset": dataset, "arch": arch, "seed": seed}
            configs.append({**trial_config(args, preset, method={"name": "vanilla"}, **setup),
                            "label": UNCALIBRATED_LABEL, "label_rank": 0})
            for label, name in zip(args.methods, names, strict=True):
                for size in sizes_by_dataset[dataset]:
                    rank = table_rank(label, size)
                    for draw in range(args.draws if size is not None else 1):
                        subset = {} if size is None else {"calibration_size": size, "calibration_draw": draw}
                        method = {"name": name, **subset}
                        configs.append({**trial_config(args, preset, method=method, **setup), "label_rank": rank,
                                        "label": f"{label} · {'all' if size is None else f'n={size}'}"})
    configs = with_settings(args, configs)
    print(settings_line(args.study, preset, configs, options))
    print(f"[{args.study}] methods {', '.join(args.methods)} · sizes "
          f"{' '.join('all' if s is None else str(s) for s in sizes)} · {args.draws} draws · seeds {seeds} "
          f"· store {paths.store}")
    run = run_grid(configs, store=paths.store, study=args.study, options=options)
    if isinstance(run, CheckedOnly):
        return run

    trials = read_finished(paths.store, args.study, run.trial_ids)
    for (dataset, arch), group in trials.groupby(["dataset", "arch"], observed=True):
        with report_step(args.study, f"table for {dataset} · {arch}"):
            summary = calibration_size_summary(group, str(dataset), val_images.get(str(dataset)))
            print(f"\n{dataset} · {arch} · test split · mean ± 95% CI over draws and seeds (percent; NLL, its "
                  f"calibration (cal) and refinement (ref) errors in nats, Brier's as they are; ΔAcc: accuracy minus "
                  f"the uncalibrated model's; changed: test predictions whose class the method changed; degenerate: "
                  f"the fits of the row that were)\n")
            print(to_markdown(summary, ["method", "calibration set", "degenerate"], STUDY.metrics))
            if note := mixed_trainings(group):
                print(f"\n{note}")
        with report_step(args.study, f"figure for {dataset} · {arch}"):
            path = paths.outputs / "figures" / f"{args.study}_{dataset}_{arch}_sizes.png"
            figure = plot_calibration_sizes(summary, path, f"{dataset} · {arch}")
            print(f"\nfigure: {figure}")
    print(f"\nstore: {paths.store} ({len(trials)} finished trials of this run; {run.skipped} were already there)")
    return study_exit_code(args.study, paths.store, run.failed, len(trials))


if __name__ == "__main__":
    raise SystemExit(main())
