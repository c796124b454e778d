"""Soak test of crash-safe resumption: SIGKILL the study driver at random moments, re-run, check the store.

    python benchmarks/soak.py --kills 10
    python benchmarks/soak.py --kills 10 --compact-every 1 --worker-kills 2

Runs ``studies/sensitivity_gamma.py`` (quick preset; 3 seeds × {vanilla, γ 0.9, γ 1} = 9 trials, 12 Stage-I
and 100 Stage-II epochs: about 40-60 s on 2 cores, a third of it Ray's start-up) once uninterrupted into a
reference store, then soaks a second store: start the same command in a new session, SIGKILL the whole
session (driver, local Ray's GCS/raylet/workers) at a random moment, check the store, start it again, and so
on. Kill moments are drawn in [1 s, 0.95 × the duration of the last uninterrupted full run] (the machine's
load changes it), one per 1/N of that span in a seeded random order, so that they land in every phase:
imports, Ray start-up, Stage I, Stage II and store writes, the report. A run that finishes before its kill
moment ends a *round*: its store must then equal the reference, and the next run starts a fresh store
(resumed runs are shorter, so a late moment needs a full-length run). After the N-th kill the last round's
command is run to completion.

With ``--compact-every N`` the study compacts its store every N finished trials (1: after every trial,
so that kills land inside compactions), and ``--worker-kills K`` also SIGKILLs, K times per run at
random moments, a Ray worker process that runs a trial (the study runs with ``--max-failures 3`` then,
so that Tune retries the killed trial: from its last Stage-I checkpoint).

Checked at every kill, and continuously by a reader thread while a driver runs:
  * every Parquet file under ``<store>/trials`` and ``<store>/history`` (names not starting with "."
    or "_") reads with ``pyarrow.parquet.read_table``; a trial's own file holds that trial's rows only;
    ``calib.store.read_trials`` and ``read_history`` read each trial once; ``pandas.read_parquet(<store>/trials)``
    reads each trial once unless a compaction is under way or was killed (its lease
    ``<store>/compaction/study=<study>.json`` exists); every stored trial has its history rows;
  * every Stage-I artifact directory ``<store>/artifacts/stage1/<id>/`` (``.tmp-*`` ones excepted) has
    a ``record.json`` and loadable ``model.pt`` / ``cache.pt`` (``torch.load(weights_only=True)``);
    every other visible JSON file of the store (the study manifest) parses;
  * after a kill no process of the killed session survives (and none that names its Ray session).
At the end of every round: the reference's trial ids, each once and ``ok``; the same history rows;
every ``val_*`` / ``test_*`` column and every history metric identical (``==``) to the reference; one
Stage-I artifact per seed with the reference's weights and cached outputs.

Prints one line (PASS or FAIL with the reason) on stdout and exits 0 or 1; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from soak_checks import Watcher, check_anytime, check_final, load_reference

from calib.store import read_trials

REPO = Path(__file__).resolve().parents[1]
STUDY_SCRIPT = REPO / "studies" / "sensitivity_gamma.py"
RAY_SESSION = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+")


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class Proc:
    sid: int
    pid: int
    stat: str
    args: str


def processes() -> list[Proc]:
    """Every process on the machine (session id, pid, state, command line)."""
    out = subprocess.run(["ps", "-e", "-o", "sid=,pid=,stat=,args="], capture_output=True, text=True,
                         check=True).stdout
    procs = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3:
            procs.append(Proc(int(parts[0]), int(parts[1]), parts[2], parts[3] if len(parts) > 3 else ""))
    return procs


def alive(procs: list[Proc]) -> list[Proc]:
    return [p for p in procs if not p.stat.startswith("Z")]


def session_members(sid: int) -> list[Proc]:
    return alive([p for p in processes() if p.sid == sid])


def sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class Cleanup:
    """What was left of a driver's session after it ended."""

    stragglers: list[str] = field(default_factory=list)  # still alive after the grace period: SIGKILLed by us
    stray: list[str] = field(default_factory=list)      # survived our SIGKILL, or escaped the session


