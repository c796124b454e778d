"""Studies through `python -m calib.cluster slurm` on a real Slurm (Debian's slurm-wlm 22.05, two slurmd nodes).

One lab serves every test of this file, with ``KillWait=10`` (Slurm kills a job's processes 10 s after its
SIGTERM). A two-node γ study is interrupted in the middle of Stage I twice, by the warning Slurm sends before
the time limit (``scancel --batch --signal=USR1``: the signal ``--signal=B:USR1@<s>`` delivers) and by
``scontrol requeue`` (what a preemption does: the study's line, the script's last line and exit 3 within 5 s),
and finishes on its third start with every row once and every Stage I trained once, its takeovers of the
earlier starts' Stage-I claims in its own output and one Ray log per node and start. Meanwhile a second job runs
and ends on its head node without touching its Ray (ports, temporary folder, stop), a third is cancelled
with ``scancel`` and says so, and a second Unix user of the nodes tries to take or touch the study's Ray folder.
Bad input exits 2 before anything is submitted, a node-local Python or store among it; a job whose nodes' Python
cannot import calib ends at once, naming the node and the Python.

The nodes see the checkout and the Python's environment at their paths (:data:`SHARED`), as a cluster's shared
file system would, wherever they are: under /tmp, which each node has to itself, the lab binds them into it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from slurm_lab import SlurmLab, check_listed_ports, missing_slurm

ROOT = Path(__file__).resolve().parents[2]
STUDY = str(ROOT / "studies" / "sensitivity_gamma.py")
EPOCHS = 130
"""Stage I of jobs A and C: long enough that both interruptions of A fall inside it (A reached epoch 70 of the
first start while B ran on a quiet machine, about 40 under load 13-18, and at most 75 at the requeue: 55 epochs to
spare), short enough that A's third start, which trains what is left of it, does not train for minutes."""

SHARED = (ROOT, Path(sys.prefix), Path(sys.base_prefix))
"""What the job's nodes import calib from: the checkout and the Python's environments (a venv and its base)."""

pytestmark = [pytest.mark.ray, pytest.mark.skipif(missing_slurm() is not None,
                                                  reason=f"Slurm test: {missing_slurm()}")]


@pytest.fixture(scope="module")
def lab():
    lab = SlurmLab.create(nodes=2, cpus=2, kill_wait=10, shared=SHARED)
    try:
        yield lab
    finally:
        lab.close()
    assert not lab.leftovers(), lab.leftovers()


def launch(lab: SlurmLab, run_dir: Path, *flags: str, study: list[str]) -> subprocess.CompletedProcess:
    """``python -m calib.cluster slurm FLAGS -- python <sensitivity_gamma.py> STUDY`` against the lab."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "calib.cluster", "slurm", "--run-dir", str(run_dir),
         "--setup", f"export PATH={Path(sys.executable).parent}:$PATH", *shared_flags(lab), *flags, "--", "python",
         STUDY, *study],
        env=lab.env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def shared_flags(lab: SlurmLab, *folders: Path) -> list[str]:
    """``--shared-path`` for every folder the lab's nodes see as this machine does, and ``folders``."""
    return [f"--shared-path={folder}" for folder in (*lab.shared_paths, *folders)]


