"""One writer per checkpoint prefix: a lease object with its owner, a heartbeat and an expiry.

Rank 0 takes ``lease.json`` before its first write, renews it on a thread and checks it before every
write. Every change of the lease is a conditional write (``Storage.put_if``: create only if absent,
replace or delete only the version last read), so two runs can never both believe they hold it: of
two creates or two take-overs of the same version exactly one succeeds, and a write whose response was
lost and that is retried finds its own lease there. Another run that finds a live lease (its heartbeat
moves, or its expiry is ahead) stops with one line instead of overwriting the checkpoints; a lease
left by a killed run is taken over once it has gone a whole lease period without a heartbeat; a run
that ends or stops releases its own.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from gpuyard.jobs.workload.storage import Conflict, MissingObject, NotAnObject, Storage, StorageError

LEASE = "lease.json"
RELEASE_SECONDS = 0.5  # normally two small requests; a slow store lets the lease expire instead


class LeaseHeld(StorageError):
    """Another run writes to this prefix (or the lease cannot be held), as one line."""


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Holder:
    """A lease as read: who holds it, its heartbeat count, its expiry (None when it is not a lease we can read)."""

    owner: str | None
    beats: int
    expires_at: float
    etag: str


class Lease:
    """The writer lease on ``storage``; ``lost`` turns true once another owner has replaced it."""

    def __init__(self, storage: Storage, seconds: float, owner: str | None = None):
        self.storage, self.seconds, self.owner = storage, seconds, owner or new_owner()
        self.lost, self.lost_message = False, ""
        self._beats, self._etag = 0, ""
        self._lock = threading.Lock()  # the heartbeat and a save's confirm never interleave
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lease, waiting out one that is held but not renewed; raises LeaseHeld if it is alive."""
        deadline = time.monotonic() + self.seconds
        seen: Holder | None = None
        while True:
            current = self._read()
            try:
                if current is None:
                    self._write(etag=None)
                    break
                if current.owner is None or current.owner == self.owner:
                    self._write(etag=current.etag)  # not a lease we can read, or ours: take it
                    break
                if seen and (current.owner, current.beats) != (seen.owner, seen.beats):
                    raise LeaseHeld(self._held_message(current.owner))
                if current.expires_at <= time.time() or time.monotonic() > deadline:
                    # expired, or not renewed for a whole lease period: its holder is gone, whatever the clocks say
                    self._write(etag=current.etag)
                    break
            except Conflict:
                seen = None  # another run wrote it in between: read it again
                continue
            seen = current
            time.sleep(min(1.0, self.seconds / 10))
        self._thread = threading.Thread(target=self._heartbeat, name="lease", daemon=True)
        self._thread.start()

    def confirm(self) -> None:
        """Raise LeaseHeld (and mark the lease lost) unless this run still holds the version it wrote last."""
        with self._lock:
            current = self._read()
            if current is None or current.owner != self.owner or current.etag != self._etag:
                self.lost = True
                self.lost_message = self._held_message(current.owner if current else None)
                raise LeaseHeld(self.lost_message)

    def release(self, timeout: float = RELEASE_SECONDS) -> None:
        """Delete our lease, giving up after ``timeout`` (storage down): a stopping run must exit in its grace."""
        self._stopped.set()
        releaser = threading.Thread(target=self._delete_own, args=(time.monotonic() + timeout,), daemon=True)
        releaser.start()
        releaser.join(timeout)

    def _delete_own(self, deadline: float) -> None:
        if self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        try:
            with self._lock:
                if self._etag and not self.lost:
                    self.storage.delete_if(LEASE, self._etag)
        except StorageError:
            pass  # taken over (Conflict) or storage down: it is not ours, or it expires on its own

    def _heartbeat(self) -> None:
        while not self._stopped.wait(self.seconds / 3):
            try:
                with self._lock:
                    self._write(etag=self._etag)
            except Conflict:
                self.lost, self.lost_message = True, self._held_message(self._owner_now())
                return
            except StorageError:
                continue  # storage down: the next beat or the next save tries again

    def _owner_now(self) -> str | None:
        try:
            current = self._read()
        except StorageError:
            return None
        return current.owner if current else None

    def _read(self) -> Holder | None:
        try:
            data, etag = self.storage.read(LEASE)
        except MissingObject:
            return None
        except NotAnObject as error:
            raise LeaseHeld(f"the lease cannot be held: {error}") from None
        try:
            lease = json.loads(data)
            return Holder(str(lease["owner"]), int(lease["beats"]), float(lease["expires_at"]), etag)
        except (ValueError, KeyError, TypeError):
            return Holder(None, 0, 0.0, etag)  # not a lease we can read: take it over

    def _write(self, etag: str | None) -> None:
        body = {"owner": self.owner, "beats": self._beats + 1, "expires_at": time.time() + self.seconds}
        self._etag = self.storage.put_if(LEASE, json.dumps(body).encode(), etag)
        self._beats += 1

    def _held_message(self, holder: str | None) -> str:
        who = holder or "nobody (it was deleted)"
        return f"{self.storage.uri}/{LEASE} is held by {who}: another run writes to this --checkpoint-uri"
