"""The reference DDP trainer: one code path under torchrun, mpirun, Ray Train and plain python.

    python -m jobs.workload.train TOTAL_EPOCHS SAVE_EVERY --batch_size N [--checkpoint-uri URI] ...

Grown from the PyTorch DDP tutorial (``multigpu_torchrun.py``): the Trainer is handed its model,
loader and optimizer, loads the newest checkpoint before the DDP wrap and saves
``model.module.state_dict()`` from rank 0 only, every SAVE_EVERY epochs and every
``--save-every-steps`` steps. A checkpoint holds the optimizer, every RNG state and the position in
the epoch, so a resumed run ends bitwise identical to an uninterrupted one. On SIGTERM every rank
stops after the same step, rank 0 saves that step within ``--grace-period`` and all exit 143.
Rank 0 ends with one JSON line: ``{"event": "done", ..., "weights_sha256": "...", "checkpoint": URI}``
(or ``"stopped"``).
"""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from jobs.workload import dist
from jobs.workload.args import TrainArgs, exit_on_bad_args
from jobs.workload.checkpoint import BackgroundSaver, Checkpoint, Checkpointer, IdentityMismatch, serialize
from jobs.workload.data import build_loader, build_model, synthetic_dataset, weights_sha256
from jobs.workload.interrupt import (EXIT_CONFLICT, EXIT_NONFINITE, EXIT_RETRYABLE, GraceBudget, GraceWatch,
                                     StepAgreement, StopRequest, Verdict)
from jobs.workload.lease import Lease, LeaseHeld
from jobs.workload.metrics import TrainMetrics
from jobs.workload.progress import Reporter
from jobs.workload.storage import Storage, StorageError, open_storage

Event = dict[str, Any]
MOMENTUM = 0.9
PROBE = ".save-probe"


@dataclass(frozen=True)
class Telemetry:
    """Every trainer event goes to the metrics and to rank 0's progress output."""

    reporter: Reporter
    metrics: TrainMetrics

    def emit(self, event: Event) -> None:
        self.metrics.record(event)
        self.reporter.event(event)

    def step(self, seconds: float) -> None:
        self.metrics.step_seconds.observe(seconds)
        self.reporter.step()


@dataclass(frozen=True)
class SavePolicy:
    """When to checkpoint, and how long a save may take once SIGTERM has arrived."""

    every_epochs: int
    every_steps: int | None
    budget: GraceBudget


@dataclass(frozen=True)
class Outcome:
    """The last event of a rank and the exit status it asks for."""

    event: Event
    exit_code: int = 0