def job_of(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    return re.search(r"submitted job (\d+)", proc.stdout).group(1)


def handover_epochs(artifacts: Path) -> list[int]:
    """The epoch each Stage I being trained has saved for a takeover (torch's handover files)."""
    epochs = []
    for path in artifacts.glob("stage1/*.handover.pt"):
        try:
            epochs.append(int(torch.load(path, map_location="cpu", weights_only=True)["epoch"]))
        except Exception:  # replaced while read
            continue
    return epochs


def wait_for(what: str, check, log: Path, timeout: float = 120.0, lab: SlurmLab | None = None) -> None:
    """Wait until ``check()``; on timeout fail with the end of the job's ``log`` (and the lab's queue)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            queue = (lab.run("squeue", "--all", "-o", "%i %T %r %N", check=False).stdout
                     + lab.run("sinfo", "-N", "-o", "%N %T %E", check=False).stdout) if lab else ""
            pytest.fail(f"timed out waiting for {what}; the job's log ends with:\n"
                        f"{log.read_text()[-4000:] if log.exists() else '(no log)'}\n{queue}")
        time.sleep(0.3)


def left_running(lab: SlurmLab) -> list[str]:
    """Processes in the nodes' namespaces other than slurmd: what a job left behind."""
    out = []
    for pid in lab.processes():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "slurmd" not in command and "unshare" not in command:
            out.append(f"{pid} {command[:100]}")
    return out


def slurm_lines(text: str, study: str = "sensitivity_gamma") -> list[str]:
    """The job script's lines (``[calib-slurm HH:MM:SS] ...``) and the study's (``[<study>] ...``)."""
    return [line for line in text.splitlines() if line.startswith(("[calib-slurm", f"[{study}] "))]


def seconds_between(first: str, last: str) -> int:
    """Seconds from the timestamp of the script's line ``first`` to that of ``last`` (across midnight too)."""
    def clock(line: str) -> int:
        hours, minutes, seconds = map(int, re.match(r"\[calib-slurm (\d\d):(\d\d):(\d\d)\]", line).groups())
        return hours * 3600 + minutes * 60 + seconds
    return (clock(last) - clock(first)) % 86400


def last_line_bound(said: list[str]) -> int:
    """Seconds from the script's SIGTERM line to its last: 5 when the study stopped by itself (it stops within
    2 s unloaded); when it did not, the script ends it KillWait (10) less its 3-s margin after the SIGTERM, and its
    last line follows at once (+1 s: the log's clock has whole seconds). Either way before Slurm's SIGKILL."""
    return 8 if any("the study did not stop within " in line for line in said) else 5


def sigterm_ending(said: list[str], study: str, script_says: str, last_says: str) -> tuple[int, int]:
    """Where the script's SIGTERM line and its last line are. The study's own "interrupted by SIGTERM" line is in
    the same start, after the script's ``study:`` line and before its last: the batch step (script and study) has
    the signal at about the moment Ray's steps have it, so the study's line (and its progress lines) may come
    before or after the script's SIGTERM line. Slurm signals a node's steps one by one, though: where Ray's step
    had it first, Ray may end the study's process (exit 1) before the study says anything, and then the script
    says so, with that exit status, before its last line. A study that exits 3 always said why."""
    term = next(i for i, line in enumerate(said) if line.endswith(script_says))
    script = [i for i in range(term + 1, len(said)) if said[i].startswith("[calib-slurm")]
    # Under load the study may outlast KillWait less the script's margin: the script then ends it, saying so.
    ended_by_script = [said[i] for i in script[:1] if "the study did not stop within " in said[i]]
    script = script[len(ended_by_script):]
    ended_by_ray = [said[i] for i in script[:1] if "the study's process " in said[i]]
    last = script[len(ended_by_ray)]
    if ended_by_ray:  # Ray ended it, or the SIGTERM itself in the study's start-up (exit 143)
        assert re.search(r"the study's process ended with exit (\d+): Ray, stopped by the same SIGTERM, ended it "
                         r"\(the study's own line may be missing\)$", ended_by_ray[0]) or ended_by_ray[0].endswith(
            "the study's process was ended by the SIGTERM itself (exit 143), in its own start-up, before it listened "
            "for the signal: its own line is missing; nothing it had finished is lost"), ended_by_ray
        assert not re.search(r"exit (3|143):", ended_by_ray[0]), ended_by_ray
    assert said[last].endswith(last_says), "\n".join(said)
    began = max(i for i in range(term) if said[i].startswith("[calib-slurm") and "] study: " in said[i])
    assert ended_by_ray or ended_by_script or any(line.startswith(f"[{study}] interrupted by SIGTERM")
                                                  for line in said[began:last]), \
        "\n".join(said)
    return term, last


def test_a_two_node_study_survives_the_warning_a_requeue_other_jobs_and_another_user_on_its_nodes(lab: SlurmLab):
    """Job A: a two-node γ study, interrupted inside Stage I by the time-limit warning, then requeued by
    ``scontrol requeue``, finished on its third start. Job B: a short study on A's head node at the same
    time, whose Ray start and stop leave A's alone. Job C: a study on a node of A's, cancelled. Another Unix
    user of the nodes (:func:`another_user_is_refused`), before A starts and while it trains: one job, one
    bring-up of Ray per start, for all of it."""
    # Another Unix user: a uid of its own, without a line in /etc/passwd (useradd would rewrite that file, and
    # replacing it detaches the bind mounts of /etc/passwd that the SSH hosts of the other cluster tests run on).
    user = next(uid for uid in range(61000 + int(lab.tag, 16) % 2000, 65000) if uid not in _passwd_uids())
    # root's: the other user links to it, and must not get it removed; its name makes this run's folders (the test
    # can run again in the same lab)
    decoy = Path(tempfile.mkdtemp(prefix="decoy-", dir=lab.root))
    (decoy / "kept").write_text("root's\n")
    try:
        _two_node_study(lab, user, decoy)
    finally:
        for node in lab.nodes:
            for path in node.tmp.glob("calib-*.zzzzzzzz"):
                path.unlink()


def _two_node_study(lab: SlurmLab, user: int, decoy: Path) -> None:
    from calib.store import read_trials

    run_dir, store = lab.root / f"run-a-{decoy.name}", lab.root / "shared" / f"store-a-{decoy.name}"
    study = ["--store", str(store), "--data-root", str(lab.root / "data"), "--seeds", "1", "2", "--gammas", "0.9",
             "--epochs", str(EPOCHS), "--stage2-epochs", "2", "--configs-per-trial", "1", "--cpus-per-trial", "1"]
    submitted = launch(lab, run_dir, "--nodes", "2", "--cpus-per-node", "1", "--time", "0:30:00", "--signal-seconds",
                       "60", "--handover-seconds", "0", "--max-requeues", "2", "--sbatch-option=--hold", "--submit",
                       study=study)
    job = job_of(submitted)
    assert "[sensitivity_gamma] checked: 4 trials to run" in submitted.stdout
    log = run_dir / "slurm" / f"calib-sensitivity_gamma-{job}.out"
    for node in lab.nodes:  # before the job starts (held): the other user takes the job's name and plants a link
        taken = lab.on_node(node, f"mkdir -m 777 /tmp/calib-{job} && ln -s {decoy} /tmp/calib-{job}.zzzzzzzz",
                            user=user)
        assert taken.returncode == 0, taken.stderr
    lab.run("scontrol", "release", job)
    head = lab.nodes[0]
    short = job_of(launch(lab, lab.root / "run-b", "--cpus-per-node", "1", f"--sbatch-option=--nodelist={head.name}",
                          "--submit", study=["--study", "gamma-short", "--store", str(lab.root / "shared" / "store-b"),
                                             "--data-root", str(lab.root / "data"), "--seeds", "1", "--gammas", "0.9",
                                             "--epochs", "2", "--stage2-epochs", "2"]))
    short_log = lab.root / "run-b" / "slurm" / f"calib-gamma-short-{short}.out"
    cancelled_store = lab.root / "shared" / "store-c"  # C starts once B has left a CPU of the head node
    # C's command checks its study (~20 s) while B and A run: it is submitted after B, which is all C needs
    launching_c = ThreadPoolExecutor(1)
    c_submitted = launching_c.submit(
        launch, lab, lab.root / "run-c", "--cpus-per-node", "1", "--handover-seconds", "0",
        f"--sbatch-option=--nodelist={head.name}", "--submit",
        study=["--study", "gamma-cancelled", "--store", str(cancelled_store), "--data-root", str(lab.root / "data"),
               "--seeds", "1", "--gammas", "0.9", "--epochs", str(EPOCHS), "--stage2-epochs", "2"])
    launching_c.shutdown(wait=False)

    # B runs on A's head node while A trains, and ends: its Ray is stopped, A's is not
    wait_for("both jobs running", lambda: lab.job_state(job) == lab.job_state(short) == "RUNNING", log)
    assert lab.wait_job(short, timeout=180) == "COMPLETED", short_log.read_text()[-3000:]
    assert lab.job_state(job) == "RUNNING", log.read_text()[-3000:]
    own = [p for p in head.tmp.glob(f"calib-{job}.*") if not p.name.endswith(".zzzzzzzz")]  # not the other user's
    assert len(own) == 1 and not list(head.tmp.glob(f"calib-{short}*"))
    ports = [re.search(r"Ray head on \S+ \((\S+)\)", f.read_text()).group(1) for f in (log, short_log)]
    assert ports[0] != ports[1] and short_log.read_text().rstrip().endswith("the study finished")
    assert (read_trials(lab.root / "shared" / "store-b")["status"] == "ok").sum() == 2

    # 1st start of A: Slurm's warning before the time limit, in the middle of both Stage Is
    wait_for("both Stage Is training", lambda: len(handover_epochs(store / "artifacts")) == 2, log)
    lab.run("scancel", "--batch", "--signal=USR1", job)
    wait_for("the job to requeue itself", lambda: lab.job_state(job) == "PENDING", log, lab=lab)
    first = max(handover_epochs(store / "artifacts"))
    assert first < EPOCHS, "Stage I ended before the warning: the test needs more epochs"
    lab.start_now(job)
    # C, on A's head node while A starts again: cancelled while it trains
    cancelled = job_of(c_submitted.result())
    cancelled_log = lab.root / "run-c" / "slurm" / f"calib-gamma-cancelled-{cancelled}.out"
    wait_for("C's Stage I training", lambda: handover_epochs(cancelled_store / "artifacts"), cancelled_log,
             timeout=180, lab=lab)
    lab.run("scancel", cancelled)
    assert lab.wait_job(cancelled, timeout=60) == "CANCELLED"
    wait_for("C's script to end", lambda: lab.batch_exit_codes(cancelled), cancelled_log, timeout=20)
    said = slurm_lines(cancelled_log.read_text(), "gamma-cancelled")
    term, last = sigterm_ending(
        said, "gamma-cancelled", "SIGTERM: Slurm cancelled the job (scancel, or a preemption that cancels); stopping "
        "the study", "the study stopped after SIGTERM: the job was cancelled; submit this script again, or run the "
        "same study command, to continue it")
    assert last == len(said) - 1 and seconds_between(said[term], said[last]) <= last_line_bound(said), "\n".join(said)
    assert lab.batch_exit_codes(cancelled) == ["exit 3"], "\n".join(said)

    # 2nd start: requeued by the administrator (what preemption does), again inside Stage I
    wait_for("Stage I to go on from its handover", lambda: max(handover_epochs(store / "artifacts") or [0])
             >= first + 5, log, timeout=180, lab=lab)
    steps = ("squeue", "--steps", "--noheader", f"--jobs={cancelled}")  # C's Ray gone: only A's ports listen
    wait_for("C's steps to end", lambda: not lab.run(*steps, check=False).stdout.strip(), cancelled_log, timeout=30)
    another_user_is_refused(lab, job, user, log)
    lab.run("scontrol", "requeue", job)
    wait_for("the requeue", lambda: lab.job_state(job) == "PENDING", log, lab=lab)
    lab.start_now(job)

    assert lab.wait_job(job, timeout=300) == "COMPLETED", log.read_text()[-3000:]
    text = log.read_text()
    said = slurm_lines(text)
    for expected in (
        "USR1: stopping the study cleanly",
        "[sensitivity_gamma] interrupted by SIGTERM: 0 of the 4 trials of this run are in the store",  # its own
        "interrupted before the time limit: the study is not finished; requeued, start 2 continues it",
        "start 3 of at most 3",
    ):
        assert expected in text, f"{expected!r} is not in the job's log:\n" + "\n".join(said)
    assert said[-1].endswith("the study finished") and text.count("the study finished") == 1, "\n".join(said)
    # The requeue with KillWait=10: the study's line and the script's last line before Slurm's SIGKILL.
    term, last = sigterm_ending(
        said, "sensitivity_gamma", "SIGTERM: Slurm requeued the job (scontrol requeue or a preemption); stopping the "
        "study", "the study stopped after SIGTERM: the job was requeued; start 3 continues it")
    assert seconds_between(said[term], said[last]) <= last_line_bound(said), "\n".join(said)
    assert lab.batch_exit_codes(job) == ["exit 3", "exit 3", "exit 0"]  # the warning, the requeue, the end
    assert not re.search(r"line \d+: .*(Killed|Terminated)", text), "bash reported a killed step:\n" + text[-3000:]
    # The later starts took over the earlier starts' Stage-I claims, and the study's output said so.
    takeovers = [line for line in said if line.startswith("[sensitivity_gamma] trial ") and "takes it over" in line]
    continued = [line for line in said if line.startswith("[sensitivity_gamma] trial ") and "continuing the training"
                 in line]
    assert takeovers and len(continued) >= 2, "\n".join(said)
    # The clean stop before the time limit handed its trainings over and released their claims: start 2 takes them
    # at once (no claim to take over, no wait for one), while the requeue's SIGTERM stopped Ray too (start 3 takes
    # the dead holders' claims over).
    start1 = next(i for i, line in enumerate(said) if "start 1 of at most 3" in line)
    start2 = next(i for i, line in enumerate(said) if "start 2 of at most 3" in line)
    start3 = next(i for i, line in enumerate(said) if "start 3 of at most 3" in line)
    assert any("Stage-I training" in line and "handed over" in line for line in said[start1:start2]), \
        "\n".join(said)
    assert not [line for line in said[start2:start3] if "takes it over" in line or "is being trained by" in line], \
        "\n".join(said)
    # One Ray log per node and start, none overwritten.
    ray_logs = sorted(p.name for p in (run_dir / "slurm").glob(f"{job}-*.log"))
    assert ray_logs == sorted(f"{job}-start{start}-ray-{node.name}.log" for start in (1, 2, 3) for node in lab.nodes)
    assert all("Ray runtime started" in (run_dir / "slurm" / name).read_text() for name in ray_logs), ray_logs

    rows = read_trials(store)
    assert len(rows) == 4 and rows["trial_id"].is_unique and (rows["status"] == "ok").all()
    assert rows["node_id"].nunique() == 2, rows[["method", "seed", "node_id"]]  # both nodes ran trials
    trainers = rows[~rows["stage1_cache_hit"].astype(bool)].groupby("stage1_id").size()
    assert trainers.to_dict() == dict.fromkeys(rows["stage1_id"].unique(), 1)  # each Stage I trained once
    assert (rows.groupby("stage1_id")["stage1_writer"].nunique() == 1).all()
    assert rows["stage1_resumed_from_epoch"].notna().sum() == 2  # both trainings continued a handover
    assert not left_running(lab), left_running(lab)
    assert not list((run_dir / "slurm").glob(".ray-token-*"))
    for node in lab.nodes:
        for start in (1, 2, 3):
            ray_log = (run_dir / "slurm" / f"{job}-start{start}-ray-{node.name}.log").read_text()
            assert re.search(rf"the job's Ray folder on {node.name}: /tmp/calib-{job}\.\w{{8}} \(made by the job, "
                             rf"mode 0700\)", ray_log), ray_log[:2000]
    # Every job's Ray folder removed; the other user's folder and link left alone, and what the link points at.
    left = sorted(str(p.relative_to(node.tmp)) for node in lab.nodes for p in node.tmp.glob("calib-[0-9]*"))
    assert left == sorted([f"calib-{job}", f"calib-{job}.zzzzzzzz"] * len(lab.nodes)), left
    assert (decoy / "kept").read_text() == "root's\n"


def another_user_is_refused(lab: SlurmLab, job: str, user: int, log: Path) -> None:
    """A second Unix user on the nodes, as the threat, while the job's study trains: it took the job's predictable
    folder name (``/tmp/calib-<id>``) and linked one more to a folder of root's before the job started; now it
    tries to list the job's folder, rename Ray's raylet socket, plant a module where Ray unpacks plugins
    (``runtime_resources``), remove or rename the folder. Each is refused. Meanwhile every TCP port listening on
    the nodes is one that docs/how-to/slurm.md lists (:func:`check_listed_ports`)."""
    base = int(re.findall(r"Ray head on \S+ \(\S+:(\d+)\)", log.read_text())[-1])
    for node in lab.nodes:
        folders = lab.on_node(node, f"ls -d /tmp/calib-{job}.*", user=user).stdout.split()
        own = [f for f in folders if not f.endswith(".zzzzzzzz")]
        assert len(own) == 1 and re.fullmatch(rf"/tmp/calib-{job}\.[A-Za-z0-9]{{8}}", own[0]), folders
        folder, sockets = own[0], f"{own[0]}/ray/session_latest/sockets"
        assert lab.on_node(node, f"stat -c '%a %U' {folder}").stdout.split() == ["700", "root"]
        for attempt in (f"ls {folder}", f"mv {sockets}/raylet {sockets}/raylet.gone",
                        f"mkdir -p {folder}/ray/session_latest/runtime_resources/x",
                        f"echo 'import os' > {folder}/ray/session_latest/runtime_resources/plugin.py",
                        f"rm -rf {folder}", f"mv {folder} {folder}.gone"):
            tried = lab.on_node(node, attempt, user=user)
            assert tried.returncode != 0 and ("Permission denied" in tried.stderr
                                              or "Operation not permitted" in tried.stderr), (attempt, tried)
        assert lab.on_node(node, f"test -S {sockets}/raylet && test ! -e {folder}/ray/session_latest/"
                                 f"runtime_resources/plugin.py").returncode == 0
        assert lab.on_node(node, f"ls -A /tmp/calib-{job}").stdout == ""  # the other user's: not used
        check_listed_ports(lab.listening(node), base, head=node is lab.nodes[0])


@pytest.mark.parametrize(("flags", "study", "message"), [
    (["--partition", "nope"], [], "Slurm would not accept the job: invalid partition specified: nope"),
    (["--gpus-per-node", "1"], [], "--gpus-per-node 1: partition debug has no GPUs"),
    (["--time", "5"], [], "--time 5 (300 s) must be longer than the warning before it (--signal-seconds 300)"),
    ([], ["--gammas", "0"], "The study command fails calib's checks: `method.accuracy_weight` must be > 0"),
    ([], ["--address", "auto"], "The study command must not have --address"),
], ids=["unknown partition", "gpus on a cpu partition", "time under the warning", "bad study flag", "address"])
def test_bad_input_exits_2_before_anything_is_submitted(lab: SlurmLab, tmp_path: Path, flags: list[str],
                                                         study: list[str], message: str,
                                                         monkeypatch: pytest.MonkeyPatch, capsys):
    """In process (``calib.cluster.main``, the command's own entry point), against the lab's Slurm."""
    from calib.cluster import main

    jobs = ("squeue", "--noheader", "--all", "--format=%i")  # the job ids: a running job's elapsed time changes
    before = lab.run(*jobs).stdout
    monkeypatch.setenv("SLURM_CONF", lab.env["SLURM_CONF"])
    monkeypatch.chdir(ROOT)
    code = main(["slurm", "--run-dir", str(tmp_path), "--setup", f"export PATH={Path(sys.executable).parent}:$PATH",
                 *shared_flags(lab, tmp_path), *flags, "--submit", "--", "python", STUDY, "--store",
                 str(tmp_path / "store"), *study])
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0], stderr
    assert lab.run(*jobs).stdout == before and not (tmp_path / "slurm").exists()


