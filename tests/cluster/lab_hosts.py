"""Two SSH hosts made on this machine, for running Ray's cluster launcher for real in a test.

Each host is a network namespace joined to a bridge by a veth pair, with its own private address and
a default route through the bridge (so Ray finds the host's address). It runs its own ``sshd`` as PID 1
of its own PID, UTS (hostname) and mount namespaces: ``ray stop`` on one host sees only that host's
processes; the host's ``/etc/passwd`` gives the login user a home directory of the lab, so ``~/calib``,
``~/venv`` and ``~/ray_bootstrap_key.pem`` are per host, as on real machines. Every login's ``TMPDIR`` is
one path, ``<lab>/tmp``, which each host's mount namespace binds to a directory of its own: a Ray node
that joins a cluster takes the head's temporary directory (the path, not the files), so Ray's session
files, sockets and logs are per host only if that path is private on each host, as ``/tmp`` is on real
machines. Everything else (the system, the Python running the tests) is this machine's.

The hosts have no route beyond the bridge. Their Python is an overlay virtual environment per host
(``~/venv``) that sees the packages of the Python running the tests, and pip is configured offline
(``~/.config/pip/pip.conf``: no index, no build isolation, no dependency resolution), so the launcher's
``setup_commands`` find the pinned Ray and boto3 installed (a different pin fails: no index to get it
from) and ``pip install -e ~/calib`` installs each host's own copy without touching the test
environment. The test environment has ``ray[default]``'s dashboard packages (the ``test`` extra), so the
hosts run Ray with its dashboard and agents, as the nodes of cluster.yaml do.

Everything is created under one short-named directory (Ray's Unix sockets live under each host's
``TMPDIR``, and a socket path has at most 107 bytes) and torn down by
:meth:`Lab.close`: the sshd process trees (killing PID 1 of a PID namespace kills every process in it,
and the bind mounts go with the namespace), the namespaces, the bridge and veth pairs, the keys, and the
directory.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
TOOLS = ("ip", "unshare", "ssh", "ssh-keygen", "rsync")


def missing_requirements() -> str | None:
    """Why the lab cannot be built here (not root, a missing tool), or None."""
    if sys.platform != "linux":
        return "needs Linux network namespaces"
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, sshd)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None] + ([] if Path(SSHD).exists() else [SSHD])
    if missing:
        return f"missing {', '.join(missing)} (Debian: apt-get install openssh-server openssh-client rsync iproute2)"
    return None


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@dataclass
class Host:
    name: str
    ip: str
    netns: str
    home: Path  # the login user's home on the host (its /etc/passwd says so)
    tmp: Path  # what the host's TMPDIR (Lab.tmp, the same path on every host) holds, seen from outside
    process: subprocess.Popen | None = None


@dataclass
class Lab:
    """The hosts, their shared key, and the environment to run the launcher in."""

    root: Path
    tag: str
    gateway: str
    hosts: list[Host]
    key: Path
    user: str
    host_env: dict[str, str]
    outsiders: list[Host] = field(default_factory=list)  # hosts on the same bridge that are not in the cluster
    _links: list[str] = field(default_factory=list)
    _control_dirs: set[Path] = field(default_factory=set)  # Ray's SSH control dirs that existed before
    _made_sshd_dir: bool = False
    _s3_server: object | None = None  # moto's ThreadedMotoServer of start_s3, stopped by close

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def workers(self) -> list[Host]:
        return self.hosts[1:]

    @property
    def every_host(self) -> list[Host]:
        """The cluster's hosts and the outsiders."""
        return [*self.hosts, *self.outsiders]

    @property
    def tmp(self) -> Path:
        """Every login's TMPDIR on every host: one path, bound to each host's own ``Host.tmp``."""
        return self.root / "tmp"

    def ssh(self, host: Host, command: str, **popen: object) -> subprocess.Popen:
        """Run ``command`` in a login shell on ``host`` over SSH (``popen``: subprocess.Popen's arguments)."""
        return subprocess.Popen(
            ["ssh", "-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"{self.user}@{host.ip}", command], **popen)

    def start_s3(self) -> tuple[dict[str, str], str]:
        """A moto S3 server on the bridge address, which every host reaches, with a new bucket: the AWS
        variables that point at it, and the bucket's name. :meth:`close` stops it."""
        import boto3
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address=self.gateway, port=0, verbose=False)
        server.start()
        self._s3_server = server
        host, port = server.get_host_and_port()
        aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        bucket = f"calib-lab-{secrets.token_hex(5)}"
        boto3.client("s3", region_name="us-east-1", endpoint_url=aws["AWS_ENDPOINT_URL"],
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=bucket)
        return aws, bucket

    def launcher_env(self) -> dict[str, str]:
        """This machine's environment for ``ray up`` and friends, with HOME and TMPDIR inside the lab."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST_"))}
        home = self.root / "launcher"
        env.update(HOME=str(home), TMPDIR=str(home / "tmp"), RAY_USAGE_STATS_ENABLED="0",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        return env

    # ------------------------------------------------------------------------------------ building

    @classmethod
    def create(cls, names: tuple[str, ...] = ("calib-head", "calib-worker"), outsiders: tuple[str, ...] = ()) -> Lab:
        """The network, keys and per-host files; :meth:`start` then starts the hosts' sshd. ``outsiders``: more
        hosts on the bridge, with the same login, that the tests keep out of the cluster (:attr:`outsiders`)."""
        tag = secrets.token_hex(3)
        root = Path(tempfile.mkdtemp(prefix=f"cl{tag}", dir="/var/tmp"))
        subnet = free_subnet()
        user = os.environ.get("USER") or "root"
        lab = cls(root=root, tag=tag, gateway=f"{subnet}.1", hosts=[], key=root / "key", user=user, host_env={},
                  _control_dirs=_ray_control_dirs())
        try:
            lab._build(names, outsiders, subnet)
        except BaseException:
            lab.close()
            raise
        return lab

    def _build(self, names: tuple[str, ...], outsiders: tuple[str, ...], subnet: str) -> None:
        (self.root / "launcher" / "tmp").mkdir(parents=True)
        self.tmp.mkdir(mode=0o1777)
        self.tmp.chmod(0o1777)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"calib-lab-{self.tag}", "-f", str(self.key))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / "hostkey"))
        shutil.copy(self.key.with_suffix(".pub"), self.root / "authorized_keys")

        bridge = add_bridge(self.tag, self.gateway, self._links)
        for i, name in enumerate((*names, *outsiders)):
            host = Host(name=name, ip=f"{subnet}.{i + 2}", netns=f"calib-{self.tag}-{i}",
                        home=self.root / f"h{i}" / "home", tmp=self.root / f"h{i}" / "t")
            (self.hosts if i < len(names) else self.outsiders).append(host)
            add_namespace_host(bridge, host.netns, host.ip, self.gateway, f"{self.tag}{i}", self._links)
            host.tmp.mkdir(parents=True, mode=0o1777)
            host.tmp.chmod(0o1777)
            self._make_venv(host.home / "venv")
            self._write_pip_config(host.home)

    def start(self, host_env: dict[str, str] | None = None) -> None:
        """Start each host's sshd; ``host_env`` is set in every login on the hosts (e.g. AWS settings)."""
        self.host_env = dict(host_env or {})
        for host in self.every_host:
            self._start_sshd(host)
        for host in self.every_host:
            _wait_for_port(host.ip, 22, timeout=30)

    def _write_pip_config(self, home: Path) -> None:
        # Offline pip: requirements already in the overlay are satisfied without an index; an editable
        # install builds with the test environment's setuptools.
        (home / ".config" / "pip").mkdir(parents=True)
        (home / ".config" / "pip" / "pip.conf").write_text(
            "[global]\nno-index = true\ndisable-pip-version-check = true\n"
            "[install]\nno-build-isolation = false\nno-deps = true\n")

    def _make_venv(self, venv: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        packages = next(venv.glob("lib/python*/site-packages"))
        (packages / "_calib_lab_base.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        python = venv / "bin" / "python"
        for script, module in (("pip", "pip._internal.cli.main"), ("ray", "ray.scripts.scripts")):
            path = venv / "bin" / script
            path.write_text(f"#!{python}\nimport sys\nfrom {module} import main\nsys.exit(main())\n")
            path.chmod(0o755)

    def _start_sshd(self, host: Host) -> None:
        sshd_dir = Path("/run/sshd")  # sshd's privilege-separation directory
        if not sshd_dir.exists():
            sshd_dir.mkdir(mode=0o755, parents=True)
            self._made_sshd_dir = True
        passwd = host.home.parent / "passwd"
        passwd.write_text(_with_home(Path("/etc/passwd").read_text(), self.user, host.home))
        config = self.root / f"sshd-{host.name}.conf"
        config.write_text("\n".join([
            f"ListenAddress {host.ip}", "Port 22", f"HostKey {self.root / 'hostkey'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}", "PidFile none", "UsePAM no", "StrictModes no",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "MaxStartups 100", "MaxSessions 100",
            "SetEnv " + " ".join(f"{k}={v}" for k, v in {"TMPDIR": self.tmp, **self.host_env}.items()), ""]))
        log = open(self.root / f"sshd-{host.name}.log", "wb")
        host.process = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--pid", "--uts", "--mount-proc", "--kill-child=SIGKILL",
             "sh", "-c", f"hostname {host.name} && mount --bind {passwd} /etc/passwd && "
                         f"mount --bind {host.tmp} {self.tmp} && exec {SSHD} -D -e -f {config}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    # ----------------------------------------------------------------------------------- tearing down

    def processes(self) -> list[int]:
        """PIDs of every process left in the hosts' network namespaces."""
        return namespace_pids([h.netns for h in self.every_host])

    def close(self) -> None:
        """Kill what the lab started, delete its namespaces, links and files; never raises halfway."""
        if self._s3_server is not None:
            self._s3_server.stop()
        for host in self.every_host:
            if host.process is not None and host.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(host.process.pid, signal.SIGKILL)  # unshare; --kill-child takes sshd, PID 1, and all
                host.process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.processes():  # started in a namespace of ours by something that escaped the PID namespace
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        remove_network([h.netns for h in self.every_host], self._links)
        # The launcher's SSH control sockets: Ray puts them under /tmp/ray_ssh_<user>/<cluster>, whatever TMPDIR says.
        for path in sorted(_ray_control_dirs() - self._control_dirs, key=lambda p: -len(p.parts)):
            shutil.rmtree(path, ignore_errors=True)
        if self._made_sshd_dir:
            shutil.rmtree("/run/sshd", ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of the lab still exists after :meth:`close` (empty when it cleaned up)."""
        found = lab_leftovers(self.root, [h.netns for h in self.every_host], self._links)
        found += [f"directory {p}" for p in sorted(_ray_control_dirs() - self._control_dirs)]
        return found


def add_bridge(tag: str, gateway: str, links: list[str]) -> str:
    """A bridge ``cb<tag>`` with the address ``gateway``/24 (appended to ``links``, which teardown deletes)."""
    bridge = f"cb{tag}"
    _sh("ip", "link", "add", bridge, "type", "bridge")
    links.append(bridge)
    _sh("ip", "addr", "add", f"{gateway}/24", "dev", bridge)
    _sh("ip", "link", "set", bridge, "up")
    return bridge


def add_namespace_host(bridge: str, netns: str, ip: str, gateway: str, suffix: str, links: list[str]) -> None:
    """A network namespace ``netns`` joined to ``bridge`` by a veth pair, at ``ip``/24 with a default route
    through ``gateway``; the outside end (``cv<suffix>``) is appended to ``links``."""
    outside, inside = f"cv{suffix}", f"cp{suffix}"
    _sh("ip", "netns", "add", netns)
    _sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
    links.append(outside)
    _sh("ip", "link", "set", inside, "netns", netns)
    _sh("ip", "link", "set", outside, "master", bridge)
    _sh("ip", "link", "set", outside, "up")
    inns = ("ip", "netns", "exec", netns)
    _sh(*inns, "ip", "addr", "add", f"{ip}/24", "dev", inside)
    _sh(*inns, "ip", "link", "set", inside, "up")
    _sh(*inns, "ip", "link", "set", "lo", "up")
    _sh(*inns, "ip", "route", "add", "default", "via", gateway)


def remove_network(netns: list[str], links: list[str]) -> None:
    """Delete the namespaces and links a lab made (what exists of them; never raises)."""
    for name in netns:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for link in reversed(links):
        subprocess.run(["ip", "link", "del", link], capture_output=True)


def namespace_pids(netns: list[str]) -> list[int]:
    """PIDs of every process in the network namespaces ``netns``."""
    pids: list[int] = []
    for name in netns:
        out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
        pids += [int(p) for p in out.split()]
    return pids


def lab_leftovers(root: Path, netns: list[str], links: list[str]) -> list[str]:
    """What of a lab still exists: its namespaces and links, processes naming its folder, the folder."""
    found = []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"network namespace {name}" for name in netns if name in listed]
    shown = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {name}" for name in links if f" {name}:" in shown or f" {name}@" in shown]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if str(root).encode() in (proc / "cmdline").read_bytes():
                    found.append(f"process {proc.name}")
    if root.exists():
        found.append(f"directory {root}")
    return found


def _ray_control_dirs() -> set[Path]:
    return {*Path("/tmp").glob("ray_ssh_*"), *Path("/tmp").glob("ray_ssh_*/*")}


def _with_home(passwd: str, user: str, home: Path) -> str:
    """``/etc/passwd`` text with ``user``'s home directory replaced by ``home``."""
    lines = []
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) == 7 and fields[0] == user:
            fields[5] = str(home)
        lines.append(":".join(fields))
    return "\n".join(lines) + "\n"


def free_subnet() -> str:
    """A 10.233.N /24 no interface on this machine uses."""
    used = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    candidates = [n for n in range(256) if f" 10.233.{n}." not in used]
    return f"10.233.{random.choice(candidates)}"


def _wait_for_port(ip: str, port: int, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((ip, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {ip}:{port} after {timeout:.0f} s") from None
            time.sleep(0.1)


