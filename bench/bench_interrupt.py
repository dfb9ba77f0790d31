"""Interruption: SIGTERM-to-exit time, checkpoint save throughput, per-step agreement overhead; prints JSON.

    python bench/bench_interrupt.py [--skip-1gb] [--only sigterm_to_exit|save_throughput|agreement]

1. SIGTERM to torchrun (2 workers, mlp, checkpoints to a local moto S3) at a random step after the
   first checkpoint: seconds from the signal to torchrun's exit, median and max, against the grace period.
2. One synchronous save (Checkpointer: data, manifest, prune) of 2 MB, 64 MB and 1 GB states against a
   plain boto3 PUT of the same bytes (``put_object``, or ``upload_fileobj`` above the multipart threshold)
   to the same endpoint, in MB/s; 1 GB only if the machine has the memory for it.
3. samples/s of the bare DDP loop against the same loop plus the stop agreement (one all-reduce of four
   float64 values every step, and about every AGREE_SECONDS as the trainer does) and against our Trainer,
   under torchrun with 2 workers.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
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

from gpuyard.jobs.local_aws import LocalAWS, free_port
from gpuyard.jobs.workload import dist
from gpuyard.jobs.workload.args import TRAIN_MODULE, TrainArgs
from gpuyard.jobs.workload.checkpoint import Checkpointer, serialize
from gpuyard.jobs.workload.data import build_model, synthetic_dataset
from gpuyard.jobs.workload.interrupt import AGREE_SECONDS, StepAgreement, StopRequest
from gpuyard.jobs.workload.metrics import TrainMetrics
from gpuyard.jobs.workload.progress import Reporter
from gpuyard.jobs.workload.storage import MULTIPART_THRESHOLD, S3Storage
from gpuyard.jobs.workload.train import Telemetry, build_trainer

BUCKET, SIGTERMS, SAVES, LOOP_REPEATS = "bench", 5, 3, 5
GRACE = 30.0
LOOP = TrainArgs(total_epochs=2, save_every=1, batch_size=64, dataset_size=16384, model="mlp", seed=0)
INTERRUPTED = TrainArgs(total_epochs=200, save_every=50, batch_size=64, dataset_size=4096, model="mlp", seed=0,
                        save_every_steps=20, grace_period=GRACE, lease_seconds=5, checkpoint_uri=f"s3://{BUCKET}/run")
SIZES = {"2MB": 2 * 2**20, "64MB": 64 * 2**20, "1GB": 2**30}


def sigterm_to_exit(aws: LocalAWS, runs: int = SIGTERMS) -> dict:
    """torchrun is PID 1's stand-in: SIGTERM it after the first checkpoint and time its exit."""
    seconds, saves, stops = [], [], []
    rng = random.Random(0)
    for number in range(runs):
        args = INTERRUPTED.model_copy(update={"checkpoint_uri": f"s3://{BUCKET}/sigterm-{number}"})
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                   "127.0.0.1", "--master-port", str(free_port()), "-m", TRAIN_MODULE, *args.to_argv()]
        with tempfile.TemporaryFile("w+") as out:
            job = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, **aws.env, "OMP_NUM_THREADS": "1"})
            _wait_for_checkpoint(out, job)
            time.sleep(rng.uniform(0.0, 2.0))
            signalled = time.monotonic()
            job.send_signal(signal.SIGTERM)
            job.wait(timeout=GRACE * 3)
            seconds.append(time.monotonic() - signalled)
            out.seek(0)
            stopped = [json.loads(line) for line in out if line.startswith('{"event": "stopped"')]
            saves += [event["checkpoint"] is not None for event in stopped]
            stops += [event["seconds_since_sigterm"] for event in stopped if event["seconds_since_sigterm"] is not None]
    return {"runs": runs, "grace_period_s": GRACE, "median_s": round(statistics.median(seconds), 3),
            "max_s": round(max(seconds), 3), "stopped_with_a_durable_checkpoint": sum(saves),
            "agreed_and_saved_after_s": {"median": round(statistics.median(stops), 3), "max": round(max(stops), 3)}}


def _wait_for_checkpoint(out, job: subprocess.Popen) -> None:
    while True:
        out.seek(0)
        if '"event": "checkpoint"' in out.read():
            return
        if job.poll() is not None:
            raise RuntimeError("the trainer ended before its first checkpoint")
        time.sleep(0.05)