@pytest.mark.parametrize(("python", "study", "message"), [
    ("/tmp/calib-venv/bin/python", [], "node-local path: the Python /tmp/calib-venv/bin/python (under /tmp). Each "
     "node of a Slurm job has its own there"),
    (None, ["--store", "/dev/shm/calib-store"], "node-local path: --store /dev/shm/calib-store (under /dev/shm)."),
], ids=["python under /tmp", "store under /dev/shm"])
def test_a_node_local_environment_is_refused_before_submission(lab: SlurmLab, python: str | None, study: list[str],
                                                               message: str, monkeypatch: pytest.MonkeyPatch, capsys):
    """The Python this command runs (the job's) or the store where each node has its own: exit 2, one line, no
    job, no script; before the study's own check and Slurm's (in process, against the lab)."""
    from calib.cluster import main

    jobs = ("squeue", "--noheader", "--all", "--format=%i")
    before = lab.run(*jobs).stdout
    monkeypatch.setenv("SLURM_CONF", lab.env["SLURM_CONF"])
    monkeypatch.chdir(ROOT)
    run_dir = lab.root / "refused"
    run_dir.mkdir(exist_ok=True)
    if python:
        monkeypatch.setattr(sys, "executable", python)
    code = main(["slurm", "--run-dir", str(run_dir), *shared_flags(lab), "--submit", "--", "python", STUDY, *study])
    stderr = capsys.readouterr().err
    assert code == 2 and len(stderr.splitlines()) == 1 and stderr.startswith(f"error: {message}"), stderr
    assert lab.run(*jobs).stdout == before and not (run_dir / "slurm").exists()


