"""The CheckpointManager: when the trainer's state is saved, and the one checkpoint every rank resumes from.

The training loop registers its ``Stateful`` parts once (``state_dict``/``load_state_dict``, the
protocol of torch.distributed.checkpoint), asks ``due(...)`` after each step and epoch, and calls
``save(step)`` and ``load()``; it knows nothing of storage. Both are collectives, called by every rank
at the same point:

- ``save``: each rank hands rank 0 the state of its per-rank objects (its RNG); rank 0 adds the shared
  objects (model, optimizer, progress: the same on every rank under DDP) and writes one checkpoint on
  a background thread (``Checkpointer``, ``BackgroundSaver``).
- ``load``: rank 0 chooses: the newest checkpoint that verifies and applies to its own objects (each one
  skipped on the way is reported). Every other rank loads exactly that one; if any rank cannot, all
  raise ResumeFailed together. The step each rank loaded is then compared across ranks before training
  goes on. A rank that did not exist when the checkpoint was written (the job grew) seeds its per-rank
  objects afresh.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from gpuyard.jobs.workload.checkpoint import (BackgroundSaver, Checkpoint, Checkpointer, CorruptCheckpoint, IdentityMismatch,
                                       save_estimate, serialize)
from gpuyard.jobs.workload.dist import DistEnv
from gpuyard.jobs.workload.storage import StorageError

Event = dict[str, Any]
RANKS = "ranks"  # the per-rank states, indexed by the rank that saved them


class ResumeFailed(Exception):
    """The ranks could not all resume from the checkpoint rank 0 chose, as one line."""


@dataclass(frozen=True)
class SaveSchedule:
    """Every ``every_epochs`` epochs, every ``every_steps`` global steps, and at the end of training."""

    every_epochs: int
    every_steps: int | None = None

    def due(self, step: int, *, epoch_end: int | None = None, last: bool = False) -> bool:
        """After global step ``step``; ``epoch_end`` is the number of epochs done when the step ended one."""
        if self.every_steps and step % self.every_steps == 0:
            return True
        return epoch_end is not None and (last or epoch_end % self.every_epochs == 0)


@dataclass(frozen=True)
class Resumed:
    """The checkpoint every rank loaded, and the world size that wrote it."""

    step: int
    uri: str
    world_size: int


class CheckpointManager:
    """Owns when and what is saved and loaded; ``checkpointer`` None trains without checkpoints."""

    def __init__(self, checkpointer: Checkpointer | None, schedule: SaveSchedule, env: DistEnv,
                 reseed: Callable[[], None] = lambda: None):
        self.checkpointer, self.schedule, self.env, self.reseed = checkpointer, schedule, env, reseed
        self.shared: dict[str, Any] = {}
        self.per_rank: dict[str, Any] = {}
        self.saver = BackgroundSaver(checkpointer) if checkpointer and env.is_main else None
        self._chosen: Checkpoint | None = None  # rank 0: the checkpoint it chose and applied

    @property
    def publishes(self) -> bool:
        """This rank writes the manifests (rank 0, with checkpoints on)."""
        return self.saver is not None

    def register(self, name: str, stateful: Any, *, per_rank: bool = False) -> None:
        (self.per_rank if per_rank else self.shared)[name] = stateful

    def due(self, step: int, *, epoch_end: int | None = None, last: bool = False) -> bool:
        return self.checkpointer is not None and self.schedule.due(step, epoch_end=epoch_end, last=last)

    @property
    def durable(self) -> str | None:
        """The URI of the newest checkpoint known to be written (rank 0), else None."""
        return self.saver.durable if self.saver else None

    @property
    def durable_step(self) -> int | None:
        return self.saver.durable_step if self.saver else None

    def save(self, step: int, timeout: float | None = None, **details: Any) -> bool:
        """Collective: rank 0 gathers every rank's own state and writes the checkpoint of ``step`` in the
        background, once the previous save is done; False (rank 0) if that still runs after ``timeout``."""
        if self.checkpointer is None:
            return True
        ranks = self._gather({name: stateful.state_dict() for name, stateful in self.per_rank.items()})
        if not self.saver:
            return True
        if not self.saver.wait(timeout):
            return False
        self.saver.submit(step, self._state(step, ranks), world_size=self.env.world_size, **details)
        return True

    def save_estimate(self) -> tuple[int, float, str] | None:
        """Rank 0: bytes and seconds of a save, from the newest manifest, else from serializing this state and an
        upload probe of at most 1 MiB (never a whole extra checkpoint); None elsewhere. Raises StorageError."""
        if not self.saver:
            return None

        def probe() -> tuple[int, float]:
            started = time.perf_counter()
            mine = {name: stateful.state_dict() for name, stateful in self.per_rank.items()}
            size = len(serialize(self._state(0, [mine] * self.env.world_size)))
            serialized = time.perf_counter() - started
            return size, serialized + self.checkpointer.upload_seconds(size)
        return save_estimate(self.checkpointer.newest_manifest(), probe)

    def _state(self, step: int, ranks: list[Any]) -> dict[str, Any]:
        return {"step": step, **{name: s.state_dict() for name, s in self.shared.items()}, RANKS: ranks}

    def wait(self, timeout: float | None = None) -> bool:
        """True once no save is in flight; False if one still runs after ``timeout`` seconds."""
        return self.saver.wait(timeout) if self.saver else True

    def load(self) -> Resumed | None:
        """Collective: every rank resumes from the checkpoint rank 0 chose, or none; raises ResumeFailed
        (a rank could not load it, or the ranks disagree on the step) or IdentityMismatch."""
        if self.checkpointer is None:
            return None
        decision = self._broadcast(self._choose() if self.env.is_main else None)
        kind, detail = decision
        if kind == "identity":
            raise IdentityMismatch(detail)
        if kind == "unreadable":
            raise ResumeFailed(f"could not list the checkpoints: {detail}")
        if kind == "fresh":
            return None
        failure, loaded = None, None
        try:
            loaded = self._chosen if self.env.is_main else self._load(detail)
        except (CorruptCheckpoint, StorageError) as error:
            failure = str(error)
        failures = self._all_gather(failure)
        if any(failures):
            rank = next(rank for rank, message in enumerate(failures) if message)
            raise ResumeFailed(f"rank {rank} could not load {detail}, the checkpoint rank 0 chose: {failures[rank]}")
        steps = self._all_gather(loaded.step)
        if len(set(steps)) != 1:
            raise ResumeFailed(f"the ranks loaded different steps ({steps}) from {detail}")
        if self.saver:
            self.saver.durable, self.saver.durable_step = loaded.uri, loaded.step
        return Resumed(loaded.step, loaded.uri, len(loaded.state[RANKS]))

    def _choose(self) -> tuple[str, str | None]:
        """Rank 0: the newest checkpoint that verifies and applies here (a fresh start if none does)."""
        registered = {**self.shared, **self.per_rank}
        initial: dict[str, Any] = {}

        def accept(checkpoint: Checkpoint) -> None:
            if not initial:  # before the first attempt: a checkpoint that half applies must not stay half applied
                initial.update({name: copy.deepcopy(s.state_dict()) for name, s in registered.items()})
            self._apply(checkpoint)

        try:
            self._chosen = self.checkpointer.choose(accept)
        except IdentityMismatch as error:
            return "identity", str(error)
        except StorageError as error:
            return "unreadable", str(error)
        if self._chosen is None:
            for name, state in initial.items():
                registered[name].load_state_dict(state)
            return "fresh", None
        return "resume", self._chosen.name

    def _load(self, name: str) -> Checkpoint:
        checkpoint = self.checkpointer.read(name)
        self._apply(checkpoint)
        return checkpoint

    def _apply(self, checkpoint: Checkpoint) -> None:
        """Load ``checkpoint`` into the registered objects; CorruptCheckpoint if it is not a state of them."""
        state, data = checkpoint.state, checkpoint.manifest["data"]
        missing = [name for name in ("step", *self.shared, RANKS) if name not in state]
        if missing:
            raise CorruptCheckpoint(f"{data}: not a checkpoint of this trainer: no {missing[0]!r}")
        if state["step"] != checkpoint.step:
            raise CorruptCheckpoint(f"{data}: holds step {state['step']!r}, its manifest says {checkpoint.step}")
        ranks = state[RANKS]
        if not isinstance(ranks, list) or not ranks or not all(
                isinstance(entry, dict) and set(self.per_rank) <= entry.keys() for entry in ranks):
            raise CorruptCheckpoint(f"{data}: not a checkpoint of this trainer: no per-rank state")
        for name, stateful in self.shared.items():
            self._apply_one(data, name, stateful, state[name])
        if self.env.rank < len(ranks):
            for name, stateful in self.per_rank.items():
                self._apply_one(data, name, stateful, ranks[self.env.rank][name])
        else:
            self.reseed()

    @staticmethod
    def _apply_one(data: str, name: str, stateful: Any, state: Any) -> None:
        try:
            stateful.load_state_dict(state)
        except Exception as error:  # another model's tensors, a malformed entry: whatever load_state_dict raises
            message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CorruptCheckpoint(f"{data}: its {name} does not fit this run: {message}") from None

    def _collective(self) -> bool:
        return self.env.world_size > 1 and dist.is_initialized()

    def _broadcast(self, value: Any) -> Any:
        if not self._collective():
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _all_gather(self, value: Any) -> list[Any]:
        if not self._collective():
            return [value]
        values: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(values, value)
        return values

    def _gather(self, value: Any) -> list[Any]:
        if not self._collective():
            return [value]
        values: list[Any] | None = [None] * self.env.world_size if self.env.is_main else None
        dist.gather_object(value, values, dst=0)
        return values or []
