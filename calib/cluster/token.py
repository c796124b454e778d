"""Ray's token authentication on a launcher cluster (``ray up``): one token per cluster, on every node, and Ray
started to require it.

Ray 2.60 requires a token only where ``RAY_AUTH_MODE=token`` is set (or, with it unset, where the node already
has one at ``~/.ray/auth_token``); a cluster started by ``ray start`` without it accepts whoever reaches its ports:
any machine of the network joins as a node, runs a driver or a Ray Client session, and so runs code as the user on
every host. So calib's cluster files (``cluster.yaml``, the on-prem file) start Ray on every node with
``RAY_AUTH_MODE=token``, and ship one token to every node by the launcher's own ``file_mounts``:

    file_mounts:
      "~/.ray/auth_token": "~/.config/calib/ray-tokens/<cluster_name>.token"

On a node it is Ray's default path, so every Ray process there finds it, the study's driver (``--address auto``)
and ``ray job submit`` included. ``python -m calib.cluster token FILE`` creates the local file once (a random
256-bit token, mode 0600, in a 0700 folder of the home directory: never in the checkout, never printed), or makes
a new one with ``--rotate``. ``python -m calib.cluster validate`` refuses a file whose start commands do not
set ``RAY_AUTH_MODE=token``, that ships no token or whose token file does not exist yet (:func:`token_problems`),
unless ``metadata.calib.trusted_network`` is true.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import re
import secrets
from pathlib import Path
from typing import Any

from calib._config import ConfigError
from calib.cluster.cluster_file import CALIB_SECTION, Problem, load_cluster_yaml
from calib.cluster.launcher import Launcher
from calib.exit_codes import ExitCode

__all__ = ["AUTH_MODE", "LAUNCHER", "NODE_TOKEN_PATH", "START_KEYS", "TRUSTED_KEY", "ensure_token",
           "local_token_path", "token_mount", "token_problems", "uses_token_auth"]

AUTH_MODE = "RAY_AUTH_MODE=token"
"""What a ``ray start`` (and anything else that must require the token) is prefixed with."""
NODE_TOKEN_PATH = "~/.ray/auth_token"
"""Where each node keeps the cluster's token: Ray's default, which its processes and drivers read."""
START_KEYS = ("head_start_ray_commands", "worker_start_ray_commands")
TRUSTED_KEY = "trusted_network"
"""``metadata.calib.trusted_network: true``: the user says no one else reaches the nodes; no token required."""
_AUTH_RE = re.compile(r"(?<![\w-])RAY_AUTH_MODE=(['\"]?)token\1(?![\w-])")
_RAY_START_RE = re.compile(r"(?<![\w-])ray\s+start(?![\w-])")


def local_token_path(cluster_name: str) -> str:
    """Where the launching machine keeps ``cluster_name``'s token (``~`` unexpanded, as in a cluster file)."""
    return f"~/.config/calib/ray-tokens/{cluster_name}.token"


def uses_token_auth(command: str) -> bool:
    """Whether ``command`` sets ``RAY_AUTH_MODE=token`` before each ``ray start`` it runs."""
    starts = [m.start() for m in _RAY_START_RE.finditer(command)]
    auth = [m.start() for m in _AUTH_RE.finditer(command)]
    return all(any(a < s for a in auth) for s in starts)


def token_mount(config: dict[str, Any]) -> str | None:
    """The local file ``file_mounts`` ships to the nodes' :data:`NODE_TOKEN_PATH`, or None."""
    mounts = config.get("file_mounts")
    if not isinstance(mounts, dict):
        return None
    for remote, local in mounts.items():
        if isinstance(remote, str) and _same_node_path(remote, NODE_TOKEN_PATH) and isinstance(local, str):
            return local
    return None


def _same_node_path(a: str, b: str) -> bool:
    return posixpath.normpath(a.replace("$HOME", "~")) == posixpath.normpath(b)


