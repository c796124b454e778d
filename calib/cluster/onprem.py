"""The on-premises cluster file: Ray's ``local`` provider (your own machines over SSH), made from cluster.yaml.

``python -m calib.cluster onprem cluster.yaml --head-ip IP --worker-ips IP ... --ssh-user USER
--ssh-key KEY --store URI -o cluster-onprem.yaml`` writes a launcher file whose provider is
``{type: local, head_ip, worker_ips}`` and whose launcher sections are copied from cluster.yaml
(:data:`SHARED_KEYS`: file mounts, rsync filters, setup commands with the Ray pin, and
``metadata.calib``'s cluster-wide settings). cluster.yaml stays the one place these are written;
regenerate the on-prem file after editing it. The head starts Ray with the v1 autoscaler
(:data:`HEAD_START_RAY_COMMANDS`); every host starts it under NVIDIA MPS unless ``--no-mps``
(:data:`MPS_HEAD_START_RAY_COMMANDS`, :data:`MPS_WORKER_START_RAY_COMMANDS`). Every host starts Ray requiring the
cluster's token, which ``file_mounts`` ships from ``~/.config/calib/ray-tokens/<cluster name>.token``
(:mod:`calib.cluster.token`; ``python -m calib.cluster token FILE`` creates it).

``--venv DIR`` makes every command on the hosts run in that virtual environment (first setup command:
activate it from ``~/.bashrc``, which Ray's command runner sources), for machines where the project's
Python is a venv rather than the system's.
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from calib._config import ConfigError
from calib.cluster.cluster_file import load_cluster_yaml
from calib.cluster.launcher import Launcher
from calib.cluster.token import AUTH_MODE, NODE_TOKEN_PATH, local_token_path, token_mount
from calib.exit_codes import ExitCode

__all__ = ["HEAD_START_RAY_COMMANDS", "LAUNCHER", "MPS_HEAD_START_RAY_COMMANDS", "MPS_WORKER_START_RAY_COMMANDS",
           "SHARED_CALIB_KEYS", "SHARED_KEYS", "WORKER_START_RAY_COMMANDS", "onprem_text", "render_onprem",
           "venv_command"]

# Launcher sections every provider runs the same way: what is copied to the nodes and what is installed.
SHARED_KEYS = ("file_mounts", "rsync_filter", "rsync_exclude", "initialization_commands", "setup_commands",
               "head_setup_commands", "worker_setup_commands")
SHARED_CALIB_KEYS = ("gpus_per_trial", "shared_paths", "trusted_network")
# Ray 2.60's default autoscaler (v2) never records an on-prem head in its node state, so it never starts
# the workers; the head runs the v1 autoscaler. Every `ray start` requires the cluster's token (RAY_AUTH_MODE=token,
# the token shipped to ~/.ray/auth_token by file_mounts: calib.cluster.token); the dashboard listens on the head's
# loopback only (reach it through `ray dashboard FILE`, an SSH tunnel).
HEAD_START = ("ulimit -c unlimited; " + AUTH_MODE + " RAY_enable_autoscaler_v2=0 {mps}ray start --head --port=6379 "
              "--dashboard-host=127.0.0.1 --autoscaling-config=~/ray_bootstrap_config.yaml")
WORKER_START = AUTH_MODE + " {mps}ray start --address=$RAY_HEAD_IP:6379"
HEAD_START_RAY_COMMANDS = ["ray stop", HEAD_START.format(mps="")]
WORKER_START_RAY_COMMANDS = ["ray stop", WORKER_START.format(mps="")]
# With NVIDIA MPS (--mps, the default): Ray starts under `calib.cluster.mps start` on every host, which starts the
# daemon on a host with GPUs (its Ray's workers inherit CUDA_MPS_PIPE_DIRECTORY) and stops it when Ray stops.
MPS_START = "python -m calib.cluster.mps start -- "
MPS_HEAD_START_RAY_COMMANDS = ["ray stop", HEAD_START.format(mps=MPS_START)]
MPS_WORKER_START_RAY_COMMANDS = ["ray stop", WORKER_START.format(mps=MPS_START)]
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9-]{1,63})*$")


def _address(value: str, flag: str) -> str:
    """An IP address or a host name, else ConfigError naming ``flag``."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        if _HOSTNAME.match(value) and not value.replace(".", "").isdigit():
            return value
    raise ConfigError(f"{flag} {value!r} is neither an IP address nor a host name (e.g. 192.168.1.10 or gpu-01).")


def venv_command(venv: str) -> str:
    """The setup command that activates ``venv`` in every later command on the node (idempotent)."""
    line = f"source {venv.rstrip('/')}/bin/activate"
    quoted = shlex.quote(line)
    return f"grep -qxF {quoted} ~/.bashrc 2>/dev/null || echo {quoted} >> ~/.bashrc"


