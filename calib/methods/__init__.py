"""Methods applied to a Stage-I artifact, by registered name. Adding one: a file here and a register call."""

from calib.methods import mac_cal, vanilla
from calib.methods import tst as tst
from calib.methods import vtst as vtst
from calib.methods._base import MethodOutcome, MethodSpec
from calib.methods._registry import METHODS
from calib.methods.mac_cal import MacCalConfig
from calib.posthoc import smart as smart
from calib.posthoc import temperature_scaling as temperature_scaling

__all__ = ["METHODS", "MacCalConfig", "MethodOutcome", "MethodSpec", "mac_cal", "vanilla"]
