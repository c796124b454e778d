"""Publishing a Stage I to an object store and fetching it from there, first writer wins.

A writer uploads its files under ``<root>/stage1/<id>/<writer>/`` and then creates ``record.json``
only if there is none (a conditional PUT): the first record is never replaced, so every node reads the
same training. A writer that finds a record already there deletes its own uploads and adopts the
published artifact. Nodes that find ``record.json`` download the files of the writer it names, so a
reader never mixes the weights of one training with the features of another.

A download that fails its check is discarded and downloaded once more; if that copy fails too, the
published files are bad: they are moved to the bucket's ``quarantine/`` and the artifact is trained
and published again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path

from calib import storage
from calib.artifacts.artifact import ARTIFACT_FILES, Stage1Artifact, load_artifact
from calib.artifacts.checks import (
    CorruptArtifactError,
    parse_record,
    quarantine_remote,
    record_writer,
    say,
)

__all__ = ["fetch_checked", "publish"]


def fetch(remote: str, final: Path, record_text: bytes) -> None:
    """Download the published artifact whose ``record.json`` reads ``record_text`` (as read already) and the
    files of the writer it names into ``final``, via a temporary directory and a rename."""
    writer = record_writer(parse_record(record_text))
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex}"
    try:
        tmp.mkdir()
        (tmp / "record.json").write_bytes(record_text)
        for name in ARTIFACT_FILES:
            try:
                storage.download(storage.join(remote, writer, name), tmp / name)
            except FileNotFoundError:
                raise CorruptArtifactError(f"the writer's {name} is missing") from None
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch_checked(remote: str, final: Path, stage1_id: str) -> Stage1Artifact | None:
    """The published artifact, downloaded into ``final`` and checked; None if none is published.

    A bad download is discarded and downloaded once more; if it fails again, the published record and
    writer's files are quarantined (unless another node replaced the record meanwhile) and None returned.
    """
    record_location = storage.join(remote, "record.json")
    problem, seen = "", b""
    for attempt in (1, 2):
        try:
            seen = storage.read_bytes(record_location)
        except FileNotFoundError:
            return None
        try:
            fetch(remote, final, seen)
            return load_artifact(final, stage1_id, remote)
        except CorruptArtifactError as err:
            problem = str(err)
            shutil.rmtree(final, ignore_errors=True)
            if attempt == 1:
                say(f"downloaded copy of {remote} failed its check ({problem}); discarded it, downloading again")
    with contextlib.suppress(FileNotFoundError):
        if storage.read_bytes(record_location) == seen:
            quarantine_remote(remote, published_files(remote, seen), f"Stage-I artifact {remote}", problem)
    return None


def published_files(remote: str, record_text: bytes) -> list[str]:
    """``record.json`` and the files of the writer it names, relative to ``remote``."""
    try:
        writer = record_writer(parse_record(record_text))
    except CorruptArtifactError:
        return ["record.json"]
    return ["record.json", *(f"{writer}/{name}" for name in storage.list_files(storage.join(remote, writer)))]


def publish(final: Path, remote: str) -> str | None:
    """Upload a local artifact: the writer's files first, then ``record.json`` unless one exists.

    Returns None when this artifact is now the published one, else the writer of the record that was
    there first (this writer's uploads are deleted again)."""
    record_text = (final / "record.json").read_bytes()
    writer = record_writer(parse_record(record_text))
    for name in ARTIFACT_FILES:
        storage.upload(final / name, storage.join(remote, writer, name))
    if storage.create_exclusive(storage.join(remote, "record.json"), record_text) is not None:
        return None
    for name in ARTIFACT_FILES:
        storage.delete(storage.join(remote, writer, name))
    try:
        return record_writer(parse_record(storage.read_bytes(storage.join(remote, "record.json"))))
    except (FileNotFoundError, CorruptArtifactError):
        return "another writer"
