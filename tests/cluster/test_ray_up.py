"""`ray up` for real: the on-prem commands of docs/how-to/ray-cluster.md, run literally, on two SSH hosts made
on this machine.

The hosts (:mod:`lab_hosts`) are network namespaces with their own sshd, hostname, processes, home and TMPDIR; the
store is a moto S3 server on the bridge address both reach. The test sets the variables the page tells users to set,
then runs each command of the page's ``onprem-commands`` block from a copy of this checkout: render the on-prem file
from cluster.yaml, create its token, validate it, ``ray up`` (file mounts, setup commands, Ray on head and worker),
wait for both nodes, an intruder (:func:`intruder_is_refused`: a third host on the same bridge without the token,
refused at each door, no code of its run anywhere), the γ study through ``ray exec`` (twice: the second run must
skip every trial), two more γ studies at once on the same cluster, one driver per host, sharing their Stage Is while
a claim holder is killed (:mod:`stage1_once`: each Stage I trained once), ``stop-workers`` and ``ray down``, after
which no Ray process may be left on either host. A failing step fails the test with what broke: the setup command
that failed, a host without the checkout at ``~/calib``, a Ray pin the validator refused.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_hosts import Lab, missing_requirements
from stage1_once import each_stage1_is_trained_once

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_PAGE = ROOT / "docs" / "how-to" / "ray-cluster.md"
# Two seeds, one γ, 2 epochs: 2 Stage-I trainings and 4 trials. A Stage-I trial asks for both CPUs a host
# has, so the two trainings run one on each host.
STUDY_ARGS = "--seeds 1 2 --gammas 0.9 --epochs 2 --stage2-epochs 2 --cpus-per-trial 2 --cpus-per-cached-trial 1"
TIMEOUTS = {"ray up": 300, "wait": 240, "study": 300, "ray down": 120}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def readme_commands(marker: str) -> list[str]:
    """The shell commands of the cluster page's ```sh block under ``<!-- marker ... -->``, continuations joined."""
    text = CLUSTER_PAGE.read_text()
    at = text.index(f"<!-- {marker}")
    start = text.index("```sh\n", at) + len("```sh\n")
    block = text[start:text.index("```", start)]
    lines = block.replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _kind(command: str) -> str:
    for needle, kind in (("calib.cluster onprem", "render"), ("calib.cluster validate", "validate"),
                         ("calib.cluster token", "token"),
                         ("ray up", "ray up"), ("calib.cluster wait", "wait"), ("studies/", "study"),
                         ("calib.cluster stop-workers", "stop workers"), ("ray down", "ray down")):
        if needle in command:
            return kind
    raise AssertionError(f"ray-cluster.md command not understood by this test: {command}")


def test_the_aws_commands_are_onprem_commands_run_by_the_launcher_test() -> None:
    """Each AWS command is an on-prem command with cluster.yaml for cluster-onprem.yaml: the test runs them."""
    onprem = readme_commands("onprem-commands")
    aws = readme_commands("aws-commands")
    assert [_kind(c) for c in onprem] == ["render", "token", "validate", "ray up", "wait", "study", "stop workers",
                                          "ray down"]
    for command in aws:
        assert command.replace("cluster.yaml", "cluster-onprem.yaml") in onprem, command


