"""One training per Stage I across nodes: the atomic writes, claims with leases, waiting, first-writer-wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest
import torch
from locations import local_or_s3_location

from calib import storage
from calib.artifacts import Stage1WaitTimeout, get_or_train_stage1
from calib.artifacts import stage1 as stage1_module
from calib.artifacts.claim import ClaimSettings, acquire, claim_location
from calib.artifacts.publish import publish
from calib.artifacts.waits import WAITED, WAITING, Stage1Event
from calib.config import config_hash, parse_trial_config, stage1_identity

ROOT = Path(__file__).resolve().parents[2]
FAST = ClaimSettings(lease_seconds=0.6, wait_seconds=30.0, poll_seconds=0.05)


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    """An artifact root: a local (or shared) directory, or a bucket on moto's S3 server."""
    return local_or_s3_location(request, tmp_path, "artifacts")


def test_create_exclusive_replace_if_and_delete_if_are_conditional(root):
    location = storage.join(root, "stage1", "x.claim")
    first = storage.create_exclusive(location, b"one")
    assert first is not None
    assert storage.create_exclusive(location, b"two") is None  # exists: refused, unchanged
    assert storage.read_versioned(location) == (b"one", first)
    second = storage.replace_if(location, b"three", first)
    assert second is not None and second != first
    assert storage.replace_if(location, b"four", first) is None  # stale token: refused
    assert storage.read_versioned(location)[0] == b"three"
    assert not storage.delete_if(location, first)
    assert storage.delete_if(location, second)
    assert storage.read_versioned(location) is None
    assert storage.replace_if(location, b"five", second) is None  # gone: nothing to replace


def never_published() -> bool:
    return False


def test_a_claim_is_renewed_and_released(root):
    said: list[Stage1Event] = []
    claim = acquire(root, "abc", never_published, "node-a-1", FAST, said.append)
    assert claim is not None and said == []
    body, _ = storage.read_versioned(claim_location(root, "abc"))
    assert json.loads(body)["holder"] == "node-a-1"
    time.sleep(FAST.lease_seconds)  # the background thread renews every third of the lease
    assert json.loads(storage.read_versioned(claim_location(root, "abc"))[0])["renewals"] >= 1
    claim.release()
    assert storage.read_versioned(claim_location(root, "abc")) is None


def test_a_holder_that_stops_renewing_loses_its_claim_after_the_lease(root):
    holder = acquire(root, "abc", never_published, "node-a-1", FAST, print)
    holder._stop.set()  # the holder hangs: no more renewals
    holder._thread.join()
    said: list[Stage1Event] = []
    start = time.monotonic()
    taker = acquire(root, "abc", never_published, "node-b-2", FAST, said.append)
    waited = time.monotonic() - start
    assert taker is not None and taker.took_over == "node-a-1"
    assert waited >= FAST.lease_seconds  # by the waiter's own clock: a whole lease without a change
    assert [e.kind for e in said] == [WAITING, WAITED]  # one line when the wait starts, one when it ends
    assert "is being trained by node-a-1" in said[0].message and "not renewed for 0.6 s" in said[0].message
    assert "node-a-1 stopped renewing its claim" in said[-1].message and "node-b-2" in said[-1].message
    assert FAST.lease_seconds <= said[-1].seconds <= waited and "takes it over after waiting" in said[-1].message
    assert not holder.renew() and holder.lost.is_set()  # the old holder learns it lost the claim
    holder.release()  # ...and leaves the new holder's claim alone
    assert json.loads(storage.read_versioned(claim_location(root, "abc"))[0])["holder"] == "node-b-2"
    taker.release()


