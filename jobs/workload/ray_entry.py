"""Ray Train entrypoint: the same trainer in ``TorchTrainer`` workers on a local or existing Ray cluster.

    python -m jobs.workload.ray_entry TOTAL_EPOCHS SAVE_EVERY --batch_size N [...] [--num-workers N] [--use-gpu]

Ray Train starts the gloo/nccl process group and sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in each
worker, so the workers run ``train.run`` unchanged. Worker output stays in Ray's logs; rank 0 hands
its ``done`` event to the driver through a Ray queue and the driver prints it. Starts a local Ray
instance unless ``RAY_ADDRESS`` names a cluster (as in a RayJob).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

import torch

from jobs.workload import dist, train
from jobs.workload.args import parse_args
from jobs.workload.storage import open_storage


def _train_loop(config: dict[str, Any]) -> None:
    args, env = parse_args(config["argv"]), dist.launcher_env()
    done = train.run(args, env, open_storage(args.checkpoint_uri) if args.checkpoint_uri else None)
    if env.is_main:
        config["done"].put(done)


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
    train.check_inputs(trainer_argv)

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    if "RAY_ADDRESS" in os.environ:
        ray.init(log_to_driver=False)
    else:
        ray.init(num_cpus=launcher.num_workers, include_dashboard=False, log_to_driver=False)
    done = Queue(maxsize=1, actor_options={"num_cpus": 0})
    with tempfile.TemporaryDirectory(prefix="gpuyard-ray-") as results:
        TorchTrainer(
            _train_loop, train_loop_config={"argv": trainer_argv, "done": done},
            scaling_config=ScalingConfig(num_workers=launcher.num_workers, use_gpu=launcher.use_gpu),
            run_config=RunConfig(name="gpuyard-train", storage_path=results),
        ).fit()
    sys.stdout.write(json.dumps(done.get(timeout=30)) + "\n")
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
