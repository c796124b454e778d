"""Stage-I artifacts: weights, cached features/logits and the record, keyed by the Stage-I config hash.

One module per concern:

- :mod:`~calib.artifacts.artifact`: what an artifact is (:class:`Stage1Artifact`), its layout, loading;
- :mod:`~calib.artifacts.checks`: checksums, records and sidecars, the quarantine;
- :mod:`~calib.artifacts.claim`: which trial in a cluster trains a Stage I, while others wait;
- :mod:`~calib.artifacts.publish`: first-writer-wins publishing to an object store, and fetching;
- :mod:`~calib.artifacts.stage1`: :func:`get_or_train_stage1`, which puts the above together;
- :mod:`~calib.artifacts.splits`: OOD, corrupted and method splits computed on first use.
- :mod:`~calib.artifacts.export`: stored Stage Is written out as features files (``report.py --export-features``).
"""

from calib.artifacts.artifact import SPLITS, SplitCache, Stage1Artifact, stage1_dir, stage1_exists
from calib.artifacts.checks import ArtifactWarning, CorruptArtifactError
from calib.artifacts.claim import ClaimSettings, Stage1WaitTimeout
from calib.artifacts.splits import METHOD_SPLITS, corrupted_split, method_split, ood_split
from calib.artifacts.stage1 import get_or_train_stage1, stage1_data

__all__ = [
    "METHOD_SPLITS",
    "SPLITS",
    "ArtifactWarning",
    "ClaimSettings",
    "CorruptArtifactError",
    "SplitCache",
    "Stage1Artifact",
    "Stage1WaitTimeout",
    "corrupted_split",
    "get_or_train_stage1",
    "method_split",
    "ood_split",
    "stage1_data",
    "stage1_dir",
    "stage1_exists",
]
