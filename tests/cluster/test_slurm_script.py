"""The Slurm launcher without a Slurm: the generated script for a GPU partition against a reviewed golden
file, shellcheck on the template and the scripts of the main configurations, the settings and their checks, the
places every node must see, and the command's paths that need no ``sbatch``."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calib._config import ConfigError
from calib.cluster import slurm_checks
from calib.cluster.slurm import JOB_TEMPLATE, SlurmSettings, parse_time, render_script
from calib.cluster.slurm_checks import local_storage_warnings, node_local_places

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "slurm_gpu.sbatch"

GPU_SETTINGS = SlurmSettings(
    partition="gpu", account="ml-lab", qos="normal", nodes=4, gpus_per_node=4, cpus_per_node=32,
    mem_per_node="256G", time="2-00:00:00", signal_seconds=300, max_requeues=3, handover_seconds=120,
    setup=("module load cuda/12.4", "source ~/venvs/calib/bin/activate"), run_dir="/shared/alice/calib",
    sbatch_options=("--constraint=a100",))
GPU_COMMAND = ["python", "studies/compare_methods.py", "--preset", "paper", "--store", "/shared/alice/results"]


def test_the_script_for_a_gpu_partition_is_the_reviewed_golden_file():
    script = render_script(GPU_SETTINGS, GPU_COMMAND, name="calib-compare_methods")
    if os.environ.get("CALIB_UPDATE_GOLDEN"):  # regenerate, then review the diff before committing it
        GOLDEN.write_text(script)
    assert script == GOLDEN.read_text()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


CONFIGURATIONS = {
    "gpu": GPU_SETTINGS,
    "gpu without MPS": dataclasses.replace(GPU_SETTINGS, mps=False),
    "cpu, defaults": SlurmSettings(run_dir="/shared/alice/calib"),
    "cpu, one node, settings file": SlurmSettings(nodes=1, cpus_per_node=8, mem_per_node="500", setup=(
        ". /etc/profile.d/modules.sh", "conda activate calib"), run_dir="/shared/alice/calib", ray_tmp="/scratch/",
        sbatch_options=("--exclusive",)),
}


@pytest.mark.skipif(shutil.which("shellcheck") is None and not os.environ.get("CALIB_CI"),
                    reason="shellcheck is not installed (apt-get install shellcheck); .ci/run installs it, runs this")
def test_shellcheck_passes_the_template_and_the_scripts_of_the_main_configurations(tmp_path: Path):
    """shellcheck (Debian's package) at its default severity, every warning fixed or disabled in the template with
    its reason. Never skipped in CI (.ci/run sets ``CALIB_CI``): there a missing shellcheck fails."""
    assert shutil.which("shellcheck"), "shellcheck is not installed: apt-get install shellcheck"
    template = Path(slurm_checks.__file__).parent / JOB_TEMPLATE
    scripts = [template]
    for name, settings in CONFIGURATIONS.items():
        scripts.append(tmp_path / f"{name.replace(' ', '_').replace(',', '')}.sbatch")
        scripts[-1].write_text(render_script(settings, GPU_COMMAND, name="calib-compare_methods"))
    proc = subprocess.run(["shellcheck", "--shell=bash", *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_gpu_script_asks_slurm_for_what_the_settings_say():
    directives = [line.removeprefix("#SBATCH ") for line in GOLDEN.read_text().splitlines()
                  if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=calib-compare_methods", "--partition=gpu", "--account=ml-lab", "--qos=normal", "--nodes=4",
        "--ntasks-per-node=1", "--cpus-per-task=32", "--mem=256G", "--gpus-per-node=4", "--time=2-00:00:00",
        "--signal=B:USR1@300", "--requeue", "--open-mode=append",
        "--output=/shared/alice/calib/slurm/%x-%j.out", "--constraint=a100"]
    text = GOLDEN.read_text()
    assert "--object-store-memory=82463372083" in text  # 30 % of 256 GiB, not of the whole node's memory
    assert 'GPUS=${SLURM_GPUS_ON_NODE:-0}' in text  # set with --gpus-per-node (SLURM_GPUS_PER_TASK is not)
    assert "NodeAddr" in text and "$(hostname -" not in text  # addresses from Slurm, never `hostname -i`


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 5400), ("30:15", 1815), ("1:02:03", 3723), ("2-00", 172800), ("1-01:30", 91800),
    ("1-00:00:10", 86410)])
def test_slurm_time_limits_in_every_format(text: str, seconds: int):
    assert parse_time(text) == seconds


@pytest.mark.parametrize(("settings", "message"), [
    (SlurmSettings(time="1h"), "--time '1h' is not a Slurm time limit; allowed: MINUTES"),
    (SlurmSettings(time="6", signal_seconds=300), "--time 6 (360 s) must be longer than the warning"),
    (SlurmSettings(nodes=0), "--nodes must be an integer >= 1, got 0"),
    (SlurmSettings(gpus_per_node=-1), "--gpus-per-node must be an integer >= 0, got -1"),
    (SlurmSettings(max_requeues=True), "--max-requeues must be an integer >= 0, got True"),
    (SlurmSettings(mem_per_node="64GB"), "--mem-per-node must be a size such as 64G"),
    (SlurmSettings(partition="gpu a100"), "--partition must be a Slurm name (letters, digits, underscores, dots, "
                                          "dashes and plus signs), got 'gpu a100'."),
    (SlurmSettings(mps="yes"), "--mps must be true or false (on or off in a settings file), got 'yes'"),
])
def test_bad_settings_name_the_value_and_what_is_allowed(settings: SlurmSettings, message: str):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        settings.check()


def test_a_settings_file_takes_dashes_or_underscores_and_rejects_unknown_keys(tmp_path: Path):
    good = tmp_path / "slurm.yaml"
    good.write_text("partition: gpu\ngpus-per-node: 2\nmax_requeues: 5\nsetup: module load cuda\n"
                    "sbatch-options: [--exclusive]\n")
    settings = SlurmSettings.from_file(good)
    assert (settings.partition, settings.gpus_per_node, settings.max_requeues) == ("gpu", 2, 5)
    assert settings.setup == ("module load cuda",) and settings.sbatch_options == ("--exclusive",)
    bad = tmp_path / "bad.yaml"
    bad.write_text("partition: gpu\ngpus: 2\n")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) gpus; allowed: account, cpus_per_node"):
        SlurmSettings.from_file(bad)


def test_places_under_a_node_local_folder_or_in_memory_are_found_and_a_disks_are_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Under /tmp, /var/tmp or /dev/shm, or on a memory file system wherever it is mounted: node-local, refused;
    on a disk's file system: a warning (the site may export it); s3:// and --shared-path folders: neither."""
    import calib

    kinds = {"/scratch/alice": "tmpfs", "/home/alice": "ext4", "/shared": "nfs4"}
    # the Python and calib on the shared file system, wherever this checkout and its environment lie (CI: /tmp)
    monkeypatch.setattr(sys, "executable", "/shared/venv/bin/python")
    monkeypatch.setattr(calib, "__file__", "/shared/calib/calib/__init__.py")
    monkeypatch.setattr(slurm_checks, "_file_system", lambda path: next(
        (kind for mount, kind in kinds.items() if str(path).startswith(mount)), "nfs4"))
    command = ["python", "studies/s.py", "--store", "/dev/shm/calib-results", "--artifacts", "s3://bucket/artifacts",
               "--storage=/scratch/alice/ray"]
    found = node_local_places(Path("/shared/run"), command)
    assert found == ["--store /dev/shm/calib-results (under /dev/shm)",
                     "--storage /scratch/alice/ray (on tmpfs, in the node's memory)"]
    assert node_local_places(Path("/var/tmp/run"), ["python", "/var/tmp/run/s.py"]) == [
        "the run directory /var/tmp/run (under /var/tmp)", "--store (default results) /var/tmp/run/results (under "
        "/var/tmp)"]  # the study script: in the run directory, said once
    assert node_local_places(Path("/shared/run"), command, shared=["/dev/shm", "/scratch/alice"]) == []
    warnings = local_storage_warnings(Path("/home/alice/run"), ["python", "s.py", "--store", "s3://b/r"])
    assert warnings == ["warning: the run directory /home/alice/run is on a node-local file system (ext4): each "
                        "node of the job, and a requeued job's, would see its own copy. Put it on the cluster's "
                        "shared file system, or use an s3:// store."]  # the store on S3: nothing to say
    assert local_storage_warnings(Path("/home/alice/run"), ["python", "s.py"], shared=["/home/alice"]) == []


def test_the_python_and_calib_are_places_every_node_must_see(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys, "executable", "/tmp/venv/bin/python")
    found = node_local_places(ROOT, ["python", "studies/s.py", "--store", "s3://b/r"])
    assert found[0] == "the Python /tmp/venv/bin/python (under /tmp)"
    import calib

    if str(Path(calib.__file__).resolve()).startswith(("/tmp/", "/var/tmp/", "/dev/shm/")):  # a checkout there
        assert found[1].startswith(f"calib {Path(calib.__file__).resolve().parent} (under /")


SHARED = [f"--shared-path={folder}" for folder in (ROOT, Path(sys.prefix), Path(sys.base_prefix))]
"""This checkout and its Python, taken as on the cluster's shared file system wherever they are (under /tmp too)."""


def _cli(tmp_path: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m calib.cluster slurm`` on a PATH without Slurm's commands (this machine's login node), with
    ``tmp_path`` taken as a folder every node sees, typed in ``cwd``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(bin_dir), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "calib.cluster", "slurm", *SHARED, f"--shared-path={tmp_path}", *args],
                          cwd=cwd, capture_output=True, text=True, env=env)