def _copy_checkout(target: Path) -> None:
    """What ``file_mounts: {~/calib: .}`` would send: tracked and untracked files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def what_broke(kind: str, output: str, lab: Lab, checkout: Path) -> list[str]:
    """The launcher sections a failed step points at, one line each."""
    found = []
    text = _ANSI.sub("", output)
    for line in text.splitlines():
        if line.startswith("error: ") and ": setup_commands" in line:
            found.append(f"the Ray pin or setup_commands, refused by the validator: {line[7:]}")
    if kind == "ray up" and ("update-failed" in text or "Failed to setup" in text):
        started = re.findall(r"\((\d+)/(\d+)\)\s+(.+)", text)
        if started:
            index, total, command = started[-1]
            found.append(f"setup_commands[{index}] of {total} failed on the head: `{command.strip()}`")
    reached = {"ray up": [lab.head], "wait": [lab.head]}.get(kind, lab.hosts if kind in ("study", "stop workers",
                                                                                       "ray down") else [])
    expected = (checkout / "pyproject.toml").read_bytes()
    for host in reached:
        copy = host.home / "calib" / "pyproject.toml"
        if not copy.exists() or copy.read_bytes() != expected:
            found.append(f"file_mounts: {host.name} has no copy of the checkout at ~/calib "
                         f"(found {sorted(p.name for p in (host.home / 'calib').glob('*'))[:8] or 'nothing'})")
    return found


@pytest.mark.ray
@pytest.mark.skipif(missing_requirements() is not None, reason=f"launcher test: {missing_requirements()}")
def test_ray_up_runs_the_readme_on_two_hosts(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from calib.store import read_trials

    commands = readme_commands("onprem-commands")
    monkeypatch.setattr(logging.getLogger("werkzeug"), "level", logging.ERROR)  # moto's request log
    lab = Lab.create(outsiders=("calib-intruder",))
    transcript: list[str] = []
    try:
        aws, bucket = lab.start_s3()
        lab.start(host_env=aws)
        for name, value in aws.items():  # this process reads the store too
            monkeypatch.setenv(name, value)
        checkout = lab.root / "checkout"
        _copy_checkout(checkout)
        store = f"s3://{bucket}/calib"
        env = {**lab.launcher_env(), "HEAD_IP": lab.head.ip, "WORKER_IPS": " ".join(h.ip for h in lab.workers),
               "NODES": str(len(lab.hosts)), "SSH_USER": lab.user, "SSH_KEY": str(lab.key), "VENV": "~/venv",
               "STORE": store, "STUDY_ARGS": STUDY_ARGS}

        def step(command: str) -> str:
            kind = _kind(command)
            started = time.monotonic()
            proc = subprocess.run(["bash", "-c", command], cwd=checkout, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=TIMEOUTS.get(kind, 120))
            transcript.append(f"$ {command}   # {kind}: exit {proc.returncode}, {time.monotonic() - started:.0f} s")
            if proc.returncode != 0:
                tail = "\n".join(_ANSI.sub("", proc.stdout).splitlines()[-40:])
                broke = what_broke(kind, proc.stdout, lab, checkout) or ["(no launcher section identified)"]
                pytest.fail(f"`{command}` exited {proc.returncode}. What broke:\n  " + "\n  ".join(broke)
                            + f"\nLast lines:\n{tail}", pytrace=False)
            return _ANSI.sub("", proc.stdout)

        outputs: dict[str, str] = {}
        for command in commands:
            kind = _kind(command)
            outputs[kind] = step(command)
            if kind == "ray up":
                transcript += [line for line in outputs[kind].splitlines() if "Running setup commands" in line
                               or "Starting the Ray runtime" in line or "up-to-date" in line][-3:]
            if kind == "token":
                token = lab.root / "launcher" / ".config" / "calib" / "ray-tokens" / "calib-onprem.token"
                assert token.stat().st_mode & 0o777 == 0o600 and token.read_text().strip() not in outputs[kind]
            if kind == "wait":
                transcript += [line for line in outputs[kind].splitlines() if "nodes up" in line or "  head " in line
                               or "  worker " in line]
                transcript += ports_are_the_pages(lab)
                transcript += intruder_is_refused(lab)
            if kind == "study":
                first = outputs[kind]
                table = [line for line in first.splitlines() if "±" in line or "trials:" in line]
                transcript += table
                assert table, f"the study printed no table:\n{first[-3000:]}"
                rows = read_trials(store, study="sensitivity_gamma")
                assert len(rows) == 4 and set(rows["status"]) == {"ok"}, rows[["method", "seed", "status"]]
                assert set(rows["host"]) == {h.name for h in lab.hosts}, rows[["method", "seed", "host"]]
                assert rows["node_id"].nunique() == len(lab.hosts)
                second = step(command)
                skipped = [line for line in second.splitlines() if "already in the store" in line]
                transcript += skipped
                assert skipped and "4 already in the store, 0 to run" in skipped[0], second[-3000:]
                assert len(read_trials(store, study="sensitivity_gamma")) == 4
                assert not markers(lab), f"code of the intruder ran on the hosts: {markers(lab)}"
                transcript += each_stage1_is_trained_once(lab, bucket)  # on this cluster: one bring-up for both
            if kind == "stop workers":
                transcript += [line for line in outputs[kind].splitlines() if "Ray on" in line]
            if kind == "ray down":
                deadline, leftover = time.monotonic() + 20, [0]
                while leftover and time.monotonic() < deadline:
                    time.sleep(1)
                    leftover = [p for p in lab.processes() if not _cmdline(p).startswith((b"sshd", b"unshare"))]
                transcript.append(f"Ray processes left on the hosts after ray down: {len(leftover)}")
                assert not leftover, f"ray down left processes on the hosts: {[_cmdline(p)[:200] for p in leftover]}"
    finally:
        lab.close()
        with capsys.disabled():
            print("\n[launcher test] " + "\n[launcher test] ".join(transcript))
    assert not lab.leftovers(), lab.leftovers()


FIXED_PORTS = {22: ("every host", "address"), 6379: ("head", "all"), 10001: ("head", "address and loopback"),
               8265: ("head", "loopback"), 52365: ("every node", "address and loopback"), 44217: ("head", "all"),
               44227: ("head", "all")}
"""The fixed ports of ray-cluster.md's "What listens where" for the on-prem file: where (the head or every host) and
on which addresses (all, the host's own, loopback)."""
RAY_PORT_FILES = {"metrics_export_port": "all", "metrics_agent_port": "all", "runtime_env_agent_port": "address"}
"""The random ports Ray records in its session folder on each node (the dashboard agent's metrics and gRPC, the
runtime-env agent), and their addresses."""
WORKER_PORTS = range(10002, 20000)


def port_table() -> dict[str, str]:
    """ray-cluster.md's "What listens where" table: its first cell -> its "on" cell."""
    text = CLUSTER_PAGE.read_text()
    table = text[text.index("**What listens where.**"):]
    table = table[:table.index("\n\n", table.index("| port |"))]
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return {port.strip(): on.strip() for port, on, _ in rows[1:]}


def listening(host) -> dict[int, tuple[str, set[str]]]:
    """The TCP ports listening in ``host``'s network (``ss -ltnp``): each with its process and its addresses
    (``all`` for the wildcard, ``address`` for the host's own, ``loopback``)."""
    out = subprocess.run(["ip", "netns", "exec", host.netns, "ss", "-Hltnp"], capture_output=True, text=True,
                         check=True).stdout
    found: dict[int, tuple[str, set[str]]] = {}
    for line in filter(str.strip, out.splitlines()):
        local = line.split()[3]
        address, port = local.rsplit(":", 1)
        address = address.strip("[]").removeprefix("::ffff:")
        kind = {"*": "all", "0.0.0.0": "all", "::": "all", host.ip: "address", "127.0.0.1": "loopback"}[address]
        process = re.search(r'users:\(\("([^"]+)"', line).group(1)
        found.setdefault(int(port), (process, set()))[1].add(kind)
    return found


SERVERS_UP_SECONDS = 120.0
"""How long a host's servers may take to listen after `calib.cluster wait` saw its node: Ray's head starts Ray
Client's server (10001) after its node registers, seconds later on a loaded machine (once, on CI's two busy cores,
not within 60 s)."""


def listening_once_up(host, ports: set[int]) -> dict[int, tuple[str, set[str]]]:
    """:func:`listening` once every port of ``ports`` listens, or after :data:`SERVERS_UP_SECONDS` (the
    caller's assertions then name the ports that never did)."""
    deadline = time.monotonic() + SERVERS_UP_SECONDS
    while not ports <= set(found := listening(host)) and time.monotonic() < deadline:
        time.sleep(1.0)
    return found


def ports_are_the_pages(lab: Lab) -> list[str]:
    """Every TCP port listening on the hosts (``ss -ltn``) is one ray-cluster.md lists for that host, bound to the
    addresses its row says, and every port the page lists for a host listens on it (checked before the intruder,
    whose attempts may end Ray Client's server)."""
    table = port_table()
    for port, (where, addresses) in FIXED_PORTS.items():  # the page says what this test checks
        on = table[str(port)]
        assert ("head" in on) == (where == "head"), (port, on)
        assert ("all its addresses" in on) == (addresses == "all") and ("loopback" in on) == (
            "loopback" in addresses), (port, on)
    numbered = {int(p) for cell in table for p in re.findall(r"^(\d+)(?: |$)", cell) if "(AWS)" not in cell}
    assert numbered == set(FIXED_PORTS), numbered
    assert "10002-19999" in table and sum(cell.startswith("random") for cell in table) >= 1
    has_client = subprocess.run([sys.executable, "-c", "import grpc"], capture_output=True).returncode == 0
    said = []
    for host in lab.hosts:
        head = host is lab.head
        expected = {port: addresses for port, (where, addresses) in FIXED_PORTS.items()
                    if (head or where != "head") and (port != 10001 or has_client)}
        session = max(host.tmp.glob("ray/session_2*"), key=lambda p: p.stat().st_mtime)
        for name, addresses in RAY_PORT_FILES.items():
            expected[int(next(session.glob(f"{name}_*")).read_text())] = addresses
        ports = listening_once_up(host, set(expected))
        raylet = {port for port, (process, _) in ports.items() if process == "raylet"}
        assert len(raylet) == 2, ports  # the node manager and the object manager
        workers = {port for port, (process, _) in ports.items() if process.startswith("ray::")
                   and port in WORKER_PORTS and port not in expected}
        unlisted = set(ports) - set(expected) - raylet - workers
        assert not unlisted, f"{host.name}: listening but not in ray-cluster.md: {[(p, ports[p]) for p in unlisted]}"
        silent = set(expected) - set(ports)
        assert not silent, (f"{host.name}: in ray-cluster.md but not listening: {sorted(silent)}; {ports}; "
                            f"Ray Client's server log ends with: {_client_server_log(session)}")
        for port, addresses in expected.items():
            assert ports[port][1] == set(addresses.split(" and ")), (host.name, port, ports[port], addresses)
        for port in raylet | workers:
            assert ports[port][1] == {"all"}, (host.name, port, ports[port])
        said.append(f"{host.name}: {len(ports)} ports listening, each in ray-cluster.md's table: "
                    + ", ".join(f"{p} {ports[p][0]}" for p in sorted(expected)))
    return said


def _client_server_log(session: Path) -> str:
    """The end of Ray Client's server logs in a node's ``session`` folder (why 10001 is silent)."""
    logs = sorted((session / "logs").glob("ray_client_server*"))
    return " | ".join(f"{p.name}: {p.read_text(errors='replace')[-1500:]}" for p in logs) or "(no such log)"


def markers(lab: Lab) -> list[str]:
    """The marker files the intruder's code writes (``~/intruder-<door>-<host>``), on any host of the lab."""
    return sorted(str(p.relative_to(lab.root)) for host in lab.every_host for p in host.home.glob("intruder-*"))


def intruder_is_refused(lab: Lab) -> list[str]:
    """A host on the cluster's bridge without the token tries the three doors (:mod:`intruder`): joining as a node
    and running tasks on every node, Ray Client, the Jobs API. Each must be refused and no code run on any host."""
    intruder = lab.outsiders[0]
    assert not (intruder.home / ".ray").exists()
    script = (Path(__file__).parent / "intruder.py").read_text()
    proc = lab.ssh(intruder, f"~/venv/bin/python - {lab.head.ip}", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    out, _ = proc.communicate(script, timeout=420)
    doors = {d["door"]: d for d in (json.loads(line) for line in out.splitlines() if line.startswith('{"door"'))}
    assert set(doors) == {"join", "client", "jobs"}, out[-3000:]
    let_in = [f"{d['door']}: {d['said']}" for d in doors.values() if not d["refused"]]
    assert not let_in, "a host without the token got in:\n  " + "\n  ".join(let_in)
    assert not markers(lab), f"code of the intruder ran on the hosts: {markers(lab)}"
    return [f"intruder at {intruder.ip}, {door}: refused ({d['said'][:160]})" for door, d in doors.items()] + [
        f"intruder: {time.monotonic() - started:.0f} s"]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""

