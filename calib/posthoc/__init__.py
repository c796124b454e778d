"""Post-hoc calibrators: fitted on held-out logits, applied to any logits (docs/methods.md §5).

Each is a :class:`PostHocCalibrator` (``fit(logits, labels)``, ``forward(logits)``) registered in
:data:`POSTHOC`, and a method of :data:`calib.methods.METHODS` (:func:`register_posthoc_method`) that
fits on the calibration set of a Stage-I artifact's cached validation logits. Adding one is one file
here: every module of this package that does not start with ``_`` is imported below.
"""

from calib._registry import import_submodules
from calib.posthoc._base import POSTHOC, PROBABILITY_FLOOR, DegenerateFitWarning, PostHocCalibrator, PostHocPredictor
from calib.posthoc._method import PostHocConfig, calibration_indices, register_posthoc_method
from calib.posthoc.smart import SMART, SMARTConfig, soft_binned_ece
from calib.posthoc.temperature_scaling import TEMPERATURE_GRID, TemperatureScaling, TemperatureScalingConfig

import_submodules(__name__, __path__)

__all__ = [
    "POSTHOC",
    "PROBABILITY_FLOOR",
    "SMART",
    "TEMPERATURE_GRID",
    "DegenerateFitWarning",
    "PostHocCalibrator",
    "PostHocConfig",
    "PostHocPredictor",
    "SMARTConfig",
    "TemperatureScaling",
    "TemperatureScalingConfig",
    "calibration_indices",
    "register_posthoc_method",
    "soft_binned_ece",
]