def token_problems(config: dict[str, Any], calib: dict[str, Any], source: str | None = None) -> list[Problem]:
    """One problem (the first start command without token authentication, the missing token mount, or a token
    file that does not exist here yet), or none when every ``ray start`` of ``config`` (as Ray prepared it: its
    defaults filled in) requires the token and ``file_mounts`` ships an existing one, or when
    ``metadata.calib.trusted_network`` is true. ``source``: the cluster file, named in the fix."""
    trusted = calib.get(TRUSTED_KEY, False)
    if not isinstance(trusted, bool):
        return [Problem(f"{CALIB_SECTION}.{TRUSTED_KEY}", f"must be true or false, got {trusted!r}.")]
    if trusted:
        return []
    open_starts = [f"{key}[{i}]" for key in START_KEYS if isinstance(config.get(key), list)
                   for i, command in enumerate(config[key])
                   if isinstance(command, str) and _RAY_START_RE.search(command) and not uses_token_auth(command)]
    how = (f"anyone who reaches the nodes' ports could join the cluster and run code on every host; see "
           f"docs/how-to/ray-cluster.md#who-can-reach-your-cluster (or set {CALIB_SECTION}.{TRUSTED_KEY}: true if "
           f"no one else can reach these machines).")
    if open_starts:
        others = f" (and {', '.join(open_starts[1:])})" if open_starts[1:] else ""
        return [Problem(open_starts[0], f"starts Ray without token authentication{others}: put `{AUTH_MODE}` "
                                        f"before `ray start` (Ray's defaults apply when the file sets no start "
                                        f"commands); {how}")]
    local = token_mount(config)
    if local is None:
        return [Problem("file_mounts", f"ships no token to the nodes: add `\"{NODE_TOKEN_PATH}\": "
                                       f"\"{local_token_path(str(config.get('cluster_name', 'calib')))}\"` and create "
                                       f"it with `python -m calib.cluster token FILE`; {how}")]
    if not Path(local).expanduser().is_file():  # `ray up` would end in Ray's FileNotFoundError traceback
        return [Problem(f"file_mounts[{NODE_TOKEN_PATH}]",
                        f"the token file {local} does not exist yet: create it with `python -m calib.cluster token "
                        f"{source or 'FILE'}` before `ray up`.")]
    return []


def ensure_token(path: str | os.PathLike, *, rotate: bool = False) -> bool:
    """Create the token file at ``path`` (its folder 0700, the file 0600, a random 256-bit hex token) unless it
    exists; with ``rotate``, replace it by a new one. Whether a token was written. An existing file readable by
    others is made private (0600)."""
    file = Path(path).expanduser()
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if file.exists() and not rotate:
        if file.stat().st_mode & 0o077:
            file.chmod(0o600)
        if not file.read_text().strip():
            raise ConfigError(f"the token file {file} is empty: make a new one with `--rotate`.")
        return False
    new = file.with_name(f".{file.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(secrets.token_hex(32) + "\n")
    os.replace(new, file)
    return True


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the cluster file, e.g. cluster.yaml or cluster-onprem.yaml")
    parser.add_argument("--rotate", action="store_true",
                        help="replace the token by a new one (then `ray up` the cluster again)")


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    config = load_cluster_yaml(args.file)
    local = token_mount(config)
    if local is None:
        raise ConfigError(f"{args.file}: file_mounts ships no token to the nodes' {NODE_TOKEN_PATH}; regenerate the "
                          f"file, or see docs/how-to/ray-cluster.md#who-can-reach-your-cluster.")
    written = ensure_token(local, rotate=args.rotate)
    what = "new token" if args.rotate else ("token created" if written else "token exists, kept")
    print(f"{what}: {Path(local).expanduser()} (mode 0600; `ray up` copies it to every node's {NODE_TOKEN_PATH})")
    return ExitCode.OK


LAUNCHER = Launcher("token", "create the cluster's Ray token where the cluster file's file_mounts ship it from "
                             "(once; --rotate: a new one)", _add_arguments, _run)
"""``python -m calib.cluster token FILE [--rotate]``."""