class Trainer:
    """The tutorial's Trainer: resumes before the DDP wrap, trains, saves from rank 0 on a thread."""

    def __init__(self, model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer, policy: SavePolicy,
                 checkpointer: Checkpointer | None, telemetry: Telemetry, env: dist.DistEnv, stop: StopRequest,
                 lease: Lease | None = None):
        self.device = dist.device(env)
        self.model = model.to(self.device)
        self.loader, self.sampler, self.optimizer, self.policy = loader, loader.sampler, optimizer, policy
        self.checkpointer, self.telemetry, self.env, self.stop, self.lease = checkpointer, telemetry, env, stop, lease
        self.agreement = StepAgreement(stop, env.world_size, self.device)
        self.epoch = self.step_in_epoch = self.global_step = 0
        checkpoint = checkpointer.load_latest() if checkpointer else None
        if checkpoint:
            self._restore(checkpoint)
        self._saved_step = checkpoint.step if checkpoint else None
        self.saver = None
        if checkpointer and env.is_main:
            self.saver = BackgroundSaver(checkpointer, *((checkpoint.uri, checkpoint.step) if checkpoint else ()))
        self.model = DDP(self.model, device_ids=[self.device] if self.device.type == "cuda" else None)

    def train(self, max_epochs: int) -> Outcome:
        """Run the remaining steps; returns this rank's outcome (done, stopped or failed)."""
        self.telemetry.reporter.start(max_epochs * self.sampler.batches_per_epoch, self.global_step)
        while self.epoch < max_epochs:
            self.sampler.set_position(self.epoch, self.step_in_epoch)
            started, loss_sum, steps = time.perf_counter(), torch.zeros((), device=self.device), 0
            for source, targets in self.loader:
                step_started = time.perf_counter()
                loss = self._run_batch(source.to(self.device), targets.to(self.device))
                verdict = self.agreement.check(loss, lease_lost=self.lease is not None and self.lease.lost)
                if verdict != Verdict():
                    return self._interrupted(verdict)
                loss_sum, steps = loss_sum + loss, steps + 1
                self.telemetry.step(time.perf_counter() - step_started)
                if self.policy.every_steps and self.global_step % self.policy.every_steps == 0 and not self._save():
                    return self._nonfinite()
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
            self._emit_epoch(loss_sum, steps, time.perf_counter() - started)
            if (self.epoch % self.policy.every_epochs == 0 or self.epoch == max_epochs) and not self._save():
                return self._nonfinite()
        return self._finish()

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        self.global_step, self.step_in_epoch = self.global_step + 1, self.step_in_epoch + 1
        return loss.detach()

    def _emit_epoch(self, loss_sum: torch.Tensor, steps: int, seconds: float) -> None:
        samples = steps * self.sampler.batch_size * self.env.world_size
        self.telemetry.emit({"event": "epoch", "epoch": self.epoch, "global_step": self.global_step,
                             "loss": round(loss_sum.item() / max(steps, 1), 6),
                             "samples_per_s": round(samples / seconds, 1), "seconds": round(seconds, 4)})

    def _save(self) -> bool:
        """Hand this step's state to the background saver (rank 0); False if the weights are not finite."""
        if self._saved_step == self.global_step:
            return True
        if not all(torch.isfinite(tensor).all() for tensor in self.model.module.state_dict().values()
                   if tensor.is_floating_point()):
            return False  # the same weights on every rank: every rank returns False here
        self._saved_step = self.global_step
        if self.saver:
            state = self.snapshot()
            self.saver.submit(self.global_step, state, epoch=state["epoch"], step_in_epoch=state["step_in_epoch"])
        return True

    def snapshot(self) -> dict[str, Any]:
        epoch, position = self.epoch, self.step_in_epoch
        if position == self.sampler.batches_per_epoch:
            epoch, position = epoch + 1, 0
        return {"global_step": self.global_step, "epoch": epoch, "step_in_epoch": position,
                "model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}}

    def _restore(self, checkpoint: Checkpoint) -> None:
        state = checkpoint.state
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if state["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.global_step, self.epoch, self.step_in_epoch = state["global_step"], state["epoch"], state["step_in_epoch"]
        self.telemetry.emit({"event": "resume", "epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                             "global_step": self.global_step, "checkpoint": checkpoint.uri})

    @property
    def durable(self) -> str | None:
        return self.saver.durable if self.saver else None

    def _interrupted(self, verdict: Verdict) -> Outcome:
        if verdict.nonfinite:
            return self._nonfinite()
        if verdict.lease_lost:
            if self.lease:
                sys.stderr.write(f"train: error: {self.lease.lost_message}\n")
            return Outcome({"event": "lease_lost", "global_step": self.global_step, "checkpoint": self.durable},
                           EXIT_CONFLICT)
        return self._stopped()

    def _stopped(self) -> Outcome:
        """SIGTERM: rank 0 saves this step within the grace budget; every rank asks to be retried."""
        if self.saver:
            budget = self.policy.budget
            if not self.saver.wait(budget.remaining(self.stop)):
                self.telemetry.emit({"event": "checkpoint_failed", "step": self.global_step,
                                     "error": "the previous save was still running at the grace deadline"})
            elif self._save() and not self.saver.wait(budget.remaining(self.stop)):
                self.telemetry.emit({"event": "checkpoint_failed", "step": self.global_step,
                                     "error": f"not written within the {budget.seconds:.1f}s grace budget"})
        waited = time.monotonic() - (self.stop.requested_at or time.monotonic())
        return Outcome({"event": "stopped", "global_step": self.global_step, "checkpoint": self.durable,
                        "seconds_since_sigterm": round(waited, 3)}, EXIT_RETRYABLE)

    def _nonfinite(self) -> Outcome:
        if self.saver:
            self.saver.wait()
        if self.env.is_main:
            sys.stderr.write(f"train: error: loss or weights not finite at step {self.global_step}; no checkpoint "
                             f"of them is written; last durable checkpoint: {self.durable or 'none'}\n")
        return Outcome({"event": "nonfinite", "global_step": self.global_step, "checkpoint": self.durable},
                       EXIT_NONFINITE)

    def _finish(self) -> Outcome:
        done = {"event": "done", "epochs": self.epoch, "global_step": self.global_step,
                "weights_sha256": weights_sha256(self.model.module), "checkpoint": None}
        if not self.saver:
            return Outcome(done)
        self.saver.wait()
        done["checkpoint"] = self.saver.durable
        if self.saver.durable_step == self.global_step:
            return Outcome(done)
        sys.stderr.write(f"train: error: the final checkpoint (step {self.global_step}) is not durable; "
                         f"last durable checkpoint: {self.saver.durable or 'none'}\n")
        return Outcome(done, EXIT_RETRYABLE)


def identity(args: TrainArgs, world_size: int) -> dict[str, Any]:
    """What shapes a run: a checkpoint only resumes a run with the same values."""
    return {"model": args.model, "dataset_size": args.dataset_size, "seed": args.seed,
            "batch_size": args.batch_size, "world_size": world_size, "lr": args.lr}


def open_checked_storage(uri: str | None) -> Storage | None:
    """The checkpoint storage, checked reachable before any process group starts."""
    if uri is None:
        return None
    storage = open_storage(uri)
    storage.check()
    return storage


def build_trainer(args: TrainArgs, env: dist.DistEnv, storage: Storage | None, telemetry: Telemetry,
                  stop: StopRequest | None = None, lease: Lease | None = None) -> Trainer:
    """Data, model and optimizer from the seed, handed to a Trainer (which resumes from ``storage``)."""
    dist.pin_cpu_threads(env)
    loader = build_loader(synthetic_dataset(args.dataset_size, args.seed), args.batch_size,
                          env.rank, env.world_size, args.seed)
    model = build_model(args.model, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM)
    budget = GraceBudget(args.grace_period)
    checkpointer = None
    if storage:
        watch = GraceWatch(budget, telemetry.emit)
        checkpointer = Checkpointer(storage, identity(args, env.world_size),
                                    emit=lambda event: (telemetry.emit(event), watch.observe(event)),
                                    guard=lease.confirm if lease else lambda: None)
    trainer = Trainer(model, loader, optimizer, SavePolicy(args.save_every, args.save_every_steps, budget),
                      checkpointer, telemetry, env, stop or StopRequest(), lease)
    if trainer.saver:
        _estimate_save(trainer, storage, watch)
    return trainer


def _estimate_save(trainer: Trainer, storage: Storage, watch: GraceWatch) -> None:
    """Say at start how long a save takes: from the last checkpoint's manifest, or by timing a probe."""
    manifest = trainer.checkpointer.newest_manifest()
    if manifest and "upload_seconds" in manifest:
        watch.estimate(manifest["bytes"], manifest["upload_seconds"], "last checkpoint")
        return
    started = time.perf_counter()
    payload = serialize(trainer.snapshot())
    try:
        storage.put(PROBE, payload)
        storage.delete(PROBE)
    except StorageError as error:
        trainer.telemetry.emit({"event": "checkpoint_failed", "step": trainer.global_step, "error": str(error)})
        return
    watch.estimate(len(payload), time.perf_counter() - started, "probe")


def _take_lease(lease: Lease | None, env: dist.DistEnv, device: torch.device) -> str | None:
    """Rank 0 takes the writer lease; every rank learns whether it failed (and gets the one-line reason)."""
    reason = None
    if lease:
        try:
            lease.acquire()
        except LeaseHeld as error:
            reason = str(error)
    failed = torch.tensor([int(reason is not None)], device=device)
    if env.world_size > 1:
        torch.distributed.all_reduce(failed, op=torch.distributed.ReduceOp.MAX)
    return reason or ("rank 0 could not take the checkpoint lease" if failed.item() else None)


def run(args: TrainArgs, env: dist.DistEnv, storage: Storage | None, stop: StopRequest | None = None,
        reporter: Reporter | None = None) -> Outcome:
    """Train inside a joined process group; returns this rank's outcome, rank 0 reports every event."""
    telemetry = Telemetry(reporter or Reporter(enabled=env.is_main), TrainMetrics())
    if env.is_main and args.metrics_port is not None:
        telemetry.metrics.serve(args.metrics_port)
    lease = Lease(storage, args.lease_seconds) if storage and env.is_main else None
    held = _take_lease(lease, env, dist.device(env))
    if held:
        if env.is_main:
            sys.stderr.write(f"train: error: {held}\n")
        return Outcome({"event": "lease_held"}, EXIT_CONFLICT)
    try:
        outcome = build_trainer(args, env, storage, telemetry, stop, lease).train(args.total_epochs)
    finally:
        if lease:
            lease.release()
    telemetry.reporter.done(outcome.event)
    return outcome


def check_inputs(argv: list[str], world_size: int | None = None) -> tuple[TrainArgs, dist.DistEnv, Storage | None]:
    """Arguments, launcher environment, storage and checkpoint identity; anything wrong is one line and exit 2.

    ``world_size`` is the job's when this process is not one of its ranks (the Ray driver).
    """
    args = exit_on_bad_args(argv)
    try:
        env = dist.launcher_env()
        storage = open_checked_storage(args.checkpoint_uri)
        if storage:
            Checkpointer(storage, identity(args, world_size or env.world_size)).newest_manifest()
    except (dist.LaunchError, StorageError, IdentityMismatch) as error:
        sys.stderr.write(f"train: error: {error}\n")
        raise SystemExit(2) from None
    return args, env, storage


def main(argv: list[str]) -> None:
    stop = StopRequest()
    stop.install()
    args, env, storage = check_inputs(argv)
    dist.init_process_group(env)
    try:
        outcome = run(args, env, storage, stop)
        # also a barrier: under mpirun rank 0 hosts the store, so nobody may leave early
        exit_code = dist.agree_exit_code(outcome.exit_code, dist.device(env))
    finally:
        dist.destroy_process_group()
    # Everything is saved and reported by now. The interpreter's teardown of torch takes seconds on a busy node
    # (too long within a grace period) and now and then aborts in a C++ destructor after the process group is gone
    # ("terminate called without an active exception", exit 134), so the process leaves without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


if __name__ == "__main__":
    main(sys.argv[1:])
