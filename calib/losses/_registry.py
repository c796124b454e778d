from calib._registry import Registry
from calib.losses._base import LossSpec

LOSSES: Registry[LossSpec] = Registry("loss")
