"""Shared fixtures, and each parallel test worker's share of the CPU's threads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# Under pytest-xdist (the README's `-n 2`) each worker gets its share of the cores for torch's and BLAS's thread
# pools, it and the processes it starts (a study's Ray and trials): two workers each spinning up as many threads
# as the machine has cores oversubscribe it (the post-hoc tests took 1.3x as long). Set before torch loads.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

from trial_fixtures import tiny_config  # noqa: E402  (it loads torch: after the thread count is set)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files with a test that starts Ray (marker ``ray``: minutes each, the cluster ones first) run first, the
    rest in collection order. Under the README's ``-n 2 --dist loadfile`` a worker takes whole files in this order
    (pyproject's ``--no-loadscope-reorder``: xdist would put the files with the most tests first, and so the cluster
    files, minutes for a few tests, last, which one worker then ran alone while the other had nothing left)."""
    starts_ray = {item.path for item in items if item.get_closest_marker("ray")}
    items.sort(key=lambda item: item.path not in starts_ray)  # stable


@pytest.fixture(scope="module", autouse=True)
def _ray_ends_with_its_module():
    """A local Ray that a test module's in-process studies started (``in_process.run_study``) is stopped when
    the module ends: the next module on this worker starts from no Ray."""
    import sys

    started_before = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    yield
    if not started_before and "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


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
