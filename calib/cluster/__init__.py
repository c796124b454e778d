"""Ray clusters for calib's studies: check a launcher file, make the on-prem one, wait for the nodes.

``python -m calib.cluster validate FILE``: Ray's own schema plus calib's rules, offline
(:mod:`calib.cluster.validate`). ``python -m calib.cluster onprem cluster.yaml ...``: the launcher file
for your own machines, sharing cluster.yaml's launcher sections (:mod:`calib.cluster.onprem`).
``python -m calib.cluster wait --nodes N``: on the head, until N nodes are up; ``python -m calib.cluster
stop-workers``: on an on-prem head, ``ray stop`` on every worker before ``ray down`` (:mod:`calib.cluster.nodes`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from calib._config import ConfigError
from calib.cluster.nodes import BOOTSTRAP_CONFIG
from calib.cluster.onprem import SHARED_CALIB_KEYS, SHARED_KEYS, onprem_text, render_onprem
from calib.cluster.validate import (
    Checked,
    ClusterConfigError,
    Problem,
    check_cluster,
    load_cluster_yaml,
    validate_cluster,
)

__all__ = ["SHARED_CALIB_KEYS", "SHARED_KEYS", "Checked", "ClusterConfigError", "Problem", "check_cluster",
           "load_cluster_yaml", "main", "render_onprem", "validate_cluster"]


def _parser() -> argparse.ArgumentParser:
    from calib.cli import HelpFormatter

    parser = argparse.ArgumentParser(prog="python -m calib.cluster", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", formatter_class=HelpFormatter,
                              help="check a Ray cluster YAML offline: Ray's schema and calib's rules")
    validate.add_argument("file", help="the cluster YAML, e.g. cluster.yaml or cluster-onprem.yaml")
    validate.add_argument("--store", default=None,
                          help="the store URI the studies will use (default: metadata.calib.store)")
    validate.add_argument("--gpus-per-trial", type=float, default=None,
                          help="GPUs each trial requests (default: metadata.calib.gpus_per_trial, else 1 as in "
                               "--preset paper)")

    onprem = sub.add_parser("onprem", formatter_class=HelpFormatter,
                            help="write the launcher file for your own machines (Ray's local provider) from "
                                 "cluster.yaml's shared sections")
    onprem.add_argument("source", help="the cluster file whose launcher sections to share, e.g. cluster.yaml")
    onprem.add_argument("--head-ip", required=True, help="address of the head node (runs the study driver)")
    onprem.add_argument("--worker-ips", nargs="*", default=[], metavar="IP",
                        help="addresses of the worker nodes (none: a one-node cluster)")
    onprem.add_argument("--ssh-user", required=True, help="account the launcher logs in as on every host")
    onprem.add_argument("--ssh-key", required=True, help="private key that logs in to every host")
    onprem.add_argument("--store", default=None,
                        help="store every host reaches: s3://<bucket>/calib or a path on a shared mount "
                             "(default: the source's metadata.calib.store)")
    onprem.add_argument("--venv", default=None,
                        help="run the hosts' commands in this virtual environment, e.g. ~/venv (default: the "
                             "login shell's Python)")
    onprem.add_argument("--cluster-name", default="calib-onprem", help="Ray's cluster_name")
    onprem.add_argument("-o", "--output", default=None, help="file to write (default: standard output)")

    wait = sub.add_parser("wait", formatter_class=HelpFormatter,
                          help="on the head node: wait until the cluster has N nodes alive")
    wait.add_argument("--nodes", type=int, required=True, help="nodes to wait for, the head included")
    wait.add_argument("--address", default="auto", help="Ray cluster to ask")
    wait.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up (exit 1)")

    stop = sub.add_parser("stop-workers", formatter_class=HelpFormatter,
                          help="on an on-prem head: `ray stop` on every worker (before `ray down`, which stops the "
                               "head only)")
    stop.add_argument("--config", default=BOOTSTRAP_CONFIG,
                      help="the cluster file `ray up` put on the head")
    return parser


def _onprem(args: argparse.Namespace, argv: list[str]) -> int:
    source = load_cluster_yaml(args.source)
    config = render_onprem(source, head_ip=args.head_ip, worker_ips=args.worker_ips, ssh_user=args.ssh_user,
                           ssh_key=args.ssh_key, store=args.store, venv=args.venv, cluster_name=args.cluster_name)
    text = onprem_text(config, Path(args.source).name, argv[1:])
    if args.output is None:
        sys.stdout.write(text)
        return 0
    Path(args.output).write_text(text)
    print(f"wrote {args.output}: {len(config['provider']['worker_ips'])} worker(s), head {args.head_ip}; "
          f"check it with `python -m calib.cluster validate {args.output}`")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The CLI: 0 on success, 2 with one ``error:`` line per problem, 1 when ``wait`` times out or a worker
    could not be stopped."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    try:
        if args.command == "validate":
            print(validate_cluster(args.file, store=args.store, gpus_per_trial=args.gpus_per_trial))
        elif args.command == "onprem":
            return _onprem(args, argv)
        elif args.command == "stop-workers":
            from calib.cluster.nodes import stop_workers

            results = stop_workers(args.config)
            for address, stopped, output in results:
                last = output.splitlines()[-1] if output else ""
                print(f"stopped Ray on {address}" if stopped else f"error: could not stop Ray on {address}: {last}")
            if not results:
                print("no workers in the cluster file")
            return 0 if all(stopped for _, stopped, _ in results) else 1
        else:
            from calib.cluster.nodes import wait_for_nodes

            try:
                lines = wait_for_nodes(args.nodes, address=args.address, timeout=args.timeout)
            except ValueError as err:
                raise ConfigError(str(err)) from None
            except TimeoutError as err:
                print(f"error: {err}", file=sys.stderr)
                return 1
            print(f"{len(lines)} nodes up:")
            for line in lines:
                print(f"  {line}")
    except ConfigError as err:
        for line in str(err).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    return 0
