"""A launcher under supervision: its exit status read as the trainer's, a SIGTERM passed on, retries bounded.

    python -m gpuyard.jobs.workload.launch [--restarts N] [--wait-for HOST:PORT,...] [--wait-seconds S] -- COMMAND...

For mpirun in an MPIJob launcher and a Volcano Job master. Open MPI 4's mpirun exits with the status of
the first rank that failed (1 and 2 stay final, 143 and 137 retryable; 205 when it loses the daemon of
a worker node), but with 1 when it is itself sent SIGTERM. Without a signal, a retryable status (128 or
more) reruns the command up to ``--restarts`` times, after waiting (bounded) until every ``--wait-for``
address accepts TCP again (the workers' sshd, back in their new pods; the first run waits for them
too); a final status (below 128) ends it at once, with that status. After a SIGTERM or SIGINT the
launcher exits 143 ("retry") once the command has ended.

How a SIGTERM is passed on to the reference trainer: not as a SIGTERM to mpirun. Open MPI 4.1 cannot
forward SIGTERM (orte/mca/ess/base/ess_base_frame.c ``known_signals``: SIGTERM ``can_forward`` false); on
its own SIGTERM mpirun aborts the job (orte/mca/ess/hnp/ess_hnp_module.c ``clean_abort``), and every
daemon's ``orte_odls_base_default_kill_local_procs`` (orte/mca/odls/base/odls_base_default_fns.c) sends
the ranks SIGCONT, ``sleep()``s ``odls_base_sigkill_timeout`` s, sends SIGTERM, sleeps as long again and
sends SIGKILL, all inside one callback of the event loop that also forwards the ranks' output (IOF). For
those two sleeps nobody reads the ranks' stdout, a pty (orte/mca/iof/base/iof_base_setup.c) that takes about
14 KB without a reader (Linux 6.18): rank 0, still training and printing its JSON lines until its SIGTERM,
blocked in write() once that was full, never reached the stop's agreement or save, and was SIGKILLed. So when
the command runs the reference trainer (``TRAIN_MODULE``) the supervisor sends mpirun SIGUSR1 instead,
the trainer's other stop signal (``gpuyard.jobs.workload.interrupt.STOP_SIGNALS``), which mpirun forwards to
every rank at once through its daemons, from the event loop, without sleeping (ess_hnp_module.c ``signal_forward_callback``;
SIGUSR1 is forwarded by default). The ranks stop, save and exit 143, and mpirun, aborting on that first
143, exits once its daemons' two sleeps are over. Any other command (a user's, through
``gpuyard.jobs.command.mpi_rank``, which may not handle SIGUSR1) gets the SIGTERM, as before; ``--stop-signal``
overrides the choice. A second SIGTERM or SIGINT goes to the command's process group as it is. Nothing is
sent on a timer: a SIGTERM while mpirun is already aborting (after the first rank's 143) made Open MPI 4.1.4
crash in ``PMIx_Finalize`` and hang.

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

from gpuyard.infra.conventions import EXIT_RETRYABLE, LAUNCH_RERUN
from gpuyard.jobs.workload.args import TRAIN_MODULE

# The trainer's stop request other than SIGTERM (gpuyard.jobs.workload.interrupt.STOP_SIGNALS), which mpirun forwards
STOP_REQUEST = signal.SIGUSR1


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.stderr.write("launch: error: give the command after --\n")
        raise SystemExit(2)
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m gpuyard.jobs.workload.launch")
    parser.add_argument("--restarts", type=int, default=0, help="reruns after a retryable exit status")
    parser.add_argument("--wait-for", default="", help="HOST:PORT,... that must accept TCP before each run")
    parser.add_argument("--wait-seconds", type=float, default=300.0)
    parser.add_argument("--stop-signal", type=signal_number, default=None,
                        help="what a first SIGTERM or SIGINT sends the command (default: SIGUSR1 to the reference "
                             "trainer's mpirun, else the signal itself)")
    return parser.parse_args(argv[:split]), argv[split + 1:]


def reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except OSError:
        return False


def wait_for(addresses: list[str], seconds: float) -> bool:
    """True once every address accepts TCP; False, said on stderr, after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not all(reachable(address) for address in addresses):
        if time.monotonic() > deadline:
            sys.stderr.write(f"launch: {','.join(addresses)} not reachable after {seconds:g}s\n")
            return False
        time.sleep(2)
    return True


def signal_number(name: str) -> signal.Signals:
    try:
        return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except KeyError:
        raise argparse.ArgumentTypeError(f"not a signal: {name!r}") from None


def stop_signal(command: list[str]) -> signal.Signals | None:
    """SIGUSR1 for the reference trainer (its stop request, which mpirun forwards at once); None: the signal itself."""
    return STOP_REQUEST if TRAIN_MODULE in command else None


class Supervisor:
    """Runs one command at a time in its own process group. A first SIGTERM or SIGINT is sent to the command as
    ``stop`` (None: as it is), a second to the command's process group."""

    def __init__(self, stop: signal.Signals | None = None) -> None:
        self.stop = stop
        self.signalled = False
        self._child: subprocess.Popen | None = None

    def forward(self, signum: int, frame: object) -> None:
        first = not self.signalled
        self.signalled = True
        if not self._child or self._child.poll() is not None:
            return
        if first and self.stop is not None:
            os.kill(self._child.pid, self.stop)
        else:
            os.killpg(self._child.pid, signum)

    def run(self, command: list[str]) -> int:
        self._child = subprocess.Popen(command, start_new_session=True)
        while True:
            try:
                code = self._child.wait()
                break
            except InterruptedError:
                continue
        return 128 - code if code < 0 else code


def main(argv: list[str]) -> None:
    options, command = parse(argv)
    supervisor = Supervisor(options.stop_signal or stop_signal(command))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, supervisor.forward)
    hosts = [address for address in options.wait_for.split(",") if address]
    # before the first run too: under NetworkPolicies a new pod reaches its peers only once the policy implementation
    # knows its address (kube-router at its next sync; measured in the sim: the launcher's first mpirun exited 255,
    # its ssh to the workers refused); past the bound, mpirun runs anyway and says what it cannot reach
    wait_for(hosts, options.wait_seconds)
    for attempt in range(options.restarts + 1):
        code = supervisor.run(command)
        if supervisor.signalled:
            raise SystemExit(EXIT_RETRYABLE)
        if code < 128 or attempt == options.restarts:
            raise SystemExit(code)
        sys.stderr.write(f"launch: exit {code}, {LAUNCH_RERUN} ({attempt + 1} of {options.restarts})\n")
        if not wait_for(hosts, options.wait_seconds):
            raise SystemExit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
