"""Faults on real processes: a killed worker, rank 0 killed mid-save, an S3 outage, a corrupted object."""

import json
import os
import re
import signal
from functools import cache

import boto3
import pytest
import torch

from gpuyard.jobs.workload.args import TrainArgs
from gpuyard.jobs.workload.checkpoint import Checkpointer, data_name, manifest_name, serialize
from gpuyard.jobs.workload.storage import LocalStorage, S3Storage
from gpuyard.jobs.workload.train import identity
from workload_launch import (FaultyProxy, children, done_event, environ_of, events, finished, python_cmd, run,
                             start, torchrun_cmd, trained, wait_for)

pytestmark = pytest.mark.slow
SHORT = TrainArgs(total_epochs=4, save_every=1, batch_size=32, seed=11, lease_seconds=2)
STEPS = 2048 // 32  # per epoch at world size 1


@cache
def uninterrupted(args: TrainArgs, launcher=python_cmd) -> dict:
    return trained(done_event(run(launcher(args))))


def _latest(storage, args: TrainArgs, **kwargs):
    return Checkpointer(storage, identity(args), **kwargs).load_latest()


def _assert_every_manifest_names_its_data(storage) -> None:
    names = storage.names()
    for manifest in (n for n in names if n.endswith(".json")):
        assert json.loads(storage.get(manifest))["data"] in names, names


def _moto_through(proxy: FaultyProxy, local_aws) -> dict[str, str]:
    boto3.client("s3").create_bucket(Bucket="ckpt")
    return {**local_aws.env, "AWS_ENDPOINT_URL": proxy.endpoint_url}


def test_sigkill_a_worker_after_the_first_checkpoint_restarts_to_bitwise_identical_weights(tmp_path):
    args = TrainArgs(total_epochs=10, save_every=2, batch_size=32, dataset_size=4096, seed=5, lease_seconds=2,
                     checkpoint_uri=str(tmp_path / "ckpt"))
    out = tmp_path / "out"
    job = start(torchrun_cmd(args, max_restarts=3), out)
    wait_for(lambda: (tmp_path / "ckpt" / manifest_name(128)).exists(), what="the first checkpoint")
    rank_1 = next(pid for pid in children(job.pid) if environ_of(pid).get("RANK") == "1")
    os.kill(rank_1, signal.SIGKILL)
    result = finished(job, out)
    resumed = [e["epoch"] for e in events(result.stdout) if e["event"] == "resume"]
    assert resumed and resumed[0] >= 2, result.stdout
    reference = args.model_copy(update={"checkpoint_uri": str(tmp_path / "reference")})
    assert trained(done_event(result)) == uninterrupted(reference, torchrun_cmd)


def test_sigkill_rank_0_between_data_and_manifest_leaves_the_previous_checkpoint(tmp_path, local_aws):
    """The first save lands; the next one to be written (a periodic save is skipped while one is in flight, so
    its step depends on the machine) has its data uploaded and its manifest's upload held when rank 0 dies."""
    proxy = FaultyProxy(local_aws.port)
    env = _moto_through(proxy, local_aws)
    args = SHORT.model_copy(update={"checkpoint_uri": "s3://ckpt/run"})
    proxy.hold(rb"PUT /ckpt/run/(?!%s)ckpt-\d{9}\.json " % manifest_name(STEPS).encode())
    trainer = start(python_cmd(args), tmp_path / "out", env)
    assert proxy.held.wait(timeout=90), (tmp_path / "out").read_text()
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(timeout=30)
    proxy.close()
    held_step = int(re.search(rb"ckpt-(\d{9})\.json", proxy.held_request).group(1))

    skipped = []
    latest = _latest(S3Storage("ckpt", "run"), args, emit=skipped.append)
    assert latest.step == STEPS < held_step
    assert skipped == [{"event": "checkpoint_skipped", "name": data_name(held_step),
                        "reason": "no manifest (partial write)"}]
    resumed = run(python_cmd(args), env=local_aws.env)
    assert {"event": "resume", "epoch": 1, "epoch_samples": 0, "global_step": STEPS,
            "checkpoint": f"s3://ckpt/run/{manifest_name(STEPS)}"} in events(resumed.stdout)
    assert trained(done_event(resumed)) == uninterrupted(SHORT)