def test_without_slurm_the_command_writes_the_script_and_says_how_to_submit_it(tmp_path: Path):
    out, study = tmp_path / "gamma.sbatch", str(ROOT / "studies" / "sensitivity_gamma.py")
    proc = _cli(tmp_path, "--nodes", "2", "--time", "4:00:00", "--run-dir", str(tmp_path), "-o", str(out), "--",
                "python", study, "--store", str(tmp_path / "results"), "--seeds", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "[sensitivity_gamma] checked: 6 trials to run; nothing was started (--check-only)",
        f"wrote {out}: submit it with `sbatch {out}`"]
    script = out.read_text()
    assert "#SBATCH --job-name=calib-sensitivity_gamma" in script and "#SBATCH --nodes=2" in script
    assert f"python {study} --store {tmp_path / 'results'} --seeds 1 --address" in script
    assert (tmp_path / "slurm").is_dir()  # the job's log folder: sbatch does not create it
    proc = _cli(tmp_path, "--run-dir", str(tmp_path), "--submit", "--", "python", study)
    assert proc.returncode == 2 and proc.stderr.startswith("error: sbatch is not on this machine's PATH")


def test_relative_paths_are_taken_where_the_command_was_typed_and_a_new_run_dir_is_created(tmp_path: Path):
    """Typed in the checkout, run from a run directory that does not exist yet: the study script and the path
    flags' values become the checkout's absolute paths (the job runs from the run directory), a URI stays, and
    the run directory is made. A study script that is not where the command was typed is refused, naming the
    absolute path to give when the run directory has it; a run directory refused later leaves nothing behind."""
    run_dir = tmp_path / "new" / "run"
    proc = _cli(tmp_path, "--run-dir", str(run_dir), "--", "python", "studies/sensitivity_gamma.py", "--data-root",
                "data", "--store", str(tmp_path / "store"), "--storage=s3://bucket/ray", "--seeds", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"created the run directory {run_dir}"
    script = (run_dir / "slurm" / "calib-sensitivity_gamma.sbatch").read_text()
    assert (f"python {ROOT / 'studies' / 'sensitivity_gamma.py'} --data-root {ROOT / 'data'} --store "
            f"{tmp_path / 'store'} --storage=s3://bucket/ray --seeds 1 --address") in script
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _cli(tmp_path, "--run-dir", str(ROOT), "--", "python", "studies/sensitivity_gamma.py", cwd=elsewhere)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"error: studies/sensitivity_gamma.py is not a file in {elsewhere}, where this command was typed: give the "
        f"study script's path from here, or its absolute path (the run directory has "
        f"{ROOT / 'studies' / 'sensitivity_gamma.py'}: give that absolute path)."], proc.stderr
    refused = tmp_path / "refused" / "run"
    proc = _cli(tmp_path, "--run-dir", str(refused), "--", "python", "studies/sensitivity_gamma.py", "--gammas", "0")
    assert proc.returncode == 2 and "must be > 0" in proc.stderr and not (tmp_path / "refused").exists()
    (tmp_path / "a-file").write_text("")
    proc = _cli(tmp_path, "--run-dir", str(tmp_path / "a-file"), "--", "python", "studies/sensitivity_gamma.py")
    assert proc.returncode == 2 and f"--run-dir {tmp_path / 'a-file'} is a file" in proc.stderr


