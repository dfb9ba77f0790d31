"""The reference DDP trainer: one code path under torchrun, mpirun, Ray Train and plain python.

    python -m gpuyard.jobs.workload.train TOTAL_EPOCHS SAVE_EVERY --batch_size N [--checkpoint-uri URI] ...

Grown from the PyTorch DDP tutorial (``multigpu_torchrun.py``): the Trainer is handed its model,
loader, optimizer and CheckpointManager, registers what it owns with the manager (model, optimizer
and progress once, its rank's RNG per rank), resumes before the DDP wrap and checkpoints every
SAVE_EVERY epochs and every ``--save-every-steps`` steps. Every rank resumes from the one checkpoint
rank 0 chose, so a resumed run ends bitwise identical to an uninterrupted one; after a resize (another
world size) the data position is remapped by samples. On SIGTERM every rank stops after the same step,
rank 0 saves that step within ``--grace-period`` and all exit 143. Rank 0 ends with one JSON line:
``{"event": "done", ..., "weights_sha256": "...", "checkpoint": URI}`` (or ``"stopped"``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from gpuyard.infra.conventions import EXIT_CONFLICT, EXIT_NONFINITE, EXIT_RETRYABLE
from gpuyard.infra.validation import one_line
from gpuyard.jobs.workload import dist
from gpuyard.jobs.workload.args import TrainArgs, exit_on_bad_args
from gpuyard.jobs.workload.checkpoint import Checkpointer, IdentityMismatch
from gpuyard.jobs.workload.data import build_loader, build_model, state_sha256, synthetic_dataset, weights_sha256
from gpuyard.jobs.workload.engine import ShardedCheckpointer
from gpuyard.jobs.workload.interrupt import AGREE_SECONDS, GraceBudget, GraceWatch, StepAgreement, StopRequest, Verdict
from gpuyard.jobs.workload.lease import Lease, LeaseHeld
from gpuyard.jobs.workload.manager import CheckpointManager, Resumed, ResumeFailed, SaveSchedule
from gpuyard.jobs.workload.metrics import PortInUse, TrainMetrics, check_port
from gpuyard.jobs.workload.progress import Reporter
from gpuyard.jobs.workload.sharded import ShardedCheckpointManager
from gpuyard.jobs.workload.state import RankRNG, TrainProgress
from gpuyard.jobs.workload.storage import Storage, StorageError, open_storage

Event = dict[str, Any]
MOMENTUM = 0.9


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
class Outcome:
    """The last event of a rank and the exit status it asks for."""

    event: Event
    exit_code: int = 0


class Trainer:
    """The tutorial's Trainer: resumes before the DDP wrap, trains, checkpoints through its manager."""

    def __init__(self, model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer, rng: RankRNG,
                 checkpoints: CheckpointManager, watch: GraceWatch, telemetry: Telemetry, env: dist.DistEnv,
                 stop: StopRequest, lease: Lease | None = None, fsdp: bool = False):
        self.device = dist.device(env)
        self.module = model.to(self.device)
        self.loader, self.sampler, self.optimizer = loader, loader.sampler, optimizer
        self.checkpoints, self.watch, self.budget, self.telemetry, self.env, self.stop, self.lease = (
            checkpoints, watch, watch.budget, telemetry, env, stop, lease)
        self.progress = TrainProgress()
        # a short grace period gets a quarter of its budget between agreements at most
        self.agreement = StepAgreement(stop, env.world_size, self.device, min(AGREE_SECONDS, self.budget.seconds / 4))
        for name, stateful in (("model", self.module), ("optimizer", optimizer), ("progress", self.progress)):
            checkpoints.register(name, stateful)
        checkpoints.register("rng", rng, per_rank=True)
        resumed = checkpoints.load()
        if resumed:
            self._report_resume(resumed)
        self._saved_step = resumed.step if resumed else None
        self._estimated = False
        self.fsdp = fsdp  # the module is sharded already (fully_shard): it trains as it is
        self.model = self.module if fsdp else DDP(self.module, device_ids=[self.device] if self.device.type == "cuda"
                                                 else None)

    def train(self, max_epochs: int) -> Outcome:
        """Run the remaining steps; returns this rank's outcome (done, stopped or failed)."""
        self.telemetry.reporter.start(max_epochs * self.sampler.batches_per_epoch, self.progress.global_step)
        while self.progress.epoch < max_epochs:
            outcome = self._run_epoch(max_epochs)
            if outcome:
                return outcome
        return self._finish()

    def _run_epoch(self, max_epochs: int) -> Outcome | None:
        """The rest of this epoch; an outcome if training must end here (stopped, lease lost, not finite)."""
        progress = self.progress
        self.sampler.set_position(progress.epoch, progress.epoch_samples)
        batches, started, loss_sum = len(self.loader), time.perf_counter(), torch.zeros((), device=self.device)
        if batches == 0:  # nothing left of this epoch at this world size
            progress.end_epoch()
        for index, (source, targets) in enumerate(self.loader, 1):
            step_started = time.perf_counter()
            loss = self._run_batch(source.to(self.device), targets.to(self.device))
            verdict = self.agreement.check(loss, lease_lost=self.lease is not None and self.lease.lost)
            if verdict != Verdict():
                return self._interrupted(verdict)
            loss_sum += loss
            self.telemetry.step(time.perf_counter() - step_started)
            if not self._estimated:  # after a step: the optimizer's state exists and counts
                self._estimate_save()
            if index == batches:
                progress.end_epoch()
                self._emit_epoch(loss_sum, index, time.perf_counter() - started)
            last = index == batches and progress.epoch == max_epochs
            due = self.checkpoints.due(progress.global_step, epoch_end=progress.epoch if index == batches else None,
                                       last=last)
            # only the final save waits for the one before it: training never blocks on a slow or hung upload
            if due and not self._save(None if last else 0.0):
                return self._nonfinite()
        return None

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        self.progress.advance(len(source) * self.env.world_size)
        return loss.detach()

    def _emit_epoch(self, loss_sum: torch.Tensor, steps: int, seconds: float) -> None:
        samples = steps * self.sampler.batch_size * self.env.world_size
        self.telemetry.emit({"event": "epoch", "epoch": self.progress.epoch, "global_step": self.progress.global_step,
                             "loss": round(loss_sum.item() / max(steps, 1), 6),
                             "samples_per_s": round(samples / seconds, 1), "seconds": round(seconds, 4)})

    def _estimate_save(self) -> None:
        """Say how long a save takes (rank 0), from the last manifest or a small upload probe."""
        self._estimated = True
        try:
            estimate = self.checkpoints.save_estimate()
        except StorageError as error:
            self.telemetry.emit({"event": "checkpoint_failed", "step": None, "error": f"save estimate: {error}"})
            return
        if estimate:
            self.watch.estimate(*estimate)

    def _report_resume(self, resumed: Resumed) -> None:
        event = {"event": "resume", **self.progress.state_dict(), "checkpoint": resumed.uri}
        if resumed.world_size != self.env.world_size:  # a resize: the same samples, another global batch
            event["world_size"] = {"saved": resumed.world_size, "now": self.env.world_size}
        self.telemetry.emit(event)

    def _save(self, timeout: float | None) -> bool:
        """Checkpoint this step (a collective: every rank calls it at the same step) once the previous save is done,
        waiting at most ``timeout`` for it (None: as long as it takes), else this step is not saved; False if the
        weights are not finite, which is the same on every rank."""
        step = self.progress.global_step
        if self._saved_step == step:
            return True
        if not self._weights_finite():
            return False
        self._saved_step = step
        if not self.checkpoints.save(step, timeout, epoch=self.progress.epoch,
                                     epoch_samples=self.progress.epoch_samples):
            self.telemetry.emit({"event": "checkpoint_failed", "step": step,
                                 "error": "not saved: the previous save was still running"})
        return True

    def _weights_finite(self) -> bool:
        """The same answer on every rank: under FSDP each rank checks its shard and the ranks agree."""
        finite = all(bool(torch.isfinite(_local(tensor)).all()) for tensor in self.module.state_dict().values()
                     if tensor.is_floating_point())
        if not self.fsdp or self.env.world_size == 1:
            return finite
        flag = torch.tensor([int(finite)], device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        return bool(flag.item())

    def _weights_sha256(self) -> str:
        """Of the whole model: under FSDP gathered from every rank's shard (a collective)."""
        if not self.fsdp:
            return weights_sha256(self.module)
        return state_sha256(get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True)))

    def _interrupted(self, verdict: Verdict) -> Outcome:
        if verdict.nonfinite:
            return self._nonfinite()
        if verdict.lease_lost:
            if self.lease:
                sys.stderr.write(f"train: error: {self.lease.lost_message}\n")
            return Outcome({"event": "lease_lost", "global_step": self.progress.global_step,
                            "checkpoint": self.checkpoints.durable}, EXIT_CONFLICT)
        return self._stopped()

    def _stopped(self) -> Outcome:
        """SIGTERM: rank 0 saves this step within the grace budget; every rank asks to be retried."""
        step = self.progress.global_step
        if self._save(self.budget.remaining(self.stop)) and not self.checkpoints.wait(self.budget.remaining(self.stop)):
            self.telemetry.emit({"event": "checkpoint_failed", "step": step,
                                 "error": f"not written within the {self.budget.seconds:.1f}s grace budget"})
        # None on a rank that got no signal itself (another rank's stop, agreed): its clock says nothing of when
        waited = None if self.stop.requested_at is None else round(time.monotonic() - self.stop.requested_at, 3)
        return Outcome({"event": "stopped", "global_step": step, "checkpoint": self.checkpoints.durable,
                        "seconds_since_sigterm": waited}, EXIT_RETRYABLE)

    def _nonfinite(self) -> Outcome:
        self.checkpoints.wait()
        if self.env.is_main:
            sys.stderr.write(f"train: error: loss or weights not finite at step {self.progress.global_step}; no "
                             f"checkpoint of them is written; last durable checkpoint: "
                             f"{self.checkpoints.durable or 'none'}\n")
        return Outcome({"event": "nonfinite", "global_step": self.progress.global_step,
                        "checkpoint": self.checkpoints.durable}, EXIT_NONFINITE)

    def _finish(self) -> Outcome:
        done = {"event": "done", "epochs": self.progress.epoch, "global_step": self.progress.global_step,
                "weights_sha256": self._weights_sha256(), "checkpoint": None}
        if not self.checkpoints.publishes:
            return Outcome(done)
        self.checkpoints.wait()
        done["checkpoint"] = self.checkpoints.durable
        if self.checkpoints.durable_step == self.progress.global_step:
            return Outcome(done)
        sys.stderr.write(f"train: error: the final checkpoint (step {self.progress.global_step}) is not durable; "
                         f"last durable checkpoint: {self.checkpoints.durable or 'none'}\n")
        return Outcome(done, EXIT_RETRYABLE)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (FSDP), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def identity(args: TrainArgs) -> dict[str, Any]:
    """What shapes a run: a checkpoint only resumes a run with the same values. The world size is not part of
    it: model and optimizer state do not depend on it, and the data position is kept in samples."""
    return {"model": args.model, "dataset_size": args.dataset_size, "seed": args.seed,
            "batch_size": args.batch_size, "lr": args.lr, "dropout": args.dropout}