def test_a_waiting_trial_times_out_naming_the_stage1_and_its_holder(root):
    holder = acquire(root, "abc", never_published, "node-a-1", FAST, print)  # alive: renews all along
    said: list[Stage1Event] = []
    patient = ClaimSettings(lease_seconds=FAST.lease_seconds, wait_seconds=1.5, poll_seconds=0.05)
    with pytest.raises(Stage1WaitTimeout, match=r"gave up after 1.5 s waiting for Stage I abc, claimed by node-a-1"):
        acquire(root, "abc", never_published, "node-b-2", patient, said.append)
    assert "waiting for it to be published, at most 1.5 s (CALIB_STAGE1_WAIT_SECONDS)" in said[0].message
    assert [e.kind for e in said] == [WAITING, WAITED] and said[1].message == ""  # the error says the rest
    assert said[1].seconds >= 1.5
    holder.release()


def test_a_waiter_returns_once_the_holder_publishes(root):
    holder = acquire(root, "abc", never_published, "node-a-1", FAST, print)
    published = threading.Event()

    def publish_and_release() -> None:
        published.set()
        holder.release()

    timer = threading.Timer(0.3, publish_and_release)
    timer.start()
    said: list[Stage1Event] = []
    assert acquire(root, "abc", published.is_set, "node-b-2", FAST, said.append) is None
    timer.join()
    assert [e.kind for e in said] == [WAITING, WAITED] and "was published after this trial waited" in said[1].message


def test_a_claim_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    root = str(tmp_path / "artifacts")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    body = {"holder": "gone", "host": os.uname().nodename, "pid": int(dead.stdout), "renewed_at": "then",
            "pid_namespace": os.stat("/proc/self/ns/pid").st_ino}
    storage.create_exclusive(claim_location(root, "abc"), json.dumps(body).encode())
    start = time.monotonic()
    said: list[Stage1Event] = []
    patient = ClaimSettings(lease_seconds=600, wait_seconds=5, poll_seconds=0.05)  # a wait shorter than a lease
    claim = acquire(root, "abc", never_published, "me", patient, said.append)
    assert claim is not None and time.monotonic() - start < 600
    assert [e.kind for e in said] == [WAITED]  # taken over at once: no wait was announced
    assert said[0].message == "Stage I abc: its holder gone is a process of this host that is gone; this trial (me) " \
                              "takes it over"
    claim.release()


RACER = """
import json, sys, torch
from calib.artifacts import get_or_train_stage1
from calib.config import parse_trial_config
artifact, hit = get_or_train_stage1(parse_trial_config(json.loads(sys.argv[1])), torch.device("cpu"))
print(json.dumps({"hit": hit, "writer": artifact.record["writer"]}))
"""


def test_two_nodes_racing_for_one_stage1_train_it_once(s3, make_config, tmp_path):
    bucket, aws = s3
    config = {**make_config(method={"name": "vanilla"}, epochs=6), "artifact_root": f"s3://{bucket}/artifacts"}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, json.dumps(config)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, **aws, "CALIB_ARTIFACT_CACHE": str(tmp_path / f"node-{i}"),
                                   "CALIB_STAGE1_LEASE_SECONDS": "5"})
             for i in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    answers = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sorted(a["hit"] for a in answers) == [False, True]  # one trained, the other waited and loaded it
    assert answers[0]["writer"] == answers[1]["writer"]
    waiter = next(err for (_, err), a in zip(outputs, answers, strict=True) if a["hit"])
    stage1_id = config_hash(stage1_identity(parse_trial_config(config)))
    assert f"Stage I {stage1_id} is being trained by {answers[0]['writer']}" in waiter
    listing = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="artifacts/")
    assert sorted(o["Key"].split("/", 3)[-1] for o in listing["Contents"]) == sorted(
        ["record.json", f"{answers[0]['writer']}/model.pt", f"{answers[0]['writer']}/cache.pt"])