def reap_session(sid: int, ray_sessions: set[str], workdir: Path, *, grace: float, timeout: float = 10.0) -> Cleanup:
    """Wait up to ``grace`` s for the session's processes to exit by themselves, SIGKILL the rest, and verify
    that nothing of it survives: no process in session ``sid``, none naming one of its Ray sessions or the
    soak's work directory."""
    result = Cleanup()
    deadline = time.monotonic() + grace
    while session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while (members := session_members(sid)) and time.monotonic() < deadline:
        for p in members:
            killed.setdefault(p.pid, p.args.split(" --", 1)[0][-60:])
            sigkill(p.pid)
        time.sleep(0.2)
    result.stragglers = [f"{pid} {args}" for pid, args in killed.items()]
    result.stray += [f"pid {p.pid} (session {sid}) survived SIGKILL: {p.args[:120]}" for p in session_members(sid)]
    me = {os.getpid(), os.getppid()}
    for p in alive(processes()):
        if p.sid == sid or p.pid in me or p.args.startswith("ps "):
            continue
        if any(name in p.args for name in ray_sessions) or str(workdir) in p.args:
            result.stray.append(f"pid {p.pid} (session {p.sid}, outside the driver's) left running: {p.args[:120]}")
            sigkill(p.pid)
    return result


# ----------------------------------------------------------------------------------------------------------------
# Driver runs
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class Run:
    rc: int | None                  # None: killed by us
    seconds: float
    phase: str = ""
    cleanup: Cleanup = field(default_factory=Cleanup)
    log: Path | None = None


def phase_of(log_text: str, store: Path, num_seeds: int) -> str:
    """Where the driver was, from its output and the store: imports, Ray start-up, trials while a Stage-I
    artifact is still missing ("stage I": Stage I trains, Stage-II trials may run beside it), trials once every
    Stage I is stored ("stage II"), or the report after the last trial."""
    if "trials:" not in log_text:
        return "imports"
    if ", 0 to run" in log_text:
        return "report"
    progress = re.findall(r"\] (\d+)/(\d+) done · (\d+) running", log_text)
    if not progress:
        return "ray start-up"
    done, total, running = map(int, progress[-1])
    if done == total and running == 0:
        return "report"
    artifacts = [d for d in (store / "artifacts" / "stage1").glob("*") if (d / "record.json").exists()]
    return "stage I" if len(artifacts) < num_seeds else "stage II"


