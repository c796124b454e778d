"""A post-hoc calibrator as a method: fitted on (a subset of) the Stage-I artifact's validation logits.

Every post-hoc method's config derives from :class:`PostHocConfig`, which adds the calibration set:
``calibration_size`` samples of the validation split (None: all of it), drawn by ``calibration_draw``
(studies/posthoc.py, SMART's data-efficiency experiment). :func:`register_posthoc_method` registers
the method from its config class and its calibrator class: the config declares each hyperparameter once, with its
default and its check (:func:`~calib._config.checked_field`), and the calibrator is built from the config's
fields by one rule (:func:`build_calibrator`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from calib._config import check_fields, checked_field, integer, or_null
from calib.methods._base import MethodOutcome, MethodSpec
from calib.methods._registry import METHODS
from calib.posthoc._base import PostHocCalibrator, PostHocPredictor

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact

__all__ = [
    "CALIBRATION_FIELDS",
    "PostHocConfig",
    "build_calibrator",
    "calibration_indices",
    "hyperparameters",
    "register_posthoc_method",
]

@dataclass(frozen=True, kw_only=True)
class PostHocConfig:
    """The calibration set of a post-hoc method.

    Attributes:
        calibration_size: fit on this many validation samples, >= 2, drawn uniformly without
            replacement; None (default): the whole validation split.
        calibration_draw: which draw, >= 0: the subset is the first ``calibration_size`` of a
            permutation seeded by the draw, so a draw's smaller subsets are nested in its larger ones.
    """

    calibration_size: int | None = checked_field(None, or_null(integer(at_least=2), "the whole validation split"))
    calibration_draw: int = checked_field(0, integer(at_least=0))

    def __post_init__(self) -> None:
        """Check every field by its declared rule (a subclass adds only the checks that join fields)."""
        check_fields(self)


CALIBRATION_FIELDS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(PostHocConfig)}
"""The calibration-set fields with their defaults (all of the validation split, draw 0): ``added_fields`` of the
methods registered before the calibration set existed (TS, SMART)."""


def calibration_indices(num_val: int, size: int | None, draw: int) -> np.ndarray:
    """Indices of the calibration set in a validation split of ``num_val`` samples (sorted).

    >>> calibration_indices(5, None, 0).tolist()
    [0, 1, 2, 3, 4]
    >>> set(calibration_indices(10, 3, 0)) <= set(calibration_indices(10, 6, 0))
    True
    """
    if size is None:
        return np.arange(num_val)
    if size > num_val:
        raise ValueError(f"`method.calibration_size` must be at most the validation split's {num_val} samples, "
                         f"got calibration_size={size}.")
    return np.sort(np.random.default_rng(draw).permutation(num_val)[:size])


def hyperparameters(params: PostHocConfig) -> dict[str, Any]:
    """The fields of a post-hoc method's config other than the calibration set's: its calibrator's arguments."""
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.name not in CALIBRATION_FIELDS}


def build_calibrator(calibrator: type[PostHocCalibrator], params: PostHocConfig, seed: int) -> PostHocCalibrator:
    """``calibrator(**hyperparameters(params))``, and ``seed=seed`` when its constructor takes a ``seed``: the one
    rule that builds a post-hoc method's calibrator from its config."""
    seeded = "seed" in inspect.signature(calibrator).parameters
    return calibrator(**hyperparameters(params), **({"seed": seed} if seeded else {}))


def _builder(config: type[PostHocConfig],
             calibrator: type[PostHocCalibrator] | Callable[[Any, int], PostHocCalibrator]
             ) -> Callable[[Any, int], PostHocCalibrator]:
    """``build(params, seed)`` of a calibrator class (each config field one of its keyword arguments, checked
    here, at registration), or the factory itself where one is given (a plugin written before the rule)."""
    if not (isinstance(calibrator, type) and issubclass(calibrator, PostHocCalibrator)):
        return calibrator
    parameters = inspect.signature(calibrator).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        fields = [f.name for f in dataclasses.fields(config) if f.name not in CALIBRATION_FIELDS]
        missing = [name for name in fields if name not in parameters]
        if missing:
            raise TypeError(f"{calibrator.__name__} must take each field of {config.__name__} as a keyword argument "
                            f"of the same name; it has no {', '.join(repr(m) for m in missing)}.")
    return lambda params, seed: build_calibrator(calibrator, params, seed)


def register_posthoc_method(
    name: str,
    config: type[PostHocConfig],
    calibrator: type[PostHocCalibrator] | Callable[[Any, int], PostHocCalibrator],
    description: str,
    *,
    label: str | None,
    order: float = math.inf,
    added_fields: Mapping[str, Any] | None = None,
    former_name: str | None = None,
) -> None:
    """Register post-hoc method ``name``: its ``calibrator`` class, built from ``config``'s fields
    (:func:`build_calibrator`; a ``build(params, seed)`` factory is still accepted), fitted on the calibration set;
    ``label`` is its row in the studies' tables and ``--methods`` (``CE+<label>`` on a trained CE Stage I),
    ``order`` its place among the post-hoc rows, ``added_fields`` the fields added after its results were stored,
    with their defaults, ``former_name`` its name before a rename, still accepted, its trials' ids kept
    (:class:`~calib.methods.MethodSpec`).

    With the whole validation split as calibration set the trial's validation metrics are in-sample (read
    the test metrics); with ``calibration_size`` below it they are those of the held-out rest, so a search
    of a post-hoc method's parameters can use them. The fitted calibrator is ``outcome.predict.calibrator``.
    Fitting runs on the CPU whatever the device.
    """
    build = _builder(config, calibrator)

    def run(params: PostHocConfig, artifact: Stage1Artifact, *, seed: int, device: torch.device) -> MethodOutcome:
        val = artifact.splits["val"]
        keep = calibration_indices(len(val.labels), params.calibration_size, params.calibration_draw)
        fitted = build(params, seed).fit(val.logits[torch.from_numpy(keep)], val.labels[torch.from_numpy(keep)])
        outcome = MethodOutcome.from_predictor(PostHocPredictor(fitted), artifact)
        outcome.fit_details = fitted.fit_details()
        held_out = torch.from_numpy(np.setdiff1d(np.arange(len(val.labels)), keep))
        if len(held_out):  # validation metrics on the samples the fit did not see
            outcome.val_probs, outcome.val_indices = outcome.val_probs[held_out], held_out
        return outcome

    run.__doc__ = f"Fit {name} on the calibration set of the artifact's validation logits; apply it to val and test."
    METHODS.register(name)(MethodSpec(config, run, description, logits_only=True, posthoc=True, label=label,
                                      order=order, added_fields=dict(added_fields or {}), former_name=former_name))
    if former_name is not None:
        METHODS.alias(former_name, name)
