"""The lease both a Stage-I claim and a store compaction hold (calib._lease): one holder at a time, first
writer wins, renewal and release only while the lease is still the holder's, takeover by the caller's rule
or at once from a dead process of this host. The claims' and compactions' own rules: test_stage1_claims.py,
test_compaction.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from calib._lease import HeldLease, OtherHolder, holder_identity, lease_record, lease_seconds_of, try_take


def never(other: OtherHolder) -> bool:
    return False


def always(other: OtherHolder) -> bool:
    return True


def body_of(name: str):
    return lambda other: lease_record(30.0, name=name, took_over_from=None if other is None else other.record["name"])


def test_the_first_writer_holds_it_and_the_others_see_its_record(tmp_path: Path):
    location = str(tmp_path / "lease.json")
    first = try_take(location, body_of("a"), never)
    assert isinstance(first, HeldLease) and first.took_over is None
    second = try_take(location, body_of("b"), never)
    assert isinstance(second, OtherHolder) and second.token == first.token
    assert second.record == {"name": "a", "took_over_from": None, **holder_identity(), "lease_seconds": 30.0}
    assert first.renew(lease_record(30.0, name="a", renewals=1))
    assert json.loads(Path(location).read_bytes())["renewals"] == 1
    first.release()
    assert not Path(location).exists()


def test_a_taken_over_lease_is_no_longer_its_old_holders(tmp_path: Path):
    location = str(tmp_path / "lease.json")
    old = try_take(location, body_of("a"), never)
    assert isinstance(old, HeldLease)
    taker = try_take(location, body_of("b"), always)
    assert isinstance(taker, HeldLease) and taker.took_over is not None and taker.took_over.record["name"] == "a"
    assert json.loads(Path(location).read_bytes())["took_over_from"] == "a"
    assert not old.renew(lease_record(30.0, name="a")), "the old holder notices"
    old.release()
    assert json.loads(Path(location).read_bytes())["name"] == "b", "and deletes nothing"
    taker.release()
    assert not Path(location).exists()


def test_a_dead_holder_on_this_host_is_taken_over_whatever_the_callers_rule(tmp_path: Path):
    location = tmp_path / "lease.json"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    location.write_text(json.dumps({**holder_identity(), "pid": int(dead.stdout), "name": "gone"}))
    taken = try_take(str(location), body_of("b"), never)
    assert isinstance(taken, HeldLease) and taken.took_over is not None and taken.took_over.record["name"] == "gone"


def test_an_unreadable_record_is_empty_and_a_longer_lease_of_its_holder_counts(tmp_path: Path):
    location = tmp_path / "lease.json"
    location.write_text("not json")
    other = try_take(str(location), body_of("b"), never)
    assert isinstance(other, OtherHolder) and other.record == {}
    assert lease_seconds_of({}, 60.0) == 60.0
    assert lease_seconds_of({"lease_seconds": 600}, 60.0) == 600.0
    assert lease_seconds_of({"lease_seconds": 6}, 60.0) == 60.0