class WorkerKiller(threading.Thread):
    """SIGKILLs ``kills`` times, at moments drawn in [1 s, ``span`` s], a Ray worker of session ``sid`` that
    runs a trial (its command line names a Tune trainable, ``ray::ImplicitFunc`` or ``ray::_Inner``)."""

    def __init__(self, sid: int, kills: int, span: float, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.sid, self.moments, self.rng = sid, sorted(rng.uniform(1.0, span) for _ in range(kills)), rng
        self.stop = threading.Event()
        self.killed: list[str] = []

    def run(self) -> None:
        start = time.monotonic()
        for moment in self.moments:
            if self.stop.wait(max(0.0, moment - (time.monotonic() - start))):
                return
            workers = [p for p in session_members(self.sid)
                       if p.args.startswith(("ray::ImplicitFunc", "ray::_Inner")) and "IDLE" not in p.args]
            if workers:
                victim = self.rng.choice(workers)
                sigkill(victim.pid)
                self.killed.append(f"{time.monotonic() - start:.1f} s {victim.args[:40]}")


class Driver:
    """Starts the study command in its own session and ends it (on exit or by SIGKILL of the session)."""

    def __init__(self, command: list[str], workdir: Path, num_seeds: int, grace: float, watch_interval: float,
                 worker_kills: int = 0, rng: random.Random | None = None) -> None:
        self.command, self.workdir, self.num_seeds = command, workdir, num_seeds
        self.grace, self.watch_interval = grace, watch_interval
        self.worker_kills, self.rng = worker_kills, rng or random.Random(0)
        self.runs = 0
        self.reads = 0
        self.watch_problems: list[str] = []
        self.workers_killed: list[str] = []
        self.span = 60.0  # worker-kill moments: within the last full run's duration, once known

    def run(self, store: Path, kill_after: float | None, timeout: float, kill_workers: bool = True) -> Run:
        """Run the command on ``store``; SIGKILL its session after ``kill_after`` s unless it ended before."""
        self.runs += 1
        logfile = self.workdir / f"run-{self.runs:03d}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        watcher = Watcher(store, self.watch_interval)
        start = time.monotonic()
        with open(logfile, "w") as out:
            proc = subprocess.Popen(
                [*self.command, "--store", str(store)], cwd=self.workdir, env=env, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        watcher.start()
        killer = None
        if self.worker_kills and kill_workers:
            killer = WorkerKiller(proc.pid, self.worker_kills, min(self.span, kill_after or self.span), self.rng)
            killer.start()
        ray_sessions: set[str] = set()
        rc: int | None
        phase = ""
        try:
            rc = proc.wait(timeout=kill_after if kill_after is not None else timeout)
        except subprocess.TimeoutExpired:
            members = session_members(proc.pid)
            ray_sessions = {m for p in members for m in RAY_SESSION.findall(p.args)}
            phase = phase_of(logfile.read_text(errors="replace"), store, self.num_seeds)
            _killpg(proc)
            rc = None if kill_after is not None else -9
        except BaseException:  # interrupted soak: leave nothing running
            _killpg(proc)
            reap_session(proc.pid, set(), self.workdir, grace=0.0)
            raise
        finally:
            seconds = time.monotonic() - start
            watcher.stop.set()
            watcher.join()
            if killer is not None:
                killer.stop.set()
                killer.join()
                self.workers_killed += killer.killed
        self.reads += watcher.reads
        self.watch_problems += [p for p in watcher.problems if p not in self.watch_problems]
        # A run that exited by itself gets a longer grace: a normal exit shuts local Ray down.
        cleanup = reap_session(proc.pid, ray_sessions, self.workdir,
                               grace=self.grace if rc is None else max(self.grace, 15.0))
        if rc is not None:  # the driver exited by itself: whatever outlived it 15 s is a leak
            cleanup.stray += [f"{p} still running 15 s after the driver exited (rc {rc})" for p in cleanup.stragglers]
            cleanup.stragglers = []
        return Run(rc, seconds, phase, cleanup, logfile)


def _killpg(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of a driver started with ``start_new_session`` (its pid is the group id)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# ----------------------------------------------------------------------------------------------------------------
# The soak
# ----------------------------------------------------------------------------------------------------------------

def kill_strata(rng: random.Random, n: int) -> list[tuple[float, float]]:
    """``n`` equal strata of [0, 1] in a random order (popped from the end): one kill moment is drawn uniformly
    in each (as a fraction of the span of a run), so that even a few kills spread over the whole run: Ray's
    start-up alone takes a third of it."""
    strata = [(i / n, (i + 1) / n) for i in range(n)]
    rng.shuffle(strata)
    return strata


def soak(args: argparse.Namespace, workdir: Path) -> tuple[bool, str]:
    command = [sys.executable, str(STUDY_SCRIPT), "--preset", "quick", "--data-root", str(workdir / "data"),
               "--seeds", *map(str, args.seeds), "--gammas", *map(str, args.gammas),
               "--epochs", str(args.epochs), "--stage2-epochs", str(args.stage2_epochs)]
    if args.compact_every is not None:
        command += ["--compact-every", str(args.compact_every)]
    if args.worker_kills:
        command += ["--max-failures", "3"]
    rng = random.Random(args.seed)
    driver = Driver(command, workdir, len(args.seeds), args.grace, args.watch_interval, args.worker_kills,
                    random.Random(args.seed + 1))
    failures: list[str] = []
    stray: list[str] = []
    stragglers = 0

    log(f"reference run: {' '.join(command)} --store {workdir / 'reference'}")
    ref_run = driver.run(workdir / "reference", None, timeout=args.timeout, kill_workers=False)
    stray += ref_run.cleanup.stray
    if ref_run.rc != 0:
        log(f"the reference run exited with {ref_run.rc}:\n{_tail(ref_run.log)}")
        return False, f"soak: FAIL: the reference run exited with {ref_run.rc} (log {ref_run.log}), see stderr"
    ref = load_reference(workdir / "reference", ref_run.seconds)
    if problems := check_anytime(workdir / "reference"):
        failures += [f"reference store: {p}" for p in problems]
    full_runs = [ref.seconds]  # durations of uninterrupted runs from an empty store: the machine's load varies
    driver.span = 0.9 * ref.seconds
    strata = kill_strata(rng, args.kills)
    log(f"reference: {len(ref.trials)} trials, {len(ref.history)} history rows, {len(ref.artifacts)} Stage-I "
        f"artifacts in {ref.seconds:.1f} s; kill moments ~ U(1 s, {args.span:g} × the last full run's duration), "
        f"one per 1/{args.kills} of that span")

    kills: list[tuple[float, str]] = []
    rounds, max_delta, round_runs = 1, 0.0, 0
    store = workdir / f"store-{rounds}"

    def finish_round(last: Run) -> None:
        nonlocal max_delta
        if last.rc != 0:
            failures.append(f"round {rounds}: the run on {store} exited with {last.rc} (log {last.log}):\n"
                            f"{_tail(last.log)}")
            return
        problems, delta = check_final(store, ref, len(args.seeds))
        max_delta = max(max_delta, delta)
        failures.extend(f"round {rounds} ({store}): {p}" for p in problems)
        log(f"round {rounds} complete after {round_runs} runs: {'ok' if not problems else '; '.join(problems)}")

    while len(kills) < args.kills and len(failures) < 5:
        if driver.runs > 3 * args.kills + 10:
            failures.append(
                f"only {len(kills)} of {args.kills} kills landed in {driver.runs} runs: the others ended first")
            break
        a, b = strata.pop()
        at = 1.0 + rng.uniform(a, b) * max(0.5, args.span * full_runs[-1] - 1.0)
        run = driver.run(store, at, timeout=args.timeout)
        fresh = round_runs == 0
        round_runs += 1
        stragglers += len(run.cleanup.stragglers)
        stray += run.cleanup.stray
        if run.rc is not None:
            log(f"run on {store.name} finished (rc {run.rc}) after {run.seconds:.1f} s, before its kill at {at:.1f} s")
            # The next run starts on a fresh store (a full-length run) and draws in this stratum again.
            strata.append((a, b))
            if fresh:
                full_runs.append(run.seconds)
            finish_round(run)
            rounds += 1
            round_runs = 0
            store = workdir / f"store-{rounds}"
            continue
        kills.append((run.seconds, run.phase))
        problems = check_anytime(store)
        stored = len(read_trials(store)) if not problems else "?"
        log(f"kill {len(kills)}/{args.kills} at {run.seconds:.1f} s ({run.phase}) on {store.name}: {stored} trials "
            f"stored, {len(run.cleanup.stragglers)} session processes SIGKILLed after the grace"
            f"{f' {run.cleanup.stragglers}' if run.cleanup.stragglers else ''}, "
            f"{len(run.cleanup.stray)} stray · {'ok' if not problems else '; '.join(problems)}")
        failures.extend(f"after kill {len(kills)} ({store}): {p}" for p in problems)

    if not failures:
        log(f"completing round {rounds} on {store.name}")
        last = driver.run(store, None, timeout=args.timeout)
        round_runs += 1
        stray += last.cleanup.stray
        finish_round(last)

    failures += driver.watch_problems
    failures += [f"stray process: {s}" for s in stray]
    times = [t for t, _ in kills]
    phases = Counter(p for _, p in kills)
    order = ["imports", "ray start-up", "stage I", "stage II", "report"]
    span = f"{min(times, default=0):.1f}-{max(times, default=0):.1f} s"
    full = f"{min(full_runs):.1f}-{max(full_runs):.1f} s runs" if len(full_runs) > 1 else f"a {ref.seconds:.1f} s run"
    line = (f"soak: {len(kills)} kills in {rounds} round{'s' * (rounds != 1)} (at {span} of {full}; "
            f"{', '.join(f'{p} {phases[p]}' for p in order if phases[p])}), "
            f"{len(driver.workers_killed)} Ray workers SIGKILLed, "
            f"{len(ref.trials)} trials each stored once, all files readable at every kill and in {driver.reads} "
            f"reads while running, metrics identical to the uninterrupted run (max |Δ| {max_delta:.3g}), "
            f"{len(stray)} stray processes ({stragglers} session processes SIGKILLed after the driver)")
    if failures:
        for f in failures:
            log(f"FAIL: {f}")
        first = failures[0].splitlines()[0]
        more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
        return False, f"{line} · FAIL: {first}{more}, see stderr"
    return True, f"{line} · PASS"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs of the driver (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments (default 0)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="directory for the stores and run logs (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (always kept on failure)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="study seeds (default 1 2 3)")
    parser.add_argument("--gammas", type=float, nargs="+", default=[0.9, 1.0], help="MaC-Cal γ values (default 0.9 1)")
    parser.add_argument("--epochs", type=int, default=12, help="Stage-I epochs (default 12)")
    parser.add_argument("--stage2-epochs", type=int, default=100, help="Stage-II epochs (default 100)")
    parser.add_argument("--span", type=float, default=0.95,
                        help="kill moments are drawn in [1 s, span × the reference run's duration] (default 0.95)")
    parser.add_argument("--grace", type=float, default=3.0,
                        help="seconds a killed session's processes get to exit by themselves (default 3)")
    parser.add_argument("--watch-interval", type=float, default=2.0,
                        help="seconds between the reader's checks while a driver runs (default 2)")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit of an uninterrupted run (default 600 s)")
    parser.add_argument("--compact-every", type=int, default=None,
                        help="the study's --compact-every (1: a compaction after every finished trial)")
    parser.add_argument("--worker-kills", type=int, default=0,
                        help="SIGKILLs of a Ray worker running a trial per run, at random moments (default 0)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    workdir = args.workdir.resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="calib-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if any(workdir.iterdir()):
        print(f"soak: FAIL: --workdir {workdir} is not empty", flush=True)
        return 1
    ok, line = False, "soak: FAIL: interrupted"
    try:
        ok, line = soak(args, workdir)
    finally:
        if args.keep or not ok:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
