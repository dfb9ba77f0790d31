"""Sharded checkpoints on torch.distributed.checkpoint (DCP): every rank writes its own part, in parallel, staged off
the training thread; a manifest, published by rank 0 once every part is durable, is what makes one a checkpoint.

On the storage (a local path or ``s3://bucket/prefix``), named by the global step like the one-object format:

- ``ckpt-000000300/``: DCP's checkpoint, ``__<rank>_<n>.distcp`` written by each rank (on S3, S3_WRITE_STREAMS
  of them at once) and ``.metadata`` by rank 0;
- ``ckpt-000000300.json``: the manifest ``{"step", "data": "ckpt-000000300/", "format": "dcp", "files": {name:
  bytes}, "world_size", "identity", ...}``, written after DCP's save returned on rank 0. DCP's coordinator gathers
  every rank's write results before it writes ``.metadata`` (torch/distributed/checkpoint/state_dict_saver.py,
  ``_save_state_dict``: ``finish_checkpoint`` runs on ``all_results``), so by then every rank's files are closed;
  rank 0 then lists the folder and publishes only if every file DCP recorded is there whole.

Readers trust only manifests: rank 0 takes the newest whose files are all present with their sizes and whose
identity is this run's; every rank then reads just its part of it (DCP plans the reads from ``.metadata``, so a
checkpoint written at another world size, or by FSDP shards, loads here: resharding). S3 goes through the S3
Connector for PyTorch's DCP writer (``s3torchconnector``: multipart uploads), subclassed in ``s3_dcp`` to fail a
save when any upload failed, and DCP's own reader on boto3's ranged GETs, reading large tensors straight into place;
a local path through DCP's own ``FileSystemWriter``/``FileSystemReader`` (fsync'd). Data is not hashed: a shard of
the right size whose bytes changed is not detected (its load fails, or it loads wrong values).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from gpuyard.jobs.workload.checkpoint import CorruptCheckpoint, manifest_name, read_manifest, step_of
from gpuyard.jobs.workload.storage import LocalStorage, S3Storage, Storage, StorageError

Event = dict[str, Any]
FORMAT = "dcp"
METADATA = ".metadata"  # DCP's name for the coordinator's file (torch/distributed/checkpoint/filesystem.py)
MANIFEST = re.compile(r"ckpt-(\d{9})\.json")
# Objects each rank uploads at once. DCP deals a rank's items into ``thread_count`` files, each written by a thread
# (torch 2.13.0 torch/distributed/checkpoint/filesystem.py: ``_split_by_size_and_type``; s3_dcp.S3ShardWriter runs
# ``thread_count`` threads); s3torchconnector 1.5.0's ``S3StorageWriter`` defaults to 1
# (dcp/s3_file_system.py), one multipart upload per rank that runs its parts with too little concurrency to keep up
# with boto3's 10 threads (bench_checkpoint, 1 GB: 4 objects a rank 0.9-1.04 of boto3 where 1 was 0.77-0.84).
S3_WRITE_STREAMS = 4


def folder_name(step: int) -> str:
    return f"ckpt-{step:09d}"


class ModelState:
    """A module as DCP's ``Stateful``: its state dict by parameter name, sharded (DTensor) under FSDP2."""

    def __init__(self, module: nn.Module):
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.module)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.module, state)


class OptimizerState:
    """An optimizer as DCP's ``Stateful``: keyed by parameter name (not by index), its state created if not yet."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer):
        self.module, self.optimizer = module, optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.module, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.module, self.optimizer, state)


def check_manifest(name: str, manifest: Any) -> dict[str, Any]:
    """The sharded manifest ``name`` holds, if it names its own folder and lists its files with their sizes."""
    if not isinstance(manifest, dict):
        raise CorruptCheckpoint(f"unreadable manifest: a {type(manifest).__name__}, not an object")
    step = step_of(name)
    if manifest.get("format") != FORMAT:
        raise CorruptCheckpoint(f"{name}: not a sharded checkpoint (format {manifest.get('format')!r})")
    for key, value in {"step": step, "data": f"{folder_name(step)}/"}.items():
        if manifest.get(key) != value or type(manifest.get(key)) is not type(value):
            raise CorruptCheckpoint(f"unreadable manifest: {key} is {manifest.get(key)!r}, not {value!r}")
    files = manifest.get("files")
    if (not isinstance(files, dict) or METADATA not in files
            or not all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in files.values())):
        raise CorruptCheckpoint("unreadable manifest: 'files' is not a map of file names to sizes with .metadata")
    world_size = manifest.get("world_size")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise CorruptCheckpoint(f"unreadable manifest: world_size is {world_size!r}")
    return manifest


def shard_sizes(metadata: Metadata) -> dict[str, int]:
    """Each data file's size as DCP recorded it: the end of its last item (items are written back to back)."""
    sizes: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), info.offset + info.length)
    return sizes


def storage_writer(storage: Storage, rank: int):
    """DCP's writer for ``storage``; its ``checkpoint_id`` is set per save (``dcp.async_save(checkpoint_id=...)``)."""
    if isinstance(storage, S3Storage):
        from gpuyard.jobs.workload.s3_dcp import S3ShardWriter, s3_client

        region, client = s3_client(rank)
        return S3ShardWriter(region, storage.uri, client, S3_WRITE_STREAMS)
    if isinstance(storage, LocalStorage):
        return dcp.FileSystemWriter(storage.root, sync_files=True)
    raise StorageError(f"{storage.uri}: sharded checkpoints need a local path or s3://")


