"""Atomic, verified checkpoints on a Storage: written by rank 0, each one read whole by every rank.

A checkpoint is two objects named by the global step: ``ckpt-000000300.pt`` (the ``torch.save``
bytes) and, written only after it, the manifest ``ckpt-000000300.json`` naming it with its size,
sha256 and the run's identity (model, dataset size, seed, batch size, lr, dropout). A reader only
trusts manifests and verifies the data against them, so it never sees a partial checkpoint; a corrupt
or partial one (an unreadable manifest, one naming anything but its own data object, data that is
not what the manifest says or not a torch file, a state that does not apply) is reported and skipped
for the previous one; a checkpoint of another run's identity is an error. Objects whose names are not
exactly ours are ignored. Pruning to the last ``keep`` deletes a manifest before its data, so no
manifest ever names missing data.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gpuyard.jobs.workload.storage import Storage, StorageError

Event = dict[str, Any]
DATA, MANIFEST = ".pt", ".json"
OURS = re.compile(r"ckpt-(\d{9})\.(pt|json)")
SHA256 = re.compile(r"[0-9a-f]{64}")
PROBE, PROBE_BYTES = ".save-probe", 2**20
IDENTITY_FLAGS = {"model": "--model", "dataset_size": "--dataset-size", "seed": "--seed",
                  "batch_size": "--batch_size", "lr": "--lr", "dropout": "--dropout"}


def data_name(step: int) -> str:
    return f"ckpt-{step:09d}{DATA}"


def manifest_name(step: int) -> str:
    return f"ckpt-{step:09d}{MANIFEST}"


def step_of(name: str) -> int:
    return int(name[5:14])


def our_names(names: list[str]) -> list[str]:
    """Only checkpoint objects: ``ckpt-latest.json``, ``ckpt-000000001.json/x`` and the like are not ours."""
    return [name for name in names if OURS.fullmatch(name)]


@dataclass(frozen=True)
class Checkpoint:
    step: int
    state: dict[str, Any]
    uri: str
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return manifest_name(self.step)


class CorruptCheckpoint(Exception):
    """A manifest or its data does not check out, as one line."""


class IdentityMismatch(Exception):
    """The checkpoint was written by a run of another shape, as one line."""


def identity_mismatch(uri: str, theirs: Any, ours: dict[str, Any]) -> str | None:
    """One line naming each flag whose value differs between the checkpoint and this run, or None."""
    if not isinstance(theirs, dict):
        return f"{uri} records no run identity: use another --checkpoint-uri"
    differing = [f"{flag} {theirs.get(key)!r} in the checkpoint, {ours[key]!r} now"
                 for key, flag in IDENTITY_FLAGS.items() if key in ours and theirs.get(key) != ours[key]]
    if not differing:
        return None
    return (f"{uri} was written by another run ({'; '.join(differing)}): "
            "resume with the same values or use another --checkpoint-uri")


def read_manifest(storage: Storage, name: str, identity: dict[str, Any],
                  check: Callable[[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """The manifest ``name`` in ``storage`` as ``check`` (its format's) accepts it, if it is the run ``identity``'s;
    raises CorruptCheckpoint, IdentityMismatch or StorageError."""
    try:
        manifest = check(name, json.loads(storage.get(name)))
    except (ValueError, RecursionError) as error:
        raise CorruptCheckpoint(f"unreadable manifest: {error}") from None
    mismatch = identity_mismatch(f"{storage.uri}/{name}", manifest.get("identity"), identity)
    if mismatch:
        raise IdentityMismatch(mismatch)
    return manifest


def check_manifest(name: str, manifest: Any) -> dict[str, Any]:
    """The manifest ``name`` holds, if it names exactly its own data object with a size and a sha256."""
    if not isinstance(manifest, dict):
        raise CorruptCheckpoint(f"unreadable manifest: a {type(manifest).__name__}, not an object")
    step = step_of(name)
    expected = {"step": step, "data": data_name(step)}
    for key, value in expected.items():
        if key not in manifest:
            raise CorruptCheckpoint(f"unreadable manifest: no {key!r}")
        if manifest[key] != value or type(manifest[key]) is not type(value):
            raise CorruptCheckpoint(f"unreadable manifest: {key} is {manifest[key]!r}, not {value!r}")
    if not isinstance(manifest.get("bytes"), int) or isinstance(manifest["bytes"], bool) or manifest["bytes"] < 0:
        raise CorruptCheckpoint("unreadable manifest: no 'bytes'" if "bytes" not in manifest
                                else f"unreadable manifest: bytes is {manifest['bytes']!r}")
    if not isinstance(manifest.get("sha256"), str) or not SHA256.fullmatch(manifest["sha256"]):
        raise CorruptCheckpoint("unreadable manifest: no 'sha256'" if "sha256" not in manifest
                                else "unreadable manifest: sha256 is not a hex digest")
    return manifest


def deserialize(name: str, payload: bytes) -> dict[str, Any]:
    """``torch.load`` of untrusted bytes (weights only): whatever it raises, the object is no checkpoint."""
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as error:  # zip, pickle and tensor errors alike: RuntimeError, UnpicklingError, EOFError, ...
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CorruptCheckpoint(f"{name}: not a checkpoint: {message}") from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{name}: not a checkpoint: holds a {type(state).__name__}, not a dict")
    return state


class Checkpointer:
    """Save, prune, list and read checkpoints on ``storage``; ``emit`` receives one event dict per outcome.

    ``guard`` runs before every write (rank 0 checks its lease there) and raises StorageError to stop it.
    """

    def __init__(self, storage: Storage, identity: dict[str, Any], keep: int = 3,
                 emit: Callable[[Event], None] = lambda event: None, guard: Callable[[], None] = lambda: None):
        self.storage, self.identity, self.keep, self.emit, self.guard = storage, identity, keep, emit, guard
        self._names: set[str] | None = None  # rank 0 is the only writer: list once, then track

    def _known_names(self) -> set[str]:
        if self._names is None:
            self._names = set(our_names(self.storage.names()))
        return self._names

    def uri(self, step: int) -> str:
        return f"{self.storage.uri}/{manifest_name(step)}"

    def save(self, step: int, payload: bytes, **details: Any) -> bool:
        """Write data, then manifest, then prune; True once the manifest is written. Failures are reported."""
        started = time.perf_counter()
        manifest = {"step": step, "data": data_name(step), "bytes": len(payload),
                    "sha256": hashlib.sha256(payload).hexdigest(), "identity": self.identity, **details}
        try:
            self.guard()
            self.storage.put(data_name(step), payload)
            names = self._known_names()
            names.add(data_name(step))
            manifest["upload_seconds"] = round(time.perf_counter() - started, 4)
            self.guard()
            self.storage.put(manifest_name(step), json.dumps(manifest).encode())
            names.add(manifest_name(step))
        except StorageError as error:
            # a PUT that failed on the client may still have landed on the server: list again before pruning
            self._names = None
            self.emit({"event": "checkpoint_failed", "step": step, "error": str(error)})
            return False
        self.emit({"event": "checkpoint", "step": step, **details, "uri": self.uri(step), "bytes": len(payload),
                   "seconds": round(time.perf_counter() - started, 4)})
        try:
            self._prune()
        except StorageError as error:
            self._names = None
            self.emit({"event": "prune_failed", "error": str(error)})
        return True

    def manifests(self) -> list[str]:
        """Manifest names, newest first; reports data objects newer than any manifest (partial writes)."""
        names = our_names(self.storage.names())
        self._names = set(names)
        manifests = sorted((n for n in names if n.endswith(MANIFEST)), reverse=True)
        newest_complete = step_of(manifests[0]) if manifests else -1
        for partial in sorted(n for n in names if n.endswith(DATA) and n.replace(DATA, MANIFEST) not in names):
            if step_of(partial) > newest_complete:
                self.emit({"event": "checkpoint_skipped", "name": partial, "reason": "no manifest (partial write)"})
        return manifests

    def upload_seconds(self, size: int) -> float:
        return probe_upload_seconds(self.storage, size)

    def newest_manifest(self) -> dict[str, Any] | None:
        """The newest readable manifest; raises IdentityMismatch if it belongs to a run of another shape."""
        for name in sorted((n for n in our_names(self.storage.names()) if n.endswith(MANIFEST)), reverse=True):
            try:
                return self._manifest(name)
            except (CorruptCheckpoint, StorageError):
                continue
        return None

    def read(self, name: str) -> Checkpoint:
        """The checkpoint of manifest ``name``, verified; raises CorruptCheckpoint or StorageError."""
        manifest = self._manifest(name)
        payload = self.storage.get(manifest["data"])
        if len(payload) != manifest["bytes"] or hashlib.sha256(payload).hexdigest() != manifest["sha256"]:
            raise CorruptCheckpoint(f"{manifest['data']}: size or sha256 differs from its manifest")
        return Checkpoint(manifest["step"], deserialize(manifest["data"], payload), f"{self.storage.uri}/{name}",
                          manifest)

    def choose(self, accept: Callable[[Checkpoint], None] = lambda checkpoint: None) -> Checkpoint | None:
        """The newest checkpoint that verifies and that ``accept`` takes (it raises CorruptCheckpoint if not);
        reports each one skipped on the way."""
        for name in self.manifests():
            try:
                checkpoint = self.read(name)
                accept(checkpoint)
                return checkpoint
            except (CorruptCheckpoint, StorageError) as error:
                self.emit({"event": "checkpoint_skipped", "name": name, "reason": str(error)})
        return None

    def load_latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies."""
        return self.choose()

    def _manifest(self, name: str) -> dict[str, Any]:
        return read_manifest(self.storage, name, self.identity, check_manifest)

    def _prune(self) -> None:
        names = self._known_names()
        manifests = sorted((n for n in names if n.endswith(MANIFEST)), reverse=True)
        if len(manifests) <= self.keep:
            return
        oldest_kept = step_of(manifests[self.keep - 1])
        stale_data = sorted(n for n in names if n.endswith(DATA) and step_of(n) < oldest_kept)
        for name in manifests[self.keep:] + stale_data:  # manifests first: none may name missing data
            self.storage.delete(name)
            names.discard(name)


def probe_upload_seconds(storage: Storage, size: int) -> float:
    """About how long uploading ``size`` bytes takes: one PUT of at most PROBE_BYTES (then deleted), scaled by size.
    Conservative for large checkpoints (it counts the request latency per MiB and no multipart parallelism); raises
    StorageError."""
    probe = min(size, PROBE_BYTES) or 1
    started = time.perf_counter()
    storage.put(PROBE, bytes(probe))
    seconds = time.perf_counter() - started
    storage.delete(PROBE)
    return seconds * max(1.0, size / probe)


def serialize(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def save_estimate(manifest: dict[str, Any] | None, probe: Callable[[], tuple[int, float]]) -> tuple[int, float, str]:
    """Bytes and seconds of a save: the newest checkpoint's (its manifest's ``bytes`` and ``upload_seconds``), else
    ``probe()``'s; the one rule of both checkpoint formats."""
    if manifest and "upload_seconds" in manifest:
        return manifest["bytes"], manifest["upload_seconds"], "last checkpoint"
    return (*probe(), "probe")


class SaveThread:
    """At most one save in flight, on a daemon thread: a daemon thread never holds the process past its grace
    period (a save still running at exit is abandoned; without its manifest it is never read)."""

    def __init__(self):
        self._thread: threading.Thread | None = None

    def start(self, target: Callable[..., None], *args: Any) -> None:
        self._thread = threading.Thread(target=target, args=args, name="checkpoint", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """True once no save is in flight; False if one still runs after ``timeout`` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True


class BackgroundSaver:
    """Serializes a state at once and uploads it on a SaveThread. ``durable`` is the URI of the newest checkpoint
    whose manifest is written."""

    def __init__(self, checkpointer: Checkpointer, durable: str | None = None, durable_step: int | None = None):
        self.checkpointer = checkpointer
        self.durable, self.durable_step = durable, durable_step
        self._saving = SaveThread()

    def submit(self, step: int, state: dict[str, Any], **details: Any) -> None:
        self.wait()
        self._saving.start(self._save, step, serialize(state), details)

    def _save(self, step: int, payload: bytes, details: dict[str, Any]) -> None:
        if self.checkpointer.save(step, payload, **details):
            self.durable, self.durable_step = self.checkpointer.uri(step), step

    def wait(self, timeout: float | None = None) -> bool:
        return self._saving.wait(timeout)