def test_a_copy_trained_after_another_was_published_is_discarded_for_it(s3, make_config, tmp_path, monkeypatch,
                                                                         capsys):
    bucket, _ = s3
    cfg = parse_trial_config({**make_config(method={"name": "vanilla"}), "artifact_root": f"s3://{bucket}/artifacts"})
    cpu = torch.device("cpu")
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-a"))
    first, hit = get_or_train_stage1(cfg, cpu)
    assert not hit
    record = storage.read_bytes(storage.join(cfg.artifact_root, "stage1", first.stage1_id, "record.json"))

    # Node B misses the record (a lease that expired under a slow holder) and trains a copy of its own.
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-b"))
    real_find, calls = stage1_module._find, []

    def blind_at_first(*args):
        calls.append(args)
        return None if len(calls) <= 2 else real_find(*args)

    monkeypatch.setattr(stage1_module, "_find", blind_at_first)
    monkeypatch.setattr(stage1_module, "_published", lambda final, remote: False)
    with pytest.warns(UserWarning, match="was published by .* while this trial .* trained it too"):
        adopted, hit = get_or_train_stage1(cfg, cpu)
    assert hit, "the row uses the published training, not its own"
    assert adopted.record["writer"] == first.record["writer"]
    assert adopted.path.is_relative_to(tmp_path / "node-b")  # the local cache holds the published copy
    assert json.loads((adopted.path / "record.json").read_text())["writer"] == first.record["writer"]
    assert torch.equal(adopted.splits["test"].logits, first.splits["test"].logits)
    # The published record is untouched and node B's uploads are gone again.
    assert storage.read_bytes(storage.join(cfg.artifact_root, "stage1", first.stage1_id, "record.json")) == record
    listing = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="artifacts/")
    writers = {o["Key"].split("/")[3] for o in listing["Contents"] if o["Key"].count("/") == 4}
    assert writers == {first.record["writer"]}


def test_publish_never_replaces_a_record(s3, make_config, tmp_path, monkeypatch):
    bucket, _ = s3
    cfg = parse_trial_config({**make_config(method={"name": "vanilla"}), "artifact_root": f"s3://{bucket}/artifacts"})
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-a"))
    first, _ = get_or_train_stage1(cfg, torch.device("cpu"))
    remote = storage.join(cfg.artifact_root, "stage1", first.stage1_id)
    assert publish(first.path, remote) is None or True  # republishing one's own: the record is there already
    other = first.path.parent / "other"
    other.mkdir()
    for name in ("model.pt", "cache.pt"):
        (other / name).write_bytes((first.path / name).read_bytes())
    (other / "record.json").write_text(json.dumps({**first.record, "writer": "node-b-9-deadbeef"}))
    assert publish(other, remote) == first.record["writer"]
    assert json.loads(storage.read_bytes(storage.join(remote, "record.json")))["writer"] == first.record["writer"]
    assert not storage.exists(storage.join(remote, "node-b-9-deadbeef", "model.pt"))


def test_on_a_shared_directory_the_first_artifact_in_place_wins(make_config, tmp_path, monkeypatch):
    import shutil

    other_node = parse_trial_config(make_config(method={"name": "vanilla"}))
    landed, _ = get_or_train_stage1(other_node, torch.device("cpu"))
    cfg = parse_trial_config({**make_config(method={"name": "vanilla"}), "artifact_root": str(tmp_path / "shared")})
    real_train = stage1_module.train_stage1

    def train_while_another_node_lands(cfg_, *args, **kwargs):  # its artifact lands in place while this one trains
        trained = real_train(cfg_, *args, **kwargs)
        shutil.copytree(landed.path, Path(cfg.artifact_root) / "stage1" / landed.stage1_id)
        return trained

    monkeypatch.setattr(stage1_module, "train_stage1", train_while_another_node_lands)
    with pytest.warns(UserWarning, match="discarded this copy and adopted the published one"):
        adopted, hit = get_or_train_stage1(cfg, torch.device("cpu"))
    assert hit and adopted.record["writer"] == landed.record["writer"]
    assert sorted(p.name for p in (tmp_path / "shared" / "stage1").iterdir()) == [
        landed.stage1_id, f"{landed.stage1_id}.claim.lock", f"{landed.stage1_id}.lock"], \
        "the discarded copy and the claim leave nothing behind but their lock files"


