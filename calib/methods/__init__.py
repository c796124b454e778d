"""Methods applied to a Stage-I artifact, by registered name. Adding one: a file here and a register call: every
module of this package that does not start with ``_`` is imported below.

Post-hoc calibrators live in :mod:`calib.posthoc`, which registers them into the same registry; the
registry imports both packages when first read (:func:`calib.plugins.load_components`).
"""

from calib._registry import import_submodules
from calib.methods import mac_cal, mac_cal_training, tst, vanilla, vtst
from calib.methods._base import MethodOutcome, MethodSpec, Predictor
from calib.methods._registry import METHODS
from calib.methods.mac_cal import MacCalConfig
from calib.methods.tst import TSTConfig
from calib.methods.vtst import VTSTConfig

import_submodules(__name__, __path__)

__all__ = [
    "METHODS",
    "MacCalConfig",
    "MethodOutcome",
    "MethodSpec",
    "Predictor",
    "TSTConfig",
    "VTSTConfig",
    "mac_cal",
    "mac_cal_training",
    "tst",
    "vanilla",
    "vtst",
]