def test_a_job_whose_nodes_cannot_import_calib_ends_at_once_naming_the_node_and_the_python(lab: SlurmLab):
    """The job's setup puts a Python without calib first on the PATH (the interpreter of this one's environment,
    without PYTHONPATH): the job ends before Ray starts, with one line naming the node and that Python."""
    bare = lab.root / "bare-python"
    bare.mkdir(exist_ok=True)
    (bare / "python").unlink(missing_ok=True)
    (bare / "python").symlink_to(Path(sys.base_prefix) / "bin" / "python3")
    run_dir = lab.root / "run-bare"
    run_dir.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "calib.cluster", "slurm", "--run-dir", str(run_dir), "--setup",
         f"unset PYTHONPATH; export PATH={bare}:$PATH", *shared_flags(lab), "--cpus-per-node", "1", "--submit", "--",
         "python", STUDY, "--store", str(lab.root / "shared" / "store-bare"), "--seeds", "1", "--gammas", "0.9"],
        env=lab.env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    job = job_of(proc)
    log = run_dir / "slurm" / f"calib-sensitivity_gamma-{job}.out"
    assert lab.wait_job(job, timeout=60) == "FAILED", log.read_text()[-3000:] if log.exists() else "(no log)"
    said = slurm_lines(log.read_text())
    nodes = "|".join(node.name for node in lab.nodes)
    assert re.fullmatch(rf"\[calib-slurm [\d:]+\] calib does not import on node ({nodes}) with "
                        rf"{re.escape(str(bare / 'python'))} \(ModuleNotFoundError: No module named 'calib'\): "
                        rf"install calib where every node sees it .*", said[-1]), "\n".join(said)
    assert not any("Ray head on" in line for line in said), "\n".join(said)  # ended before Ray started
    assert lab.batch_exit_codes(job) == ["exit 1"]


