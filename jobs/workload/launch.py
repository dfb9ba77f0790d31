"""A launcher under supervision: its exit status read as the trainer's, a SIGTERM passed on, retries bounded.

    python -m gpuyard.jobs.workload.launch [--restarts N] [--wait-for HOST:PORT,...] [--wait-seconds S] -- COMMAND...

For mpirun in an MPIJob launcher and a Volcano Job master. Open MPI 4's mpirun exits with the status of
the first rank that failed (1 and 2 stay final, 143 and 137 retryable; 205 when it loses the daemon of
a worker node), but with 1 when it is itself sent SIGTERM. Here a SIGTERM is forwarded to the
command's process group and, once the command has ended, the launcher exits 143 ("retry"). Without a
signal, a retryable status (128 or more) reruns the command up to ``--restarts`` times, after waiting
(bounded) until every ``--wait-for`` address accepts TCP again (the workers' sshd, back in their new
pods; the first run waits for them too); a final status (below 128) ends it at once, with that status.

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


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.stderr.write("launch: error: give the command after --\n")
        raise SystemExit(2)
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m gpuyard.jobs.workload.launch")
    parser.add_argument("--restarts", type=int, default=0, help="reruns after a retryable exit status")
    parser.add_argument("--wait-for", default="", help="HOST:PORT,... that must accept TCP before a rerun")
    parser.add_argument("--wait-seconds", type=float, default=300.0)
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
    """Runs one command at a time in its own process group, forwarding SIGTERM and SIGINT to it."""

    def __init__(self) -> None:
        self.signalled = False
        self._child: subprocess.Popen | None = None

    def forward(self, signum: int, frame: object) -> None:
        self.signalled = True
        if self._child and self._child.poll() is None:
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
    supervisor = Supervisor()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, supervisor.forward)
    hosts = [address for address in options.wait_for.split(",") if address]
    # before the first run too: under NetworkPolicies a new pod reaches its peers only once the policy implementation
    # knows its address (kube-router at its next sync; measured in the sim: the launcher's first mpirun exited 255,
    # its ssh to the workers refused); past the bound, mpirun runs anyway and says what it cannot reach
    if hosts and not wait_for(hosts, options.wait_seconds):
        sys.stderr.write(f"launch: {options.wait_for} not reachable after {options.wait_seconds:g}s\n")
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