def test_a_trial_taking_over_continues_the_state_its_holder_left(make_config, tmp_path, monkeypatch):
    """The holder dies after epoch 2 of 5; the next trial resumes at epoch 3 and ends with the model an
    uninterrupted training gives."""
    monkeypatch.setenv("CALIB_STAGE1_HANDOVER_SECONDS", "0")  # share the state after every epoch
    cpu = torch.device("cpu")
    whole, _ = get_or_train_stage1(parse_trial_config({**make_config(method={"name": "vanilla"}, epochs=5),
                                                       "artifact_root": str(tmp_path / "uninterrupted")}), cpu)
    cfg = parse_trial_config(make_config(method={"name": "vanilla"}, epochs=5))

    class Died(Exception):
        pass

    def dies_after_epoch_2(state):
        if state["epoch"] == 2:
            raise Died

    with pytest.raises(Died):
        get_or_train_stage1(cfg, cpu, on_checkpoint=dies_after_epoch_2)
    handover = Path(cfg.artifact_root) / "stage1" / f"{whole.stage1_id}.handover.pt"
    assert handover.exists()
    trained_here = []
    with pytest.warns(UserWarning, match="continuing the training a previous holder left at epoch 3"):
        resumed, hit = get_or_train_stage1(cfg, cpu, on_epoch=trained_here.append)
    # stage1_resumed_from_epoch: the 0-based last epoch the state completed; the log's N counts epochs (N - 1)
    assert not hit and resumed.record["resumed_from_epoch"] == 2
    assert [row["epoch"] for row in trained_here] == [3, 4], "the taker trains from the next epoch on"
    assert not handover.exists(), "the handover state goes once the artifact is in place"
    assert torch.equal(resumed.splits["test"].logits, whole.splits["test"].logits)
    assert [r["train_loss"] for r in resumed.record["history"]] == [r["train_loss"] for r in whole.record["history"]]


def test_a_local_copy_a_dead_trial_never_published_is_published_not_trained_again(s3, make_config, tmp_path,
                                                                                  monkeypatch):
    bucket, _ = s3
    cfg = parse_trial_config({**make_config(method={"name": "vanilla"}), "artifact_root": f"s3://{bucket}/artifacts"})
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-a"))

    def dies_before_publishing(final, remote):
        raise KeyboardInterrupt  # the trial is killed between its training and the upload

    real_publish = stage1_module.publish
    monkeypatch.setattr(stage1_module, "publish", dies_before_publishing)
    with pytest.raises(KeyboardInterrupt):
        get_or_train_stage1(cfg, torch.device("cpu"))
    monkeypatch.setattr(stage1_module, "publish", real_publish)
    local = stage1_module.stage1_dir(cfg.artifact_root, config_hash(stage1_identity(cfg)))
    orphan_writer = json.loads((local / "record.json").read_text())["writer"]

    trained = []
    monkeypatch.setattr(stage1_module, "train_stage1", lambda *a, **k: trained.append(1))
    with pytest.warns(UserWarning, match=f"publishing the copy {orphan_writer} trained on this node"):
        artifact, hit = get_or_train_stage1(cfg, torch.device("cpu"))
    assert not hit and not trained, "its row is the one that trained it; nothing is trained again"
    record = storage.read_bytes(storage.join(cfg.artifact_root, "stage1", artifact.stage1_id, "record.json"))
    assert json.loads(record)["writer"] == orphan_writer == artifact.record["writer"]


def test_a_stale_local_copy_gives_way_to_the_published_training(s3, make_config, tmp_path, monkeypatch):
    import shutil

    bucket, _ = s3
    cfg = parse_trial_config({**make_config(method={"name": "vanilla"}), "artifact_root": f"s3://{bucket}/artifacts"})
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-a"))
    mine, _ = get_or_train_stage1(cfg, torch.device("cpu"))
    kept = tmp_path / "kept"
    shutil.copytree(mine.path, kept)
    # The published artifact is replaced behind this node's back (quarantined and published again).
    for key in [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]:
        boto3.client("s3").delete_object(Bucket=bucket, Key=key)
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-b"))
    theirs, _ = get_or_train_stage1(cfg, torch.device("cpu"))
    assert theirs.record["writer"] != mine.record["writer"]
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-a"))
    again, hit = get_or_train_stage1(cfg, torch.device("cpu"))
    assert hit and again.record["writer"] == theirs.record["writer"], "node A reads the published training"


