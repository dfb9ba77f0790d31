"""torchrun whose exit status is its workers', so an operator can tell a final failure from a retryable one.

    python -m gpuyard.jobs.workload.torchrun [torchrun options] -m gpuyard.jobs.workload.train ...

torch 2.13's torchrun exits 1 whatever happened: a worker failure raises ChildFailedError and a
SIGTERM to the agent raises SignalException (torch/distributed/launcher/api.py ``launch_agent``), both
re-raised through ``@record`` (torch/distributed/run.py ``main``). This runs that same ``main`` and
exits instead with the highest status among the failed workers (a signal counts as 128 + its number):
a rank that exits 1 (non-finite loss) or 2 (lease or identity) ends the pod with that status, which
the templates treat as final, while a rank killed or stopped (137, 143) outranks the others' status and
reads "retry". A SIGTERM to the agent itself exits 143 once torchrun has stopped its workers (said on stderr:
``torchrun: stopped by signal 15, exit 143``), also when torch loses its SignalException: its ``prof`` wrapper
(torch/distributed/elastic/metrics/api.py) assigns ``start = time.time()`` inside the ``try`` whose ``finally``
reads ``start``, so a SIGTERM raised at that assignment surfaces as an UnboundLocalError (the SignalException its
``__context__``), which torchrun alone ends with 1, the final status. Measured in the sim: a TrainJob rank's pod
deleted mid-run exited 1 and its JobSet failed. The workers are stopped all the same (``SimpleElasticAgent.run``
shuts them down in its ``finally``).

torchrun's own restarts (``--max-restarts``) rerun the worker group after any failure, whatever its
status (torch/distributed/elastic/agent/server/api.py ``SimpleElasticAgent._invoke_run``: a FAILED or
UNHEALTHY group is restarted while ``_remaining_restarts > 0``), so they would rerun final failures:
the templates set ``--max-restarts=0`` and leave retries to the operator, which reads this status.
"""

from __future__ import annotations

import sys

from gpuyard.infra.conventions import EXIT_RETRYABLE


def worker_status(exit_codes: list[int]) -> int:
    """The pod's status for its failed workers' exit codes (negative: killed by that signal)."""
    return max(128 - code if code < 0 else code for code in exit_codes) if exit_codes else EXIT_RETRYABLE


def signal_of(error: BaseException | None) -> int | None:
    """The signal of the SignalException ``error`` is, or was raised while handling; None without one."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    while error is not None and not isinstance(error, SignalException):
        error = error.__context__
    return int(error.sigval) if error is not None else None


def main(argv: list[str]) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except ChildFailedError as error:
        raise SystemExit(worker_status([failure.exitcode for failure in error.failures.values()])) from None
    except Exception as error:
        if (signum := signal_of(error)) is None:
            raise
        sys.stderr.write(f"torchrun: stopped by signal {signum}, exit {128 + signum}\n")
        raise SystemExit(128 + signum) from None


if __name__ == "__main__":
    main(sys.argv[1:])
