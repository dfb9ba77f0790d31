"""Where checkpoints live: a local directory or ``s3://bucket/prefix`` (boto3, honours ``AWS_ENDPOINT_URL``).

Both give whole-object writes: a local file appears by ``os.replace`` of a synced temp file, an S3
object by a single PUT. S3 calls are retried with exponential backoff on network and 5xx errors.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import urlparse

T = TypeVar("T")
MULTIPART_THRESHOLD = 8 * 2**20  # boto3's default


class StorageError(Exception):
    """A storage call failed for good, as one line."""


class MissingObject(StorageError):
    """The named object does not exist."""


class Storage(Protocol):
    uri: str

    def check(self) -> None: ...
    def put(self, name: str, data: bytes) -> None: ...
    def get(self, name: str) -> bytes: ...
    def names(self) -> list[str]: ...
    def delete(self, name: str) -> None: ...


class LocalStorage:
    """A directory; writes go to a temp file in it, fsync, then ``os.replace``."""

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
        try:
            self._put(name, data)
        except OSError as error:
            raise StorageError(f"checkpoint dir {self.root}: put {name}: {error.strerror or error}") from None

    def _put(self, name: str, data: bytes) -> None:
        fd, temp = tempfile.mkstemp(dir=self.root, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, self.root / name)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def get(self, name: str) -> bytes:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            raise MissingObject(f"{self.root / name}: missing") from None

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(path.name for path in self.root.iterdir() if not path.name.startswith(".") and path.is_file())

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)


class S3Storage:
    """Objects under ``s3://bucket/prefix/``; each call retried with backoff."""

    def __init__(self, bucket: str, prefix: str, attempts: int = 6, base_delay: float = 0.25):
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.attempts, self.base_delay = attempts, base_delay
        # read_timeout is boto3's 60 s: completing a multipart upload of a large checkpoint takes S3 (and moto) a while
        config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=60)
        try:
            self._s3 = boto3.client("s3", config=config)
        except ValueError as error:  # botocore's "Invalid endpoint: ..." for a malformed AWS_ENDPOINT_URL
            variable = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
            raise StorageError(f"{variable}: {error} (an http:// or https:// URL)") from None

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _retry(self, what: str, call: Callable[[], T], attempts: int | None = None) -> T:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        attempts, attempt = attempts or self.attempts, 1
        while True:
            try:
                return call()
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code", "")
                status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if code in ("NoSuchKey", "404"):
                    raise MissingObject(f"{self.uri}: {what}: missing") from None
                if status < 500 and code not in ("SlowDown", "Throttling", "RequestTimeout"):
                    raise StorageError(f"{self.uri}: {what}: {code or status}") from None
                failure = code or str(status)
            except (BotoCoreError, S3UploadFailedError) as error:
                failure = str(error)
            if attempt >= attempts:
                raise StorageError(f"{self.uri}: {what} failed after {attempts} attempts: {failure}")
            time.sleep(min(self.base_delay * 2 ** (attempt - 1), 4.0))
            attempt += 1

    def check(self) -> None:
        try:
            self._retry("head bucket", lambda: self._s3.head_bucket(Bucket=self.bucket), attempts=2)
        except MissingObject:
            raise StorageError(f"{self.uri}: bucket {self.bucket!r} not found") from None

    def put(self, name: str, data: bytes) -> None:
        """One PUT, or a parallel multipart upload for large data (boto3's managed transfer)."""
        def upload() -> None:
            if len(data) < MULTIPART_THRESHOLD:
                self._s3.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
            else:
                self._s3.upload_fileobj(io.BytesIO(data), self.bucket, self._key(name))
        self._retry(f"put {name}", upload)

    def get(self, name: str) -> bytes:
        return self._retry(f"get {name}",
                           lambda: self._s3.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read())

    def names(self) -> list[str]:
        def list_all() -> list[str]:
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(""))
            start = len(self._key(""))
            return sorted(item["Key"][start:] for page in pages for item in page.get("Contents", []))
        return self._retry("list", list_all)

    def delete(self, name: str) -> None:
        self._retry(f"delete {name}", lambda: self._s3.delete_object(Bucket=self.bucket, Key=self._key(name)))


def open_storage(uri: str) -> Storage:
    """A local path (or ``file://``) or ``s3://bucket/prefix``; other schemes are a StorageError."""
    if not uri.strip():
        raise StorageError("--checkpoint-uri is empty: leave it out to train without checkpoints")
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"checkpoint URI {uri!r} has no bucket: use s3://bucket/prefix")
        return S3Storage(parsed.netloc, parsed.path)
    if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
        raise StorageError(f"checkpoint URI {uri!r} names host {parsed.netloc!r}: use file:///path (this machine)")
    if parsed.scheme in ("", "file"):
        return LocalStorage(Path(parsed.path if parsed.scheme else uri))
    raise StorageError(f"checkpoint URI {uri!r}: unsupported scheme {parsed.scheme!r} (use a path or s3://bucket/prefix)")
