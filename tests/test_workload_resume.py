"""Every rank resumes from the one checkpoint rank 0 chose, with its own RNG state, at any world size.

Real torchrun processes and a real moto S3; faults are injected on the wire (a proxy in front of moto).
"""

import os
import signal
import sys
from functools import cache

import boto3
import pytest
import torch

from gpuyard.infra.conventions import EXIT_RETRYABLE
from gpuyard.jobs.workload.args import TORCHRUN_MODULE, TrainArgs
from gpuyard.jobs.workload.checkpoint import data_name, manifest_name
from gpuyard.jobs.workload.data import ResumableSampler, synthetic_dataset
from workload_launch import (FaultyProxy, done_event, events, finished, python_cmd, run, start, torchrun_cmd, trained,
                             wait_for)

pytestmark = pytest.mark.slow
ARGS = TrainArgs(total_epochs=4, save_every=1, batch_size=32, seed=21, lease_seconds=2)
STEPS_WORLD_2 = 2048 // 2 // 32  # per epoch


def wrapped_torchrun(args: TrainArgs) -> list[str]:
    """torchrun as the templates run it: its exit status is its workers'."""
    return [sys.executable, "-m", TORCHRUN_MODULE, *torchrun_cmd(args)[1:]]


@cache
def uninterrupted(args: TrainArgs, launcher=torchrun_cmd) -> dict:
    return trained(done_event(run(launcher(args), timeout=600)))


def test_one_failed_get_on_rank_1_fails_every_rank_together_and_the_next_start_resumes_both_there(
        tmp_path, local_aws):
    """Issue 24 measured rank 1 resuming from step 32 and rank 0 from 64 after one failed GET on rank 1."""
    boto3.client("s3").create_bucket(Bucket="ckpt")
    first_half = ARGS.model_copy(update={"total_epochs": 2, "checkpoint_uri": "s3://ckpt/run"})
    done_event(run(torchrun_cmd(first_half), env=local_aws.env, timeout=600))  # checkpoints at steps 32 and 64

    proxy = FaultyProxy(local_aws.port)
    proxy.fail(f"GET /ckpt/run/{data_name(2 * STEPS_WORLD_2)}".encode(), nth=2)  # rank 0 reads it first, then rank 1
    full = first_half.model_copy(update={"total_epochs": 4})
    failed = run(wrapped_torchrun(full), env={**local_aws.env, "AWS_ENDPOINT_URL": proxy.endpoint_url}, timeout=600)
    proxy.close()
    assert proxy.failed_request and b"gpuyard-rank/1" in proxy.failed_request  # the GET the proxy refused was rank 1's
    assert failed.returncode == EXIT_RETRYABLE, failed.stderr[-3000:]
    assert (f"rank 1 could not load {manifest_name(2 * STEPS_WORLD_2)}, the checkpoint rank 0 chose"
            in failed.stderr), failed.stderr[-3000:]
    assert not any(event["event"] == "checkpoint" for event in events(failed.stdout))  # nobody trained on

    resumed = run(wrapped_torchrun(full), env=local_aws.env, timeout=600)
    assert next(e for e in events(resumed.stdout) if e["event"] == "resume")["global_step"] == 2 * STEPS_WORLD_2
    assert trained(done_event(resumed)) == uninterrupted(full.model_copy(update={"checkpoint_uri": None}))


def test_every_rank_restores_its_own_rng_so_per_rank_dropout_resumes_bitwise(tmp_path):
    """Dropout draws each rank's masks from its own generator: restoring one rank's state onto every rank (or
    none) would give another run."""
    args = ARGS.model_copy(update={"model": "mlp", "dropout": 0.25, "total_epochs": 30, "save_every": 10,
                                   "save_every_steps": 10, "checkpoint_uri": str(tmp_path / "ckpt")})
    out = tmp_path / "out"
    job = start(torchrun_cmd(args), out)
    wait_for(lambda: (tmp_path / "ckpt" / manifest_name(40)).exists(), timeout=300, what="the step-40 checkpoint")
    os.kill(job.pid, signal.SIGTERM)
    stopped = next(e for e in events(finished(job, out).stdout) if e["event"] == "stopped")
    saved = torch.load(tmp_path / "ckpt" / data_name(stopped["global_step"]), weights_only=True)
    ranks = saved["ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])

    resumed = run(torchrun_cmd(args), timeout=600)
    assert next(e for e in events(resumed.stdout) if e["event"] == "resume")["global_step"] == stopped["global_step"]
    assert trained(done_event(resumed)) == uninterrupted(args.model_copy(update={"checkpoint_uri": None}))


def test_a_job_shrunk_from_2_ranks_to_1_resumes_mid_epoch_and_finishes(tmp_path):
    """World size is not part of the run's identity: the data position is remapped by samples (the per-rank
    batch stays --batch_size, so the global batch halves)."""
    args = ARGS.model_copy(update={"model": "mlp", "total_epochs": 20, "save_every": 10, "save_every_steps": 10,
                                   "checkpoint_uri": str(tmp_path / "ckpt")})
    out = tmp_path / "out"
    job = start(torchrun_cmd(args), out)
    wait_for(lambda: (tmp_path / "ckpt" / manifest_name(50)).exists(), timeout=300, what="the step-50 checkpoint")
    os.kill(job.pid, signal.SIGTERM)
    stopped = next(e for e in events(finished(job, out).stdout) if e["event"] == "stopped")

    shrunk = run(python_cmd(args), timeout=600)
    resume = next(e for e in events(shrunk.stdout) if e["event"] == "resume")
    assert resume["world_size"] == {"saved": 2, "now": 1} and resume["global_step"] == stopped["global_step"]
    # the samples trained, 64 a step at 2 ranks: a stop after an epoch's last batch resumes at (epoch, 2048), the
    # same place as (epoch + 1, 0) (measured in a cold .ci/run, where the stop came at step 96)
    position = resume["epoch"] * 2048 + resume["epoch_samples"]
    assert position == stopped["global_step"] * 64 and 0 <= resume["epoch_samples"] <= 2048
    done = done_event(shrunk)
    remaining = (args.total_epochs * 2048 - position) // 32  # at world size 1
    assert done["epochs"] == args.total_epochs and done["global_step"] == stopped["global_step"] + remaining


@pytest.mark.parametrize("before, after", [(2, 1), (2, 3), (4, 2)])
def test_after_a_resize_every_sample_of_the_epoch_is_trained_exactly_once(before, after):
    dataset = synthetic_dataset(100, 0)
    batch = 4
    first = [ResumableSampler(dataset, batch, rank, before, seed=7) for rank in range(before)]
    for sampler in first:
        sampler.set_position(epoch=3)
    steps = 5
    trained_before = [index for sampler in first for index in list(sampler)[:steps * batch]]
    rest = [ResumableSampler(dataset, batch, rank, after, seed=7) for rank in range(after)]
    for sampler in rest:
        sampler.set_position(epoch=3, consumed=steps * batch * before)
    trained_after = [index for sampler in rest for index in sampler]
    assert sorted(trained_before + trained_after)[:100] == list(range(100))
    assert len(trained_before) + len(trained_after) - 100 < after  # only the last round's padding repeats


def test_an_unchanged_world_size_resumes_the_same_order():
    dataset = synthetic_dataset(100, 0)
    for rank in range(3):
        whole = ResumableSampler(dataset, 4, rank, 3, seed=1)
        whole.set_position(2)
        resumed = ResumableSampler(dataset, 4, rank, 3, seed=1)
        resumed.set_position(2, consumed=24)
        assert list(resumed) == list(whole)[8:]
