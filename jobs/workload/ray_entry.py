"""Ray Train entrypoint: the same trainer in ``TorchTrainer`` workers on a local or existing Ray cluster.

    python -m jobs.workload.ray_entry TOTAL_EPOCHS SAVE_EVERY --batch_size N [...] [--num-workers N] [--use-gpu]

Ray Train starts the gloo/nccl process group and sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in each
worker, so the workers run ``train.run`` unchanged. Worker output stays in Ray's logs; rank 0 hands
its events (JSON lines, ending with ``done`` or ``stopped``) and exit status to the driver through a Ray
queue at the end; the driver prints them and exits with that status. SIGTERM to the driver sets a flag in a Ray actor that every
worker polls on a thread, so the workers stop at one agreed step as under torchrun. Starts a local Ray
instance unless ``RAY_ADDRESS`` names a cluster (as in a RayJob).
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import tempfile
import threading
from typing import Any

import torch

from jobs.workload import dist, train
from jobs.workload.args import parse_args
from jobs.workload.interrupt import EXIT_RETRYABLE, StopRequest
from jobs.workload.progress import Reporter
from jobs.workload.storage import open_storage


POLL_SECONDS = 0.2


class StopFlag:
    """A Ray actor: the driver sets it on SIGTERM, the workers poll it."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def _poll(flag: Any, stop: StopRequest, finished: threading.Event) -> None:
    import ray

    while not finished.wait(POLL_SECONDS):
        if ray.get(flag.is_set.remote()):
            stop.set()
            return


def _train_loop(config: dict[str, Any]) -> None:
    args, env = parse_args(config["argv"]), dist.launcher_env()
    stop, finished = StopRequest(), threading.Event()
    stop.install()
    threading.Thread(target=_poll, args=(config["stop"], stop, finished), name="stop-poll", daemon=True).start()
    lines = io.StringIO()
    try:
        outcome = train.run(args, env, open_storage(args.checkpoint_uri) if args.checkpoint_uri else None, stop,
                            Reporter(enabled=env.is_main, stream=lines))
    finally:
        finished.set()
    if env.is_main:
        config["done"].put({"lines": lines.getvalue(), "exit_code": outcome.exit_code})


def _launcher_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``--num-workers`` and ``--use-gpu`` (default: this machine has CUDA) for Ray; the rest is the trainer's."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, default=torch.cuda.is_available())
    known, rest = parser.parse_known_args(argv)
    if known.num_workers < 1:
        sys.stderr.write(f"ray_entry: error: --num-workers must be >= 1 (got {known.num_workers})\n")
        raise SystemExit(2)
    return known, rest


def main(argv: list[str]) -> None:
    launcher, trainer_argv = _launcher_args(argv)
    train.check_inputs(trainer_argv, world_size=launcher.num_workers)

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    if "RAY_ADDRESS" in os.environ:
        ray.init(log_to_driver=False)
    else:
        ray.init(num_cpus=launcher.num_workers, include_dashboard=False, log_to_driver=False)
    done = Queue(maxsize=1, actor_options={"num_cpus": 0})
    stop = ray.remote(num_cpus=0)(StopFlag).remote()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set.remote())
    with tempfile.TemporaryDirectory(prefix="gpuyard-ray-") as results:
        TorchTrainer(
            _train_loop, train_loop_config={"argv": trainer_argv, "done": done, "stop": stop},
            scaling_config=ScalingConfig(num_workers=launcher.num_workers, use_gpu=launcher.use_gpu),
            run_config=RunConfig(name="gpuyard-train", storage_path=results),
        ).fit()
    outcome = done.get(timeout=30)
    sys.stdout.write(outcome["lines"])
    ray.shutdown()
    if outcome["exit_code"] == EXIT_RETRYABLE:
        sys.stdout.flush()
        os._exit(EXIT_RETRYABLE)  # as train.main: no seconds of interpreter teardown inside a grace period
    if outcome["exit_code"]:
        raise SystemExit(outcome["exit_code"])


if __name__ == "__main__":
    main(sys.argv[1:])
