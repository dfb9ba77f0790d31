"""The Ray entry for the user's own command: one process per Ray Train worker, as torchrun would start it.

    python -m gpuyard.jobs.command.ray_entry --num-workers N [--use-gpu] [--max-restarts N] [--grace-period S] \
        -- SCRIPT.py ARGS...    (or -- -m MODULE ARGS...)

The reference entry (``gpuyard.jobs.workload.ray_entry``) runs the trainer inside the Ray Train workers; a user's
script instead runs as a child of each worker, with torchrun's variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) and a ``MASTER_ADDR``/``MASTER_PORT`` of its own: rank 0's node and a
free port there, which rank 0 sends over the process group Ray Train has set up (whose store keeps its own
port). Every rank's lines reach the driver, prefixed ``[rank N]``, so ``ray job logs`` and ``kubectl logs``
show them.

Stops and retries are the reference entry's (its ``Driver``): a SIGTERM to the driver or a leaving pod's
preStop hook (``gpuyard.jobs.workload.ray_stop``) sets the stop flag, each worker passes SIGTERM to its child
and the flag reads "stopped" once every child has exited (the script saves on SIGTERM, by the contract).
The attempt's status is the workers' as under ``gpuyard.jobs.workload.torchrun``: the highest failed status,
where a stopped or lost rank (128 or more, or a worker group that failed) reads 143, "retry", and the
driver runs the command again (at most ``--max-restarts`` times); 1 and 2 stay final.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from gpuyard.infra.conventions import EXIT_RETRYABLE
from gpuyard.jobs.workload.ray_entry import NAMESPACE, POLL_SECONDS, Driver
from gpuyard.jobs.workload.torchrun import worker_status


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _child_env(master: tuple[str, int]) -> dict[str, str]:
    """torchrun's variables for this worker's child, from the Ray Train context, with the command's own master."""
    from ray import train

    context = train.get_context()
    return {**os.environ, "RANK": str(context.get_world_rank()), "WORLD_SIZE": str(context.get_world_size()),
            "LOCAL_RANK": str(context.get_local_rank()), "LOCAL_WORLD_SIZE": str(context.get_local_world_size()),
            "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])}


def _forward_lines(stream: Any, lines: Any, rank: int, name: str) -> None:
    for line in iter(stream.readline, ""):
        lines.put((name, f"[rank {rank}] {line}"))


def _command_loop(config: dict[str, Any]) -> None:
    """One worker: start the command with the agreed port, SIGTERM it when the stop flag is set, report its status."""
    import ray
    import torch.distributed as dist
    from ray import train

    rank, lines, flag = train.get_context().get_world_rank(), config["lines"], config["stop"]
    master = [(ray.util.get_node_ip_address(), _free_port()) if rank == 0 else None]
    dist.broadcast_object_list(master, src=0)
    child = subprocess.Popen(config["command"], cwd=config["cwd"], env=_child_env(master[0]), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    readers = [threading.Thread(target=_forward_lines, args=(stream, lines, rank, name), daemon=True)
               for stream, name in ((child.stdout, "stdout"), (child.stderr, "stderr"))]
    for reader in readers:
        reader.start()
    while child.poll() is None:
        try:
            child.wait(POLL_SECONDS)
        except subprocess.TimeoutExpired:
            if ray.get(flag.is_set.remote()):
                child.send_signal(signal.SIGTERM)
                child.wait()
    for reader in readers:
        reader.join()
    lines.put(("exit", (rank, child.returncode)))


def attempt_status(codes: dict[int, int], workers: int) -> int:
    """The attempt's status from its ranks' (negative: killed by that signal): 0, a final status, or 143."""
    if len(codes) < workers:
        return EXIT_RETRYABLE  # a worker never reported: the group failed
    failed = [code for code in codes.values() if code]
    status = worker_status(failed) if failed else 0
    return EXIT_RETRYABLE if status >= 128 else status


class CommandDriver(Driver):
    """The reference entry's driver (stops, retries, the preStop agreement) running the command per worker."""

    def __init__(self, launcher: argparse.Namespace, command: list[str]):
        super().__init__(launcher, command, launcher.grace_period)
        self.cwd = os.getcwd()

    def _attempt(self) -> int:
        config = {"command": [sys.executable, *self.trainer_argv], "cwd": self.cwd}
        codes = self._fit(_command_loop, config, "gpuyard-command", reporting=self.launcher.num_workers)
        return attempt_status(codes, self.launcher.num_workers)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.stderr.write("ray_entry: error: give the command after --: SCRIPT.py ARGS... or -m MODULE ARGS...\n")
        raise SystemExit(2)
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m gpuyard.jobs.command.ray_entry")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--grace-period", type=float, default=30.0)
    options = parser.parse_args(argv[:split])
    for flag, value, minimum in (("--num-workers", options.num_workers, 1), ("--max-restarts", options.max_restarts, 0),
                                 ("--grace-period", options.grace_period, 0)):
        if value < minimum:
            parser.error(f"{flag} must be >= {minimum} (got {value:g})")
    return options, argv[split + 1:]


def main(argv: list[str]) -> None:
    launcher, command = parse(argv)

    import ray

    if "RAY_ADDRESS" in os.environ:
        ray.init(namespace=NAMESPACE, log_to_driver=False)
    else:
        ray.init(num_cpus=launcher.num_workers, include_dashboard=False, log_to_driver=False, namespace=NAMESPACE)
    driver = CommandDriver(launcher, command)
    signal.signal(signal.SIGTERM, driver.on_sigterm)
    exit_code = driver.run()
    ray.shutdown()  # also stops the local Ray instance ray.init started
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


if __name__ == "__main__":
    main(sys.argv[1:])
