"""Trainer overhead and checkpoint I/O, in one run; prints JSON.

    python bench/bench_trainer.py

1. samples/s of our Trainer against a bare DDP loop (same model, data, world size 2 under torchrun),
   with checkpointing off and with a checkpoint every epoch to a local moto S3.
2. one checkpoint save and restore (Checkpointer: data, manifest, prune; list, get, verify, load)
   against a plain boto3 ``upload_file``/``download_file`` of the same bytes to the same endpoint,
   for the bench model's checkpoint (~2 MB) and a 64 MB state; ratios are plain seconds / ours.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from gpuyard.jobs.local_aws import LocalAWS
from gpuyard.jobs.workload import dist
from gpuyard.jobs.workload.args import TrainArgs
from gpuyard.jobs.workload.checkpoint import BackgroundSaver, Checkpointer, serialize
from gpuyard.jobs.workload.data import build_model, synthetic_dataset
from gpuyard.jobs.workload.metrics import TrainMetrics
from gpuyard.jobs.workload.progress import Reporter
from gpuyard.jobs.workload.storage import S3Storage
from gpuyard.jobs.workload.train import Telemetry, build_trainer, open_checked_storage

ARGS = TrainArgs(total_epochs=4, save_every=1, batch_size=64, dataset_size=16384, model="mlp", seed=0)
BUCKET, REPEATS, IO_REPEATS = "bench", 3, 10


def bare_ddp_seconds(args: TrainArgs, env: dist.DistEnv) -> float:
    """The bare loop: what every DDP tutorial writes, nothing else."""
    dataset = synthetic_dataset(args.dataset_size, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = DDP(build_model(args.model, args.seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    torch.distributed.barrier()
    started = time.perf_counter()
    for epoch in range(args.total_epochs):
        sampler.set_epoch(epoch)
        for source, targets in loader:
            optimizer.zero_grad()
            F.mse_loss(model(source), targets).backward()
            optimizer.step()
    torch.distributed.barrier()
    return time.perf_counter() - started


def trainer_seconds(args: TrainArgs, env: dist.DistEnv) -> float:
    trainer = build_trainer(args, env, open_checked_storage(args.checkpoint_uri),
                            Telemetry(Reporter(enabled=False), TrainMetrics()))
    torch.distributed.barrier()
    started = time.perf_counter()
    trainer.train(args.total_epochs)
    torch.distributed.barrier()
    return time.perf_counter() - started


MODES = ("bare", "trainer_no_checkpoint", "trainer_checkpoint_every_epoch")


def _run_mode(mode: str, repeat: int, env: dist.DistEnv) -> float:
    if mode == "bare":
        return bare_ddp_seconds(ARGS, env)
    uri = f"s3://{BUCKET}/run-{repeat}" if mode == "trainer_checkpoint_every_epoch" else None
    return trainer_seconds(ARGS.model_copy(update={"checkpoint_uri": uri}), env)


def worker() -> None:
    """Runs under torchrun: the modes interleaved REPEATS times; rank 0 prints the best samples/s of each."""
    env = dist.launcher_env()
    dist.init_process_group(env)
    dist.pin_cpu_threads(env)
    best = dict.fromkeys(MODES, float("inf"))
    for repeat in range(REPEATS):
        for mode in MODES:
            best[mode] = min(best[mode], _run_mode(mode, repeat, env))
    if env.is_main:
        samples = ARGS.total_epochs * ARGS.dataset_size
        sys.stdout.write(json.dumps({mode: round(samples / seconds, 1) for mode, seconds in best.items()}) + "\n")
    dist.destroy_process_group()
    dist.leave(0)  # not the interpreter's exit, which can deadlock in gloo's teardown


def samples_per_second(aws: LocalAWS) -> dict[str, float]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               __file__, "--worker"]
    result = subprocess.run(command, capture_output=True, text=True, check=True,
                            env={**os.environ, **aws.env, "OMP_NUM_THREADS": "1"})
    return json.loads(result.stdout.strip().splitlines()[-1])


def mlp_checkpoint() -> dict:
    """The bench model's checkpoint state, momentum buffers included."""
    model = build_model(ARGS.model, ARGS.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=ARGS.lr, momentum=0.9)
    F.mse_loss(model(torch.rand(8, 20)), torch.rand(8, 1)).backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def checkpoint_io(state: dict, prefix: str) -> dict[str, float]:
    """Median seconds of our save/restore and of boto3 upload_file/download_file of the same bytes.

    ``training_blocked`` is what a save costs the training loop: BackgroundSaver serializes the
    state and hands the upload to its thread.
    """
    import boto3

    payload = serialize(state)
    checkpointer = Checkpointer(S3Storage(BUCKET, prefix), {"bench": prefix})
    saver = BackgroundSaver(Checkpointer(S3Storage(BUCKET, f"{prefix}-background"), {"bench": prefix}))
    s3 = boto3.client("s3")
    timings: dict[str, list[float]] = {"save": [], "restore": [], "upload_file": [], "download_file": [],
                                       "training_blocked": []}
    with tempfile.TemporaryDirectory() as scratch:
        source, target = Path(scratch) / "ckpt.pt", Path(scratch) / "back.pt"
        source.write_bytes(payload)
        for epoch in range(1, IO_REPEATS + 1):
            timings["save"].append(_timed(lambda: checkpointer.save(epoch, payload)))
            timings["restore"].append(_timed(checkpointer.load_latest))
            timings["upload_file"].append(_timed(lambda: s3.upload_file(str(source), BUCKET, f"plain-{prefix}")))
            timings["download_file"].append(_timed(lambda: s3.download_file(BUCKET, f"plain-{prefix}", str(target))))
            timings["training_blocked"].append(_timed(lambda: saver.submit(epoch, state)))
            saver.wait()
    io = {name: statistics.median(values) for name, values in timings.items()}
    return {"bytes": len(payload), **{f"{name}_s": round(value, 4) for name, value in io.items()},
            "ratio_save": round(io["upload_file"] / io["save"], 3),
            "ratio_restore": round(io["download_file"] / io["restore"], 3),
            "ratio_save_and_restore": round((io["upload_file"] + io["download_file"]) / (io["save"] + io["restore"]), 3)}


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main() -> None:
    with LocalAWS() as aws:
        os.environ.update(aws.env)
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        rates = samples_per_second(aws)
        io = {"mlp_checkpoint": checkpoint_io(mlp_checkpoint(), "mlp"),
              "64mb_state": checkpoint_io({"weights": torch.rand(16 * 2**20)}, "large")}
    report = {
        "setup": {"model": ARGS.model, "dataset_size": ARGS.dataset_size, "batch_size": ARGS.batch_size,
                  "epochs": ARGS.total_epochs, "world_size": 2, "launcher": "torchrun", "backend": "gloo",
                  "best_of": REPEATS, "cpus": os.cpu_count()},
        "samples_per_s": rates,
        "ratio_no_checkpoint": round(rates["trainer_no_checkpoint"] / rates["bare"], 3),
        "ratio_checkpoint_every_epoch": round(rates["trainer_checkpoint_every_epoch"] / rates["bare"], 3),
        "checkpoint_io_plain_boto3_over_ours": io,
    }
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        main()
