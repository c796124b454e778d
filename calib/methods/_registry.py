from calib.registries import METHODS

__all__ = ["METHODS"]
