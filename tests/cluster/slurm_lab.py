"""A real Slurm on this machine, for running calib's sbatch scripts in a test.

``slurmctld`` runs on a bridge; each compute node is a ``slurmd`` in a network namespace of its own on that
bridge (``nsenter --net``: ``ip netns exec`` remounts /sys and slurmd 22.05 then aborts), with a private
``/tmp`` (a mount namespace binding a folder of the lab over it: Ray's per-node files live there, as on
real nodes). The lab's own folder and the folders given as ``shared`` (the checkout, the Python's environment)
are seen by every node at the same path, as on a cluster's shared file system: those under ``/tmp`` are bound
into each node's own ``/tmp`` at their place. Debian's slurm-wlm 22.05, no munge (``auth/none``, ``cred/none``),
no accounting, one partition. Client commands find the lab through ``SLURM_CONF`` (:attr:`SlurmLab.env`). Everything is
created under one directory outside ``/tmp`` and torn down by :meth:`SlurmLab.close`: the daemons (by
PID), whatever the jobs left in the namespaces, the namespaces, the bridge and the directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab_hosts import add_bridge, add_namespace_host, free_subnet, lab_leftovers, namespace_pids, remove_network

DAEMONS = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "sinfo", "scancel")


def missing_slurm() -> str | None:
    """Why a Slurm lab cannot be built here, or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (network and mount namespaces)"
    missing = [tool for tool in (*DAEMONS, "nsenter", "unshare", "ip") if shutil.which(tool) is None]
    if missing:
        return (f"missing {', '.join(missing)} (Debian: apt-get install --no-install-recommends slurmctld slurmd "
                f"slurm-client)")
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


@dataclass
class SlurmNode:
    name: str
    ip: str
    netns: str
    tmp: Path
    process: subprocess.Popen | None = None


