from calib._registry import Registry
from calib.methods._base import MethodSpec

METHODS: Registry[MethodSpec] = Registry("method")
