"""Stopping on SIGTERM at a step boundary every rank agrees on, within the pod's grace period.

The kubelet signals the container's PID 1 (torchrun, mpirun, the Ray entry or python); torchrun and
mpirun forward SIGTERM to their ranks, but any subset of ranks may be the one signalled. About every
``AGREE_SECONDS`` each rank contributes its flags to one small all-reduce (MAX), so all ranks see the
same verdict after the same step and stop together; rank 0 then writes a step checkpoint and every
rank exits with ``EXIT_RETRYABLE``.
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

# How often the ranks agree whether to stop: about every 2 s whatever a step takes, so a stop waits at most
# about this long plus one step (every N steps would wait N * 5-10 s on a large model). bench/bench_interrupt.py
# measures what it costs against the bare DDP loop.
AGREE_SECONDS = 2.0
# SIGTERM, and SIGUSR1: the stop request that gpuyard.jobs.workload.launch sends mpirun, which Open MPI forwards to
# every rank at once (a SIGTERM to mpirun reaches the ranks only after odls_base_sigkill_timeout, and while Open MPI
# waits it does not read the ranks' output: see jobs/workload/launch.py)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Set by SIGTERM (or by a launcher on this rank's behalf); remembers when it first arrived."""

    def __init__(self) -> None:
        self.requested_at: float | None = None

    def install(self) -> None:
        """Handle the stop signals in this process (only possible from the main thread)."""
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                signal.signal(signum, lambda signum, frame: self.set())

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
    """About every ``seconds``, one all-reduce (MAX) of four numbers: stop, non-finite, lease lost, and the
    seconds a step has taken since the last agreement.

    Every rank receives the same slowest step time, so every rank computes the same number of steps to
    the next agreement (``seconds`` of the slowest rank's steps, at least one) and they reduce at the
    same steps again. In between a rank only folds its loss into a local non-finite flag, with no
    synchronisation.
    """

    def __init__(self, request: StopRequest, world_size: int, device: torch.device, seconds: float = AGREE_SECONDS):
        self.request, self.world_size, self.seconds = request, world_size, seconds
        self._nonfinite = torch.zeros((), dtype=torch.bool, device=device)
        self._flags = torch.zeros(4, dtype=torch.float64, device=device)
        self._steps_left, self._steps, self._since = 1, 0, time.perf_counter()

    def check(self, loss: torch.Tensor, lease_lost: bool = False) -> Verdict:
        self._nonfinite |= ~torch.isfinite(loss)
        self._steps, self._steps_left = self._steps + 1, self._steps_left - 1
        if self._steps_left > 0:
            return Verdict()
        now = time.perf_counter()
        self._flags[0] = float(self.request.is_set)
        self._flags[1] = self._nonfinite.to(torch.float64)
        self._flags[2] = float(lease_lost)
        self._flags[3] = (now - self._since) / self._steps
        if self.world_size > 1:
            dist.all_reduce(self._flags, op=dist.ReduceOp.MAX)
        stop, nonfinite, lost, step_seconds = self._flags.tolist()
        self._steps_left = max(1, int(self.seconds / step_seconds)) if step_seconds > 0 else 1
        self._steps, self._since = 0, now
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

    Once after the first step from an estimate, then after a save that overran, each time the checkpoint has grown.
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
