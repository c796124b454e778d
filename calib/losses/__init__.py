"""Training losses, by registered name. Adding a loss: one file here, one ``LOSSES.register`` call."""

from calib.losses import cross_entropy
from calib.losses._base import LossSpec, Reduction
from calib.losses._registry import LOSSES
from calib.losses.cross_entropy import CrossEntropy, CrossEntropyConfig

__all__ = ["LOSSES", "CrossEntropy", "CrossEntropyConfig", "LossSpec", "Reduction", "cross_entropy"]
