"""Where checkpoints live: a local directory or ``s3://bucket/prefix`` (boto3, honours ``AWS_ENDPOINT_URL``).

Both give whole-object writes: a local file appears by ``os.replace`` of a synced temp file, an S3
object by a single PUT. Both also give conditional writes, which the writer lease needs to be
mutual exclusion: ``put_if(name, data, etag=None)`` creates only what does not exist, with an etag
it replaces only the version of that etag, and ``delete_if`` deletes only that version. S3 does
it with ``If-None-Match: *`` and ``If-Match`` (PutObject, DeleteObject; a 412 is a Conflict), a
directory with ``os.link`` of a temp file (fails if the name exists) and, for compare-and-swap, a
``flock`` on the directory held while the current version is compared and replaced (mutual exclusion
among the processes that share the filesystem's locks). Every failure a backend can raise is a
StorageError; S3 calls are retried with exponential backoff on network and 5xx errors.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import urlparse

T = TypeVar("T")
MULTIPART_THRESHOLD = 8 * 2**20  # boto3's default
READ_CHUNK = 2**20  # what read_at copies at a time: all it holds besides its target



@contextmanager
def folder_locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on ``folder`` itself for the block, across processes; no lock file is left behind."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

class StorageError(Exception):
    """A storage call failed for good, as one line."""


class MissingObject(StorageError):
    """The named object does not exist."""


class NotAnObject(StorageError):
    """A folder stands where an object is expected."""


class Conflict(StorageError):
    """A conditional write or delete found another version than the one it names (or any, for a create)."""


class Storage(Protocol):
    uri: str

    def check(self) -> None: ...
    def put(self, name: str, data: bytes) -> None: ...
    def get(self, name: str) -> bytes: ...
    def names(self) -> list[str]: ...
    def delete(self, name: str) -> None: ...
    def read(self, name: str) -> tuple[bytes, str]: ...
    def put_if(self, name: str, data: bytes, etag: str | None) -> str: ...
    def delete_if(self, name: str, etag: str) -> None: ...
    def folder(self, name: str) -> dict[str, int]: ...
    def delete_folder(self, name: str) -> None: ...


def _plain(name: str) -> str:
    """Names are one path component: a manifest naming ``../x`` must not read outside the prefix."""
    if not name or "/" in name or name in (".", ".."):
        raise StorageError(f"{name!r} is not an object name")
    return name


class LocalStorage:
    """A directory; writes go to a temp file in it, fsync, then ``os.replace`` (or ``os.link`` to create)."""

    def __init__(self, root: Path):
        self.root = root
        self.uri = str(root)

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StorageError(f"checkpoint dir {self.root}: {error.strerror}") from None
        if not os.access(self.root, os.W_OK):
            raise StorageError(f"checkpoint dir {self.root}: not writable")

    def put(self, name: str, data: bytes) -> None:
        """Atomic and durable; a full disk or a folder gone unwritable is a StorageError, reported like S3's."""
        with self._errors("put", name):
            self._write(name, data, lambda temp, target: os.replace(temp, target))

    def get(self, name: str) -> bytes:
        with self._errors("get", name):
            return (self.root / _plain(name)).read_bytes()

    def read(self, name: str) -> tuple[bytes, str]:
        data = self.get(name)
        return data, hashlib.sha256(data).hexdigest()

    def put_if(self, name: str, data: bytes, etag: str | None) -> str:
        with self._errors("put", name), self._locked(name):
            if etag is None:
                self._write(name, data, _link_new)
            else:
                self._check_version(name, etag)
                self._write(name, data, lambda temp, target: os.replace(temp, target))
        return hashlib.sha256(data).hexdigest()

    def delete_if(self, name: str, etag: str) -> None:
        with self._errors("delete", name), self._locked(name):
            self._check_version(name, etag)
            (self.root / name).unlink()

    def names(self) -> list[str]:
        with self._errors("list", ""):
            if not self.root.is_dir():
                return []
            return sorted(path.name for path in self.root.iterdir()
                          if not path.name.startswith(".") and path.is_file())

    def delete(self, name: str) -> None:
        with self._errors("delete", name):
            (self.root / _plain(name)).unlink(missing_ok=True)

    def folder(self, name: str) -> dict[str, int]:
        """The size of every file in the folder ``name`` (a sharded checkpoint's files), by file name."""
        with self._errors("list", name):
            folder = self.root / _plain(name)
            if not folder.is_dir():
                return {}
            return {path.name: path.stat().st_size for path in folder.iterdir() if path.is_file()}

    def delete_folder(self, name: str) -> None:
        """The folder ``name`` and the files in it (never a folder inside it: a checkpoint's files are flat)."""
        with self._errors("delete", name):
            folder = self.root / _plain(name)
            for file in self.folder(name):
                (folder / file).unlink(missing_ok=True)
            if folder.is_dir():
                folder.rmdir()

    @contextmanager
    def _errors(self, what: str, name: str) -> Iterator[None]:
        """Every OSError as one line: a missing object, a folder where an object should be, a full disk."""
        try:
            yield
        except FileNotFoundError:
            raise MissingObject(f"{self.root / name}: missing") from None
        except (IsADirectoryError, NotADirectoryError):
            raise NotAnObject(f"{self.root / name}: a folder, not a file: remove it") from None
        except OSError as error:
            raise StorageError(f"checkpoint dir {self.root}: {what} {name}: {error.strerror or error}") from None

    @contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """The directory locked while ``name`` is compared and replaced."""
        _plain(name)
        self.root.mkdir(parents=True, exist_ok=True)
        with folder_locked(self.root):
            yield

    def _check_version(self, name: str, etag: str) -> None:
        try:
            current = hashlib.sha256((self.root / name).read_bytes()).hexdigest()
        except FileNotFoundError:
            raise Conflict(f"{self.root / name}: gone (expected version {etag[:12]})") from None
        if current != etag:
            raise Conflict(f"{self.root / name}: replaced by another writer")

    def _write(self, name: str, data: bytes, place: Callable[[str, Path], None]) -> None:
        """The first write makes the folder, as an S3 prefix needs none."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=self.root, prefix=f".{_plain(name)}.")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            place(temp, self.root / name)
        finally:
            Path(temp).unlink(missing_ok=True)
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _link_new(temp: str, target: Path) -> None:
    """Create ``target`` with the temp file's content only if it does not exist (link(2) fails with EEXIST)."""
    try:
        os.link(temp, target)
    except FileExistsError:
        raise Conflict(f"{target}: exists") from None
    except OSError as error:
        if error.errno == errno.EISDIR:
            raise Conflict(f"{target}: a folder") from None
        raise


