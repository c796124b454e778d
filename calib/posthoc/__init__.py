"""Post-hoc calibrators: fitted on held-out logits, applied to any logits (docs/methods.md §5).

Each is a :class:`PostHocCalibrator` (``fit(logits, labels)``, ``forward(logits)``) registered in
:data:`POSTHOC`; each is also a method in :data:`calib.methods.METHODS` (``temperature_scaling``,
``smart``) that fits on a Stage-I artifact's cached validation logits.
"""

from calib.posthoc._base import POSTHOC, PostHocCalibrator, PostHocPredictor
from calib.posthoc.smart import SMART, SMARTConfig, soft_binned_ece
from calib.posthoc.temperature_scaling import TEMPERATURE_GRID, TemperatureScaling, TemperatureScalingConfig

__all__ = [
    "POSTHOC",
    "SMART",
    "TEMPERATURE_GRID",
    "PostHocCalibrator",
    "PostHocPredictor",
    "SMARTConfig",
    "TemperatureScaling",
    "TemperatureScalingConfig",
    "soft_binned_ece",
]