def test_every_row_names_the_training_it_used(make_config, tmp_path):
    import warnings

    from calib.artifacts import ArtifactWarning
    from calib.store import read_trials, write_result
    from calib.trial import run_trial

    store = str(tmp_path / "store")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArtifactWarning)  # a plain training says nothing about claims or handovers
        for method in ({"name": "vanilla"}, {"name": "temperature_scaling"}):
            write_result(store, run_trial(make_config(method=method)))
    rows = read_trials(store)
    record = json.loads(next((tmp_path / "artifacts" / "stage1").glob("*/record.json")).read_text())
    assert sorted(rows["stage1_cache_hit"]) == [False, True]
    assert set(rows["stage1_writer"]) == {record["writer"]}


def test_the_grid_searcher_starts_dependents_after_their_trainer():
    from ray.tune.search import Searcher

    from calib.run.stage1_first import Stage1FirstSearcher

    trials = [{"configs": ["t-a"], "role": "stage1", "stage1_id": "a"},
              {"configs": ["t-b"], "role": "stage1", "stage1_id": "b"},
              {"configs": ["a1", "a2"], "role": "cached", "stage1_id": "a"},
              {"configs": ["b1"], "role": "cached", "stage1_id": "b"},
              {"configs": ["b2"], "role": "cached", "stage1_id": "b"}]
    published: set[str] = set()
    searcher = Stage1FirstSearcher(trials, published=lambda trial: trial["stage1_id"] in published)
    given = {}

    def suggest(name):
        suggestion = searcher.suggest(name)
        if isinstance(suggestion, dict):
            given[name] = suggestion["trial"]
        return suggestion

    assert suggest("1")["trial"]["configs"] == ["t-a"] and suggest("2")["trial"]["configs"] == ["t-b"]
    assert suggest("3") is None, "dependents wait while their trainers run"
    published.add("a")
    searcher.on_trial_complete("1", {})
    assert suggest("3")["trial"]["configs"] == ["a1", "a2"]
    assert suggest("4") is None
    searcher.on_trial_complete("2", error=True)  # the trainer of b failed for good: b1 trains instead
    assert suggest("4")["trial"] == {"configs": ["b1"], "role": "stage1", "stage1_id": "b"}
    assert suggest("5") is None, "b2 waits for its new trainer"
    searcher.on_trial_complete("4", {})  # ended without publishing (a population whose Stage I failed)
    assert suggest("5")["trial"]["role"] == "stage1"
    published.add("b")
    searcher.on_trial_complete("5", {})
    assert suggest("6") == Searcher.FINISHED


def test_a_trial_waiting_for_another_trial_of_its_node_says_when_the_wait_starts_and_ends(tmp_path, monkeypatch):
    from filelock import FileLock

    from calib.artifacts.waits import listening

    monkeypatch.setattr(stage1_module, "NODE_LOCK_QUIET_SECONDS", 0.1)
    final = tmp_path / "stage1" / "abc"
    final.parent.mkdir()
    taken, said = threading.Event(), []

    def other_trial() -> None:  # holds the node's lock on the Stage I for 0.6 s, as a trial training it would
        with FileLock(str(final) + ".lock"):
            taken.set()
            time.sleep(0.6)

    thread = threading.Thread(target=other_trial)
    thread.start()
    taken.wait()
    with listening(said.append), stage1_module._node_lock(final, "abc"):
        pass
    thread.join()
    assert [e.kind for e in said] == [WAITING, WAITED]
    assert said[0].message == "Stage I abc is being trained by another trial on this node; waiting for it"
    assert said[1].message.startswith("Stage I abc: the other trial on this node let it go after this trial waited")
    assert 0.3 <= said[1].seconds <= 5
    with listening(said.append), stage1_module._node_lock(final, "abc"):  # free at once: nothing to say
        pass
    assert len(said) == 2


