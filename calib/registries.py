"""calib's registries of named components, the one place plugins and calib's own modules register into.

::

    from calib.registries import DATASETS, LOSSES, METHODS, MODELS, OOD_SETS, POSTHOC, PROCEDURES, STUDIES

    @METHODS.register("my_method")
    ...

Each registry fills itself on first read (:func:`calib.plugins.load_components`): calib's built-in
datasets, models, losses, Stage-I training procedures, methods and post-hoc calibrators, then the installed plugins
(entry-point group ``calib.plugins``) and the modules named with ``--plugin``. This module imports none of them, so
any module (the trial config among them) can read a registry without importing the implementations it holds.
``STUDIES`` fills itself from the study scripts instead (:func:`calib.plugins.load_studies`).
"""

from __future__ import annotations

from typing import Any

from calib._registry import Registry

__all__ = ["DATASETS", "DEFAULT_LOSS", "LOSSES", "METHODS", "MODELS", "OOD_SETS", "POSTHOC", "PROCEDURES", "STUDIES"]


def _populate() -> None:
    # lazy: registries stays a leaf; loading the components imports every component package
    from calib.plugins import load_components

    load_components()


def _populate_studies() -> None:
    # lazy: registries stays a leaf; loading the studies imports every study script
    from calib.plugins import load_studies

    load_studies()


DATASETS: Registry[Any] = Registry("dataset", populate=_populate)
"""Dataset name → :class:`calib.datasets.DatasetInfo`."""

OOD_SETS: Registry[Any] = Registry("OOD dataset", populate=_populate)
"""OOD set name → :class:`calib.datasets.OODSet`."""

MODELS: Registry[Any] = Registry("architecture", populate=_populate)
"""Architecture name → factory ``(num_classes, in_channels=3) -> CalibModel``."""

LOSSES: Registry[Any] = Registry("loss", populate=_populate)
"""Stage-I loss name → :class:`calib.losses.LossSpec`."""

DEFAULT_LOSS = "cross_entropy"
"""The loss of a trial config that names none: the vanilla Stage I (:mod:`calib.losses.cross_entropy`)."""

PROCEDURES: Registry[Any] = Registry("training procedure", populate=_populate)
"""Stage-I training procedure name → :class:`calib.training.procedures.ProcedureSpec` (Mixup, MIT, PLP, BalCAL):
what Stage I runs at its hooks besides the loss; its config's fields are keys of the ``stage1`` section."""

METHODS: Registry[Any] = Registry("method", populate=_populate)
"""Method name → :class:`calib.methods.MethodSpec`: what runs on a Stage-I artifact."""

POSTHOC: Registry[Any] = Registry("post-hoc calibrator", populate=_populate)
"""Post-hoc calibrator name → its :class:`calib.posthoc.PostHocCalibrator` class:
``POSTHOC.create("temperature_scaling", objective="nll")``."""

STUDIES: Registry[Any] = Registry("study", populate=_populate_studies)
"""Study name → its :class:`calib.study.declaration.StudyDeclaration` (name, question, table metrics, figure,
command), which each script of ``studies/`` declares once; filled on first read by importing those scripts
(:func:`calib.plugins.load_studies`). ``studies/report.py`` reads it for every study's columns and figure."""
