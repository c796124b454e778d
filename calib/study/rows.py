"""Row-based studies: named (loss, method, Stage-I change) rows × datasets × seeds → trials → tables.

The shape shared by ``compare_methods``, ``combine``, ``decompose`` and ``mixup_alpha``: each row is
a labelled config variant; every (dataset, row, seed) is one trial run through Ray Tune; the table
aggregates the finished trials of this run per row.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd

from calib._config import ConfigError
from calib._registry import Registry
from calib.config import parse_trial_config
from calib.methods.vanilla import UNCALIBRATED_LABEL, current_uncalibrated_label
from calib.registries import LOSSES, METHODS, PROCEDURES
from calib.report import mixed_trainings, report_step, summarize, to_markdown
from calib.report.policy import compare_setup, default_control, row_order
from calib.report.significance_tables import MARKS
from calib.report.tables import PREDICTION_CHANGE_COLUMNS, with_current_labels
from calib.run import CheckedOnly, StudyRun, run_grid
from calib.store import read_finished
from calib.study.paths import study_paths
from calib.study.resources import execution_options, settings_line
from calib.study.row import Row
from calib.study.row_file import file_rows
from calib.study.settings import study_settings, with_settings
from calib.study.sources import preset_of, require_datasets, study_seeds, study_setups, trial_config
from calib.training.procedures.mixup import TABLE_ALPHA as TABLE_MIXUP_ALPHA

__all__ = ["GIVEN_STAGE1_ROWS", "METHOD_ROWS", "MIXING_ROWS", "POSTHOC_METHODS", "POSTHOC_ROWS", "PROCEDURE_ROWS",
           "STAGE1_ROWS", "TABLE_MIXUP_ALPHA", "RegistryRows", "Row", "loss_row", "method_row", "mit_row", "mixup_row",
           "print_row_tables", "procedure_row", "row_label", "run_rows", "with_file_rows"]

class RegistryRows(Mapping[str, Any]):
    """A read-only mapping built from the method, loss and training-procedure registries, and built again whenever
    one of them changed, so the components that a plugin registers (also after this module was imported:
    ``--plugin``) are rows like calib's own."""

    def __init__(self, build: Callable[[], dict[str, Any]], description: str) -> None:
        self._build, self._description = build, description
        self._built: tuple[tuple[int, ...], dict[str, Any]] | None = None

    def _rows(self) -> dict[str, Any]:
        versions = tuple(version for registry in (METHODS, LOSSES, PROCEDURES)
                         for version in (len(registry), registry.version))
        if self._built is None or self._built[0] != versions:
            self._built = (versions, self._build())
        return self._built[1]

    def __getitem__(self, label: str) -> Any:
        return self._rows()[label]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows())

    def __len__(self) -> int:
        return len(self._rows())

    def __repr__(self) -> str:
        return f"<{self._description}: {', '.join(self)}>"


def _labelled(registry: Registry[Any], keep: Callable[[Any], bool]) -> list[tuple[str, str]]:
    """(label, name) of the specs of ``registry`` that ``keep`` selects and that have a label, by their ``order``
    (ties: registration order)."""
    entries = [(spec.order, i, spec.label, name) for i, (name, spec) in enumerate(registry.items())
               if spec.label is not None and keep(spec)]
    return [(label, name) for _, _, label, name in sorted(entries, key=lambda e: (e[0], e[1]))]


