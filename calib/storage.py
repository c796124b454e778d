"""Where the result store and the Stage-I artifacts live: a local directory or an object-store URI.

A location is a plain string: an absolute local path, or a URI that pyarrow's file systems open
(``s3://bucket/prefix``; credentials, region and ``AWS_ENDPOINT_URL`` come from the usual AWS
environment). Local writes go to a temporary name and are renamed into place; an object-store PUT is
atomic by itself, so remote files are written under their final name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from calib._config import ConfigError

__all__ = [
    "check_writable", "create_exclusive", "delete", "delete_if", "delete_many", "download", "exists", "filesystem",
    "is_remote", "join", "list_files", "list_names", "move", "normalize", "read_bytes", "read_versioned", "replace_if",
    "upload", "write_bytes",
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
    """Copy the local file ``local`` to the remote ``location``, which appears whole or not at all.

    On S3 through boto3's managed transfer, which aborts an interrupted multipart upload (pyarrow's
    output stream would complete it with the parts sent so far when an exception closes it).
    """
    if location.startswith("s3://"):
        bucket, key = _s3_key(location)
        _s3_client().upload_file(str(local), bucket, key)
        return
    fs, path = filesystem(location)
    with open(local, "rb") as source, fs.open_output_stream(path) as target:
        shutil.copyfileobj(source, target, length=16 << 20)


def download(location: str, local: Path) -> None:
    """Copy the remote file ``location`` to ``local``, through a temporary name in the same directory.

    The caller has decided that ``location`` is remote (:func:`is_remote`): it is not asked again here."""
    fs, path = pafs.FileSystem.from_uri(location)
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


def write_bytes(location: str, data: bytes) -> None:
    """Write ``data`` at ``location`` so that readers see the old file or the new one, never a part:
    locally through a temporary name, fsync and a rename; on an object store in one PUT."""
    if is_remote(location):
        fs, path = filesystem(location)
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    path = Path(normalize(location))
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_in_place(path, data)


def list_names(folder: str, prefix: str) -> list[tuple[str, int]]:
    """``(name, size)`` of the files directly in ``folder`` whose name starts with ``prefix``, sorted; an
    object store lists only those keys (a prefix request), not the whole folder."""
    if folder.startswith("s3://"):
        bucket, key = _s3_key(folder.rstrip("/") + "/" + prefix)
        pages = _s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key, Delimiter="/")
        return sorted((item["Key"].rpartition("/")[2], item["Size"]) for page in pages
                      for item in page.get("Contents", []))
    if is_remote(folder):
        fs, path = filesystem(folder)
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return sorted((i.base_name, i.size) for i in infos
                      if i.type == pafs.FileType.File and i.base_name.startswith(prefix))
    try:
        with os.scandir(normalize(folder)) as entries:
            return sorted((e.name, e.stat().st_size) for e in entries if e.name.startswith(prefix) and e.is_file())
    except FileNotFoundError:
        return []


def move(source: str, target: str) -> None:
    """Move one file to ``target`` on the same file system (an object store copies it, then deletes the source)."""
    fs, source_path = filesystem(source)
    _, target_path = filesystem(target)
    if not is_remote(source):
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
    fs.move(source_path, target_path)


def delete(location: str) -> None:
    """Remove the file at ``location``; nothing happens if there is none. (On S3 through boto3: pyarrow
    would leave an empty "directory" marker object behind.)"""
    if is_remote(location):
        bucket, key = _s3_key(location)
        _s3_client().delete_object(Bucket=bucket, Key=key)
        return
    Path(normalize(location)).unlink(missing_ok=True)


def delete_many(locations: list[str]) -> None:
    """Remove the files at ``locations`` (missing ones are fine): on S3 in batches of 1,000 keys per
    request."""
    remote = [loc for loc in locations if is_remote(loc)]
    for loc in locations:
        if not is_remote(loc):
            Path(normalize(loc)).unlink(missing_ok=True)
    by_bucket: dict[str, list[str]] = {}
    for loc in remote:
        bucket, key = _s3_key(loc)
        by_bucket.setdefault(bucket, []).append(key)
    for bucket, keys in by_bucket.items():
        for start in range(0, len(keys), 1000):
            answer = _s3_client().delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[start:start + 1000]], "Quiet": True})
            if answer.get("Errors"):
                error = answer["Errors"][0]
                raise OSError(f"S3 could not delete s3://{bucket}/{error['Key']}: {error.get('Message', error)}")


# ---------------------------------------------------------------------------------------------------
# Conditional writes: the atomic steps claims and first-writer-wins publishing are built on. A version
# token is the object's ETag on S3 and the SHA-256 of the contents locally, where each check-and-change
# holds a lock on a ``<file>.lock`` beside the file, and the file is replaced by a rename: a reader
# sees the old contents or the new, never no file.


def _s3_client() -> Any:
    """A boto3 S3 client (region, credentials and ``AWS_ENDPOINT_URL`` from the usual AWS environment),
    one per endpoint and credentials seen in this process."""
    try:
        # optional dependency (the `cluster` extra): only an s3:// location needs it
        import boto3
    except ImportError:
        raise ConfigError("An s3:// artifact root needs boto3 for its atomic writes: pip install boto3 "
                          "(or calib[cluster]).") from None
    key = tuple(os.environ.get(name) for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION"))
    if key not in _S3_CLIENTS:
        _S3_CLIENTS[key] = boto3.client("s3")
    return _S3_CLIENTS[key]


_S3_CLIENTS: dict[tuple, Any] = {}


def _s3_key(location: str) -> tuple[str, str]:
    if not location.startswith("s3://"):
        raise ConfigError(f"Atomic writes (Stage-I claims and publishing) need a local or shared directory or an "
                          f"s3:// URI, got {location!r}.")
    bucket, _, key = location.removeprefix("s3://").partition("/")
    return bucket, key


def _s3_refused(err: Exception) -> bool:
    """Whether a boto3 error is S3 refusing a conditional request (412, or 409 for a concurrent one)."""
    code = getattr(err, "response", {}).get("Error", {}).get("Code", "")
    return code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey")


def _s3_conditional(location: str, request: Callable[[Any, str, str], Any]) -> Any:
    """``request(client, bucket, key)``'s answer, or None when S3 refuses its condition."""
    # optional dependency (the `cluster` extra): only an s3:// location needs it
    import botocore.exceptions

    bucket, key = _s3_key(location)
    try:
        return request(_s3_client(), bucket, key)
    except botocore.exceptions.ClientError as err:
        if _s3_refused(err):
            return None
        raise


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def _guarded(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<path>.lock`` (also across hosts on a shared mount: NFS maps it to
    a POSIX lock): the local conditional writes below check and change ``path`` under it, so a file
    they manage never disappears between a check and a change."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_in_place(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and a rename (readers see old or new)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _local_version(path: Path) -> str | None:
    try:
        return _digest(path.read_bytes())
    except FileNotFoundError:
        return None


def create_exclusive(location: str, data: bytes) -> str | None:
    """Write ``data`` at ``location`` unless a file is there already, in one atomic step (under the
    file's lock locally and on a shared mount; a PUT with ``If-None-Match: *`` on S3). Its version
    token if this call created it, else None."""
    if is_remote(location):
        return _s3_conditional(location, lambda s3, bucket, key: s3.put_object(
            Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")["ETag"])
    path = Path(normalize(location))
    with _guarded(path):
        if path.exists():
            return None
        _write_in_place(path, data)
    return _digest(data)


def read_versioned(location: str) -> tuple[bytes, str] | None:
    """The contents of ``location`` and their version token, or None if there is no file."""
    if is_remote(location):
        # optional dependency (the `cluster` extra): only an s3:// location needs it
        import botocore.exceptions

        bucket, key = _s3_key(location)
        try:
            answer = _s3_client().get_object(Bucket=bucket, Key=key)
        except botocore.exceptions.ClientError as err:
            if getattr(err, "response", {}).get("Error", {}).get("Code") == "NoSuchKey":
                return None
            raise
        return answer["Body"].read(), answer["ETag"]
    try:
        data = Path(normalize(location)).read_bytes()
    except FileNotFoundError:
        return None
    return data, _digest(data)


def replace_if(location: str, data: bytes, token: str) -> str | None:
    """Replace the file at ``location`` with ``data`` only if it still holds version ``token`` (S3:
    ``If-Match``); the new token, or None if the file changed or vanished meanwhile."""
    if is_remote(location):
        return _s3_conditional(location, lambda s3, bucket, key: s3.put_object(
            Bucket=bucket, Key=key, Body=data, IfMatch=token)["ETag"])
    path = Path(normalize(location))
    with _guarded(path):
        if _local_version(path) != token:
            return None
        _write_in_place(path, data)
    return _digest(data)


def delete_if(location: str, token: str) -> bool:
    """Remove the file at ``location`` only if it still holds version ``token``; whether it did."""
    if is_remote(location):
        return _s3_conditional(location, lambda s3, bucket, key: s3.delete_object(
            Bucket=bucket, Key=key, IfMatch=token)) is not None
    path = Path(normalize(location))
    with _guarded(path):
        if _local_version(path) != token:
            return False
        path.unlink()
    return True