def test_a_node_local_environment_is_refused_before_anything_is_written_or_submitted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    """A Python under /tmp and a store in /dev/shm: exit 2, one line naming both, no script, and the ``sbatch``
    on the PATH never called (nor the study's own check)."""
    from calib.cluster import main

    bin_dir, called = tmp_path / "bin", tmp_path / "sbatch-called"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\necho \"$@\" >> {called}\necho 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(sys, "executable", "/tmp/calib-venv/bin/python")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code = main(["slurm", *SHARED, f"--shared-path={run_dir}", "--run-dir", str(run_dir), "--submit", "--",
                 "python", str(ROOT / "studies" / "sensitivity_gamma.py"), "--store", "/dev/shm/calib-store"])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines() == [
        "error: node-local paths: the Python /tmp/calib-venv/bin/python (under /tmp), --store /dev/shm/calib-store "
        "(under /dev/shm). Each node of a Slurm job has its own there: the job's other nodes, and a requeued job's, "
        "would not see them. Put the Python (a virtual environment), calib, the run directory and the store on the "
        "cluster's shared file system (a store may also be s3://), or name a folder every node does see at the "
        "same path with --shared-path."]
    assert not called.exists() and not (run_dir / "slurm").exists()


def test_the_job_is_named_after_the_study_the_command_runs():
    from calib.cluster.slurm import study_name

    assert study_name(["python", "studies/search.py", "--space", "search_spaces/mac_cal_head.yaml"]) == (
        "search_mac_cal_head")  # search.py's own default
    assert study_name(["python", "studies/ablation.py", "--study=ladder-a"]) == "ladder-a"
    assert study_name(["python", "studies/compare_methods.py", "--preset", "paper"]) == "compare_methods"


