"""Ray Train entrypoint: the same trainer in ``TorchTrainer`` workers on a local or existing Ray cluster.

    python -m gpuyard.jobs.workload.ray_entry TOTAL_EPOCHS SAVE_EVERY --batch_size N [...] [--num-workers N] [--use-gpu]
        [--max-restarts N]

Ray Train starts the gloo/nccl process group and sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in each
worker, so the workers run ``train.run`` unchanged. Rank 0's output (its JSON lines and its one-line
errors) reaches the driver through a Ray queue line by line as it is written, and the driver prints it
at once, so ``ray job logs`` and ``kubectl logs`` follow the run. The driver exits with rank 0's status.

Stopping: a named Ray actor (``STOP_ACTOR``) holds the stop requests every worker polls. The driver adds
one on SIGTERM (``ray job stop``: Ray 2.60 ``dashboard/modules/job/job_supervisor.py`` sends SIGTERM,
then SIGKILL after ``RAY_JOB_STOP_WAIT_TIME_S``, which the RayJob template sets to the grace budget);
a Ray pod that is going away adds one from its preStop hook (``gpuyard.jobs.workload.ray_stop``) and waits
until the trainer has stopped and saved. Either way every rank stops at one agreed step, as under
torchrun. After a stop that a leaving pod asked for (the driver waits until one of the attempt's nodes
has left), or a worker group that failed (a worker lost without warning), the driver runs the trainer
again, at most ``--max-restarts`` times: it resumes from the newest checkpoint. Final statuses (1, 2) and a stop
of the driver itself are never run again. Starts a local Ray instance unless ``RAY_ADDRESS`` names a
cluster (as in a RayJob).
"""

from __future__ import annotations

import argparse
import io
import os
import queue
import signal
import sys
import tempfile
import threading
import time
from typing import Any

import torch

from gpuyard.infra.conventions import EXIT_RETRYABLE
from gpuyard.jobs.workload import dist, train
from gpuyard.jobs.workload.args import ArgsError, parse_args, whole_number
from gpuyard.jobs.workload.interrupt import StopRequest
from gpuyard.jobs.workload.progress import Reporter

NAMESPACE = "gpuyard"
STOP_ACTOR = "gpuyard-stop"
DRIVER = "driver"
POLL_SECONDS = 0.2
MAX_WORKERS = 10_000  # Ray Train workers of one job; a larger number is a typo (Ray would wait for them forever)
MAX_RESTARTS = 100  # reruns of the worker group; a larger number is a typo
NODE_GONE_SECONDS = 30.0  # after a worker's grace period, how long its node may take to leave the cluster


class StopFlag:
    """A Ray actor: who asked the trainer to stop (the driver, or a leaving node's id), and whether it has."""

    def __init__(self) -> None:
        self._requests: list[str] = []
        self._stopped = False

    def request(self, by: str) -> None:
        self._requests.append(by)

    def requests(self) -> list[str]:
        return list(self._requests)

    def is_set(self) -> bool:
        return bool(self._requests)

    def finish(self) -> None:
        self._stopped = True

    def stopped(self) -> bool:
        return self._stopped

    def reset(self) -> None:
        self._requests, self._stopped = [], False


class QueueLines(io.TextIOBase):
    """A text stream whose every write goes to the driver at once, tagged with the stream it stands for."""

    def __init__(self, lines: Any, stream: str):
        self.lines, self.stream = lines, stream

    def write(self, text: str) -> int:
        self.lines.put((self.stream, text))
        return len(text)


def _poll(flag: Any, stop: StopRequest, finished: threading.Event) -> None:
    import ray

    while not finished.wait(POLL_SECONDS):
        if ray.get(flag.is_set.remote()):
            stop.set()
            return


def _train_loop(config: dict[str, Any]) -> None:
    from contextlib import redirect_stderr

    args, env = parse_args(config["argv"]), dist.launcher_env()
    stop, finished = StopRequest(), threading.Event()
    threading.Thread(target=_poll, args=(config["stop"], stop, finished), name="stop-poll", daemon=True).start()
    lines = config["lines"]
    errors = QueueLines(lines, "stderr") if env.is_main else sys.stderr
    try:
        with redirect_stderr(errors):
            storage = train.open_checked_storage(args.checkpoint_uri, env.rank)
            outcome = train.run(args, env, storage, stop, Reporter(enabled=env.is_main, stream=QueueLines(lines, "stdout")))
    finally:
        finished.set()
    if env.is_main:
        lines.put(("exit", (env.rank, outcome.exit_code)))


def _launcher_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``--num-workers``, ``--use-gpu`` (default: this machine has CUDA) and ``--max-restarts`` for Ray; the rest is
    the trainer's."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--num-workers", type=whole_number, default=2)
    parser.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, default=torch.cuda.is_available())
    parser.add_argument("--max-restarts", type=whole_number, default=0)
    try:
        known, rest = parser.parse_known_args(argv)
    except (argparse.ArgumentError, ArgsError) as error:
        sys.stderr.write(f"ray_entry: error: {error}\n")
        raise SystemExit(2) from None
    if not 1 <= known.num_workers <= MAX_WORKERS:
        sys.stderr.write(f"ray_entry: error: --num-workers must be from 1 to {MAX_WORKERS} (got {known.num_workers})\n")
        raise SystemExit(2)
    if known.max_restarts < 0:
        sys.stderr.write(f"ray_entry: error: --max-restarts must be >= 0 (got {known.max_restarts})\n")
        raise SystemExit(2)
    return known, rest