@dataclass
class SlurmLab:
    root: Path
    tag: str
    gateway: str
    nodes: list[SlurmNode]
    conf: Path
    shared: tuple[Path, ...] = ()
    """Folders of this machine the nodes see at the same path (bound into their own /tmp when under /tmp)."""
    partition: str = "debug"
    controller: subprocess.Popen | None = None
    _links: list[str] = field(default_factory=list)

    @property
    def shared_paths(self) -> list[Path]:
        """Every folder the nodes see as this machine does: the lab's own and :attr:`shared`; what a launch names
        with ``--shared-path`` (the lab's folder is under /var/tmp, which real nodes keep to themselves)."""
        return [self.root, *self.shared]

    @property
    def env(self) -> dict[str, str]:
        """This machine's environment with ``SLURM_CONF`` pointing at the lab."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, **kwargs: object) -> subprocess.CompletedProcess:
        """A Slurm client command against the lab (``sbatch``, ``squeue``...), its output captured as text."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check, **kwargs)

    @classmethod
    def create(cls, nodes: int = 2, cpus: int = 2, kill_wait: int = 60, shared: tuple[Path, ...] = ()) -> SlurmLab:
        """A lab of ``nodes`` nodes with ``cpus`` CPUs each; Slurm kills a job's processes ``kill_wait``
        seconds after its SIGTERM (``KillWait``: sites set 5 to 120 s). The nodes see the folders ``shared``
        at the same path, as on a shared file system, wherever they are (under /tmp too)."""
        tag = secrets.token_hex(3)
        root = Path(tempfile.mkdtemp(prefix=f"sl{tag}", dir="/var/tmp"))
        subnet = free_subnet()
        lab = cls(root=root, tag=tag, gateway=f"{subnet}.1", nodes=[], conf=root / "slurm.conf",
                  shared=tuple(dict.fromkeys(Path(p).resolve() for p in shared)))
        try:
            lab._build(nodes, cpus, subnet, kill_wait)
        except BaseException:
            lab.close()
            raise
        return lab

    def _build(self, count: int, cpus: int, subnet: str, kill_wait: int) -> None:
        bridge = add_bridge(self.tag, self.gateway, self._links)
        for i in range(count):
            node = SlurmNode(name=f"n{self.tag}{i + 1}", ip=f"{subnet}.{i + 2}", netns=f"slurm-{self.tag}-{i}",
                             tmp=self.root / f"tmp{i + 1}")
            add_namespace_host(bridge, node.netns, node.ip, self.gateway, f"{self.tag}{i}", self._links)
            node.tmp.mkdir(mode=0o1777)
            node.tmp.chmod(0o1777)
            (self.root / "spool" / node.name).mkdir(parents=True)
            self.nodes.append(node)
        for folder in ("state", "log"):
            (self.root / folder).mkdir()
        host = socket.gethostname()
        lines = [
            f"ClusterName=lab{self.tag}", f"SlurmctldHost={host}({self.gateway})",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "AuthType=auth/none", "CredType=cred/none", "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={self.root}/state", f"SlurmdSpoolDir={self.root}/spool/%n",
            f"SlurmctldPidFile={self.root}/slurmctld.pid", f"SlurmdPidFile={self.root}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root}/log/slurmctld.log", f"SlurmdLogFile={self.root}/log/slurmd-%n.log",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "SwitchType=switch/none", "ReturnToService=2",
            f"KillWait={kill_wait}", "MinJobAge=60",
            "SlurmdDebug=verbose",  # the slurmd log then says how each batch script ended (batch_exit_codes)
            *(f"NodeName={n.name} NodeHostname={host} NodeAddr={n.ip} CPUs={cpus} RealMemory=2000 State=UNKNOWN"
              for n in self.nodes),
            f"PartitionName={self.partition} Nodes={','.join(n.name for n in self.nodes)} Default=YES "
            f"MaxTime=INFINITE State=UP OverSubscribe=NO",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        log = open(self.root / "log" / "slurmctld.out", "wb")
        self.controller = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(self.conf)], stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        log.close()
        for node in self.nodes:
            log = open(self.root / "log" / f"{node.name}.out", "wb")
            node.process = subprocess.Popen(
                ["nsenter", f"--net=/var/run/netns/{node.netns}", "unshare", "--mount", "--propagation", "private",
                 "sh", "-c", f"{self._bind_shared(node)}mount --rbind {node.tmp} /tmp && "
                             f"exec slurmd -D -N {node.name} -f {self.conf}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
            log.close()
        deadline = time.monotonic() + 60
        while True:
            states = self.run("sinfo", "--noheader", "--format=%t", check=False).stdout.split()
            if states and all(s == "idle" for s in states) and len(self.nodes) == self._node_count():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the lab's nodes are not idle after 60 s: sinfo says {states}; logs in "
                                   f"{self.root / 'log'}")
            time.sleep(0.5)

    def _bind_shared(self, node: SlurmNode) -> str:
        """Shell commands binding each shared folder under /tmp into the node's own /tmp (its folder of the lab),
        before that replaces /tmp: the node then sees the folder at its path, as every node sees a shared file
        system. The binds live in the node's mount namespace only: on this machine its folder stays empty."""
        binds = []
        for folder in self.shared:
            if Path("/tmp") not in folder.parents:
                continue
            target = node.tmp / folder.relative_to("/tmp")
            target.mkdir(parents=True, exist_ok=True)
            binds.append(f"mount --bind {shlex.quote(str(folder))} {shlex.quote(str(target))} && ")
        return "".join(binds)

    def _node_count(self) -> int:
        return len(self.run("sinfo", "--noheader", "--Node", "--format=%N", check=False).stdout.split())

    def wait_job(self, job: str, *, timeout: float, states: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED",
                                                                                  "TIMEOUT")) -> str:
        """Wait until ``job`` is in one of ``states`` (``scontrol show job``'s JobState); its state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job)
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} is {state} after {timeout:.0f} s, not one of {states}")
            time.sleep(0.5)

    def job_state(self, job: str) -> str:
        out = self.run("scontrol", "show", "job", job, check=False).stdout
        for token in out.split():
            if token.startswith("JobState="):
                return token.split("=", 1)[1]
        return "GONE"

    def start_now(self, job: str, timeout: float = 60.0) -> None:
        """Start a requeued job now instead of after Slurm's delay (reason BeginTime, about 2 minutes).

        Not within the second of the requeue: slurmd refuses a job credential created in the second its
        previous one was revoked ("Job credential revoked") and the job would end there. Slurm may set its
        own begin time after the job shows as PENDING, so the update is repeated until it leaves PENDING."""
        time.sleep(2.0)
        deadline = time.monotonic() + timeout
        while (state := self.job_state(job)) == "PENDING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} still pending after {timeout:.0f} s: "
                                   f"{self.run('scontrol', 'show', 'job', job, check=False).stdout}")
            self.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
            time.sleep(1.0)
        if state not in ("RUNNING", "CONFIGURING", "COMPLETED"):
            raise RuntimeError(f"job {job} is {state} after its start; see {self.root / 'log'}")

    def batch_exit_codes(self, job: str) -> list[str]:
        """How each start of ``job``'s batch script ended, in order, as its ``slurmstepd`` logged it (``job_rc``,
        a wait status): ``"exit N"`` or ``"signal N"``."""
        found = []
        for log in (self.root / "log").glob("slurmd-*.log"):
            found += re.findall(rf"^\[(\S+)\] \[{job}\.batch\] job {job} completed with slurm_rc = -?\d+, "
                                rf"job_rc = (\d+)$", log.read_text(errors="replace"), flags=re.MULTILINE)
        statuses = [int(status) for _, status in sorted(found)]
        return [f"exit {s >> 8}" if s & 0x7F == 0 else f"signal {s & 0x7F}" for s in statuses]

    def on_node(self, node: SlurmNode, command: str, *, user: int | None = None) -> subprocess.CompletedProcess:
        """``command`` (sh) on ``node`` as its jobs see it (its network and its own /tmp), as the Unix user of uid
        ``user`` (its own group, no other: ``setpriv``) or root; its output captured as text, never raising."""
        as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] if user else []
        return subprocess.run(["nsenter", f"--target={node.process.pid}", "--mount", "--net", *as_user, "sh", "-c",
                               f"cd / && {command}"], capture_output=True, text=True, timeout=60)

    def listening(self, node: SlurmNode) -> dict[int, str]:
        """The TCP ports something listens on in ``node``'s network (``ss -ltnp``), each with its process's name."""
        out = self.on_node(node, "ss -Hltnp").stdout
        found = {}
        for line in filter(str.strip, out.splitlines()):
            fields = line.split()
            name = re.search(r'users:\(\("([^"]+)"', line)
            found[int(fields[3].rsplit(":", 1)[1])] = name.group(1) if name else "?"
        return found

    def processes(self) -> list[int]:
        """PIDs of every process left in the nodes' network namespaces."""
        return namespace_pids([n.netns for n in self.nodes])

    def close(self) -> None:
        """Stop the daemons and whatever the jobs left, delete the namespaces, links and files; never raises."""
        for proc in [self.controller, *(n.process for n in self.nodes)]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in [self.controller, *(n.process for n in self.nodes)]:
            if proc is not None:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=15)
        for _ in range(2):  # job steps and Ray processes started in the nodes' namespaces
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        remove_network([n.netns for n in self.nodes], self._links)
        shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of the lab still exists after :meth:`close` (empty when it cleaned up)."""
        return lab_leftovers(self.root, [n.netns for n in self.nodes], self._links)


def check_listed_ports(listening: dict[int, str], base: int, *, head: bool) -> None:
    """Every port listening on a node (``ss -ltn``) is one of the job's that docs/how-to/slurm.md lists ("What
    listens where"), or Slurm's own (slurmd, srun); each listed port of the node listens."""
    ray = {port for port, process in listening.items() if process not in ("slurmd", "srun", "slurmstepd")}
    always = {base + 1, base + 2, base + 7} | ({base} if head else set())
    client = {base + 3} if head and _imports("import grpc") else set()
    # The dashboard agent's gRPC, HTTP and metrics ports, and the head's dashboard metrics, with ray[default].
    dashboard = ({base + 4, base + 5, base + 6} | ({base + 8} if head else set())
                 if _imports("from ray._private.utils import get_dashboard_dependency_error as e; assert e() is None")
                 else set())
    workers = {port for port in ray if base + 20 <= port < base + 200}
    assert ray - workers == always | client | dashboard, (sorted(listening.items()), base)


def _imports(code: str) -> bool:
    """Whether ``code`` runs in the nodes' python: what Ray finds installed decides which of its servers start."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
