"""`python -m calib.cluster validate`: the shipped cluster.yaml passes; broken variants fail naming the key.

Everything runs offline: sockets refuse to connect and boto3 cannot be imported, as in CI without AWS.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

from calib.cluster import load_cluster_yaml, main
from calib.cluster.token import ensure_token

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "cluster.yaml"
OTHER_RAY = "2.9.3" if ray.__version__ != "2.9.3" else "2.10.0"

Edit = Callable[[dict[str, Any]], None]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network and no AWS: any connection attempt or boto3 import fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"calib.cluster tried to reach the network: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setitem(sys.modules, "botocore", None)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def token_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The step before `validate`: cluster.yaml's token, made by `python -m calib.cluster token` in a home of the
    test's own."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    token = tmp_path / "home" / ".config" / "calib" / "ray-tokens" / "calib.token"
    ensure_token(token)
    return token


def shipped() -> dict[str, Any]:
    return copy.deepcopy(load_cluster_yaml(SHIPPED))


def write(tmp_path: Path, config: dict[str, Any], name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["validate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_shipped_cluster_yaml_is_valid(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, out, err = run(capsys, "cluster.yaml")
    assert (rc, err) == (0, "")
    assert out.startswith(f"cluster.yaml: valid (ray {ray.__version__} schema; head: head (CPU 8); ")
    assert "gpu_worker (CPU 4, GPU 1 × 0-8)" in out and "store s3://" in out and out.count("\n") == 1


def test_shipped_cluster_yaml_declares_what_the_studies_need():
    config = shipped()
    # the checkout, and this cluster's Ray token (python -m calib.cluster token) where Ray reads it on every node
    assert config["provider"]["type"] == "aws" and config["file_mounts"] == {
        "~/calib": ".", "~/.ray/auth_token": "~/.config/calib/ray-tokens/calib.token"}
    assert any(f'"ray[default,tune]=={ray.__version__}"' in c for c in config["setup_commands"])
    assert "pip install -e ~/calib" in config["setup_commands"]
    assert config["metadata"]["calib"]["store"].startswith("s3://")


def test_a_token_file_not_made_yet_is_refused_naming_the_token_command(token_made: Path, capsys, monkeypatch):
    """`ray up` would end in Ray's FileNotFoundError traceback (hash_runtime_conf): one line, exit 2."""
    monkeypatch.chdir(ROOT)
    token_made.unlink()
    rc, out, err = run(capsys, "cluster.yaml")
    assert rc == 2 and out == "" and err == (
        "error: cluster.yaml: file_mounts[~/.ray/auth_token]: the token file ~/.config/calib/ray-tokens/calib.token "
        "does not exist yet: create it with `python -m calib.cluster token cluster.yaml` before `ray up`.\n"), err