class Driver:
    """Runs the trainer's worker group until it ends with a status not to retry, printing rank 0's lines."""

    def __init__(self, launcher: argparse.Namespace, trainer_argv: list[str], grace_period: float):
        import ray

        self.launcher, self.trainer_argv, self.grace_period = launcher, trainer_argv, grace_period
        self.flag = ray.remote(num_cpus=0)(StopFlag).options(name=STOP_ACTOR, **_on_this_node()).remote()
        self.stopped_by_signal = False

    def on_sigterm(self, signum: int, frame: Any) -> None:
        self.stopped_by_signal = True
        self.flag.request.remote(DRIVER)

    def run(self) -> int:
        import ray

        for attempt in range(self.launcher.max_restarts + 1):
            nodes = _alive_nodes()
            exit_code = self._attempt()
            requests = ray.get(self.flag.requests.remote())
            if exit_code != EXIT_RETRYABLE or self.stopped_by_signal or DRIVER in requests:
                return exit_code
            if attempt == self.launcher.max_restarts:
                break
            if requests:  # a leaving pod asked: it has been told the trainer stopped, now it goes
                self._wait_for_one_gone(nodes)
            ray.get(self.flag.reset.remote())
            sys.stderr.write(f"ray_entry: running the trainer again ({attempt + 1} of "
                             f"{self.launcher.max_restarts} restarts): it resumes from its newest checkpoint\n")
        return exit_code

    def _attempt(self) -> int:
        codes = self._fit(_train_loop, {"argv": self.trainer_argv}, "gpuyard-train", reporting=1)
        return codes.get(0, EXIT_RETRYABLE)

    def _fit(self, loop: Any, config: dict[str, Any], name: str, reporting: int) -> dict[int, int]:
        """Run `loop` once on a Ray Train worker group, printing the lines of the first `reporting` ranks as they
        come; the exit statuses they reported, by rank (a rank missing: the group failed before it reported)."""
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
        from ray.util.queue import Queue

        lines = Queue(actor_options={"num_cpus": 0, **_on_this_node()})
        codes: dict[int, int] = {}
        ended = threading.Event()
        printer = threading.Thread(target=print_lines, args=(lines, codes, reporting, ended), name="lines",
                                   daemon=True)
        printer.start()
        try:
            with tempfile.TemporaryDirectory(prefix="gpuyard-ray-") as results:
                TorchTrainer(
                    loop, train_loop_config={**config, "lines": lines, "stop": self.flag},
                    scaling_config=ScalingConfig(num_workers=self.launcher.num_workers, use_gpu=self.launcher.use_gpu),
                    run_config=RunConfig(name=name, storage_path=results),
                ).fit()
        except Exception as error:  # a worker (or its node) was lost, or a worker raised: the group failed
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            sys.stderr.write(f"ray_entry: the worker group failed: {first_line}\n")
        finally:
            ended.set()
            printer.join(timeout=30)
            self.flag.finish.remote()
        return codes

    def _wait_for_one_gone(self, nodes: set[str]) -> None:
        """Until a node of the attempt has left the cluster (bounded by a pod's grace period), so the next attempt
        is not placed on the pod that asked to stop."""
        deadline = time.monotonic() + self.grace_period + NODE_GONE_SECONDS
        while time.monotonic() < deadline and nodes <= _alive_nodes():
            time.sleep(POLL_SECONDS)


def _on_this_node() -> dict[str, Any]:
    """Actor options placing a driver's actor on the driver's node: placed on a worker's node, it would die with that
    worker's pod (Ray places actors that need no CPU on any node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}


def _alive_nodes() -> set[str]:
    import ray

    return {node["NodeID"] for node in ray.nodes() if node["Alive"]}


def print_lines(lines: Any, codes: dict[int, int], ranks: int, ended: threading.Event) -> None:
    """Print the lines of ranks 0..`ranks`-1 as they come, until each sent its exit status to `codes` (or the
    attempt ended without)."""
    while len(codes) < ranks:
        try:
            stream, item = lines.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if ended.is_set():
                return
            continue
        if stream == "exit":
            rank, code = item
            codes[rank] = code
            continue
        out = sys.stdout if stream == "stdout" else sys.stderr
        out.write(item)
        out.flush()


def main(argv: list[str]) -> None:
    launcher, trainer_argv = _launcher_args(argv)
    train.check_inputs(trainer_argv, serves_metrics=False)
    args = parse_args(trainer_argv)

    import ray

    if "RAY_ADDRESS" in os.environ:
        ray.init(namespace=NAMESPACE, log_to_driver=False)
    else:
        ray.init(num_cpus=launcher.num_workers, include_dashboard=False, log_to_driver=False, namespace=NAMESPACE)
    driver = Driver(launcher, trainer_argv, args.grace_period)
    signal.signal(signal.SIGTERM, driver.on_sigterm)
    exit_code = driver.run()
    ray.shutdown()  # also stops the local Ray instance ray.init started
    dist.leave(exit_code)


if __name__ == "__main__":
    main(sys.argv[1:])
