"""Atomic, verified checkpoints on a Storage, written by rank 0 and read by every rank.

A checkpoint is two objects: ``ckpt-000003.pt`` (the ``torch.save`` bytes) and, written only
after it, the manifest ``ckpt-000003.json`` naming it with its size and sha256. A reader only
trusts manifests and verifies the data against them, so it never sees a partial checkpoint; a
corrupt or partial one is reported and skipped for the previous one. Pruning to the last
``keep`` deletes a manifest before its data, so no manifest ever names missing data.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from jobs.workload.storage import Storage, StorageError

Event = dict[str, Any]
DATA, MANIFEST = ".pt", ".json"


def data_name(epochs_run: int) -> str:
    return f"ckpt-{epochs_run:06d}{DATA}"


def manifest_name(epochs_run: int) -> str:
    return f"ckpt-{epochs_run:06d}{MANIFEST}"


def _epochs_of(name: str) -> int:
    return int(name.removeprefix("ckpt-").split(".")[0])


@dataclass(frozen=True)
class Checkpoint:
    epochs_run: int
    state: dict[str, Any]


class CorruptCheckpoint(Exception):
    """A manifest or its data does not check out."""


class Checkpointer:
    """Save, prune and load checkpoints on ``storage``; ``emit`` receives one event dict per outcome."""

    def __init__(self, storage: Storage, keep: int = 3, emit: Callable[[Event], None] = lambda event: None):
        self.storage, self.keep, self.emit = storage, keep, emit
        self._names: set[str] | None = None  # rank 0 is the only writer: list once, then track

    def _known_names(self) -> set[str]:
        if self._names is None:
            self._names = set(self.storage.names())
        return self._names

    def save(self, epochs_run: int, payload: bytes) -> None:
        """Write data, then manifest, then prune; a failure is reported, never raised."""
        started = time.perf_counter()
        manifest = {"epochs_run": epochs_run, "data": data_name(epochs_run), "bytes": len(payload),
                    "sha256": hashlib.sha256(payload).hexdigest()}
        try:
            self.storage.put(data_name(epochs_run), payload)
            self._known_names().add(data_name(epochs_run))
            self.storage.put(manifest_name(epochs_run), json.dumps(manifest).encode())
            self._known_names().add(manifest_name(epochs_run))
        except StorageError as error:
            self.emit({"event": "checkpoint_failed", "epoch": epochs_run, "error": str(error)})
            return
        self.emit({"event": "checkpoint", "epoch": epochs_run, "uri": f"{self.storage.uri}/{data_name(epochs_run)}",
                   "bytes": len(payload), "seconds": round(time.perf_counter() - started, 4)})
        try:
            self._prune()
        except StorageError as error:
            self.emit({"event": "prune_failed", "error": str(error)})

    def load_latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies; reports each one skipped on the way."""
        names = self.storage.names()
        self._names = set(names)
        manifests = sorted((n for n in names if n.endswith(MANIFEST)), reverse=True)
        newest_complete = _epochs_of(manifests[0]) if manifests else 0
        for partial in sorted(n for n in names if n.endswith(DATA) and n.replace(DATA, MANIFEST) not in names):
            if _epochs_of(partial) > newest_complete:
                self.emit({"event": "checkpoint_skipped", "name": partial, "reason": "no manifest (partial write)"})
        for name in manifests:
            try:
                return self._load(name)
            except (CorruptCheckpoint, StorageError) as error:
                self.emit({"event": "checkpoint_skipped", "name": name, "reason": str(error)})
        return None

    def _load(self, name: str) -> Checkpoint:
        try:
            manifest = json.loads(self.storage.get(name))
            data, size, digest, epochs_run = (manifest[key] for key in ("data", "bytes", "sha256", "epochs_run"))
        except (ValueError, KeyError, TypeError) as error:
            raise CorruptCheckpoint(f"unreadable manifest: {error!r}") from None
        payload = self.storage.get(data)
        if len(payload) != size or hashlib.sha256(payload).hexdigest() != digest:
            raise CorruptCheckpoint(f"{data}: size or sha256 differs from its manifest")
        try:
            state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        except (RuntimeError, EOFError, pickle.UnpicklingError) as error:
            raise CorruptCheckpoint(f"{data}: not a checkpoint: {error}") from None
        return Checkpoint(epochs_run, state)

    def _prune(self) -> None:
        names = self._known_names()
        manifests = sorted((n for n in names if n.endswith(MANIFEST)), reverse=True)
        if len(manifests) <= self.keep:
            return
        oldest_kept = _epochs_of(manifests[self.keep - 1])
        stale_data = sorted(n for n in names if n.endswith(DATA) and _epochs_of(n) < oldest_kept)
        for name in manifests[self.keep:] + stale_data:  # manifests first: none may name missing data
            self.storage.delete(name)
            names.discard(name)


def serialize(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


class BackgroundSaver:
    """Serializes a state at once and uploads it on a thread; one save in flight at a time."""

    def __init__(self, checkpointer: Checkpointer):
        self.checkpointer = checkpointer
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Future[None] | None = None

    def submit(self, epochs_run: int, state: dict[str, Any]) -> None:
        self.wait()
        self._pending = self._pool.submit(self.checkpointer.save, epochs_run, serialize(state))

    def wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> None:
        self.wait()
        self._pool.shutdown()
