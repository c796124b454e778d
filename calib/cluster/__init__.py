"""Ray clusters for calib's studies: check a launcher file, make the on-prem one, wait for the nodes.

``python -m calib.cluster validate FILE``: Ray's own schema plus calib's rules, offline
(:mod:`calib.cluster.validate`). ``python -m calib.cluster onprem cluster.yaml ...``: the launcher file
for your own machines, sharing cluster.yaml's launcher sections (:mod:`calib.cluster.onprem`).
``python -m calib.cluster wait --nodes N``: on the head, until N nodes are up; ``python -m calib.cluster
stop-workers``: on an on-prem head, ``ray stop`` on every worker before ``ray down`` (:mod:`calib.cluster.nodes`).
``python -m calib.cluster.mps start|run|stop``: NVIDIA MPS on a node, run by the launchers (:mod:`calib.cluster.mps`).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
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
    onprem.add_argument("--mps", action=argparse.BooleanOptionalAction, default=True,
                        help="start NVIDIA MPS on every node with GPUs before Ray, so trials sharing a GPU run at "
                             "once; --no-mps where the site runs MPS itself or must not share GPUs")
    onprem.add_argument("-o", "--output", default=None, help="file to write (default: standard output)")

    wait = sub.add_parser("wait", formatter_class=HelpFormatter,
                          help="on the head node: wait until the cluster has N nodes alive (exit 1 at once when "
                               "the autoscaler reports a node it could not start)")
    wait.add_argument("--nodes", type=int, required=True, help="nodes to wait for, the head included")
    wait.add_argument("--address", default="auto", help="Ray cluster to ask")
    wait.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up (exit 1)")

    slurm = sub.add_parser("slurm", formatter_class=HelpFormatter,
                           help="write (and with --submit, submit) an sbatch script that runs a study on a Slurm job's "
                                "nodes: python -m calib.cluster slurm [settings] -- python studies/<study>.py ...")
    slurm.add_argument("--settings", default=None, metavar="FILE",
                       help="a YAML file of these settings (keys as below, dashes or underscores); flags override it")
    slurm.add_argument("--partition", default=None, help="Slurm partition (default: the cluster's default)")
    slurm.add_argument("--account", default=None, help="account to charge")
    slurm.add_argument("--qos", default=None, help="quality of service")
    slurm.add_argument("--nodes", type=int, default=None, help="nodes of the job (default 1): Ray's head and workers")
    slurm.add_argument("--gpus-per-node", type=int, default=None, help="GPUs on each node (default 0)")
    slurm.add_argument("--cpus-per-node", type=int, default=None,
                       help="CPUs on each node (default: Slurm's default for one task)")
    slurm.add_argument("--mem-per-node", default=None, help="memory on each node, e.g. 64G")
    slurm.add_argument("--time", default=None, help="time limit of each start of the job (default 24:00:00)")
    slurm.add_argument("--signal-seconds", type=int, default=None,
                       help="Slurm's warning this long before the time limit: the study stops cleanly and the job "
                            "requeues itself (default 300)")
    slurm.add_argument("--max-requeues", type=int, default=None,
                       help="starts after the first the job may have, time limits and preemptions together (default 3)")
    slurm.add_argument("--handover-seconds", type=int, default=None,
                       help="how often a Stage I being trained saves the state a requeued job continues from "
                            "(default 120)")
    slurm.add_argument("--setup", action="append", default=None, metavar="LINE",
                       help="a shell line run before anything else on the job (repeatable), e.g. "
                            "'module load cuda/12.4' and 'source ~/venv/bin/activate'")
    slurm.add_argument("--run-dir", default=None,
                       help="the folder the job runs the command from, on the cluster's shared file system; logs go "
                            "to <run dir>/slurm/ (default: this folder)")
    slurm.add_argument("--job-name", default=None, help="job name (default calib-<study>)")
    slurm.add_argument("--sbatch-option", action="append", default=None, dest="sbatch_options", metavar="OPTION",
                       help="another #SBATCH option, as given (repeatable), e.g. --sbatch-option=--constraint=a100")
    slurm.add_argument("--mps", action=argparse.BooleanOptionalAction, default=None,
                       help="start NVIDIA MPS on every node of a GPU job before Ray, so trials sharing a GPU run at "
                            "once (default: on); --no-mps where the site runs MPS itself or must not share GPUs")
    slurm.add_argument("-o", "--output", default=None,
                       help="the script to write (default <run dir>/slurm/<job name>.sbatch)")
    slurm.add_argument("--submit", action="store_true", help="also submit it with sbatch and say how to follow it")
    slurm.add_argument("study_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                       help="after --: the study command, e.g. -- python studies/sensitivity_gamma.py --preset paper")

    stop = sub.add_parser("stop-workers", formatter_class=HelpFormatter,
                          help="on an on-prem head: `ray stop` on every worker (before `ray down`, which stops the "
                               "head only)")
    stop.add_argument("--config", default=BOOTSTRAP_CONFIG,
                      help="the cluster file `ray up` put on the head")
    return parser


def _onprem(args: argparse.Namespace, argv: list[str]) -> int:
    source = load_cluster_yaml(args.source)
    config = render_onprem(source, head_ip=args.head_ip, worker_ips=args.worker_ips, ssh_user=args.ssh_user,
                           ssh_key=args.ssh_key, store=args.store, venv=args.venv, cluster_name=args.cluster_name,
                           mps=args.mps)
    text = onprem_text(config, Path(args.source).name, argv[1:])
    if args.output is None:
        sys.stdout.write(text)
        return 0
    Path(args.output).write_text(text)
    print(f"wrote {args.output}: {len(config['provider']['worker_ips'])} worker(s), head {args.head_ip}; "
          f"check it with `python -m calib.cluster validate {args.output}`")
    return 0


def _slurm(args: argparse.Namespace) -> int:
    from calib.cluster.slurm import (
        SlurmSettings,
        check_command,
        check_with_slurm,
        local_storage_warnings,
        render_script,
        submit,
    )

    base = SlurmSettings.from_file(args.settings) if args.settings else SlurmSettings()
    given = {name: getattr(args, name) for name in ("partition", "account", "qos", "nodes", "gpus_per_node",
                                                    "cpus_per_node", "mem_per_node", "time", "signal_seconds",
                                                    "max_requeues", "handover_seconds", "run_dir", "job_name", "mps")}
    given.update({name: tuple(getattr(args, name)) for name in ("setup", "sbatch_options") if getattr(args, name)})
    settings = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    settings.check()
    command = args.study_command[1:] if args.study_command[:1] == ["--"] else args.study_command
    run_dir = Path(settings.run_dir).expanduser().resolve()
    if not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is not a folder.")
    name = settings.job_name or f"calib-{_study_name(command)}"
    script = render_script(settings, command, name=name)
    if shutil.which("sbatch"):
        check_with_slurm(settings, script)
    elif args.submit:
        raise ConfigError("sbatch is not on this machine's PATH: run this on a login node of the cluster, or write "
                          "the script here (without --submit) and submit it there with sbatch.")
    checked = check_command(command, run_dir)
    for warning in local_storage_warnings(run_dir, command):
        print(warning, file=sys.stderr)
    path = Path(args.output).resolve() if args.output else run_dir / "slurm" / f"{name}.sbatch"
    (run_dir / "slurm").mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    print(checked)
    if not args.submit:
        print(f"wrote {path}: submit it with `sbatch {path}`")
        return 0
    job = submit(path)
    log = run_dir / "slurm" / f"{name}-{job}.out"
    print(f"submitted job {job} ({path})\n  log:    {log}\n  follow: squeue -j {job}; tail -f {log}\n"
          f"  cancel: scancel {job}")
    return 0


def _flag_value(command: list[str], flag: str) -> str | None:
    for i, token in enumerate(command):
        if token == flag and i + 1 < len(command):
            return command[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def _study_name(command: list[str]) -> str:
    """The study a command runs: its --study, else the script's default (its file name; search_<space>)."""
    script = Path(command[1]).stem if len(command) > 1 else "study"
    space = _flag_value(command, "--space")
    return _flag_value(command, "--study") or (f"search_{Path(space).stem}" if script == "search" and space
                                               else script)


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
        elif args.command == "slurm":
            return _slurm(args)
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
            from calib.cluster.nodes import NodeStartError, wait_for_nodes

            try:
                lines = wait_for_nodes(args.nodes, address=args.address, timeout=args.timeout)
            except ValueError as err:
                raise ConfigError(str(err)) from None
            except (TimeoutError, NodeStartError) as err:
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