def _unique(rows: list[tuple[str, Any]], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, value in rows:
        if label in out:
            raise ValueError(f"Two {what} have the table label {label!r}: give one of them another `label`.")
        out[label] = value
    return out


def _posthoc_methods() -> dict[str, str]:
    return _unique(_labelled(METHODS, lambda spec: spec.posthoc), "post-hoc methods")


def _stage2_rows() -> list[tuple[str, Row]]:
    return [(label, Row(method={"name": name}))
            for label, name in _labelled(METHODS, lambda spec: not spec.posthoc and not spec.logits_only)]


def procedure_row(name: str, value: float | None = None) -> Row:
    """The row of the registered training procedure ``name``: its spec's ``row_values`` on the CE Stage I, its
    switch (``mixup_alpha``, ...) at ``value`` when given."""
    spec = PROCEDURES.get(name)
    return Row(stage1={**spec.row_values, **({spec.switch: value} if value is not None else {})})


def mixup_row(alpha: float = TABLE_MIXUP_ALPHA) -> Row:
    """Mixup (Zhang et al. 2018): the CE Stage I trained on Beta(α, α) mixtures, evaluated as trained."""
    return procedure_row("mixup", alpha)


def mit_row(alpha: float = TABLE_MIXUP_ALPHA) -> Row:
    """MIT (Wang et al. 2023): Mixup with the mixing inference in training (docs/methods.md §4.9)."""
    return procedure_row("mit", alpha)


MIXING_ROWS: Mapping[str, Callable[[float], Row]] = {"Mixup": mixup_row, "MIT": mit_row}
"""The Stage-I changes that ``mixup_alpha.py`` sweeps, by label: each gives its row at a Beta(α, α)."""


def _procedure_rows(combines: bool) -> list[tuple[str, Row]]:
    """(label, row) of the labelled training procedures whose row is (``combines``) or is not a Stage I that the
    methods run on too."""
    return [(label, procedure_row(name)) for label, name in _labelled(PROCEDURES, lambda s: s.combines == combines)]


def _stage1_rows() -> dict[str, Row]:
    losses = [(label, Row(loss={"name": name})) for label, name in _labelled(LOSSES, lambda spec: True)]
    return _unique([(UNCALIBRATED_LABEL, Row()), *losses, *_procedure_rows(True)], "Stage-I rows")


def _method_rows() -> dict[str, Row]:
    return _unique([*STAGE1_ROWS.items(), *PROCEDURE_ROWS.items(), *POSTHOC_ROWS.items(), *_stage2_rows()], "rows")


def _given_stage1_rows() -> dict[str, Row]:
    return _unique([(UNCALIBRATED_LABEL, Row()), *((label, Row(method={"name": name}))
                                                   for label, name in POSTHOC_METHODS.items()), *_stage2_rows()],
                   "rows")


def method_row(name: str, stage1: Row | None = None) -> tuple[str, Row]:
    """(label, row) of the registered method ``name`` (its spec's label) on the Stage I of ``stage1`` (default:
    the vanilla CE one)."""
    stage1 = stage1 or Row()
    return METHODS.get(name).label or name, Row(loss=stage1.loss, method={"name": name}, stage1=stage1.stage1)


def loss_row(name: str) -> tuple[str, Row]:
    """(label, row) of the Stage I trained with the registered loss ``name`` (its spec's label)."""
    return LOSSES.get(name).label or name, Row(loss={"name": name})


def row_label(text: str) -> str:
    """A row as a user types it (``--methods``, ``--losses``), under the label the tables give it now: the
    uncalibrated model's former names (``Vanilla (CE)``, ``CE``, ``Uncalibrated``) are ``Vanilla``."""
    return str(current_uncalibrated_label(text))


PROCEDURE_ROWS: Mapping[str, Row] = RegistryRows(lambda: _unique(_procedure_rows(False), "procedure rows"),
                                                 "procedure rows")
"""Stage-I training procedures that change the classifier themselves, beyond a loss (docs/methods.md §4.10), each
with its official defaults (its spec's ``row_values``): PLP's layer peeling with γ = 1 (``dengbaowang/PLP`` README)
and BalCAL's ETF classifier with δ = 0.95 (BALCAL-R ``train_BalCAL.sh``), then a plugin's."""

POSTHOC_METHODS: Mapping[str, str] = RegistryRows(_posthoc_methods, "post-hoc methods")
"""Every post-hoc method by its label (its spec's ``label``, docs/methods.md §5), in the order of the tables (its
``order``). HB is histogram binning as Guo et al.'s tables and netcal run it (equal-width bins), HB-EM Zadrozny &
Elkan's equal-mass bins."""

POSTHOC_ROWS: Mapping[str, Row] = RegistryRows(
    lambda: {f"CE+{label}": Row(method={"name": name}) for label, name in POSTHOC_METHODS.items()}, "post-hoc rows")
"""The post-hoc methods with their defaults, each fitted on the vanilla (CE) Stage I's validation logits."""

STAGE1_ROWS: Mapping[str, Row] = RegistryRows(_stage1_rows, "Stage-I rows")
"""Every Stage I of the tables, as trained: the vanilla (CE) model, a Stage I trained with each labelled loss,
and the training procedures the methods combine with, Mixup and MIT (at :data:`TABLE_MIXUP_ALPHA`); each with its
paper defaults."""

METHOD_ROWS: Mapping[str, Row] = RegistryRows(_method_rows, "method rows")
"""The rows of the method comparison (MaC-Cal Table 1): the :data:`STAGE1_ROWS`, the :data:`PROCEDURE_ROWS`, each
post-hoc method on the CE Stage I, and each labelled Stage-II method; each with its paper defaults."""

GIVEN_STAGE1_ROWS: Mapping[str, Row] = RegistryRows(_given_stage1_rows, "rows on a given Stage I")
"""The rows that run on a Stage I calib does not train (``calibrate.py``): the uncalibrated model, every post-hoc
method and every labelled Stage-II method."""


def with_file_rows(files: Sequence[tuple[str, Row]], rows: Mapping[str, Row]) -> dict[str, Row]:
    """``rows`` and the ``--row`` files' rows (:func:`calib.study.row_file.file_rows`) after them; a
    ``ConfigError`` for a label a row already has."""
    out = dict(rows)
    for label, row in files:
        if label in out:
            raise ConfigError(f"--row: the label {label!r} is already a row of this table; give the file another "
                              f"one: --row FILE LABEL.")
        out[label] = row
    return out


def _fits_given_stage1(config: dict[str, Any]) -> bool:
    """Whether a row of the study's table runs on the given Stage I (a checkpoint, features or predictions file):
    the rows that train a Stage I do not, and are no part of this source's table (its manifest)."""
    try:
        parse_trial_config(config)
    except ConfigError:
        return False
    return True


def run_rows(
    args: argparse.Namespace,
    rows: Mapping[str, Row],
    *,
    evaluation: Callable[[str], dict[str, Any]] | None = None,
    table: Mapping[str, Row] | None = None,
) -> tuple[pd.DataFrame, StudyRun] | CheckedOnly:
    """Run every (dataset, architecture, row, seed) trial; returns this run's ok trials with a ``row``
    column (ordered categorical), and the run (its failures). ``evaluation(dataset)`` adds evaluation keys to every
    trial of that dataset (``ood_datasets``, ``corruptions``); it runs before any trial starts, so it
    is also where a study checks or prepares its evaluation data. ``table``: the study's whole row
    table when ``rows`` is a user's selection of it (the study's manifest is computed from the table,
    so runs of different selections extend one study). The ``--row`` files' rows (:func:`with_file_rows`) join
    both. ``--check-only``: the run's :class:`CheckedOnly`."""
    files = file_rows(args)  # read once: the run's rows and the table's
    rows = with_file_rows(files, rows)
    table = with_file_rows(files, table) if table is not None else None
    preset = preset_of(args)
    paths = study_paths(args)
    setups = study_setups(args, preset)
    datasets = list(dict.fromkeys(dataset for dataset, _ in setups))
    seeds = study_seeds(args, preset)
    require_datasets(datasets, paths.data_root, args.download)
    options = execution_options(args, preset)
    extra = {d: evaluation(d) if evaluation else {} for d in datasets}

    order = list(table or rows)

    def configs_of(selection: Mapping[str, Row], selection_seeds: list[int]) -> list[dict[str, Any]]:
        configs = []
        for dataset, arch in setups:
            for label, row in selection.items():
                # the row's place in the study's whole table, whatever this run selected
                rank = order.index(label) if label in order else len(order) + list(selection).index(label)
                loss = {**row.loss, **LOSSES.get(row.loss["name"]).dataset_defaults.get(dataset, {})}
                for seed in selection_seeds:
                    config = trial_config(args, preset, dataset=dataset, arch=arch, seed=seed,
                                          method=dict(row.method), loss=loss)
                    config["stage1"].update(row.stage1)
                    configs.append({**config, "label": label, "label_rank": rank, **extra[dataset]})
        return configs

    settings = study_settings(args)  # read and checked once, for the run and the whole table
    configs = with_settings(args, configs_of(rows, seeds), settings=settings)
    print(settings_line(args.study, preset, configs, options))
    print(f"[{args.study}] {len(rows)} rows · setups {', '.join(f'{d}/{a}' for d, a in setups)} · seeds {seeds} "
          f"· store {paths.store}")
    whole = with_settings(args, configs_of(table, seeds[:1]), say=False, settings=settings) if table else None
    if whole is not None and (preset.source or preset.dataset_sources):
        whole = [config for config in whole if _fits_given_stage1(config)]
    run = run_grid(configs, store=paths.store, study=args.study, options=options, table=whole)
    if isinstance(run, CheckedOnly):
        return run
    trials = with_current_labels(read_finished(paths.store, args.study, run.trial_ids))
    trials["row"] = pd.Categorical(trials["label"], categories=list(rows), ordered=True)
    print(f"\n[{args.study}] store: {paths.store} ({len(trials)} ok trials of this run; "
          f"{run.skipped} were already there; {run.failed} failed)")
    return trials, run


def print_row_tables(trials: pd.DataFrame, metrics: Mapping[str, str], *, study: str,
                     by: tuple[str, ...] = ("row",), control: str | None = None, alpha: float = 0.05,
                     store: str | None = None, test: str = "t-test") -> None:
    """One Markdown table per (dataset, architecture): mean ± 95% CI over seeds of ``metrics`` (in percent), each
    seed's trials (Stage-II seeds) averaged first, ``n`` the seeds.

    ``control``: a row label (default: the study's own, :func:`calib.report.policy.default_control`); each cell
    significantly better / worse than its gets ▲ / ▼ under the one policy of :mod:`calib.report.policy` (the test
    ``report.py`` uses on the same store: a paired test over seeds, or with fewer than 3 seeds the bootstrap over
    seeds and the test samples the trials kept in ``store``), with the legend under the table.

    Rows with no finished trial are named in one line under the table, so a partial run shows what it has. ΔAcc and
    "changed" (:data:`~calib.report.tables.PREDICTION_CHANGE_COLUMNS`), where ``metrics`` has them, compare each
    trial with the uncalibrated model of its Stage I: a row that changes the predicted class shows it there.
    """
    change = "; ΔAcc: accuracy minus the uncalibrated model's; changed: test predictions whose class the method " \
             "changed" if PREDICTION_CHANGE_COLUMNS.keys() & metrics.keys() else ""
    control = control or default_control(study, row_order(trials))
    for (dataset, arch), group in trials.groupby(["dataset", "arch"], observed=True):
        with report_step(study, f"table for {dataset} · {arch}"):
            print(f"\n{dataset} · {arch} · test split · mean ± 95% CI over seeds "
                  f"(percent; NLL in nats and Brier as they are{change})\n")
            summary = summarize(group, list(by), list(metrics))
            comparison = compare_setup(group, metrics, control, alpha=alpha, store=store, study=study, test=test)
            marks = {key: MARKS[verdict] for key, verdict in comparison.markers().items()}
            legend = comparison.legend
            if comparison.test == "bootstrap":  # the cells' intervals come from the bootstrap's draws, in this order
                intervals = comparison.summary().set_index("label")
                summary = summary.assign(**{column: summary[by[0]].astype(str).map(intervals[column])
                                            for column in intervals.columns if column.endswith("_ci")})
            print(to_markdown(summary, list(by), metrics, marks=marks))
            for line in legend:
                print(f"\n{line}")
            if note := mixed_trainings(group):
                print(f"\n{note}")
            if "row" in by and isinstance(group["row"].dtype, pd.CategoricalDtype):
                missing = [str(r) for r in group["row"].cat.categories if not (group["row"] == r).any()]
                if missing:
                    print(f"\nno finished trial for: {', '.join(missing)}")
