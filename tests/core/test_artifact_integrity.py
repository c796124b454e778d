"""Stage-I artifacts carry checksums; a damaged one is moved to quarantine/ and rebuilt, and the trial succeeds."""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from calib.artifacts import ArtifactWarning, CorruptArtifactError, get_or_train_stage1, stage1_dir
from calib.config import config_hash, parse_trial_config, stage1_identity
from calib.datasets.corruptions import ensure_digits_c
from calib.trial import run_trial

CPU = torch.device("cpu")


def truncate(path: Path) -> None:
    """What a full disk or an interrupted copy leaves: the first half of the file."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_byte(path: Path) -> None:
    """Bit rot: one byte in the middle changed, the size unchanged."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def delete(path: Path) -> None:
    path.unlink()


def checksum(data: bytes) -> dict[str, object]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def artifact_dir(config: dict) -> Path:
    cfg = parse_trial_config(config)
    return stage1_dir(cfg.artifact_root, config_hash(stage1_identity(cfg)))


def only_quarantine_dir(config: dict) -> Path:
    """The one directory under <artifact_root>/quarantine/, named <stage1_id>-<time>."""
    found = list((Path(config["artifact_root"]) / "quarantine").iterdir())
    assert len(found) == 1, found
    assert found[0].name.startswith(artifact_dir(config).name + "-")
    return found[0]


def test_record_holds_the_checksums_of_the_files(make_config):
    config = make_config(method={"name": "vanilla"})
    get_or_train_stage1(parse_trial_config(config), CPU)
    path = artifact_dir(config)
    record = json.loads((path / "record.json").read_text())
    assert record["files"] == {name: checksum((path / name).read_bytes()) for name in ("model.pt", "cache.pt")}


@pytest.mark.parametrize(("name", "damage"), [("cache.pt", truncate), ("model.pt", flip_byte),
                                              ("record.json", truncate), ("model.pt", delete)])
def test_damaged_artifact_is_quarantined_and_retrained(make_config, capsys, name: str,
                                                       damage: Callable[[Path], None]):
    config = make_config(method={"name": "vanilla"})
    first = run_trial(config)
    path = artifact_dir(config)
    damage(path / name)
    left = {p.name: p.read_bytes() for p in path.iterdir()}

    with pytest.warns(ArtifactWarning) as caught:
        again = run_trial(config)

    assert again.status == "ok" and again.stage1_cache_hit is False
    assert again.metrics == pytest.approx(first.metrics)  # Stage I is deterministic on the CPU
    quarantined = only_quarantine_dir(config)
    assert {p.name: p.read_bytes() for p in quarantined.iterdir()} == left  # moved aside as we left it
    message = str(caught[0].message)
    assert str(path) in message and str(quarantined) in message and name in message
    assert message in capsys.readouterr().err
    assert json.loads((path / "record.json").read_text())["files"]["cache.pt"]["bytes"] > 0


def test_flipped_model_byte_still_loads_so_only_the_hash_catches_it(make_config):
    config = make_config(method={"name": "vanilla"})
    get_or_train_stage1(parse_trial_config(config), CPU)
    flip_byte(artifact_dir(config) / "model.pt")
    torch.load(artifact_dir(config) / "model.pt", weights_only=True)  # torch.load alone would not notice


@pytest.mark.parametrize(("key", "names", "file"), [("ood_datasets", ["natural-patches"], "ood-natural-patches.pt"),
                                                    ("corruptions", ["contrast"], "corruption-contrast.pt")])
def test_damaged_split_cache_is_quarantined_and_recomputed(make_config, tmp_path, capsys, key: str,
                                                           names: list[str], file: str):
    ensure_digits_c(tmp_path / "data")  # digits-C is generated
    config = {**make_config(method={"name": "vanilla"}), key: names}
    first = run_trial(config)
    cached = artifact_dir(config) / file
    sidecar = cached.with_name(file + ".json")
    assert json.loads(sidecar.read_text()) == checksum(cached.read_bytes())
    truncate(cached)
    left = cached.read_bytes()

    with pytest.warns(ArtifactWarning, match=file):
        again = run_trial(config)

    assert again.status == "ok" and again.stage1_cache_hit is True  # only the split was rebuilt
    assert again.metrics == pytest.approx(first.metrics)
    quarantined = only_quarantine_dir(config)
    assert (quarantined / file).read_bytes() == left and (quarantined / sidecar.name).exists()
    assert json.loads(sidecar.read_text()) == checksum(cached.read_bytes())
    assert str(quarantined) in capsys.readouterr().err


def test_concurrent_trials_quarantine_and_retrain_once(make_config):
    config = make_config(seed=7)
    get_or_train_stage1(parse_trial_config(config), CPU)
    truncate(artifact_dir(config) / "cache.pt")
    hits: list[bool] = []
    threads = [threading.Thread(target=lambda: hits.append(get_or_train_stage1(parse_trial_config(config), CPU)[1]))
               for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ArtifactWarning)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(hits) == [False, True, True]
    only_quarantine_dir(config)


def test_model_changed_after_loading_is_refused(make_config):
    artifact, _ = get_or_train_stage1(parse_trial_config(make_config()), CPU)
    flip_byte(artifact.path / "model.pt")
    with pytest.raises(CorruptArtifactError, match=r"model\.pt does not match its SHA-256"):
        artifact.head_state()


class TestRecordWithoutChecksums:
    """Artifacts written before checksums: no "files" in record.json, no sidecars."""

    @staticmethod
    def strip_checksums(path: Path) -> None:
        record = json.loads((path / "record.json").read_text())
        del record["files"]
        (path / "record.json").write_text(json.dumps(record, indent=1))
        for sidecar in path.glob("*.pt.json"):
            sidecar.unlink()

    def test_still_loads(self, make_config):
        config = {**make_config(method={"name": "vanilla"}), "ood_datasets": ["natural-patches"]}
        first = run_trial(config)
        self.strip_checksums(artifact_dir(config))
        with warnings.catch_warnings():
            warnings.simplefilter("error", ArtifactWarning)
            again = run_trial(config)
            artifact, hit = get_or_train_stage1(parse_trial_config(config), CPU)
            artifact.load_model()
        assert again.stage1_cache_hit and hit and again.metrics == pytest.approx(first.metrics)
        assert "files" not in json.loads((artifact.path / "record.json").read_text())  # left as it was written

    def test_unloadable_file_is_quarantined(self, make_config):
        config = make_config(method={"name": "vanilla"})
        run_trial(config)
        self.strip_checksums(artifact_dir(config))
        truncate(artifact_dir(config) / "cache.pt")
        with pytest.warns(ArtifactWarning, match="cache.pt does not load"):
            again = run_trial(config)
        assert again.status == "ok" and again.stage1_cache_hit is False
        assert "files" not in json.loads((only_quarantine_dir(config) / "record.json").read_text())