def test_module_runs_from_the_repo_root():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run([sys.executable, "-m", "calib.cluster", "validate", "cluster.yaml"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("cluster.yaml: valid (ray ")


def _node(name: str, **changes: Any) -> Edit:
    return lambda c: c["available_node_types"][name].update(changes)


def _calib(**changes: Any) -> Edit:
    return lambda c: c["metadata"]["calib"].update(changes)


def _other_ray(c: dict[str, Any]) -> None:
    c["setup_commands"] = [cmd.replace(ray.__version__, OTHER_RAY) for cmd in c["setup_commands"]]


BROKEN: list[tuple[str, Edit, list[str], str, str]] = [
    # (id, edit of the shipped config, extra CLI args, key named in the error, part of its message)
    ("unknown-top-level-key", lambda c: c.update(worker_count=8), [], "worker_count",
     "unknown key: Ray's cluster schema allows no `worker_count` here"),
    ("calib-key-at-top-level", lambda c: c.update(store="s3://b/calib"), [], "store",
     "calib's settings go under `metadata.calib`"),
    ("wrong-type", lambda c: c.update(max_workers="eight"), [], "max_workers", "'eight' is not of type 'integer'"),
    ("unknown-provider", lambda c: c["provider"].update(type="nosuchcloud"), [], "provider.type",
     "Ray's config preparation failed: Unsupported node provider: nosuchcloud"),
    ("negative-gpu", _node("gpu_worker", resources={"CPU": 4, "GPU": -1}), [],
     "available_node_types.gpu_worker.resources.GPU", "-1 is less than the minimum of 0"),
    ("resources-missing", lambda c: c["available_node_types"]["gpu_worker"].pop("resources"), [],
     "available_node_types.gpu_worker.resources", "missing: Ray's cluster schema requires it"),
    ("head-type-missing", lambda c: c.update(head_node_type="cpu_head"), [], "head_node_type",
     "`head_node_type` must be one of `available_node_types`: got `cpu_head`"),
    ("global-max-below-min-workers", lambda c: (c.update(max_workers=1), _node("gpu_worker", min_workers=2)(c)), [],
     "max_workers", "smaller than the sum of `min_workers`"),
    ("no-gpu-node-type", lambda c: c["available_node_types"].pop("gpu_worker"), [], "available_node_types",
     "a trial asks for 1 GPU (metadata.calib.gpus_per_trial) but no node type that can start"),
    ("gpu-type-cannot-start", _node("gpu_worker", max_workers=0), [], "available_node_types",
     "GPU node types here: gpu_worker (GPU 1, max_workers 0)"),
    ("two-gpus-per-trial", lambda c: None, ["--gpus-per-trial", "2"], "available_node_types",
     "declares resources.GPU >= 2"),
    ("multi-node-local-store", _calib(store="results"), [], "metadata.calib.store",
     "`results` is a local path: this cluster can start nodes besides the head (gpu_worker: up to 8 workers)"),
    ("multi-node-local-store-flag", lambda c: None, ["--store", "results"], "--store",
     "each node would write its own disk"),
    ("multi-node-no-store", lambda c: c["metadata"]["calib"].pop("store"), [], "metadata.calib.store",
     "missing: this cluster can start nodes besides the head"),
    ("store-outside-shared-paths", _calib(store="/data/calib", shared_paths=["/mnt/efs"]), [], "metadata.calib.store",
     "`/data/calib` is a local path (shared_paths: /mnt/efs)"),
    ("calib-setting-typo", _calib(gpu_per_trial=1), [], "metadata.calib.gpu_per_trial",
     "did you mean `gpus_per_trial`?"),
    ("ray-version-mismatch", _other_ray, [], "setup_commands[0]",
     f"installs ray {OTHER_RAY}, but the driver here runs ray {ray.__version__}"),
    ("ray-unpinned", lambda c: c.update(setup_commands=["pip install -U 'ray[default]' boto3", "pip install -e ."]), [],
     "setup_commands", "no command pins Ray for node type(s) head, gpu_worker"),
    ("ray-default-setup-commands", lambda c: c.pop("setup_commands"), [], "setup_commands[1]",
     "(Ray's aws default, as the file sets no `setup_commands`)"),
    ("worker-own-setup-commands", _node("gpu_worker", worker_setup_commands=[f"pip install ray=={OTHER_RAY}"]), [],
     "available_node_types.gpu_worker.worker_setup_commands[0]", f"installs ray {OTHER_RAY}"),
]


@pytest.mark.parametrize(("edit", "args", "key", "message"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_broken_variant_is_rejected_naming_the_key(tmp_path, capsys, edit, args, key, message):
    config = shipped()
    edit(config)
    path = write(tmp_path, config)
    rc, out, err = run(capsys, str(path), *args)
    assert rc == 2 and out == ""
    lines = [line for line in err.splitlines() if line.startswith(f"error: {path}: {key}: ")]
    assert lines, err
    assert message in lines[0], err


def test_every_problem_is_reported(tmp_path, capsys):
    config = shipped()
    config["worker_count"] = 8
    config["metadata"]["calib"]["store"] = "results"
    _other_ray(config)
    path = write(tmp_path, config)
    rc, _, err = run(capsys, str(path))
    keys = [line.split(": ")[2] for line in err.splitlines()]
    assert rc == 2 and keys == ["worker_count", "metadata.calib.store", "setup_commands[0]"], err


def test_yaml_syntax_error(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster_name: calib\nprovider: {type: aws\nmax_workers: 2\n")
    rc, _, err = run(capsys, str(path))
    assert rc == 2 and err.startswith(f"error: {path}: not valid YAML: ") and "at line 3, column" in err
    assert err.count("\n") == 1


def test_missing_file(tmp_path, capsys):
    rc, _, err = run(capsys, str(tmp_path / "nope.yaml"))
    assert rc == 2 and err.startswith(f"error: {tmp_path / 'nope.yaml'}: no such file.")


def test_single_node_cpu_only_with_local_store_is_valid(tmp_path, capsys):
    config = shipped()
    config["max_workers"] = 0
    del config["available_node_types"]["gpu_worker"]
    config["metadata"]["calib"] = {"store": "results"}
    path = write(tmp_path, config)
    rc, out, err = run(capsys, str(path), "--gpus-per-trial", "0")
    assert (rc, err) == (0, "")
    assert "head: head (CPU 8); workers: none; store results; 0 GPU per trial" in out
    assert run(capsys, str(path))[0] == 2  # the same cluster cannot serve the paper preset's 1 GPU per trial


@pytest.mark.parametrize("args", [["--gpus-per-trial", "0.25"], ["--store", "gs://bucket/calib"]])
def test_fractional_gpus_and_gs_store_are_valid(capsys, args):
    assert run(capsys, str(SHIPPED), *args)[0] == 0


def test_store_under_a_shared_mount_is_valid(tmp_path, capsys):
    config = shipped()
    config["metadata"]["calib"].update(store="/mnt/efs/calib", shared_paths=["/mnt/efs"])
    rc, out, _ = run(capsys, str(write(tmp_path, config)))
    assert rc == 0 and "store /mnt/efs/calib" in out