@pytest.mark.parametrize(("record", "ending"), [
    ("JobState=COMPLETING Reason=None Dependency=(null)\n   Requeue=1 Restarts=2 BatchFlag=1", "requeued"),
    ("JobState=COMPLETING Reason=TimeLimit Dependency=(null)\n   Requeue=1 Restarts=1 BatchFlag=1", "time-limit"),
    ("JobState=COMPLETING Reason=None Dependency=(null)\n   Requeue=1 Restarts=1 BatchFlag=1", "cancelled"),
    ("JobState=RUNNING Reason=None Dependency=(null)\n   Requeue=1 Restarts=1 BatchFlag=1", "signalled"),
    (None, "unknown"),
], ids=["scontrol requeue", "time limit", "scancel", "scancel --signal=TERM", "slurmctld unreachable"])
def test_the_script_tells_why_slurm_sent_sigterm_from_its_record_of_the_job(tmp_path: Path, record: str | None,
                                                                             ending: str):
    """``why_sigterm`` of the script on the second start (``SLURM_RESTART_COUNT=1``), against the records
    ``scontrol show job`` gave in the Slurm lab while each kind of SIGTERM was being delivered."""
    script = render_script(GPU_SETTINGS, GPU_COMMAND, name="calib-compare_methods")
    function = script[script.index("why_sigterm() {"):script.index("\n}\n", script.index("why_sigterm() {")) + 3]
    scontrol = tmp_path / "scontrol"
    answer = f"cat <<'END'\nJobId=7 JobName=x\n   {record}\nEND\n" if record else "exit 1\n"
    scontrol.write_text(f"#!/bin/sh\n{answer}")
    scontrol.chmod(0o755)
    proc = subprocess.run(["bash", "-c", f"RESTARTS=1 SLURM_JOB_ID=7\n{function}why_sigterm"], capture_output=True,
                          text=True, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.stdout == f"{ending}\n", proc.stderr


def test_the_script_checks_on_a_node_that_calib_imports_as_the_study_imports_it(tmp_path: Path):
    """``CHECK_NODE`` of the script, run as each node's step runs it: silent where the node's python imports calib,
    else ``<node> <python> <error>``; a ``calib`` folder in the current one does not count (the study's
    ``python studies/<study>.py`` would not import it from there)."""
    script = render_script(GPU_SETTINGS, GPU_COMMAND, name="calib-compare_methods")
    start = script.index("CHECK_NODE='")
    assignment = script[start:script.index("'\n", start) + 1]
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "python").symlink_to(Path(sys.base_prefix) / "bin" / "python3")
    (tmp_path / "calib").mkdir()  # the current folder's: not what the study imports
    (tmp_path / "calib" / "__init__.py").write_text("")

    def check(path: str, pythonpath: str | None) -> str:
        env = {**os.environ, "PATH": f"{path}:{os.environ['PATH']}", "SLURMD_NODENAME": "n7"}
        env.pop("PYTHONPATH", None)
        env.update({"PYTHONPATH": pythonpath} if pythonpath else {})
        return subprocess.run(["bash", "-c", f'{assignment}\nbash -c "$CHECK_NODE"'], cwd=tmp_path, env=env,
                              capture_output=True, text=True).stdout

    assert check(str(Path(sys.executable).parent), str(ROOT)) == ""
    assert check(str(bare), None) == f"n7 {bare / 'python'} ModuleNotFoundError: No module named 'calib'\n"


