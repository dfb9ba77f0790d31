"""A launcher under supervision: its exit status read as the trainer's, a SIGTERM passed on, retries bounded.

    python -m gpuyard.jobs.workload.launch [--restarts N] [--wait-for HOST:PORT,...] [--wait-seconds S] -- COMMAND...

For mpirun in an MPIJob launcher and a Volcano Job master. Open MPI 4's mpirun exits with the status of
the first rank that failed (1 and 2 stay final, 143 and 137 retryable; 205 when it loses the daemon of
a worker node), but with 1 when it is itself sent SIGTERM. Without a signal, a retryable status (128 or
more) reruns the command up to ``--restarts`` times, after waiting (bounded) until every ``--wait-for``
address accepts TCP again (the workers' sshd, back in their new pods); a final status (below 128) ends it
at once, with that status. After a SIGTERM or SIGINT the launcher exits 143 ("retry") once the command
has ended.

How a SIGTERM is passed on: not as a SIGTERM to mpirun. Open MPI 4.1 cannot forward SIGTERM
(orte/mca/ess/base/ess_base_frame.c ``known_signals``: SIGTERM ``can_forward`` false); on its own SIGTERM
mpirun aborts the job (orte/mca/ess/hnp/ess_hnp_module.c ``clean_abort``), and every daemon's
``orte_odls_base_default_kill_local_procs`` (orte/mca/odls/base/odls_base_default_fns.c) sends the ranks
SIGCONT, ``sleep()``s ``odls_base_sigkill_timeout`` s, sends SIGTERM, sleeps as long again and sends
SIGKILL, all inside one callback of the event loop that also forwards the ranks' output (IOF). For
those two sleeps nobody reads the ranks' stdout, a pty (orte/mca/iof/base/iof_base_setup.c), which
holds about 14 KB on Linux: rank 0, still training and printing its JSON lines until its SIGTERM, blocked
in write() once that was full, never reached the stop's agreement or save, and was SIGKILLed. So the
supervisor sends SIGUSR1 (``STOP_SIGNALS``: the trainer's stop request, as SIGTERM) to mpirun itself,
which forwards it to every rank at once through its daemons, from the event loop, without sleeping
(``ess_base_forward_signals``: SIGUSR1 is forwarded by default). The ranks stop, save and exit 143, and
mpirun exits with that status. Only if the command is still running ``--stop-seconds`` later (default:
``$OMPI_MCA_odls_base_sigkill_timeout``, else 10), or at a second SIGTERM or SIGINT, does its process
group get the signal itself (Open MPI's abort above: the ranks' SIGKILL comes two of those timeouts later).

The MPI Operator v0.8.0 runs the launcher in a batch/v1 Job whose ``backoffLimit`` is the MPIJob's
``runPolicy.backoffLimit`` and that counts every failed pod whatever its exit status, with no
podFailurePolicy (kubeflow/mpi-operator, pkg/controller/mpi_job_controller.go ``newLauncherJob``): the
MPIJob template sets it to 0 and lets this process retry, so final failures are never rerun.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from gpuyard.infra.conventions import EXIT_RETRYABLE

# The trainer's stop request other than SIGTERM (gpuyard.jobs.workload.interrupt.STOP_SIGNALS), which mpirun forwards
STOP_REQUEST = signal.SIGUSR1
SIGKILL_TIMEOUT_ENV = "OMPI_MCA_odls_base_sigkill_timeout"
DEFAULT_STOP_SECONDS = 10.0


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.stderr.write("launch: error: give the command after --\n")
        raise SystemExit(2)
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m gpuyard.jobs.workload.launch")
    parser.add_argument("--restarts", type=int, default=0, help="reruns after a retryable exit status")
    parser.add_argument("--wait-for", default="", help="HOST:PORT,... that must accept TCP before a rerun")
    parser.add_argument("--wait-seconds", type=float, default=300.0)
    parser.add_argument("--stop-seconds", type=float, default=None,
                        help="after a SIGTERM, how long the command has to end on the stop request (SIGUSR1) before "
                             "it gets the SIGTERM (default: $OMPI_MCA_odls_base_sigkill_timeout, else 10)")
    return parser.parse_args(argv[:split]), argv[split + 1:]


def reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except OSError:
        return False


def wait_for(addresses: list[str], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not all(reachable(address) for address in addresses):
        if time.monotonic() > deadline:
            return False
        time.sleep(2)
    return True


class Supervisor:
    """Runs one command at a time in its own process group; a SIGTERM or SIGINT is first a stop request
    (``STOP_SIGNALS``' SIGUSR1, to the command itself), then, after ``stop_seconds`` or at a second signal, that
    signal to the command's process group."""

    def __init__(self, stop_seconds: float = DEFAULT_STOP_SECONDS) -> None:
        self.stop_seconds = stop_seconds
        self.signalled = False
        self._signal: int | None = None
        self._deadline: float | None = None
        self._child: subprocess.Popen | None = None

    def forward(self, signum: int, frame: object) -> None:
        first = not self.signalled
        self.signalled, self._signal = True, signum
        if not self._child or self._child.poll() is not None:
            return
        if first:
            self._deadline = time.monotonic() + self.stop_seconds
            os.kill(self._child.pid, STOP_REQUEST)
        else:
            self._escalate()

    def _escalate(self) -> None:
        self._deadline = None
        if self._child and self._child.poll() is None and self._signal is not None:
            os.killpg(self._child.pid, self._signal)

    def run(self, command: list[str]) -> int:
        self._child = subprocess.Popen(command, start_new_session=True)
        while True:
            timeout = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            try:
                code = self._child.wait(timeout)
                break
            except subprocess.TimeoutExpired:
                self._escalate()
            except InterruptedError:
                continue
        return 128 - code if code < 0 else code


def stop_seconds(option: float | None, environ=os.environ) -> float:
    if option is not None:
        return option
    try:
        return float(environ.get(SIGKILL_TIMEOUT_ENV, DEFAULT_STOP_SECONDS))
    except ValueError:
        return DEFAULT_STOP_SECONDS


def main(argv: list[str]) -> None:
    options, command = parse(argv)
    supervisor = Supervisor(stop_seconds(options.stop_seconds))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, supervisor.forward)
    hosts = [address for address in options.wait_for.split(",") if address]
    for attempt in range(options.restarts + 1):
        code = supervisor.run(command)
        if supervisor.signalled:
            raise SystemExit(EXIT_RETRYABLE)
        if code < 128 or attempt == options.restarts:
            raise SystemExit(code)
        sys.stderr.write(f"launch: exit {code}, retryable: running it again ({attempt + 1} of {options.restarts})\n")
        if not wait_for(hosts, options.wait_seconds):
            sys.stderr.write(f"launch: {options.wait_for} not reachable after {options.wait_seconds:g}s\n")
            raise SystemExit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
