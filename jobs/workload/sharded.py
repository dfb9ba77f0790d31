"""The CheckpointManager of sharded checkpoints (``--checkpoint-format sharded``, and always under FSDP).

The same contract as ``manager.CheckpointManager``, with every rank writing: ``save`` is a collective in which
each rank hands its own part to DCP's ``async_save`` (staged on the training thread: a copy to host memory, kept
from one save to the next;
written on a thread; collectives of the save on a process group of its own, so they never interleave with
training's); rank 0 publishes the manifest once the save returned there. ``load``: rank 0 chooses the newest
checkpoint whose files are all there, every rank loads exactly that one with DCP (each reading only the items
it needs), or all raise ResumeFailed together; the loaded step is compared across ranks. Per-rank state (RNG)
is saved under ``rank<N>`` by rank N, the step under ``step``; a rank that did not exist when the checkpoint was written seeds afresh.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from gpuyard.jobs.workload.checkpoint import (CorruptCheckpoint, IdentityMismatch, SaveThread, manifest_name,
                                       probe_upload_seconds, save_estimate)
from gpuyard.jobs.workload import dist as launcher
from gpuyard.jobs.workload.dist import DistEnv
from gpuyard.jobs.workload.engine import (ModelState, OptimizerState, ShardedCheckpointer, kept_stager, storage_reader,
                                          storage_writer)
from gpuyard.jobs.workload.manager import ResumeFailed, Resumed, SaveSchedule
from gpuyard.jobs.workload.storage import StorageError

STEP = "step"  # saved with every checkpoint: each rank checks the step it loaded against the manifest's


class PerRank:
    """This rank's own objects as one ``Stateful``."""

    def __init__(self, objects: dict[str, Any]):
        self.objects = objects

    def state_dict(self) -> dict[str, Any]:
        return {name: stateful.state_dict() for name, stateful in self.objects.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, stateful in self.objects.items():
            stateful.load_state_dict(state[name])


class ShardedCheckpointManager:
    """Owns when and what is saved and loaded, every rank writing its part; ``checkpointer`` None: no checkpoints.

    ``replicated``: the registered model is the same on every rank (DDP), so each rank writes about 1/world of it
    (DCP's planner deals replicated items out among the ranks); under FSDP each rank's shard is its own.
    """

    def __init__(self, checkpointer: ShardedCheckpointer | None, schedule: SaveSchedule, env: DistEnv,
                 reseed=lambda: None, replicated: bool = True):
        self.checkpointer, self.schedule, self.env, self.reseed, self.replicated = (
            checkpointer, schedule, env, reseed, replicated)
        self.shared: dict[str, Any] = {}
        self.per_rank: dict[str, Any] = {}
        self.durable: str | None = None
        self.durable_step: int | None = None
        self.last_blocked_seconds = 0.0
        self._saving = SaveThread()
        distributed = env.world_size > 1 and dist.is_initialized()
        # a group of its own: the save's collectives run on its thread while training's run on the main group
        self.group = dist.new_group(backend="gloo") if checkpointer and distributed else None
        self._no_dist = not distributed
        self._writer = storage_writer(checkpointer.storage, env.rank) if checkpointer else None
        self._stager = kept_stager() if checkpointer else None

    @property
    def publishes(self) -> bool:
        return self.checkpointer is not None and self.env.is_main

    def register(self, name: str, stateful: Any, *, per_rank: bool = False) -> None:
        (self.per_rank if per_rank else self.shared)[name] = stateful

    def due(self, step: int, *, epoch_end: int | None = None, last: bool = False) -> bool:
        return self.checkpointer is not None and self.schedule.due(step, epoch_end=epoch_end, last=last)

    def _statefuls(self, ranks: range) -> dict[str, Any]:
        """What DCP saves or loads: modules and optimizers by parameter name, the rest as they are, and the
        per-rank objects of ``ranks`` (this rank's only; none after a resize that made it new)."""
        module = next((s for s in self.shared.values() if isinstance(s, nn.Module)), None)
        state: dict[str, Any] = {}
        for name, stateful in self.shared.items():
            if isinstance(stateful, nn.Module):
                state[name] = ModelState(stateful)
            elif isinstance(stateful, torch.optim.Optimizer):
                state[name] = OptimizerState(module, stateful)
            else:
                state[name] = stateful
        if self.env.rank in ranks:
            state[f"rank{self.env.rank}"] = PerRank(self.per_rank)
        return state

    def save(self, step: int, timeout: float | None = None, **details: Any) -> bool:
        """Collective: once every rank's previous save is done (waiting at most ``timeout``; if one still runs,
        no rank saves and all return False), each rank stages its part and writes it in the background."""
        if self.checkpointer is None:
            return True
        if not self._agree(self.wait(timeout)):
            return False
        started = time.perf_counter()
        future = dcp.async_save({STEP: step, **self._statefuls(range(self.env.world_size))},
                                checkpoint_id=self.checkpointer.checkpoint_id(step), storage_writer=self._writer,
                                async_stager=self._stager, process_group=self.group, no_dist=self._no_dist)
        self.last_blocked_seconds = time.perf_counter() - started
        self._saving.start(self._finish_save, step, future, started, details)
        return True

    def _finish_save(self, step: int, future: Future, started: float, details: dict[str, Any]) -> None:
        try:
            metadata = future.result()
        except (Exception, CheckpointException) as error:  # on every rank when any rank's write failed (a BaseException)
            if self.env.is_main:
                self.checkpointer.failed(step, _first_line(error))
            return
        if self.env.is_main and self.checkpointer.publish(step, metadata, self.env.world_size, started, **details):
            self.durable, self.durable_step = self.checkpointer.uri(step), step

    def wait(self, timeout: float | None = None) -> bool:
        """True once this rank's save is done (rank 0: published); False if it still runs after ``timeout``."""
        return self._saving.wait(timeout)

    def save_estimate(self) -> tuple[int, float, str] | None:
        """Rank 0: bytes and seconds of a save, from the newest manifest, else from this rank's share of the state
        and an upload probe of at most 1 MiB; None elsewhere. Raises StorageError."""
        if not self.publishes:
            return None
        newest, manifest = self.checkpointer.manifests(), None
        if newest:
            try:
                manifest = self.checkpointer.verify(newest[0])
            except (CorruptCheckpoint, IdentityMismatch):
                pass

        def probe() -> tuple[int, float]:
            local = sum(t.numel() * t.element_size() for s in self.shared.values() if hasattr(s, "state_dict")
                        for t in _tensors(s.state_dict()))
            share = local // self.env.world_size if self.replicated else local
            return share * self.env.world_size, probe_upload_seconds(self.checkpointer.storage, share)
        return save_estimate(manifest, probe)

    def load(self) -> Resumed | None:
        """Collective: every rank loads the checkpoint rank 0 chose, or none; raises ResumeFailed or
        IdentityMismatch."""
        if self.checkpointer is None:
            return None
        kind, detail = self._broadcast(self._choose() if self.env.is_main else None)
        if kind == "identity":
            raise IdentityMismatch(detail)
        if kind == "unreadable":
            raise ResumeFailed(f"could not list the checkpoints: {detail}")
        if kind == "fresh":
            return None
        manifest = detail
        name = manifest_name(manifest["step"])
        # no copy of the state to fall back to (it would double host memory): a failed load ends the run (exit 143)
        state = {STEP: -1, **self._statefuls(range(manifest["world_size"]))}
        try:
            dcp.load(state,
                     checkpoint_id=self.checkpointer.checkpoint_id(manifest["step"]),
                     storage_reader=storage_reader(self.checkpointer.storage),
                     process_group=self.group, no_dist=self._no_dist)
        except (Exception, CheckpointException) as error:  # names each rank that failed, on every rank
            raise ResumeFailed(f"could not load {name}, the checkpoint rank 0 chose: {_first_line(error)}") from None
        if self.env.rank >= manifest["world_size"]:
            self.reseed()
        steps = self._all_gather(state[STEP])
        if len(set(steps)) != 1 or steps[0] != manifest["step"]:
            raise ResumeFailed(f"the ranks loaded steps {steps} from {name}, which holds step {manifest['step']}")
        self.durable, self.durable_step = self.checkpointer.uri(manifest["step"]), manifest["step"]
        return Resumed(manifest["step"], self.checkpointer.uri(manifest["step"]), manifest["world_size"])

    def _choose(self) -> tuple[str, Any]:
        try:
            manifest = self.checkpointer.newest()
        except IdentityMismatch as error:
            return "identity", str(error)
        except StorageError as error:
            return "unreadable", str(error)
        return ("resume", manifest) if manifest else ("fresh", None)

    def _agree(self, ready: bool) -> bool:
        """True on every rank if ``ready`` is true on every rank (one all-reduce on the training group)."""
        if self._no_dist:
            return ready
        flag = torch.tensor([int(ready)], device=launcher.device(self.env))
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def _broadcast(self, value: Any) -> Any:
        if self._no_dist:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _all_gather(self, value: Any) -> list[Any]:
        if self._no_dist:
            return [value]
        values: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(values, value)
        return values


def _tensors(state: Any):
    """Every tensor of a nested state, as this rank holds it (a DTensor's local shard)."""
    if isinstance(state, torch.Tensor):
        yield state.to_local() if hasattr(state, "to_local") else state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _tensors(value)


def _first_line(error: BaseException) -> str:
    """One line; DCP's CheckpointException (one per rank that failed) names the first failing rank and its error."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        rank = min(failures)
        failure = failures[rank]
        return f"rank {rank}: {_first_line(failure[0] if isinstance(failure, tuple) else failure)}"
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