def kept_stager() -> DefaultStager:
    """What stages a save (the copy ``async_save`` makes on the training thread): DCP's ``DefaultStager``, which
    copies each tensor into a host copy it keeps for that tensor's storage from one save to the next (torch 2.13.0
    torch/distributed/checkpoint/_state_dict_stager.py ``_offload_storage``), pinned where there is a GPU, staged
    synchronously. The writers' own staging kept a copy only pinned, which needs a GPU
    (``BlockingAsyncStager(cache_staged_state_dict=True)``); otherwise it allocated a new one every save, whose pages
    the kernel faults in and zeroes each time. Host memory holds the state twice from the first save on, as every
    save does while it runs; the manager stages only once the previous save is written."""
    gpu = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=gpu, use_shared_memory=False, use_async_staging=False,
                                        use_non_blocking_copy=False))


def storage_reader(storage: Storage):
    """DCP's reader for ``storage``; its ``checkpoint_id`` is set per load (``dcp.load(checkpoint_id=...)``)."""
    if isinstance(storage, S3Storage):
        from gpuyard.jobs.workload.s3_dcp import S3ShardReader

        return S3ShardReader(storage.uri, storage)
    if isinstance(storage, LocalStorage):
        return dcp.FileSystemReader(storage.root)
    raise StorageError(f"{storage.uri}: sharded checkpoints need a local path or s3://")


class ShardedCheckpointer:
    """The thin layer above DCP: where each checkpoint goes, its manifest, choosing one, pruning to ``keep``.

    ``guard`` runs before rank 0 publishes (the lease) and raises StorageError to stop it; ``emit`` gets events.
    """

    def __init__(self, storage: Storage, identity: dict[str, Any], rank: int = 0, keep: int = 3,
                 emit: Callable[[Event], None] = lambda event: None, guard: Callable[[], None] = lambda: None):
        self.storage, self.identity, self.rank, self.keep, self.emit, self.guard = (
            storage, identity, rank, keep, emit, guard)
        self._abandoned: set[str] = set()  # folders of saves that failed here: pruned with the old ones

    def checkpoint_id(self, step: int) -> str:
        """Where DCP writes the checkpoint of ``step``: a folder under the storage's path or prefix."""
        if isinstance(self.storage, LocalStorage):
            return str(self.storage.root / folder_name(step))
        return f"{self.storage.uri}/{folder_name(step)}"

    def uri(self, step: int) -> str:
        return f"{self.storage.uri}/{manifest_name(step)}"

    def publish(self, step: int, metadata: Metadata, world_size: int, started: float, **details: Any) -> bool:
        """Rank 0, after DCP's save returned: check every file is there whole, write the manifest, prune."""
        folder = folder_name(step)
        try:
            expected, present = shard_sizes(metadata), self.storage.folder(folder)
            short = sorted(name for name, size in expected.items() if present.get(name) != size)
            if short or METADATA not in present:
                raise StorageError(f"{folder}: {', '.join(short) or METADATA} not there whole after the save")
            files = {name: present[name] for name in [*expected, METADATA]}
            manifest = {"step": step, "data": f"{folder}/", "format": FORMAT, "files": files,
                        "bytes": sum(files.values()), "world_size": world_size, "identity": self.identity,
                        "upload_seconds": round(time.perf_counter() - started, 4), **details}
            self.guard()
            self.storage.put(manifest_name(step), json.dumps(manifest).encode())
        except StorageError as error:
            self.failed(step, str(error))
            return False
        self.emit({"event": "checkpoint", "step": step, **details, "uri": self.uri(step), "bytes": manifest["bytes"],
                   "seconds": manifest["upload_seconds"], "format": FORMAT})
        try:
            self._prune()
        except StorageError as error:
            self.emit({"event": "prune_failed", "error": str(error)})
        return True

    def failed(self, step: int, error: str) -> None:
        self._abandoned.add(folder_name(step))
        self.emit({"event": "checkpoint_failed", "step": step, "error": error})

    def manifests(self) -> list[str]:
        """Manifest names, newest first."""
        return sorted((name for name in self.storage.names() if MANIFEST.fullmatch(name)), reverse=True)

    def verify(self, name: str) -> dict[str, Any]:
        """The manifest ``name`` if it is this run's and its files are all there with their sizes; raises
        CorruptCheckpoint, IdentityMismatch or StorageError."""
        manifest = read_manifest(self.storage, name, self.identity, check_manifest)
        present = self.storage.folder(folder_name(manifest["step"]))
        wrong = sorted(file for file, size in manifest["files"].items() if present.get(file) != size)
        if wrong:
            raise CorruptCheckpoint(f"{manifest['data']}{wrong[0]}: "
                                    f"{'missing' if wrong[0] not in present else 'size differs from its manifest'}")
        return manifest

    def newest(self) -> dict[str, Any] | None:
        """The newest manifest that verifies, reporting each one skipped; IdentityMismatch if it is another run's."""
        for name in self.manifests():
            try:
                return self.verify(name)
            except (CorruptCheckpoint, StorageError) as error:
                self.emit({"event": "checkpoint_skipped", "name": name, "reason": str(error)})
        return None

    def _prune(self) -> None:
        manifests = self.manifests()
        for name in manifests[self.keep:]:  # the manifest first: none may name a missing folder
            self.storage.delete(name)
            self.storage.delete_folder(folder_name(step_of(name)))
        kept = {folder_name(step_of(name)) for name in manifests[:self.keep]}
        for folder in sorted(self._abandoned - kept):
            self.storage.delete_folder(folder)
            self._abandoned.discard(folder)