def test_s3_outage_during_training_saves_retry_training_goes_on(tmp_path, local_aws):
    proxy = FaultyProxy(local_aws.port)
    env = _moto_through(proxy, local_aws)
    args = TrainArgs(total_epochs=60, save_every=1, batch_size=32, seed=2, checkpoint_uri="s3://ckpt/run",
                     lease_seconds=2)
    out = tmp_path / "out"
    trainer = start(python_cmd(args), out, env)
    wait_for(lambda: '"event": "checkpoint"' in out.read_text(), what="the first checkpoint")
    proxy.down()  # until a save has used up its retries, however slow the machine
    wait_for(lambda: " attempts: " in out.read_text(), what="a save to give up")  # not a save skipped while one runs
    proxy.up()
    result = finished(trainer, out)
    proxy.close()

    assert trained(done_event(result)) == uninterrupted(args.model_copy(update={"checkpoint_uri": None}))
    failed = [e["step"] for e in events(result.stdout) if e["event"] == "checkpoint_failed" and "attempts" in e["error"]]
    saved = [e["step"] for e in events(result.stdout) if e["event"] == "checkpoint"]
    assert failed
    assert max(saved) == 60 * STEPS and any(step > max(failed) for step in saved)
    storage = S3Storage("ckpt", "run")
    _assert_every_manifest_names_its_data(storage)
    assert _latest(storage, args).step == 60 * STEPS


def test_a_corrupted_checkpoint_is_detected_and_skipped_on_resume(tmp_path):
    """The resume is from the newest save before the corrupted one: epoch 2's, unless it was skipped because
    epoch 1's was still uploading (a loaded machine; the final save always waits)."""
    args = SHORT.model_copy(update={"total_epochs": 3, "checkpoint_uri": str(tmp_path)})
    first = run(python_cmd(args))
    done_event(first)
    saved = [e["step"] for e in events(first.stdout) if e["event"] == "checkpoint"]
    assert saved[-1] == 3 * STEPS, saved
    previous = saved[-2]
    newest = tmp_path / data_name(3 * STEPS)
    newest.write_bytes(newest.read_bytes()[:-100] + bytes(100))
    resumed = run(python_cmd(args.model_copy(update={"total_epochs": 4})))
    skipped = [e for e in events(resumed.stdout) if e["event"] == "checkpoint_skipped"]
    assert [e["name"] for e in skipped] == [manifest_name(3 * STEPS)] and "sha256" in skipped[0]["reason"]
    assert {"event": "resume", "epoch": previous // STEPS, "epoch_samples": 0, "global_step": previous,
            "checkpoint": str(tmp_path / manifest_name(previous))} in events(resumed.stdout)
    assert trained(done_event(resumed)) == uninterrupted(SHORT)
    _assert_every_manifest_names_its_data(LocalStorage(tmp_path))


def test_a_run_meeting_every_kind_of_corrupt_checkpoint_reports_each_and_resumes_from_the_good_one(tmp_path):
    """A dict without a model, a truncated file whose manifest matches, a manifest naming another object:
    issue 24 found the first crashing the run (KeyError: 'model')."""
    args = SHORT.model_copy(update={"total_epochs": 1, "checkpoint_uri": str(tmp_path)})
    done_event(run(python_cmd(args)))
    storage, checkpointer = LocalStorage(tmp_path), Checkpointer(LocalStorage(tmp_path), identity(args), keep=10)
    good = torch.load(tmp_path / data_name(STEPS), weights_only=True)
    checkpointer.save(STEPS + 1, serialize({key: value for key, value in good.items() if key != "model"}))
    checkpointer.save(STEPS + 2, serialize(good)[:-300])
    checkpointer.save(STEPS + 3, serialize(good))
    manifest = json.loads(storage.get(manifest_name(STEPS + 3))) | {"data": "../outside.pt"}
    storage.put(manifest_name(STEPS + 3), json.dumps(manifest).encode())

    resumed = run(python_cmd(args.model_copy(update={"total_epochs": 2})))
    skipped = {e["name"]: e["reason"] for e in events(resumed.stdout) if e["event"] == "checkpoint_skipped"}
    assert set(skipped) == {manifest_name(STEPS + step) for step in (1, 2, 3)}, resumed.stderr[-2000:]
    assert next(e for e in events(resumed.stdout) if e["event"] == "resume")["global_step"] == STEPS
    assert done_event(resumed)["epochs"] == 2


def test_a_fresh_start_estimates_the_save_without_uploading_a_whole_checkpoint(tmp_path, local_aws):
    """Issue 24: every fresh start uploaded a whole extra checkpoint as a timing probe."""
    proxy = FaultyProxy(local_aws.port)
    env = _moto_through(proxy, local_aws)
    args = SHORT.model_copy(update={"model": "mlp", "total_epochs": 1, "checkpoint_uri": "s3://ckpt/run"})
    result = run(python_cmd(args), env=env)
    proxy.close()
    done_event(result)
    estimate = next(e for e in events(result.stdout) if e["event"] == "save_estimate")
    checkpoint = next(e for e in events(result.stdout) if e["event"] == "checkpoint")
    assert estimate["source"] == "probe" and estimate["bytes"] == checkpoint["bytes"] > 2 * 2**20
    before_the_first_save = proxy.requests[:next(i for i, (line, _) in enumerate(proxy.requests)
                                                 if line.startswith(f"PUT /ckpt/run/{data_name(STEPS)}"))]
    uploaded = sum(size for line, size in before_the_first_save if line.startswith("PUT"))
    assert uploaded <= 2**20 + 2**12, before_the_first_save  # the probe and the lease, never the checkpoint's size