class StoppingStudy:
    """A :class:`calib.artifacts.claim.StopWatch` as the driver's mailbox is one: the claims it was told of, and
    ``stop`` (a clean stop of the study) once the test sets it."""

    def __init__(self) -> None:
        self.stop, self.held, self.events, self.answered_stop = False, {}, [], 0

    def stopping(self) -> bool:
        self.answered_stop += self.stop
        return self.stop

    def holding(self, holder: str, location: str) -> None:
        self.held[holder] = location
        self.events.append("holding")

    def let_go(self, holder: str) -> None:
        self.held.pop(holder)
        self.events.append("let go")


def test_a_clean_stop_hands_the_training_over_then_releases_its_claim_and_the_next_run_continues_at_once(
        make_config, tmp_path, monkeypatch):
    """The study stops while epoch 2 of 5 trains: at its end the state is written (whatever its age: the
    handover is not due for 300 s) and only then the claim deleted; the next trial takes the claim without a
    wait and ends with the model an uninterrupted training gives."""
    from calib.artifacts.claim import watching_for_stop

    monkeypatch.setenv("CALIB_STAGE1_HANDOVER_SECONDS", "300")
    monkeypatch.setenv("CALIB_STAGE1_LEASE_SECONDS", "0.4")  # the claim asks the watch every 0.1 s
    cpu = torch.device("cpu")
    whole, _ = get_or_train_stage1(parse_trial_config({**make_config(method={"name": "vanilla"}, epochs=5),
                                                       "artifact_root": str(tmp_path / "uninterrupted")}), cpu)
    cfg = parse_trial_config(make_config(method={"name": "vanilla"}, epochs=5))
    claim_file = Path(claim_location(cfg.artifact_root, whole.stage1_id))
    handover = Path(cfg.artifact_root) / "stage1" / f"{whole.stage1_id}.handover.pt"
    study = StoppingStudy()

    class EndedByTune(Exception):
        pass

    def stop_during_epoch_2(row):
        if row["epoch"] == 1:
            assert claim_file.exists() and not handover.exists()  # training, nothing handed over yet
            study.stop = True
            deadline = time.monotonic() + 30
            while not study.answered_stop and time.monotonic() < deadline:  # the claim's thread has asked
                time.sleep(0.01)
            time.sleep(0.3)  # ...and marked the stop (the next statement of that thread), three of its ticks ago

    def ended_by_tune(state):  # Tune ends the trial once it has handed over
        if state["epoch"] == 1:
            assert handover.exists() and not claim_file.exists() and study.events == ["holding", "let go"]
            raise EndedByTune

    with watching_for_stop(study), pytest.raises(EndedByTune):
        get_or_train_stage1(cfg, cpu, on_epoch=stop_during_epoch_2, on_checkpoint=ended_by_tune)
    assert torch.load(handover, weights_only=False)["epoch"] == 1 and study.held == {}
    said: list[Stage1Event] = []
    monkeypatch.setattr(stage1_module, "tell", said.append)
    resumed, hit = get_or_train_stage1(cfg, cpu)
    assert not hit and resumed.record["resumed_from_epoch"] == 1
    assert [e.kind for e in said if e.kind in (WAITING, WAITED)] == [], "the claim was free: no wait"
    assert torch.equal(resumed.splits["test"].logits, whole.splits["test"].logits)


def test_a_stopped_driver_deletes_only_the_claims_its_own_trials_still_hold(root):
    from calib.artifacts.claim import release_if_held_by

    mine = acquire(root, "abc", never_published, "node-a-1", FAST, print)
    theirs = acquire(root, "def", never_published, "node-b-2", FAST, print)
    mine._stop.set()  # Tune ended the trial: it renews no more
    assert release_if_held_by(claim_location(root, "abc"), "node-a-1")
    assert storage.read_versioned(claim_location(root, "abc")) is None
    assert not release_if_held_by(claim_location(root, "def"), "node-a-1"), "another holder's claim stays"
    assert not release_if_held_by(claim_location(root, "abc"), "node-a-1"), "gone: nothing to delete"
    assert json.loads(storage.read_versioned(claim_location(root, "def"))[0])["holder"] == "node-b-2"
    theirs.release()
