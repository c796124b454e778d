"""Checks on artifact files: checksums, records, sidecars, and the quarantine where failed files go.

Every file is checked before it is used, its size and then its SHA-256 (one chunked pass, about 1 s
per GB) against the record or its sidecar; a file written before checksums existed (no "files" in its
record, no sidecar) is checked by loading it. What fails is moved to ``quarantine/<stage1_id>-<UTC
time>/`` (never deleted), and an :class:`ArtifactWarning` and the same line on stderr say what was
wrong and where it went.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch

from calib import storage

__all__ = [
    "ArtifactWarning", "CorruptArtifactError", "file_checksum", "load_checked", "parse_record", "quarantine_local",
    "quarantine_remote", "read_record", "read_sidecar", "record_writer", "recorded_checksum", "say", "sidecar",
    "torch_load", "verify_file", "write_sidecar",
]


class ArtifactWarning(UserWarning):
    """An artifact file failed its check and was moved aside (or a bad download discarded) to be rebuilt."""


class CorruptArtifactError(RuntimeError):
    """An artifact file is missing, has the wrong size or SHA-256, or does not load."""


def file_checksum(path: Path) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex digest}`` of a file, hashed in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return {"bytes": size, "sha256": digest.hexdigest()}


def verify_file(path: Path, expected: dict[str, Any] | None) -> None:
    """Raise ``CorruptArtifactError`` unless ``path`` exists and, when ``expected`` is given, has its size
    (checked first, cheaply) and SHA-256."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptArtifactError(f"{path.name} is missing") from None
    if expected is None:
        return
    if size != expected["bytes"]:
        raise CorruptArtifactError(f"{path.name} has {size} bytes, its checksum says {expected['bytes']}")
    if file_checksum(path)["sha256"] != expected["sha256"]:
        raise CorruptArtifactError(f"{path.name} does not match its SHA-256 ({size} bytes as recorded)")


def torch_load(path: Path) -> Any:
    """``torch.load`` onto the CPU; a file that does not load raises ``CorruptArtifactError``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        detail = (str(err).strip().splitlines() or [""])[0]
        raise CorruptArtifactError(f"{path.name} does not load ({type(err).__name__}: {detail})") from err


def load_checked(path: Path, expected: dict[str, Any] | None) -> Any:
    """The contents of ``path`` after its check: size and SHA-256 when ``expected`` is given, loading always."""
    verify_file(path, expected)
    return torch_load(path)


def parse_record(text: str | bytes) -> dict[str, Any]:
    """A ``record.json``'s contents; ``CorruptArtifactError`` unless it is a JSON object."""
    try:
        record = json.loads(text)
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise CorruptArtifactError(f"record.json is not valid JSON ({err})") from None
    if not isinstance(record, dict):
        raise CorruptArtifactError("record.json is not a JSON object")
    return record


def read_record(path: Path) -> dict[str, Any]:
    """The record of the artifact directory ``path`` (``CorruptArtifactError`` if missing or unreadable)."""
    try:
        return parse_record((path / "record.json").read_bytes())
    except FileNotFoundError:
        raise CorruptArtifactError("record.json is missing") from None


def recorded_checksum(record: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The checksum the record holds for ``name``; None for records written before checksums."""
    return record.get("files", {}).get(name)


def record_writer(record: dict[str, Any]) -> str:
    """The writer a published record names (``CorruptArtifactError`` if it names none)."""
    if not isinstance(record.get("writer"), str):
        raise CorruptArtifactError("record.json names no writer")
    return record["writer"]


def sidecar(path: Path) -> Path:
    """The checksum sidecar of a cached split: ``ood-svhn.pt`` → ``ood-svhn.pt.json``."""
    return path.with_name(path.name + ".json")


def write_sidecar(path: Path) -> None:
    """Write the sidecar of ``path`` (already in place) through a temporary name and a rename."""
    target = sidecar(path)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(file_checksum(path)))
    os.replace(tmp, target)


def read_sidecar(path: Path) -> dict[str, Any] | None:
    """The checksum in the sidecar of ``path``; None where there is none (a split cached before checksums)."""
    try:
        checksum = json.loads(sidecar(path).read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as err:
        raise CorruptArtifactError(f"{sidecar(path).name} is not valid JSON ({err})") from None
    if not (isinstance(checksum, dict) and {"bytes", "sha256"} <= checksum.keys()):
        raise CorruptArtifactError(f"{sidecar(path).name} holds no checksum")
    return checksum


# ---------------------------------------------------------------------------------------------------
# Quarantine


def say(message: str) -> None:
    """Tell the user, with or without a result store: an ``ArtifactWarning`` and the same line on stderr."""
    warnings.warn(message, ArtifactWarning, stacklevel=3)
    print(f"calib: {message}", file=sys.stderr, flush=True)


def quarantine_name(stage1_id: str) -> str:
    """``<stage1_id>-<UTC time to the microsecond>``: one quarantine directory per incident."""
    return f"{stage1_id}-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%S.%fZ')}"


def quarantine_local(artifact_dir: Path, problem: str, names: tuple[str, ...] | None = None) -> Path:
    """Move the artifact directory, or only its files ``names``, to ``<local root>/quarantine/<id>-<time>/``."""
    target = artifact_dir.parents[1] / "quarantine" / quarantine_name(artifact_dir.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    if names is None:
        os.rename(artifact_dir, target)
        what = f"Stage-I artifact {artifact_dir}"
    else:
        target.mkdir()
        for name in names:
            if (artifact_dir / name).exists():
                os.rename(artifact_dir / name, target / name)
        what = f"cached split {artifact_dir / names[0]}"
    say(f"{what} failed its check ({problem}); moved it to {target} and rebuilding it")
    return target


def quarantine_remote(stage1_remote: str, names: list[str], what: str, problem: str) -> None:
    """Move the published files ``names`` (relative to ``<root>/stage1/<id>``) to ``<root>/quarantine/<id>-<time>/``.

    ``what`` names them in the message; a file that another node moved meanwhile is skipped.
    """
    root, _, stage1_id = stage1_remote.rsplit("/", 2)
    target = storage.join(root, "quarantine", quarantine_name(stage1_id))
    for name in names:
        source = storage.join(stage1_remote, name)
        try:
            storage.move(source, storage.join(target, name))
        except OSError:
            if storage.exists(source):
                raise
    say(f"published {what} failed its check twice ({problem}); moved it to {target} and rebuilding it")