@pytest.mark.parametrize(("child", "said", "status"), [
    ("trap '' TERM; touch READY; exec sleep 60", "the study did not stop within 1 s of the SIGTERM (Slurm's "
     "KillWait, 4 s, less 3 s for this script to end): this script ended it (SIGKILL)", 137),
    ("touch READY; exec sleep 60", None, 143),
], ids=["a study slower than KillWait", "a study the SIGTERM ends"])
def test_after_sigterm_the_script_waits_for_the_study_only_until_killwait_less_a_margin(
        tmp_path: Path, child: str, said: str | None, status: int):
    """The script's signal handling and ``run_child`` (how it runs the wait for Ray and the study), with Slurm's
    KillWait 4 s (``scontrol show config``): a SIGTERM to the script stops the child; one that outlives 4 - 3 s is
    ended by the script, in a line of its own. The child's status is returned either way."""
    script = render_script(GPU_SETTINGS, GPU_COMMAND, name="calib-compare_methods")
    start = script.index("say() {")
    part = script[start:script.index("\n", start) + 1]
    start = script.index('SIGNALLED=""')
    part += script[start:script.index("\n}\n", script.index("run_child() {")) + 3]
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\n[ \"$2\" = config ] && echo 'KillWait                = 4 sec' || exit 1\n")
    scontrol.chmod(0o755)
    ready = tmp_path / "ready"
    body = f"{part}\nrun_child bash -c {shlex.quote(child.replace('READY', str(ready)))}\necho status=$?\n"
    proc = subprocess.Popen(["bash", "-c", f"SLURM_JOB_ID=7 RESTARTS=0\n{body}"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    for _ in range(200):
        if ready.exists():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    lines = [line.split("] ", 1)[1] if line.startswith("[calib-slurm") else line for line in out.splitlines()]
    assert lines[0] == "SIGTERM: stopping the study", out  # scontrol show job answers nothing here
    assert lines[1:] == ([said] if said else []) + [f"status={status}"], out