def open_checked_storage(uri: str | None, rank: int = 0) -> Storage | None:
    """The checkpoint storage, checked reachable before any process group starts; requests name the rank."""
    if uri is None:
        return None
    storage = open_storage(uri, user_agent=f"gpuyard-rank/{rank}")
    storage.check()
    return storage


def build_trainer(args: TrainArgs, env: dist.DistEnv, storage: Storage | None, telemetry: Telemetry,
                  stop: StopRequest | None = None, lease: Lease | None = None) -> Trainer:
    """Data, model, optimizer, this rank's RNG and the checkpoint manager, handed to a Trainer (which resumes)."""
    dist.pin_cpu_threads(env)
    loader = build_loader(synthetic_dataset(args.dataset_size, args.seed), args.batch_size,
                          env.rank, env.world_size, args.seed)
    model = build_model(args.model, args.seed, args.dropout)
    if args.parallel == "fsdp":  # sharded before the optimizer is built over its (now DTensor) parameters
        model = fully_shard(model.to(dist.device(env)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM)
    rng = RankRNG(args.seed, env.rank, dist.device(env))
    rng.reseed()
    watch = GraceWatch(GraceBudget(args.grace_period), telemetry.emit)
    checkpoints = checkpoint_manager(args, env, storage, lambda event: (telemetry.emit(event), watch.observe(event)),
                                     lease, rng.reseed)
    return Trainer(model, loader, optimizer, rng, checkpoints, watch, telemetry, env, stop or StopRequest(), lease,
                   fsdp=args.parallel == "fsdp")


def sharded(args: TrainArgs) -> bool:
    return args.checkpoint_format == "sharded" or args.parallel == "fsdp"


def checkpoint_manager(args: TrainArgs, env: dist.DistEnv, storage: Storage | None, emit, lease: Lease | None,
                       reseed) -> CheckpointManager | ShardedCheckpointManager:
    """One object by rank 0 (``--checkpoint-format one``) or every rank its part (``sharded``, gpuyard.jobs.workload.engine;
    always under FSDP, where no rank holds the whole model)."""
    schedule, guard = SaveSchedule(args.save_every, args.save_every_steps), lease.confirm if lease else lambda: None
    if sharded(args):
        checkpointer = ShardedCheckpointer(storage, identity(args), env.rank, emit=emit, guard=guard) if storage else None
        return ShardedCheckpointManager(checkpointer, schedule, env, reseed=reseed, replicated=args.parallel == "ddp")
    checkpointer = Checkpointer(storage, identity(args), emit=emit, guard=guard) if storage else None
    return CheckpointManager(checkpointer, schedule, env, reseed=reseed)


def _take_lease(lease: Lease | None, env: dist.DistEnv, device: torch.device) -> tuple[str, int] | None:
    """Rank 0 takes the writer lease; every rank learns whether it failed: the one-line reason and the exit status
    (2 when another run holds it, 143 when the storage could not be reached)."""
    failure = None
    if lease:
        try:
            lease.acquire()
        except LeaseHeld as error:
            failure = (str(error), EXIT_CONFLICT)
        except StorageError as error:
            failure = (f"could not take the checkpoint lease: {error}", EXIT_RETRYABLE)
    code = torch.tensor([failure[1] if failure else 0], device=device)
    if env.world_size > 1:
        torch.distributed.all_reduce(code, op=torch.distributed.ReduceOp.MAX)
    if not code.item():
        return None
    return failure or ("rank 0 could not take the checkpoint lease", int(code.item()))


def run(args: TrainArgs, env: dist.DistEnv, storage: Storage | None, stop: StopRequest | None = None,
        reporter: Reporter | None = None) -> Outcome:
    """Train inside a joined process group; returns this rank's outcome, rank 0 reports every event."""
    telemetry = Telemetry(reporter or Reporter(enabled=env.is_main), TrainMetrics())
    if env.is_main and args.metrics_port is not None:
        telemetry.metrics.serve(args.metrics_port)
    lease = Lease(storage, args.lease_seconds) if storage and env.is_main else None
    failure = _take_lease(lease, env, dist.device(env))
    if failure:
        return _failed(env, failure[0], {"event": "lease_held"}, failure[1])
    try:
        outcome = build_trainer(args, env, storage, telemetry, stop, lease).train(args.total_epochs)
    except IdentityMismatch as error:
        return _failed(env, str(error), {"event": "identity_mismatch"}, EXIT_CONFLICT)
    except ResumeFailed as error:
        return _failed(env, str(error), {"event": "resume_failed"}, EXIT_RETRYABLE)
    finally:
        if lease:
            lease.release()
    telemetry.reporter.done(outcome.event)
    return outcome


def _failed(env: dist.DistEnv, message: str, event: Event, exit_code: int) -> Outcome:
    if env.is_main:
        sys.stderr.write(f"train: error: {message}\n")
    return Outcome(event, exit_code)


def check_inputs(argv: list[str], serves_metrics: bool = True) -> tuple[TrainArgs, dist.DistEnv, Storage | None]:
    """Arguments, launcher environment, storage and checkpoint identity; anything wrong is one line and exit 2.

    ``serves_metrics`` is False where this process is not one of the job's ranks (the Ray driver).
    """
    args = exit_on_bad_args(argv)
    try:
        env = dist.launcher_env()
        if serves_metrics and env.is_main and args.metrics_port is not None:
            check_port(args.metrics_port)
        storage = open_checked_storage(args.checkpoint_uri, env.rank)
        if storage and sharded(args):
            ShardedCheckpointer(storage, identity(args)).newest()
        elif storage:
            Checkpointer(storage, identity(args)).newest_manifest()
    except (dist.LaunchError, PortInUse, StorageError, IdentityMismatch) as error:
        sys.stderr.write(f"train: error: {one_line(error)}\n")
        raise SystemExit(EXIT_CONFLICT) from None
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
        dist.destroy_process_group()
    except RuntimeError as error:
        if not dist.lost_peer(error):
            raise
        # another rank or its node is gone: the process group is broken, a restart resumes from the checkpoint
        first_line = str(error).strip().splitlines()[0]
        sys.stderr.write(f"train: error: rank {env.rank} lost a peer ({first_line}): exit {EXIT_RETRYABLE}\n")
        exit_code = EXIT_RETRYABLE
    dist.leave(exit_code)  # everything is saved and reported by now


if __name__ == "__main__":
    main(sys.argv[1:])