def test_a_cancel_while_ray_starts_ends_with_the_cancelled_line_and_exit_3(lab: SlurmLab):
    """``scancel`` as soon as the log says Ray's head is starting, before the study starts: the cancelled line and
    exit 3, not "Ray did not start" (exit 1), and no shell report of a killed process."""
    run_dir = lab.root / "run-d" / "new"  # created by the command
    proc = subprocess.run(
        [sys.executable, "-m", "calib.cluster", "slurm", "--run-dir", str(run_dir), "--setup",
         f"export PATH={Path(sys.executable).parent}:$PATH", *shared_flags(lab), "--cpus-per-node", "1", "--submit",
         "--", "python", STUDY, "--store", str(lab.root / "shared" / "store-d"), "--seeds", "1", "--gammas", "0.9"],
        env=lab.env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    job = job_of(proc)
    assert proc.stdout.startswith(f"created the run directory {run_dir}")
    log = run_dir / "slurm" / f"calib-sensitivity_gamma-{job}.out"
    wait_for("Ray's head to start", lambda: log.exists() and "Ray head on" in log.read_text(), log, lab=lab)
    lab.run("scancel", job)
    assert lab.wait_job(job, timeout=60) == "CANCELLED"
    wait_for("the script to end", lambda: lab.batch_exit_codes(job), log, timeout=20)
    text = log.read_text()
    said = slurm_lines(text)
    assert not any("] study: " in line for line in said), "the study started before the cancel:\n" + text
    assert said[-2].endswith("SIGTERM: Slurm cancelled the job (scancel, or a preemption that cancels); stopping "
                             "the study"), "\n".join(said)
    assert said[-1].endswith("the study stopped after SIGTERM: the job was cancelled; submit this script again, or "
                             "run the same study command, to continue it"), "\n".join(said)
    assert "Ray did not start" not in text and not re.search(r"(Killed|Terminated)", text), text
    assert lab.batch_exit_codes(job) == ["exit 3"], text


def _passwd_uids() -> set[int]:
    import pwd

    return {entry.pw_uid for entry in pwd.getpwall()}


CANCEL_DELAYS = (1, 5, 15, 25)
"""Seconds after the log's "Ray head on" line at which the cancel test cancels a job: while Ray's head starts, while
the worker node joins, during the wait for the nodes, and about when the study starts."""


def test_a_cancel_at_any_moment_of_rays_start_ends_cleanly(lab: SlurmLab):
    """Two-node jobs cancelled :data:`CANCEL_DELAYS` seconds after "Ray head on" (two at a time: the lab's CPUs):
    each ends with the documented cancelled line last and exit 3, no folder of the job left on any node once Slurm
    has ended it, and no stray line (a traceback, Python's ``Exception ignored``, bash's ``Aborted``/``Killed``)."""
    with ThreadPoolExecutor(2) as pool:
        ended = list(pool.map(lambda delay: cancel_after(lab, delay), CANCEL_DELAYS))
    for delay, (job, text) in zip(CANCEL_DELAYS, ended, strict=True):
        said = slurm_lines(text)
        assert said[-1].endswith("the study stopped after SIGTERM: the job was cancelled; submit this script again, "
                                 "or run the same study command, to continue it"), (delay, "\n".join(said))
        assert any(line.endswith("SIGTERM: Slurm cancelled the job (scancel, or a preemption that cancels); "
                                 "stopping the study") for line in said), (delay, "\n".join(said))
        stray = re.findall(r"^.*(?:Traceback|Exception ignored|Aborted|Killed|Terminated|line \d+:).*$", text,
                           flags=re.MULTILINE)
        assert not stray, f"{delay} s: {stray}\n{text[-6000:]}"
        assert lab.batch_exit_codes(job) == ["exit 3"], (delay, text[-3000:])
        left = [str(p) for node in lab.nodes for p in node.tmp.glob(f"calib-{job}*")]
        assert not left, (delay, left)
    assert not left_running(lab), left_running(lab)


def cancel_after(lab: SlurmLab, delay: float) -> tuple[str, str]:
    """Submit a two-node job, ``scancel`` it ``delay`` s after its log says "Ray head on", wait until Slurm has
    ended it and its steps; its id and log."""
    run_dir = lab.root / f"run-cancel-{delay}"
    job = job_of(launch(lab, run_dir, "--nodes", "2", "--cpus-per-node", "1", "--submit", study=[
        "--study", f"gamma-cancel-{delay}", "--store", str(lab.root / "shared" / f"store-cancel-{delay}"),
        "--data-root", str(lab.root / "data"), "--seeds", "1", "--gammas", "0.9", "--epochs", "50",
        "--stage2-epochs", "2"]))
    log = run_dir / "slurm" / f"calib-gamma-cancel-{delay}-{job}.out"
    wait_for("Ray's head to start", lambda: log.exists() and "Ray head on" in log.read_text(), log, timeout=300,
             lab=lab)
    time.sleep(delay)
    lab.run("scancel", job)
    assert lab.wait_job(job, timeout=60) == "CANCELLED"
    wait_for("the script to end", lambda: lab.batch_exit_codes(job), log, timeout=30)
    steps = ("squeue", "--steps", "--noheader", f"--jobs={job}")  # the nodes' steps end (KillWait at most)
    wait_for("the job's steps to end", lambda: not lab.run(*steps, check=False).stdout.strip(), log, timeout=30)
    return job, log.read_text()