def render_onprem(source: dict[str, Any], *, head_ip: str, worker_ips: list[str], ssh_user: str, ssh_key: str,
                  store: str | None = None, venv: str | None = None, cluster_name: str = "calib-onprem",
                  mps: bool = True) -> dict[str, Any]:
    """The on-prem launcher config for these hosts, with ``source``'s (cluster.yaml's) shared sections, and
    Ray started under NVIDIA MPS on every host with GPUs when ``mps`` (:mod:`calib.cluster.mps`).

    Raises ConfigError for a bad address, a repeated host, an empty user, or a key file that does not exist.
    """
    head = _address(head_ip, "--head-ip")
    workers = [_address(ip, "--worker-ips") for ip in worker_ips]
    repeated = sorted({ip for ip in [head, *workers] if [head, *workers].count(ip) > 1})
    if repeated:
        raise ConfigError(f"--head-ip/--worker-ips name {', '.join(repeated)} more than once; each host once.")
    if not ssh_user.strip():
        raise ConfigError("--ssh-user is empty: give the account the launcher logs in as on every host.")
    key = Path(ssh_key).expanduser()
    if not key.is_file():
        raise ConfigError(f"--ssh-key {ssh_key!r} is not a file: give the private key that logs in to every host "
                          "(the launcher copies it to the head, which uses it to start the workers).")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", cluster_name):
        raise ConfigError(f"--cluster-name {cluster_name!r}: use letters, digits, '-' and '_'.")

    config: dict[str, Any] = {
        "cluster_name": cluster_name,
        "provider": {"type": "local", "head_ip": head, "worker_ips": workers},
        "auth": {"ssh_user": ssh_user, "ssh_private_key": str(key.resolve())},
    }
    for name in SHARED_KEYS:
        if name in source:
            config[name] = copy.deepcopy(source[name])
    if venv is not None:
        if not venv.strip() or any(c in venv for c in "'\"\n;&|`$"):
            raise ConfigError(f"--venv {venv!r}: give the virtual environment's directory on the hosts "
                              "(e.g. ~/venv), without quotes or shell characters.")
        config["setup_commands"] = [venv_command(venv), *config.get("setup_commands", [])]
    if not isinstance(mps, bool):
        raise ConfigError(f"--mps must be true or false, got {mps!r}.")
    # This cluster's own token (not cluster.yaml's): `python -m calib.cluster token FILE` creates it.
    mounts = {k: v for k, v in (config.get("file_mounts") or {}).items()
              if token_mount({"file_mounts": {k: v}}) is None}
    config["file_mounts"] = {**mounts, NODE_TOKEN_PATH: local_token_path(cluster_name)}
    config["head_start_ray_commands"] = list(MPS_HEAD_START_RAY_COMMANDS if mps else HEAD_START_RAY_COMMANDS)
    config["worker_start_ray_commands"] = list(MPS_WORKER_START_RAY_COMMANDS if mps else WORKER_START_RAY_COMMANDS)
    shared = ((source.get("metadata") or {}).get("calib") or {})
    calib = {k: copy.deepcopy(shared[k]) for k in SHARED_CALIB_KEYS if k in shared}
    calib["store"] = store if store is not None else shared.get("store")
    config["metadata"] = {"calib": {k: v for k, v in calib.items() if v is not None}}
    return config


def onprem_text(config: dict[str, Any], source_name: str, argv: list[str]) -> str:
    """The YAML file, headed by where it came from and how to make it again."""
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "calib.cluster", "onprem", *argv])
    header = (f"# Ray cluster launcher config for your own machines (Ray's `local` provider), generated from\n"
              f"# {source_name}, whose file_mounts, rsync filters, setup commands and metadata.calib it copies.\n"
              f"# Edit {source_name} and regenerate rather than editing this file:\n#     {command}\n\n")
    return header + yaml.safe_dump(config, sort_keys=False, width=120)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="the cluster file whose launcher sections to share, e.g. cluster.yaml")
    parser.add_argument("--head-ip", required=True, help="address of the head node (runs the study driver)")
    parser.add_argument("--worker-ips", nargs="*", default=[], metavar="IP",
                        help="addresses of the worker nodes (none: a one-node cluster)")
    parser.add_argument("--ssh-user", required=True, help="account the launcher logs in as on every host")
    parser.add_argument("--ssh-key", required=True, help="private key that logs in to every host")
    parser.add_argument("--store", default=None,
                        help="store every host reaches: s3://<bucket>/calib or a path on a shared mount "
                             "(default: the source's metadata.calib.store)")
    parser.add_argument("--venv", default=None,
                        help="run the hosts' commands in this virtual environment, e.g. ~/venv (default: the "
                             "login shell's Python)")
    parser.add_argument("--cluster-name", default="calib-onprem", help="Ray's cluster_name")
    parser.add_argument("--mps", action=argparse.BooleanOptionalAction, default=True,
                        help="start NVIDIA MPS on every node with GPUs before Ray, so trials sharing a GPU run at "
                             "once; --no-mps where the site runs MPS itself or must not share GPUs")
    parser.add_argument("-o", "--output", default=None, help="file to write (default: standard output)")


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    source = load_cluster_yaml(args.source)
    config = render_onprem(source, head_ip=args.head_ip, worker_ips=args.worker_ips, ssh_user=args.ssh_user,
                           ssh_key=args.ssh_key, store=args.store, venv=args.venv, cluster_name=args.cluster_name,
                           mps=args.mps)
    text = onprem_text(config, Path(args.source).name, argv[1:])
    if args.output is None:
        sys.stdout.write(text)
        return ExitCode.OK
    Path(args.output).write_text(text)
    print(f"wrote {args.output}: {len(config['provider']['worker_ips'])} worker(s), head {args.head_ip}; "
          f"create its token with `python -m calib.cluster token {args.output}`, "
          f"then check it with `python -m calib.cluster validate {args.output}`")
    return ExitCode.OK


LAUNCHER = Launcher("onprem", "write the launcher file for your own machines (Ray's local provider) from "
                              "cluster.yaml's shared sections", _add_arguments, _run)
"""``python -m calib.cluster onprem cluster.yaml --head-ip IP ... -o cluster-onprem.yaml``."""