class S3Storage:
    """Objects under ``s3://bucket/prefix/``; each call retried with backoff.

    ``user_agent`` is appended to every request's User-Agent (``gpuyard-rank/N``), so server access
    logs, CloudTrail and a test's proxy can tell the ranks apart.
    """

    def __init__(self, bucket: str, prefix: str, attempts: int = 6, base_delay: float = 0.25,
                 user_agent: str | None = None):
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.attempts, self.base_delay = attempts, base_delay
        # read_timeout is boto3's 60 s: completing a multipart upload of a large checkpoint takes S3 (and moto) a while
        config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=60,
                        user_agent_extra=user_agent)
        try:
            self._s3 = boto3.client("s3", config=config)
        except ValueError as error:  # botocore's "Invalid endpoint: ..." for a malformed AWS_ENDPOINT_URL
            variable = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
            raise StorageError(f"{variable}: {error} (an http:// or https:// URL)") from None

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _retry(self, what: str, call: Callable[[int], T], attempts: int | None = None) -> T:
        """``call(attempt)`` until it succeeds; network errors, 5xx, throttling and 409 conflicts are retried."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        attempts, attempt = attempts or self.attempts, 1
        while True:
            try:
                return call(attempt)
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code", "")
                status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if code in ("NoSuchKey", "404"):
                    raise MissingObject(f"{self.uri}: {what}: missing") from None
                if code == "PreconditionFailed" or status == 412:
                    raise Conflict(f"{self.uri}: {what}: another version is there") from None
                # 409 ConditionalRequestConflict: a concurrent write of the same key; S3 asks to retry
                if status < 500 and status != 409 and code not in ("SlowDown", "Throttling", "RequestTimeout"):
                    raise StorageError(f"{self.uri}: {what}: {code or status}") from None
                failure = code or str(status)
            except (BotoCoreError, S3UploadFailedError, OSError) as error:
                failure = str(error) or type(error).__name__
            if attempt >= attempts:
                raise StorageError(f"{self.uri}: {what} failed after {attempts} attempts: {failure}")
            time.sleep(min(self.base_delay * 2 ** (attempt - 1), 4.0))
            attempt += 1

    def check(self) -> None:
        try:
            self._retry("head bucket", lambda _: self._s3.head_bucket(Bucket=self.bucket), attempts=2)
        except MissingObject:
            raise StorageError(f"{self.uri}: bucket {self.bucket!r} not found") from None

    def put(self, name: str, data: bytes) -> None:
        """One PUT, or a parallel multipart upload for large data (boto3's managed transfer)."""
        def upload(_: int) -> None:
            if len(data) < MULTIPART_THRESHOLD:
                self._s3.put_object(Bucket=self.bucket, Key=self._key(_plain(name)), Body=data)
            else:
                self._s3.upload_fileobj(io.BytesIO(data), self.bucket, self._key(_plain(name)))
        self._retry(f"put {name}", upload)

    def get(self, name: str) -> bytes:
        return self.read(name)[0]

    def read(self, name: str) -> tuple[bytes, str]:
        def get(_: int) -> tuple[bytes, str]:
            response = self._s3.get_object(Bucket=self.bucket, Key=self._key(_plain(name)))
            return response["Body"].read(), response["ETag"]
        return self._retry(f"get {name}", get)

    def read_into(self, folder: str, name: str, start: int, into: memoryview) -> None:
        """Bytes ``start`` to ``start + len(into)`` of the file ``name`` in the folder ``folder`` (a sharded
        checkpoint's) into ``into``; StorageError if the file ends before."""
        if (count := self.read_at(folder, name, start, into)) != len(into):
            raise StorageError(f"{self.uri}: get {folder}/{name} bytes {start}-{start + len(into) - 1}: "
                               f"the file ends after {count}")

    def read_at(self, folder: str, name: str, start: int, into: memoryview) -> int:
        """Up to ``len(into)`` bytes of the file ``name`` in the folder ``folder`` from ``start`` into ``into``, and
        how many: fewer only where the file ends (0 from its end on). One ranged GET, its body copied as it comes,
        retried whole (a connection dropped mid-body too)."""
        from botocore.exceptions import ClientError

        end, key = start + len(into) - 1, self._key(f"{_plain(folder)}/{_plain(name)}")

        def get(_: int) -> int:
            try:
                response = self._s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end}")
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") == "InvalidRange":  # 416: start is past the end
                    return 0
                raise
            expected, done = response["ContentLength"], 0  # its body is that long, or botocore raises
            if expected > len(into):
                raise StorageError(f"{self.uri}: get {folder}/{name} bytes {start}-{end}: {expected} bytes came")
            body = response["Body"]
            with body:  # not ``as``: a StreamingBody enters as its raw urllib3 response
                for chunk in body.iter_chunks(READ_CHUNK):
                    into[done:done + len(chunk)] = chunk
                    done += len(chunk)
            return done
        return self._retry(f"get {folder}/{name} bytes {start}-{end}", get)

    def put_if(self, name: str, data: bytes, etag: str | None) -> str:
        """A conditional PUT. A retry after a lost response finds its own write there (412): that is success."""
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}

        def put(attempt: int) -> str:
            try:
                return self._s3.put_object(Bucket=self.bucket, Key=self._key(_plain(name)), Body=data,
                                           **condition)["ETag"]
            except Exception as error:
                if attempt == 1 or _status(error) != 412:
                    raise
                current, current_etag = self.read(name)
                if current != data:
                    raise
                return current_etag
        return self._retry(f"put {name} if {'absent' if etag is None else 'unchanged'}", put)

    def delete_if(self, name: str, etag: str) -> None:
        self._retry(f"delete {name} if unchanged",
                    lambda _: self._s3.delete_object(Bucket=self.bucket, Key=self._key(_plain(name)), IfMatch=etag))

    def names(self) -> list[str]:
        def list_all(_: int) -> list[str]:
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(""))
            start = len(self._key(""))
            return sorted(item["Key"][start:] for page in pages for item in page.get("Contents", []))
        return self._retry("list", list_all)

    def delete(self, name: str) -> None:
        self._retry(f"delete {name}", lambda _: self._s3.delete_object(Bucket=self.bucket, Key=self._key(_plain(name))))

    def folder(self, name: str) -> dict[str, int]:
        """The size of every object under ``name/``, by the rest of its key."""
        start = len(self._key(f"{_plain(name)}/"))

        def list_all(_: int) -> dict[str, int]:
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(f"{name}/"))
            return {item["Key"][start:]: item["Size"] for page in pages for item in page.get("Contents", [])}
        return self._retry(f"list {name}/", list_all)

    def delete_folder(self, name: str) -> None:
        for file in self.folder(name):
            self._retry(f"delete {name}/{file}",
                        lambda _, key=self._key(f"{name}/{file}"): self._s3.delete_object(Bucket=self.bucket, Key=key))


def _status(error: Exception) -> int:
    response = getattr(error, "response", None) or {}
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)


def open_storage(uri: str, user_agent: str | None = None) -> Storage:
    """A local path (or ``file://``) or ``s3://bucket/prefix``; other schemes are a StorageError."""
    if not uri.strip():
        raise StorageError("--checkpoint-uri is empty: leave it out to train without checkpoints")
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"checkpoint URI {uri!r} has no bucket: use s3://bucket/prefix")
        return S3Storage(parsed.netloc, parsed.path, user_agent=user_agent)
    if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
        raise StorageError(f"checkpoint URI {uri!r} names host {parsed.netloc!r}: use file:///path (this machine)")
    if parsed.scheme in ("", "file"):
        return LocalStorage(Path(parsed.path if parsed.scheme else uri))
    raise StorageError(f"checkpoint URI {uri!r}: unsupported scheme {parsed.scheme!r} (use a path or s3://bucket/prefix)")
