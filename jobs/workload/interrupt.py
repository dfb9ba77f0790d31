"""Stopping on SIGTERM at a step boundary every rank agrees on, within the pod's grace period.

The kubelet signals the container's PID 1 (torchrun, mpirun, the Ray entry or python); torchrun and
mpirun forward SIGTERM to their ranks, but any subset of ranks may be the one signalled. Every step
each rank contributes its flags to one small all-reduce (MAX), so all ranks see the same verdict after
the same step and stop together; rank 0 then writes a step checkpoint and every rank exits with
``EXIT_RETRYABLE``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

Event = dict[str, Any]

# The exit status of a stopped (or not durably saved) run must read "retry me" to every operator:
# - Training Operator v1.9 (kubeflow/training-operator, pkg/util/train/train_util.go, IsRetryableExitCode:
#   exitCode >= 128) restarts a replica whose restartPolicy is ExitCode only for 128-255; 1-127 are permanent.
# - MPI Operator v0.8.0 (kubeflow/mpi-operator, pkg/controller/mpi_job_controller.go, setRestartPolicy): ExitCode
#   becomes pod restartPolicy Never and the launcher Job's backoffLimit counts any non-zero exit; OnFailure (our
#   templates) restarts on any non-zero exit.
# - KubeRay v1.7.0 RayJob: spec.backoffLimit retries a failed job whatever the driver's exit code.
# - Volcano Job: `policies` match events (PodEvicted, PodFailed) or one `exitCode`; 143 can be named there.
# - Kubeflow Trainer v2.3.0 runs the trainer in a JobSet's batch/v1 Jobs: backoffLimit counts any failure.
# 143 = 128 + SIGTERM, the status a process killed by SIGTERM has: retryable everywhere above.
EXIT_RETRYABLE = 128 + signal.SIGTERM
EXIT_NONFINITE = 1  # deterministic: a rerun diverges again, so it must not be retried
EXIT_CONFLICT = 2  # another run holds the checkpoint prefix: a configuration error
# bench/bench_interrupt.py on 2 busy cores: one gloo all-reduce per step cost 28% of a bare mlp step (16 ms);
# once every 10 steps costs little and delays a stop by at most 10 steps
AGREE_EVERY_STEPS = 10


class StopRequest:
    """Set by SIGTERM (or by a launcher on this rank's behalf); remembers when it first arrived."""

    def __init__(self) -> None:
        self.requested_at: float | None = None

    def install(self) -> None:
        """Handle SIGTERM in this process (only possible from the main thread)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: self.set())

    def set(self) -> None:
        if self.requested_at is None:
            self.requested_at = time.monotonic()

    @property
    def is_set(self) -> bool:
        return self.requested_at is not None


@dataclass(frozen=True)
class Verdict:
    stop: bool = False
    nonfinite: bool = False
    lease_lost: bool = False


class StepAgreement:
    """Every ``every`` steps one all-reduce of three flags: the same verdict on every rank after the same step.

    Ranks start together and count the same steps, so they reduce at the same steps. In between a rank
    only folds its loss into a local non-finite flag, with no synchronisation.
    """

    def __init__(self, request: StopRequest, world_size: int, device: torch.device, every: int = AGREE_EVERY_STEPS):
        self.request, self.world_size, self.every = request, world_size, every
        self._nonfinite = torch.zeros((), dtype=torch.bool, device=device)
        self._flags = torch.zeros(3, dtype=torch.int32, device=device)
        self._steps = 0

    def check(self, loss: torch.Tensor, lease_lost: bool = False) -> Verdict:
        self._nonfinite |= ~torch.isfinite(loss)
        self._steps += 1
        if self.world_size > 1 and self._steps % self.every:
            return Verdict()
        self._flags[0] = int(self.request.is_set)
        self._flags[1] = self._nonfinite.to(torch.int32)
        self._flags[2] = int(lease_lost)
        if self.world_size > 1:
            dist.all_reduce(self._flags, op=dist.ReduceOp.MAX)
        stop, nonfinite, lost = self._flags.tolist()
        return Verdict(bool(stop), bool(nonfinite), bool(lost))


@dataclass(frozen=True)
class GraceBudget:
    """How long a stop save may take: the grace period less a margin for agreeing, releasing the lease and exiting."""

    grace_period: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.grace_period - max(2.0, 0.1 * self.grace_period))

    def remaining(self, request: StopRequest) -> float:
        started = request.requested_at if request.requested_at is not None else time.monotonic()
        return max(0.0, started + self.seconds - time.monotonic())


class GraceWatch:
    """Warns (as an event) when a checkpoint save could not finish within the grace budget.

    Once at start from an estimate, then after a save that overran, each time the checkpoint has grown.
    """

    def __init__(self, budget: GraceBudget, emit: Callable[[Event], None]):
        self.budget, self.emit = budget, emit
        self._warned_bytes = 0

    def estimate(self, size: int, seconds: float, source: str) -> None:
        self.emit({"event": "save_estimate", "bytes": size, "seconds": round(seconds, 4), "source": source,
                   "grace_period": self.budget.grace_period, "budget_seconds": round(self.budget.seconds, 3)})
        self._check(size, seconds)

    def observe(self, event: Event) -> None:
        if event["event"] == "checkpoint":
            self._check(event["bytes"], event["seconds"])

    def _check(self, size: int, seconds: float) -> None:
        if seconds <= self.budget.seconds or size <= self._warned_bytes:
            return
        self._warned_bytes = size
        self.emit({"event": "grace_warning", "bytes": size, "seconds": round(seconds, 4),
                   "grace_period": self.budget.grace_period,
                   "message": f"a {size / 2**20:.1f} MiB checkpoint takes {seconds:.1f}s to save, more than the "
                              f"{self.budget.seconds:.1f}s a {self.budget.grace_period:g}s grace period leaves: "
                              "a SIGTERM would lose the steps since the previous checkpoint"})
