"""calib: calibration research at scale (MaC-Cal, two-stage baselines, losses, post-hoc, metrics)."""

__version__ = "0.1.0"

__all__ = ["__version__"]