def save_throughput(sizes: dict[str, int]) -> dict:
    """MB/s of Checkpointer.save and of a plain boto3 PUT of the same bytes, median of SAVES."""
    import boto3

    s3 = boto3.client("s3")
    results = {}
    for label, size in sizes.items():
        payload = serialize({"weights": torch.rand(size // 4)})
        checkpointer = Checkpointer(S3Storage(BUCKET, f"throughput-{label}"), {"bench": label}, keep=1)
        ours, plain = [], []
        for step in range(1, SAVES + 1):
            ours.append(_timed(lambda: checkpointer.save(step, payload)))
            plain.append(_timed(lambda: _plain_put(s3, f"plain-{label}", payload)))
        megabytes = len(payload) / 2**20
        ours_s, plain_s = statistics.median(ours), statistics.median(plain)
        results[label] = {"bytes": len(payload), "ours_s": round(ours_s, 3), "plain_boto3_s": round(plain_s, 3),
                          "ours_mb_per_s": round(megabytes / ours_s, 1),
                          "plain_boto3_mb_per_s": round(megabytes / plain_s, 1),
                          "ratio_ours_over_plain": round(plain_s / ours_s, 3)}
        del payload
    return results


def _plain_put(s3, key: str, payload: bytes) -> None:
    if len(payload) < MULTIPART_THRESHOLD:
        s3.put_object(Bucket=BUCKET, Key=key, Body=payload)
    else:
        s3.upload_fileobj(io.BytesIO(payload), BUCKET, key)


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def loop_seconds(args: TrainArgs, env: dist.DistEnv, agree_seconds: float | None) -> float:
    """The bare DDP loop of every tutorial, with or without the stop agreement about every ``agree_seconds``
    (0: every step)."""
    dataset = synthetic_dataset(args.dataset_size, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = DDP(build_model(args.model, args.seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    agree = None
    if agree_seconds is not None:
        agree = StepAgreement(StopRequest(), env.world_size, torch.device("cpu"), agree_seconds)
    torch.distributed.barrier()
    started = time.perf_counter()
    for epoch in range(args.total_epochs):
        sampler.set_epoch(epoch)
        for source, targets in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(source), targets)
            loss.backward()
            optimizer.step()
            if agree and agree.check(loss.detach()).stop:
                return float("inf")
    torch.distributed.barrier()
    return time.perf_counter() - started


def trainer_seconds(args: TrainArgs, env: dist.DistEnv) -> float:
    trainer = build_trainer(args, env, None, Telemetry(Reporter(enabled=False), TrainMetrics()))
    torch.distributed.barrier()
    started = time.perf_counter()
    trainer.train(args.total_epochs)
    torch.distributed.barrier()
    return time.perf_counter() - started


MODES = {"bare": lambda env: loop_seconds(LOOP, env, agree_seconds=None),
         "agreement_every_step": lambda env: loop_seconds(LOOP, env, agree_seconds=0.0),
         f"agreement_every_{AGREE_SECONDS:g}_s": lambda env: loop_seconds(LOOP, env, agree_seconds=AGREE_SECONDS),
         "trainer": lambda env: trainer_seconds(LOOP, env)}


def worker() -> None:
    """Under torchrun: the modes interleaved LOOP_REPEATS times; rank 0 prints the best samples/s of each."""
    env = dist.launcher_env()
    dist.init_process_group(env)
    dist.pin_cpu_threads(env)
    best = dict.fromkeys(MODES, float("inf"))
    for _ in range(LOOP_REPEATS):
        for mode, seconds in MODES.items():
            best[mode] = min(best[mode], seconds(env))
    if env.is_main:
        samples = LOOP.total_epochs * LOOP.dataset_size
        sys.stdout.write(json.dumps({mode: round(samples / seconds, 1) for mode, seconds in best.items()}) + "\n")
    dist.destroy_process_group()
    dist.leave(0)  # not the interpreter's exit, which can deadlock in gloo's teardown


def agreement_overhead() -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               __file__, "--worker"]
    result = subprocess.run(command, capture_output=True, text=True, check=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    rates = json.loads(result.stdout.strip().splitlines()[-1])
    return {"samples_per_s": rates, "best_of": LOOP_REPEATS,
            "overhead_pct": {mode: round(100 * (1 - rate / rates["bare"]), 2) for mode, rate in rates.items()
                             if mode != "bare"}}


def _memory_allows_1gb() -> bool:
    """A 1 GB save holds the tensor, its serialization and moto's copy: want 6 GB available."""
    available = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemAvailable"))
    return int(available.split()[1]) * 1024 > 6 * 2**30


def main(skip_1gb: bool, only: str | None) -> None:
    sizes = dict(SIZES)
    skipped = None
    if skip_1gb or not _memory_allows_1gb():
        sizes.pop("1GB")
        skipped = "--skip-1gb" if skip_1gb else "less than 6 GB of memory available"
    with LocalAWS() as aws:
        os.environ.update(aws.env)
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        parts = {"sigterm_to_exit": lambda: sigterm_to_exit(aws), "save_throughput": lambda: save_throughput(sizes),
                 "agreement": agreement_overhead}
        report = {"setup": {"cpus": os.cpu_count(), "launcher": "torchrun", "world_size": 2, "backend": "gloo",
                            "storage": "moto_server on 127.0.0.1", "save_1gb_skipped": skipped}}
        report |= {name: part() for name, part in parts.items() if only in (None, name)}
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        options = sys.argv[1:]
        only = options[options.index("--only") + 1] if "--only" in options else None
        main(skip_1gb="--skip-1gb" in options, only=only)
