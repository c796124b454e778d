"""One Stage-I training per config on a real multi-node Ray cluster, with two drivers and a killed holder: run by
tests/cluster/test_ray_up.py on the cluster `ray up` started (two lab hosts, 2 CPUs each, the store on the lab's
moto S3 server), between the README's study and ``stop-workers``.

Two γ studies sharing their Stage Is start at once, one driver on each host; each has more trials on a stored
Stage I than the cluster has slots. While the Stage Is train, the process of one claim holder is killed (its trial
is retried, ``--max-failures 2``; whichever trial takes the claim over continues the training state the holder
left). Both studies must finish with every row ok, the takeover in the output of the study that made it, and for
every ``stage1_id`` exactly one row that trained it (``stage1_cache_hit`` false), one ``stage1_writer`` over all
rows, the writer of its ``record.json``. Each driver compacts its study every 2 finished trials while the workers
of both hosts write: at the end every row is in a part, and a plain pyarrow read of the store sees each trial once.
"""

from __future__ import annotations

import json
import subprocess
import time

LEASE_SECONDS = 3
# A short lease, and the training state shared after every epoch: a takeover continues it. The driver forwards
# both to every worker of its run (calib.run.runtime.FORWARDED_ENV).
CLAIM_ENV = f"CALIB_STAGE1_LEASE_SECONDS={LEASE_SECONDS} CALIB_STAGE1_HANDOVER_SECONDS=0"
COMMON = ("--seeds 1 2 --epochs 5 --stage2-epochs 1 --cpus-per-trial 2 --cpus-per-cached-trial 1 "
          "--configs-per-trial 1 --max-failures 2 --checkpoint-min-seconds 0 --compact-every 2")


def _claims(s3, bucket: str, prefix: str) -> list[dict]:
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/artifacts/stage1/")
    keys = [o["Key"] for o in listing.get("Contents", []) if o["Key"].endswith("/claim.json")]
    found = []
    for key in keys:
        try:
            found.append(json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))
        except s3.exceptions.NoSuchKey:
            pass
    return found


def each_stage1_is_trained_once(lab, bucket: str, prefix: str = "once") -> list[str]:
    """The scenario above on ``lab``'s running cluster, its store at ``s3://<bucket>/<prefix>``; the lines to print."""
    import boto3

    from calib.store import read_trials

    s3 = boto3.client("s3")
    store = f"s3://{bucket}/{prefix}"
    started = time.monotonic()
    transcript: list[str] = []

    def run(where, command: str, timeout: float = 120) -> str:
        proc = lab.ssh(where, command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"`{command}` on {where.name} exited {proc.returncode}:\n{out[-3000:]}"
        return out

    # A driver started over SSH on a node of the token cluster, not by `ray exec`: it says it uses the token
    # (~/.ray/auth_token, which `ray up` put on every node), as `ray job submit` does in docs/how-to/ray-cluster.md.
    study = (f"cd ~/calib && RAY_AUTH_MODE=token {CLAIM_ENV} ~/venv/bin/python studies/sensitivity_gamma.py "
             f"--address {lab.head.ip}:6379 --store {store} {COMMON}")
    drivers = {
        "gamma-a": lab.ssh(lab.head, f"{study} --study gamma-a --gammas 0.9 1.0", stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True),
        "gamma-b": lab.ssh(lab.workers[0], f"{study} --study gamma-b --gammas 0.7", stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True),
    }
    try:
        # Kill the process of a claim holder mid-training: the first claim seen, a second after it appears.
        deadline, claims = time.monotonic() + 180, []
        while not claims:
            ended = {name: d.communicate()[0][-3000:] for name, d in drivers.items() if d.poll() is not None}
            assert not ended, f"a driver ended before any claim was taken: {ended}"
            assert time.monotonic() < deadline, "no claim seen within 180 s"
            claims = _claims(s3, bucket, prefix)
            time.sleep(0.2)
        time.sleep(1.0)
        victim = claims[0]
        victim_host = next(h for h in lab.hosts if h.name == victim["host"])
        run(victim_host, f"kill -9 {victim['pid']}")
        transcript.append(f"killed the holder {victim['holder']} of Stage I {victim['stage1_id']} on "
                          f"{victim_host.name} at {time.monotonic() - started:.0f} s")
        outputs = {name: proc.communicate(timeout=420)[0] for name, proc in drivers.items()}
    finally:
        for proc in drivers.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for name, proc in drivers.items():
        assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{outputs[name][-4000:]}"
    transcript += [line for out in outputs.values() for line in out.splitlines()
                   if "trials:" in line or "takes it over" in line or "waiting for it" in line
                   or "continuing the training" in line]
    # Whoever took the killed holder's claim over said so in its study's own output, as it happened.
    takeovers = [line for name, out in outputs.items() for line in out.splitlines()
                 if line.startswith(f"[{name}] trial ") and f"Stage I {victim['stage1_id']}: its holder "
                 f"{victim['holder']} " in line and "takes it over" in line]
    assert len(takeovers) == 1, "\n".join(transcript)

    rows = read_trials(store)
    assert rows.groupby("study", observed=True).size().to_dict() == {"gamma-a": 6, "gamma-b": 4}
    assert (rows["status"] == "ok").all()
    assert set(rows["host"]) == {h.name for h in lab.hosts}, rows[["study", "seed", "host"]]
    trained = rows[~rows["stage1_cache_hit"].astype(bool)].groupby("stage1_id").size()
    assert trained.to_dict() == dict.fromkeys(rows["stage1_id"].unique(), 1), \
        rows[["study", "method", "seed", "stage1_id", "stage1_cache_hit", "stage1_writer", "host"]]
    assert (rows.groupby("stage1_id").stage1_writer.nunique() == 1).all()
    for stage1_id, writers in rows.groupby("stage1_id").stage1_writer:
        record = s3.get_object(Bucket=bucket, Key=f"{prefix}/artifacts/stage1/{stage1_id}/record.json")
        assert json.loads(record["Body"].read())["writer"] == writers.iloc[0]
    assert victim["holder"] not in set(rows["stage1_writer"]), "the killed holder published nothing"
    assert not _claims(s3, bucket, prefix), "every claim is released once its Stage I is published"
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")["Contents"]
    data = [o["Key"] for o in listing if o["Key"].endswith(".parquet")]
    assert data and all(k.rpartition("/")[2].startswith("part-") for k in data), data  # all compacted
    assert not [o["Key"] for o in listing if o["Key"].startswith(f"{prefix}/compaction/")
                and o["Key"].endswith(".json")], "no compaction lease is left"
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(store)
    plain = pads.dataset(f"{path}/trials", filesystem=fs, format="parquet", partitioning="hive").to_table()
    assert plain.num_rows == 10 and len(plain["trial_id"].unique()) == 10
    return [*transcript, f"{len(rows)} rows, {rows['stage1_id'].nunique()} Stage Is, each trained once, in "
                         f"{time.monotonic() - started:.0f} s"]
