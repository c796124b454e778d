"""benchmarks/posthoc_fit.py as a module, and netcal's records for the tests that read them."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]

RECORDS = os.environ.get("CALIB_NETCAL_RECORDS")
"""netcal's records folder (EFS-OpenSource/calibration-framework, ``examples/classification/records/``), or None."""

needs_records = pytest.mark.skipif(not RECORDS, reason="CALIB_NETCAL_RECORDS (the folder of netcal's records) unset")


def benchmark() -> ModuleType:
    """benchmarks/posthoc_fit.py, imported from its file (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("_posthoc_fit", ROOT / "benchmarks" / "posthoc_fit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
