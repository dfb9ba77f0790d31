"""One writer per checkpoint prefix: a lease object with its owner, a heartbeat and an expiry.

Rank 0 takes ``lease.json`` before its first write, renews it on a thread and checks it before every
write; another run that finds a live lease (its heartbeat moves, or its expiry is ahead) stops with one
line instead of overwriting the checkpoints. A lease left by a killed run is taken over once it has
expired; a run that ends or stops releases its own.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid

from jobs.workload.storage import MissingObject, Storage, StorageError

LEASE = "lease.json"
RELEASE_SECONDS = 0.5  # normally two small requests; a slow store lets the lease expire instead


class LeaseHeld(StorageError):
    """Another run writes to this prefix."""


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """The writer lease on ``storage``; ``lost`` turns true once another owner has replaced it."""

    def __init__(self, storage: Storage, seconds: float, owner: str | None = None):
        self.storage, self.seconds, self.owner = storage, seconds, owner or new_owner()
        self.lost, self.lost_message = False, ""
        self._beats = 0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lease, waiting out one that is held but not renewed; raises LeaseHeld if it is alive."""
        current = self._read()
        deadline = time.monotonic() + self.seconds
        while current and current["owner"] != self.owner and current["expires_at"] > time.time():
            if time.monotonic() > deadline:
                break  # not renewed for a whole lease period: its holder is gone, whatever the clocks say
            time.sleep(min(1.0, self.seconds / 10))
            latest = self._read()
            if latest and (latest["owner"], latest["beats"]) != (current["owner"], current["beats"]):
                raise LeaseHeld(self._held_message(latest))
            current = latest
        self._write()
        time.sleep(0.05)  # two runs starting together: the later write wins, the earlier one sees it
        self.confirm()
        self._thread = threading.Thread(target=self._heartbeat, name="lease", daemon=True)
        self._thread.start()

    def confirm(self) -> None:
        """Raise LeaseHeld (and mark the lease lost) unless this run still owns it."""
        current = self._read()
        if current is None or current["owner"] != self.owner:
            self.lost, self.lost_message = True, self._held_message(current)
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
            current = self._read()
            if current and current["owner"] == self.owner:
                self.storage.delete(LEASE)
        except StorageError:
            pass  # it expires on its own

    def _heartbeat(self) -> None:
        while not self._stopped.wait(self.seconds / 3):
            try:
                self.confirm()
                self._write()
            except LeaseHeld:
                return
            except StorageError:
                continue  # storage down: the next beat or the next save tries again

    def _read(self) -> dict | None:
        try:
            lease = json.loads(self.storage.get(LEASE))
            return {"owner": str(lease["owner"]), "beats": int(lease["beats"]),
                    "expires_at": float(lease["expires_at"])}
        except MissingObject:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # not a lease we can read: take it over

    def _write(self) -> None:
        self._beats += 1
        body = {"owner": self.owner, "beats": self._beats, "expires_at": time.time() + self.seconds}
        self.storage.put(LEASE, json.dumps(body).encode())

    def _held_message(self, holder: dict | None) -> str:
        who = holder["owner"] if holder else "nobody (it was deleted)"
        return f"{self.storage.uri}/{LEASE} is held by {who}: another run writes to this --checkpoint-uri"
