"""Ray on the driver: joining a cluster or starting local Ray, checking ``--address``, quieting Ray's logs.

Stage-I claim settings (``CALIB_STAGE1_*``, :mod:`calib.artifacts.claim`) and the ``--plugin`` modules
(``CALIB_PLUGINS``, :mod:`calib.plugins`) of the driver are forwarded to every Ray worker of the run
through Ray's runtime environment, with the plugins' code where it is not installed (``py_modules``).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from calib._config import ConfigError
from calib.artifacts.claim import LEASE_ENV, WAIT_ENV
from calib.artifacts.handover import HANDOVER_ENV
from calib.plugins import PLUGINS_ENV, ray_py_modules

__all__ = ["FORWARDED_ENV", "RAY_NOISE", "check_address", "init_ray", "quiet_ray_logs"]


os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
# A failed trial is one calib line (ProgressDisplay); its traceback is in the store's `error` column.
os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
# Stage-I checkpoints are reported mid-trial without the search objective, which exists only at the end.
os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
# Ctrl-C is the study's own clean stop (calib.run.stopping), which says the run was interrupted; Tune's SIGINT
# handler would end the run as if its unfinished trials had failed.
os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
# Each Tune checkpoint forces a snapshot of the experiment state, and Tune warns when one comes within 5 s
# of the previous snapshot, periodic ones included: a coincidence of timing, since calib spaces a
# trial's checkpoints by checkpoint_every epochs and checkpoint_min_seconds (HyperBand: every epoch).
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")

# Ray log records that calib replaces with its own lines or that are not the user's business:
# logger name -> message prefixes dropped. Everything else Ray logs still reaches the user.
RAY_NOISE: dict[str, tuple[str, ...]] = {
    # the notice that a local cluster turned on Ray's token authentication (its default)
    "ray._private.authentication.authentication_token_setup": ("Token authentication is enabled",),
    # the list of failed trials at the end of a run: calib prints one line per failed trial; a run stopped by
    # SIGTERM (Tune's graceful stop): calib says so in its last line, and a re-run of the command continues it
    "ray.tune.tune": ("Trials did not complete", "Stop signal received", "Experiment has been interrupted"),
    # the trials a stopped run ended before their first report: calib's last line counts what is in the store
    "ray.tune.analysis.experiment_analysis": ("Failed to fetch metrics for",),
}


def check_address(address: str | None) -> None:
    """Fail fast with a ``ConfigError`` on an ``--address`` that is malformed or where nothing listens
    (Ray itself would retry for minutes). ``None`` (local Ray) and ``"auto"`` pass; ``"auto"`` is
    checked when Ray connects."""
    if address is None or address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        problem = f" (the port must be 1-65535, got {port})" if sep and host and port.isdigit() else ""
        raise ConfigError(
            f"`--address` must be 'auto', HOST:PORT or ray://HOST:PORT of a running Ray cluster (the head's GCS "
            f"port, 6379 by default), got --address={address!r}{problem}. Leave it out to start Ray on this machine."
        )
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ConfigError(
            f"Nothing answers at --address={address!r} ({err.strerror or err}): no Ray cluster listens there. "
            f"Start one (`ray start --head`, or `ray up cluster.yaml`), pass the head's address, or leave "
            f"--address out to start Ray on this machine."
        ) from None


FORWARDED_ENV = (LEASE_ENV, WAIT_ENV, HANDOVER_ENV, PLUGINS_ENV)
"""Environment variables of the driver that every Ray worker of its run sees: the Stage-I claim settings and
the ``--plugin`` modules."""


def init_ray(address: str | None = None) -> None:
    """Start local Ray on this machine's CPUs, or join the cluster at ``address`` ("auto" or host:port).

    A cluster that cannot be reached raises ``ConfigError``. The driver's :data:`FORWARDED_ENV` reach
    every worker of the run (Ray's runtime environment), and so does the code of the ``--plugin`` modules
    that are not installed (:func:`calib.plugins.ray_py_modules`); on this machine also its ``PYTHONPATH``.
    """
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    import ray

    if ray.is_initialized():
        return
    check_address(address)
    quiet_ray_logs()
    common: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False, "include_dashboard": False}
    forwarded = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    if address is None and "PYTHONPATH" in os.environ:  # local workers import the driver's code (Ray's py_modules
        forwarded["PYTHONPATH"] = os.environ["PYTHONPATH"]  # would otherwise replace the inherited PYTHONPATH)
    if forwarded:
        common["runtime_env"] = {"env_vars": forwarded}
    if shipped := ray_py_modules():
        common.setdefault("runtime_env", {})["py_modules"] = shipped
    if address is None:
        ray.init(num_cpus=os.cpu_count(), **common)
        return
    try:
        ray.init(address=address, **common)
    except ConnectionError as err:
        raise ConfigError(
            f"Could not connect to a Ray cluster with --address={address!r}: {err} Start one (`ray start "
            f"--head`, or `ray up cluster.yaml`), or leave --address out to start Ray on this machine."
        ) from None


class _DropRecords(logging.Filter):
    """Drops the log records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def quiet_ray_logs() -> None:
    """Install the :data:`RAY_NOISE` filters on Ray's loggers in this process (once)."""
    for name, prefixes in RAY_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRecords) for f in logger.filters):
            logger.addFilter(_DropRecords(prefixes))
