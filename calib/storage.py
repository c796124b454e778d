"""Where the result store and the Stage-I artifacts live: a local directory or an object-store URI.

A location is a plain string: an absolute local path, or a URI that pyarrow's file systems open
(``s3://bucket/prefix``; credentials, region and ``AWS_ENDPOINT_URL`` come from the usual AWS
environment). Local writes go to a temporary name and are renamed into place; an object-store PUT is
atomic by itself, so remote files are written under their final name.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pyarrow.fs as pafs

__all__ = [
    "check_writable", "download", "exists", "filesystem", "is_remote", "join", "list_files", "move", "normalize",
    "read_bytes", "upload",
]


def is_remote(location: str | os.PathLike) -> bool:
    """True for a URI with a scheme other than ``file://`` (``s3://...``)."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def normalize(location: str | os.PathLike) -> str:
    """A remote URI without its trailing slash, or the absolute form of a local path."""
    text = str(location)
    if is_remote(text):
        return text.rstrip("/")
    return str(Path(text.removeprefix("file://")).expanduser().resolve())


def join(location: str, *parts: str) -> str:
    """``location/part/...`` for URIs and paths alike."""
    return "/".join([location.rstrip("/"), *parts])


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system of ``location`` and the path inside it."""
    if is_remote(location):
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), normalize(location)


def exists(location: str) -> bool:
    """Whether a file or directory exists at ``location``."""
    fs, path = filesystem(location)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def upload(local: Path, location: str) -> None:
    """Copy the local file ``local`` to the remote ``location`` (one atomic PUT)."""
    fs, path = filesystem(location)
    with open(local, "rb") as source, fs.open_output_stream(path) as target:
        shutil.copyfileobj(source, target, length=16 << 20)


def download(location: str, local: Path) -> None:
    """Copy the remote file ``location`` to ``local``, through a temporary name in the same directory."""
    fs, path = filesystem(location)
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex}.tmp")
    try:
        with fs.open_input_stream(path) as source, open(tmp, "wb") as target:
            shutil.copyfileobj(source, target, length=16 << 20)
        os.replace(tmp, local)
    finally:
        tmp.unlink(missing_ok=True)


def check_writable(location: str) -> None:
    """Raise ``ConfigError`` unless files can be written under ``location``; leaves nothing behind.

    Locally a probe file is written (creating missing directories) and removed with the directories it
    created; remotely a probe object is put and deleted.
    """
    from calib._config import ConfigError

    probe_name = f".calib-write-probe-{uuid.uuid4().hex}"
    try:
        if is_remote(location):
            fs, path = filesystem(location)
            with fs.open_output_stream(f"{path}/{probe_name}") as out:
                out.write(b"probe")
            fs.delete_file(f"{path}/{probe_name}")
            return
        root = Path(normalize(location))
        created = [p for p in (root, *root.parents) if not p.exists()]
        try:
            root.mkdir(parents=True, exist_ok=True)
            (root / probe_name).write_bytes(b"probe")
            (root / probe_name).unlink()
        finally:
            for directory in created:  # deepest first
                if directory.exists():
                    directory.rmdir()
    except OSError as err:
        raise ConfigError(
            f"The result store {location} is not writable ({err.strerror or err}). Pass --store a directory "
            f"you can write to (it is created if missing), or an s3:// URI your credentials can write."
        ) from None


def read_bytes(location: str) -> bytes:
    """The contents of the file at ``location``; ``FileNotFoundError`` if there is none."""
    fs, path = filesystem(location)
    with fs.open_input_stream(path) as source:
        return source.read()


def list_files(location: str) -> list[str]:
    """The files under the directory ``location``, recursively, as sorted paths relative to it ([] if none)."""
    fs, path = filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(info.path[len(path) + 1:] for info in infos if info.type == pafs.FileType.File)


def move(source: str, target: str) -> None:
    """Move one file to ``target`` on the same file system (an object store copies it, then deletes the source)."""
    fs, source_path = filesystem(source)
    _, target_path = filesystem(target)
    if not is_remote(source):
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
    fs.move(source_path, target_path)
