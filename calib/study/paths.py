"""Where a study writes: the store, the Stage-I artifacts, the data and the local outputs (figures, reports)."""

from __future__ import annotations

import argparse
from pathlib import Path

from calib import storage

__all__ = ["StudyPaths", "study_paths"]


class StudyPaths:
    """Absolute store, artifact and data locations (Ray Tune changes each trial's working directory).

    ``store`` and ``artifacts`` are absolute paths or object-store URIs (``s3://...``); ``outputs`` is
    the local directory for figures and reports: the store itself when it is local, else ``./results``.
    """

    def __init__(self, store: str, artifacts: str | None, data_root: str) -> None:
        self.store = storage.normalize(store)
        self.artifacts = storage.normalize(artifacts) if artifacts else storage.join(self.store, "artifacts")
        self.data_root = Path(data_root).resolve()
        self.outputs = Path("results").resolve() if storage.is_remote(self.store) else Path(self.store)


def study_paths(args: argparse.Namespace) -> StudyPaths:
    return StudyPaths(args.store, args.artifacts, args.data_root)
