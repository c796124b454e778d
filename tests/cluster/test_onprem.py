"""The on-prem launcher file: made from cluster.yaml's shared sections, checked by `validate`, its CLI errors."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from calib.cluster import SHARED_KEYS, load_cluster_yaml, main, render_onprem
from calib.cluster.nodes import stop_workers
from calib.cluster.onprem import (
    HEAD_START_RAY_COMMANDS,
    MPS_HEAD_START_RAY_COMMANDS,
    MPS_WORKER_START_RAY_COMMANDS,
    WORKER_START_RAY_COMMANDS,
    venv_command,
)
from calib.cluster.token import ensure_token, uses_token_auth

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "cluster.yaml"
TOKEN = "~/.config/calib/ray-tokens/calib-onprem.token"


@pytest.fixture(autouse=True)
def token_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The on-prem file's token, made as `python -m calib.cluster token` makes it, in a home of the test's own."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ensure_token(Path(TOKEN).expanduser())
    return Path(TOKEN).expanduser()


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_test"
    path.write_text("not a real key; only its existence is checked\n")
    return path


def rendered(key: Path, **overrides: Any) -> dict[str, Any]:
    args = {"head_ip": "10.0.0.2", "worker_ips": ["10.0.0.3", "10.0.0.4"], "ssh_user": "lab", "ssh_key": str(key),
            "store": "s3://lab-bucket/calib", "venv": "~/venv", **overrides}
    return render_onprem(load_cluster_yaml(SHIPPED), **args)


def test_the_onprem_file_shares_cluster_yaml_launcher_sections(key: Path) -> None:
    shipped = load_cluster_yaml(SHIPPED)
    config = rendered(key)
    assert config["provider"] == {"type": "local", "head_ip": "10.0.0.2", "worker_ips": ["10.0.0.3", "10.0.0.4"]}
    assert config["auth"] == {"ssh_user": "lab", "ssh_private_key": str(key.resolve())}
    for name in SHARED_KEYS:
        if name == "setup_commands":  # after the one that activates --venv
            assert config[name] == [venv_command("~/venv"), *shipped[name]]
        elif name == "file_mounts":  # the cluster's own token, not cluster.yaml's
            assert config[name] == {**shipped[name], "~/.ray/auth_token": TOKEN}
        elif name in shipped:
            assert config[name] == shipped[name], name
    assert config["file_mounts"] == {"~/calib": ".", "~/.ray/auth_token": TOKEN}
    assert any('"ray[default,tune]==2.60.0"' in c for c in config["setup_commands"])
    assert config["metadata"]["calib"] == {"gpus_per_trial": shipped["metadata"]["calib"]["gpus_per_trial"],
                                           "store": "s3://lab-bucket/calib"}
    # NVIDIA MPS by default: Ray starts under `mps start` on the head and on every worker.
    assert config["head_start_ray_commands"] == MPS_HEAD_START_RAY_COMMANDS
    assert config["worker_start_ray_commands"] == MPS_WORKER_START_RAY_COMMANDS
    # Every `ray start` requires the token; the dashboard on the head's loopback.
    assert MPS_HEAD_START_RAY_COMMANDS[1] == (
        "ulimit -c unlimited; RAY_AUTH_MODE=token RAY_enable_autoscaler_v2=0 python -m calib.cluster.mps start -- "
        "ray start --head --port=6379 --dashboard-host=127.0.0.1 --autoscaling-config=~/ray_bootstrap_config.yaml")
    assert MPS_WORKER_START_RAY_COMMANDS == [
        "ray stop", "RAY_AUTH_MODE=token python -m calib.cluster.mps start -- ray start --address=$RAY_HEAD_IP:6379"]
    assert "RAY_AUTH_MODE=token RAY_enable_autoscaler_v2=0 ray start --head" in HEAD_START_RAY_COMMANDS[1]
    # --no-mps: the same commands without it.
    off = rendered(key, mps=False)
    assert off["head_start_ray_commands"] == HEAD_START_RAY_COMMANDS
    assert off["worker_start_ray_commands"] == WORKER_START_RAY_COMMANDS == [
        "ray stop", "RAY_AUTH_MODE=token ray start --address=$RAY_HEAD_IP:6379"]
    assert all(uses_token_auth(c) for c in [*HEAD_START_RAY_COMMANDS, *WORKER_START_RAY_COMMANDS])
    assert "available_node_types" not in config and "head_node_type" not in config
    # Without --store or --venv: the source's store, its setup commands unchanged.
    plain = render_onprem(shipped, head_ip="gpu-01", worker_ips=[], ssh_user="lab", ssh_key=str(key))
    assert plain["setup_commands"] == shipped["setup_commands"]
    assert plain["metadata"]["calib"]["store"] == shipped["metadata"]["calib"]["store"]


def test_the_rendered_file_passes_ray_and_calib_checks(tmp_path: Path, key: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    out = tmp_path / "cluster-onprem.yaml"
    rc = main(["onprem", str(SHIPPED), "--head-ip", "10.0.0.2", "--worker-ips", "10.0.0.3", "10.0.0.4",
               "--ssh-user", "lab", "--ssh-key", str(key), "--store", "s3://lab-bucket/calib", "--venv", "~/venv",
               "-o", str(out)])
    assert rc == 0
    text = out.read_text()
    assert text.startswith("# Ray cluster launcher config for your own machines")
    assert "python -m calib.cluster onprem" in text.splitlines()[3]
    prepared = prepare_config(copy.deepcopy(yaml.safe_load(text)))
    validate_config(prepared)
    assert "mps start -- ray start --address=$RAY_HEAD_IP:6379" in prepared["worker_start_ray_commands"][1]
    assert prepared["available_node_types"]["local.cluster.node"]["max_workers"] == 2
    capsys.readouterr()
    assert main(["validate", str(out)]) == 0
    line = capsys.readouterr().out
    assert "head: 10.0.0.2 (resources as Ray detects them); workers: 10.0.0.3, 10.0.0.4" in line
    # cluster.yaml keeps passing Ray's own preparation and validation.
    validate_config(prepare_config(load_cluster_yaml(SHIPPED)))


@pytest.mark.parametrize(("argv", "message"), [
    (["--head-ip", "not an ip!"], "--head-ip 'not an ip!' is neither an IP address nor a host name"),
    (["--head-ip", "10.0.0.2", "--worker-ips", "10.0.0.3", "10.0.0.2"], "name 10.0.0.2 more than once"),
    (["--head-ip", "10.0.0.2", "--worker-ips", "300.1.1.1"], "--worker-ips '300.1.1.1'"),
    (["--head-ip", "10.0.0.2", "--venv", "~/venv; rm -rf /"], "--venv '~/venv; rm -rf /'"),
    (["--head-ip", "10.0.0.2", "--cluster-name", "my cluster"], "--cluster-name 'my cluster'"),
])
def test_bad_onprem_arguments_exit_2_naming_the_value(argv: list[str], message: str, key: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.yaml"
    rc = main(["onprem", str(SHIPPED), "--ssh-user", "lab", "--ssh-key", str(key), *argv, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert not out.exists()


def test_a_missing_ssh_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["onprem", str(SHIPPED), "--head-ip", "10.0.0.2", "--ssh-user", "lab", "--ssh-key",
               str(tmp_path / "nope")])
    assert rc == 2 and f"--ssh-key '{tmp_path / 'nope'}' is not a file" in capsys.readouterr().err


def _validate(tmp_path: Path, config: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "onprem.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    rc = main(["validate", str(path)])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("edit", "key_path", "message"), [
    (lambda c: c["provider"].pop("head_ip"), "provider.head_ip", "must be the head's address"),
    (lambda c: c["provider"].update(worker_ips=["10.0.0.3", "10.0.0.3"]), "provider.worker_ips",
     "10.0.0.3 appears more than once"),
    (lambda c: c["provider"].update(worker_ips="10.0.0.3"), "provider.worker_ips", "must be a list"),
    (lambda c: c["auth"].pop("ssh_user"), "auth.ssh_user", "the account that logs in"),
    (lambda c: c["auth"].update(ssh_private_key="/no/such/key"), "auth.ssh_private_key",
     "`/no/such/key` is not a file on this machine"),
    (lambda c: c.update(available_node_types={"x": {}}), "available_node_types", "not allowed in an on-prem file"),
    (lambda c: c["metadata"]["calib"].update(store="/data/calib"), "metadata.calib.store", "is a local path"),
    (lambda c: c["setup_commands"].__setitem__(1, 'pip install "ray[default,tune]==2.59.0"'), "setup_commands[1]",
     "installs ray 2.59.0"),
])
def test_validate_names_what_is_wrong_in_an_onprem_file(edit: Any, key_path: str, message: str, key: Path,
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = rendered(key)
    edit(config)
    rc, err = _validate(tmp_path, config, capsys)
    assert rc == 2, err
    assert f": {key_path}: " in err and message in err, err


def test_the_venv_command_activates_once(tmp_path: Path) -> None:
    command = venv_command("~/venv")
    for _ in range(2):
        subprocess.run(["bash", "-c", command], check=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert (tmp_path / ".bashrc").read_text() == "source ~/venv/bin/activate\n"


def test_stop_workers_refuses_what_is_not_an_onprem_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stop-workers", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot be read" in capsys.readouterr().err
    with pytest.raises(Exception, match="provider 'aws' is not an on-prem"):
        aws = tmp_path / "aws.yaml"
        aws.write_text(SHIPPED.read_text())
        stop_workers(str(aws))
    empty = tmp_path / "empty.yaml"
    empty.write_text(yaml.safe_dump({"provider": {"type": "local", "head_ip": "10.0.0.2", "worker_ips": []},
                                     "auth": {"ssh_user": "lab"}}))
    assert main(["stop-workers", "--config", str(empty)]) == 0
    assert "no workers in the cluster file" in capsys.readouterr().out


def test_wait_needs_at_least_the_head(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wait", "--nodes", "0"]) == 2
    assert "--nodes must be at least 1 (the head), got 0" in capsys.readouterr().err


@pytest.mark.parametrize(("edit", "key_path"), [
    (lambda c: c["head_start_ray_commands"].__setitem__(1, c["head_start_ray_commands"][1].replace(
        "RAY_AUTH_MODE=token ", "")), "head_start_ray_commands[1]"),
    (lambda c: c["worker_start_ray_commands"].__setitem__(1, "ray start --address=$RAY_HEAD_IP:6379 "
                                                              "# RAY_AUTH_MODE=token"), "worker_start_ray_commands[1]"),
    (lambda c: c.pop("worker_start_ray_commands"), "worker_start_ray_commands[1]"),  # Ray's default: no token
    (lambda c: c["file_mounts"].pop("~/.ray/auth_token"), "file_mounts"),
], ids=["head", "worker after ray start", "ray's default worker", "no token shipped"])
def test_validate_refuses_a_cluster_without_token_authentication(edit: Any, key_path: str, key: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2, one line naming the key, the fix and the docs; accepted when the network is said to be trusted."""
    config = rendered(key)
    edit(config)
    rc, err = _validate(tmp_path, config, capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"onprem.yaml: {key_path}: " in err and "#who-can-reach-your-cluster" in err, err
    config["metadata"]["calib"]["trusted_network"] = True
    rc, err = _validate(tmp_path, config, capsys)
    assert rc == 0, err
    config["metadata"]["calib"]["trusted_network"] = "yes"
    rc, err = _validate(tmp_path, config, capsys)
    assert rc == 2 and "metadata.calib.trusted_network: must be true or false, got 'yes'" in err, err


def test_aws_cluster_without_start_commands_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cluster.yaml without its head command: Ray's AWS default starts the head without the token."""
    config = load_cluster_yaml(SHIPPED)
    assert all(uses_token_auth(c) for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in config["head_start_ray_commands"][1]
    del config["head_start_ray_commands"]
    path = tmp_path / "aws.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and ": head_start_ray_commands[1]: starts Ray without token" in err, err


def test_the_token_command_makes_one_private_token_and_never_prints_it(tmp_path: Path, key: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "cluster-onprem.yaml"
    assert main(["onprem", str(SHIPPED), "--head-ip", "10.0.0.2", "--ssh-user", "lab", "--ssh-key", str(key),
                 "--cluster-name", "lab1", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["token", str(out)]) == 0
    token = tmp_path / "home" / ".config" / "calib" / "ray-tokens" / "lab1.token"
    first = token.read_text()
    said = capsys.readouterr().out
    assert said.startswith(f"token created: {token} (mode 0600") and first.strip() not in said
    assert token.stat().st_mode & 0o777 == 0o600 and token.parent.stat().st_mode & 0o777 == 0o700
    assert len(bytes.fromhex(first.strip())) == 32
    assert main(["token", str(out)]) == 0 and token.read_text() == first  # once per cluster
    assert capsys.readouterr().out.startswith("token exists, kept")
    token.chmod(0o644)
    assert not ensure_token(token) and token.stat().st_mode & 0o777 == 0o600
    assert main(["token", str(out), "--rotate"]) == 0 and token.read_text() != first
    assert capsys.readouterr().out.startswith("new token")
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"cluster_name": "x", "file_mounts": {"~/calib": "."}}))
    assert main(["token", str(plain)]) == 2
    assert "file_mounts ships no token to the nodes' ~/.ray/auth_token" in capsys.readouterr().err


def test_the_onprem_flow_without_its_token_step_ends_in_one_line(tmp_path: Path, key: Path, token_made: Path) -> None:
    """The cluster page's on-prem commands with `token` skipped: `validate` refuses the file (exit 2, one line naming
    the file and the `token` command), before `ray up` could end in Ray's FileNotFoundError traceback."""
    token_made.unlink()
    out = tmp_path / "cluster-onprem.yaml"
    made = subprocess.run([sys.executable, "-m", "calib.cluster", "onprem", str(SHIPPED), "--head-ip", "10.0.0.2",
                           "--ssh-user", "lab", "--ssh-key", str(key), "--store", "s3://lab-bucket/calib", "-o",
                           str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert made.returncode == 0 and "create its token with `python -m calib.cluster token" in made.stdout, made
    checked = subprocess.run([sys.executable, "-m", "calib.cluster", "validate", str(out)], capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
    assert checked.returncode == 2 and checked.stdout == "", checked
    assert checked.stderr == (
        f"error: {out}: file_mounts[~/.ray/auth_token]: the token file {TOKEN} does not exist yet: create it with "
        f"`python -m calib.cluster token {out}` before `ray up`.\n"), checked.stderr
    assert not token_made.exists()
