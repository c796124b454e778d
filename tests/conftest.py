"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trial_fixtures import tiny_config


@pytest.fixture
def make_config(tmp_path: Path):
    """``make_config(**kwargs)``: a valid tiny trial config under this test's tmp_path."""

    def factory(**kwargs: Any) -> dict[str, Any]:
        return tiny_config(tmp_path, **kwargs)

    return factory


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch):
    """An S3-compatible server (moto) on 127.0.0.1 with a fresh bucket; the AWS environment points at it.

    Yields ``(bucket, env)``. moto keeps buckets across servers in one process, hence a new name per test.
    """
    import uuid

    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bucket = f"calib-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield bucket, env
    server.stop()
