"""A store or artifact location on local disk or on moto's S3, for fixtures parametrized ``["local", "s3"]``."""

from __future__ import annotations

from pathlib import Path

import pytest


def local_or_s3_location(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> str:
    """For a fixture parametrized ``["local", "s3"]``: ``tmp_path/name``, or ``s3://<new bucket>/name`` on
    moto's S3 server (the ``s3`` fixture)."""
    if request.param == "local":
        return str(tmp_path / name)
    bucket, _ = request.getfixturevalue("s3")
    return f"s3://{bucket}/{name}"
