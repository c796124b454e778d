from calib.registries import LOSSES

__all__ = ["LOSSES"]
