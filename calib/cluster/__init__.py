"""Ray clusters for calib's studies: check a launcher file, make the on-prem one, wait for the nodes.

``python -m calib.cluster validate FILE``: Ray's own schema plus calib's rules, offline
(:mod:`calib.cluster.validate`). ``python -m calib.cluster onprem cluster.yaml ...``: the launcher file
for your own machines, sharing cluster.yaml's launcher sections (:mod:`calib.cluster.onprem`). ``python -m
calib.cluster token FILE``: the cluster's Ray token, where the file's ``file_mounts`` ship it from
(:mod:`calib.cluster.token`).
``python -m calib.cluster wait --nodes N``: on the head, until N nodes are up; ``python -m calib.cluster
stop-workers``: on an on-prem head, ``ray stop`` on every worker before ``ray down`` (:mod:`calib.cluster.nodes`).
``python -m calib.cluster slurm ... -- python studies/<study>.py ...``: a Slurm job that runs a study
(:mod:`calib.cluster.slurm`). ``python -m calib.cluster.mps start|run|stop``: NVIDIA MPS on a node, run by the
launchers (:mod:`calib.cluster.mps`). Each subcommand is a :class:`~calib.cluster.launcher.Launcher` of
:data:`LAUNCHERS`.
"""

from __future__ import annotations

import argparse
import sys

from calib._config import ConfigError
from calib._help import CommandParser, HelpFormatter
from calib.cluster import nodes, onprem, slurm, token, validate
from calib.cluster.launcher import Launcher
from calib.cluster.onprem import SHARED_CALIB_KEYS, SHARED_KEYS, render_onprem
from calib.cluster.validate import (
    Checked,
    ClusterConfigError,
    Problem,
    check_cluster,
    load_cluster_yaml,
    validate_cluster,
)
from calib.exit_codes import ExitCode

__all__ = ["LAUNCHERS", "SHARED_CALIB_KEYS", "SHARED_KEYS", "Checked", "ClusterConfigError", "Launcher", "Problem",
           "check_cluster", "load_cluster_yaml", "main", "render_onprem", "validate_cluster"]

LAUNCHERS: tuple[Launcher, ...] = (validate.LAUNCHER, onprem.LAUNCHER, token.LAUNCHER, nodes.WAIT, slurm.LAUNCHER,
                                   nodes.STOP_WORKERS)
"""The subcommands of ``python -m calib.cluster``, in the order ``--help`` lists them."""


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m calib.cluster", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for launcher in LAUNCHERS:
        launcher.add_arguments(sub.add_parser(launcher.name, formatter_class=HelpFormatter, help=launcher.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    """The CLI: 0 on success, 2 with one ``error:`` line per problem, 1 when ``wait`` times out or a worker
    could not be stopped (:mod:`calib.exit_codes`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    launcher = next(launcher for launcher in LAUNCHERS if launcher.name == args.command)
    try:
        return launcher.run(args, argv)
    except ConfigError as err:
        for line in str(err).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return ExitCode.BAD_INPUT
