"""The reference DDP trainer: one code path under torchrun, mpirun, Ray Train and plain python.

    python -m jobs.workload.train TOTAL_EPOCHS SAVE_EVERY --batch_size N [--checkpoint-uri URI] ...

Grown from the PyTorch DDP tutorial (``multigpu_torchrun.py``): the Trainer is handed its model,
loader and optimizer, loads the newest checkpoint before the DDP wrap and saves
``model.module.state_dict()`` from rank 0 only. On completion rank 0 prints one JSON line
``{"event": "done", "epochs": E, "global_step": S, "weights_sha256": "..."}``.
"""

from __future__ import annotations

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
from jobs.workload.checkpoint import BackgroundSaver, Checkpointer
from jobs.workload.data import build_loader, build_model, synthetic_dataset, weights_sha256
from jobs.workload.metrics import TrainMetrics
from jobs.workload.progress import Reporter
from jobs.workload.storage import Storage, StorageError, open_storage

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


class Trainer:
    """The tutorial's Trainer: resumes before the DDP wrap, trains, saves from rank 0 on a thread."""

    def __init__(self, model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer, save_every: int,
                 checkpointer: Checkpointer | None, telemetry: Telemetry, env: dist.DistEnv):
        self.device = dist.device(env)
        self.model = model.to(self.device)
        self.loader, self.optimizer, self.save_every = loader, optimizer, save_every
        self.checkpointer, self.telemetry, self.world_size = checkpointer, telemetry, env.world_size
        self.saver = BackgroundSaver(checkpointer) if checkpointer and env.is_main else None
        self.epochs_run = self.global_step = 0
        if checkpointer:
            self._load_checkpoint()
        self.model = DDP(self.model, device_ids=[self.device] if self.device.type == "cuda" else None)

    def train(self, max_epochs: int) -> Event:
        """Run the remaining epochs; returns the ``done`` event (same on every rank)."""
        self.telemetry.reporter.start(max_epochs * len(self.loader), self.epochs_run * len(self.loader))
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            self.epochs_run = epoch + 1
            if self.epochs_run % self.save_every == 0 or self.epochs_run == max_epochs:
                self._save_checkpoint()
        if self.saver:
            self.saver.close()
        return {"event": "done", "epochs": self.epochs_run, "global_step": self.global_step,
                "weights_sha256": weights_sha256(self.model.module)}

    def _run_epoch(self, epoch: int) -> None:
        self.loader.sampler.set_epoch(epoch)
        started, loss_sum = time.perf_counter(), torch.zeros((), device=self.device)
        for source, targets in self.loader:
            step_started = time.perf_counter()
            loss_sum += self._run_batch(source.to(self.device), targets.to(self.device))
            self.telemetry.step(time.perf_counter() - step_started)
        seconds = time.perf_counter() - started
        samples = len(self.loader.sampler) * self.world_size
        self.telemetry.emit({"event": "epoch", "epoch": epoch + 1, "global_step": self.global_step,
                             "loss": round(loss_sum.item() / len(self.loader), 6),
                             "samples_per_s": round(samples / seconds, 1), "seconds": round(seconds, 4)})

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        self.global_step += 1
        return loss.detach()

    def _save_checkpoint(self) -> None:
        if self.saver:
            self.saver.submit(self.epochs_run, {
                "epochs_run": self.epochs_run, "global_step": self.global_step,
                "model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
            })

    def _load_checkpoint(self) -> None:
        checkpoint = self.checkpointer.load_latest()
        if checkpoint is None:
            return
        state = checkpoint.state
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if state["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.epochs_run, self.global_step = state["epochs_run"], state["global_step"]
        self.telemetry.emit({"event": "resume", "epoch": self.epochs_run, "global_step": self.global_step})


def open_checked_storage(uri: str | None) -> Storage | None:
    """The checkpoint storage, checked reachable before any process group starts."""
    if uri is None:
        return None
    storage = open_storage(uri)
    storage.check()
    return storage


def build_trainer(args: TrainArgs, env: dist.DistEnv, storage: Storage | None, telemetry: Telemetry) -> Trainer:
    """Data, model and optimizer from the seed, handed to a Trainer (which resumes from ``storage``)."""
    dist.pin_cpu_threads(env)
    loader = build_loader(synthetic_dataset(args.dataset_size, args.seed), args.batch_size,
                          env.rank, env.world_size, args.seed)
    model = build_model(args.model, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM)
    checkpointer = Checkpointer(storage, emit=telemetry.emit) if storage else None
    return Trainer(model, loader, optimizer, args.save_every, checkpointer, telemetry, env)


def run(args: TrainArgs, env: dist.DistEnv, storage: Storage | None) -> Event:
    """Train inside a joined process group; returns the done event on every rank, rank 0 prints it."""
    telemetry = Telemetry(Reporter(enabled=env.is_main), TrainMetrics())
    if env.is_main and args.metrics_port is not None:
        telemetry.metrics.serve(args.metrics_port)
    done = build_trainer(args, env, storage, telemetry).train(args.total_epochs)
    telemetry.reporter.done(done)
    return done


def check_inputs(argv: list[str]) -> tuple[TrainArgs, dist.DistEnv, Storage | None]:
    """Arguments, launcher environment and storage; anything wrong is one line on stderr and exit 2."""
    args = exit_on_bad_args(argv)
    try:
        return args, dist.launcher_env(), open_checked_storage(args.checkpoint_uri)
    except (dist.LaunchError, StorageError) as error:
        sys.stderr.write(f"train: error: {error}\n")
        raise SystemExit(2) from None


def main(argv: list[str]) -> None:
    args, env, storage = check_inputs(argv)
    dist.init_process_group(env)
    try:
        run(args, env, storage)
        torch.distributed.barrier()  # under mpirun rank 0 hosts the store: nobody may leave early
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
