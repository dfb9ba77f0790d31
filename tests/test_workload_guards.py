"""What a run refuses to do: resume another run's checkpoint, write beside a live run, save non-finite
weights, or exit 0 when its final checkpoint is not durable. Real processes, a real moto S3."""

import json
import signal
import subprocess
import time

import boto3
import pytest
import torch

from gpuyard.jobs.workload import train
from gpuyard.jobs.workload.args import TrainArgs
from gpuyard.jobs.workload.checkpoint import Checkpointer, manifest_name, serialize
from gpuyard.jobs.workload.lease import LEASE
from gpuyard.jobs.workload.storage import LocalStorage, S3Storage
from workload_launch import FaultyProxy, done_event, events, finished, python_cmd, run, start, trained, wait_for

pytestmark = pytest.mark.slow
SMALL = TrainArgs(total_epochs=2, save_every=1, batch_size=32, dataset_size=512, seed=4, lease_seconds=2)
LONG = SMALL.model_copy(update={"total_epochs": 5000, "model": "mlp", "checkpoint_uri": "s3://ckpt/run"})


@pytest.fixture
def s3(local_aws):
    boto3.client("s3").create_bucket(Bucket="ckpt")
    return S3Storage("ckpt", "run")


def _one_line(stderr: str, text: str) -> None:
    assert stderr.count("\n") == 1 and stderr.startswith("train: error: ") and text in stderr, stderr


def test_resuming_a_linear_checkpoint_with_mlp_is_one_line_and_exit_2(tmp_path):
    args = SMALL.model_copy(update={"checkpoint_uri": str(tmp_path)})
    done_event(run(python_cmd(args)))
    before = sorted(path.name for path in tmp_path.iterdir())
    result = run(python_cmd(args.model_copy(update={"model": "mlp", "total_epochs": 3})))
    assert (result.returncode, result.stdout) == (2, "")
    _one_line(result.stderr, "--model 'linear' in the checkpoint, 'mlp' now")
    assert sorted(path.name for path in tmp_path.iterdir()) == before


@pytest.mark.parametrize("argv, message", [
    (["--seed", "5"], "--seed 4 in the checkpoint, 5 now"),
    (["--dataset-size", "1024"], "--dataset-size 512 in the checkpoint, 1024 now"),
    (["--dropout", "0.25"], "--dropout 0.0 in the checkpoint, 0.25 now"),
])
def test_another_seed_dataset_or_dropout_is_refused_before_any_process_group(tmp_path, capsys, argv, message):
    args = SMALL.model_copy(update={"checkpoint_uri": str(tmp_path)})
    Checkpointer(LocalStorage(tmp_path), train.identity(args)).save(16, serialize({"global_step": 16}))
    with pytest.raises(SystemExit) as exit_:
        train.check_inputs([*args.to_argv(), *argv])
    assert exit_.value.code == 2 and not torch.distributed.is_initialized()
    _one_line(capsys.readouterr().err, message)


def test_a_second_run_on_a_prefix_in_use_exits_2_and_the_first_goes_on(tmp_path, local_aws, s3):
    out = tmp_path / "first"
    first = start(python_cmd(LONG), out, local_aws.env)
    try:
        wait_for(lambda: '"event": "checkpoint"' in out.read_text(), what="the first run's checkpoint")
        second = run(python_cmd(LONG), env=local_aws.env)
        assert (second.returncode, second.stdout) == (2, "")
        _one_line(second.stderr, f"s3://ckpt/run/{LEASE} is held by ")
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        assert finished(first, out).returncode == 143
    finally:
        finished(first, out, timeout=60)
    assert LEASE not in s3.names()  # a stopped run releases its lease: its restart need not wait


def test_a_lease_not_renewed_is_taken_over(local_aws, s3):
    s3.put(LEASE, json.dumps({"owner": "killed-run", "beats": 7, "expires_at": time.time() + 3600}).encode())
    done = done_event(run(python_cmd(SMALL.model_copy(update={"checkpoint_uri": "s3://ckpt/run"})), env=local_aws.env))
    assert done["checkpoint"] == f"s3://ckpt/run/{manifest_name(32)}"
    assert LEASE not in s3.names()


def test_a_run_whose_lease_is_taken_stops_with_exit_2_and_leaves_the_new_holders_lease(tmp_path, local_aws, s3):
    out = tmp_path / "out"
    trainer = start(python_cmd(LONG), out, local_aws.env)
    wait_for(lambda: '"event": "checkpoint"' in out.read_text(), what="a checkpoint")
    intruder = json.dumps({"owner": "intruder", "beats": 1, "expires_at": time.time() + 3600}).encode()
    s3.put(LEASE, intruder)
    result = finished(trainer, out, timeout=60)
    assert result.returncode == 2
    assert f"s3://ckpt/run/{LEASE} is held by intruder" in result.stdout
    assert any(e["event"] == "lease_lost" for e in events(result.stdout))
    assert s3.get(LEASE) == intruder


def test_a_non_finite_loss_stops_in_one_line_and_no_checkpoint_holds_non_finite_weights(tmp_path):
    args = SMALL.model_copy(update={"lr": 5.0, "save_every_steps": 5, "total_epochs": 3,
                                    "checkpoint_uri": str(tmp_path)})
    result = run(python_cmd(args))
    assert result.returncode == 1
    _one_line(result.stderr, "not finite at step")
    nonfinite = next(e for e in events(result.stdout) if e["event"] == "nonfinite")
    assert nonfinite["checkpoint"] and nonfinite["checkpoint"] in result.stderr
    saved = sorted(tmp_path.glob("ckpt-*.pt"))
    assert saved
    for path in saved:
        state = torch.load(path, weights_only=True)
        assert all(torch.isfinite(tensor).all() for tensor in state["model"].values())


def test_a_final_checkpoint_that_is_not_durable_is_named_and_the_run_does_not_exit_0(tmp_path, local_aws, s3):
    proxy = FaultyProxy(local_aws.port)
    args = SMALL.model_copy(update={"checkpoint_uri": "s3://ckpt/run"})
    proxy.cut_after(b"PUT /ckpt/run/" + manifest_name(32).replace(".json", ".pt").encode())
    result = run(python_cmd(args), env={**local_aws.env, "AWS_ENDPOINT_URL": proxy.endpoint_url})
    proxy.close()
    assert result.returncode == 143
    _one_line(result.stderr, f"final checkpoint (step 32) is not durable; last durable checkpoint: "
                             f"s3://ckpt/run/{manifest_name(16)}")
    done = next(e for e in events(result.stdout) if e["event"] == "done")
    assert done["checkpoint"] == f"s3://ckpt/run/{manifest_name(16)}"
    rerun = done_event(run(python_cmd(args), env=local_aws.env))
    assert trained(rerun) == trained(done) and rerun["checkpoint"] == f"s3://ckpt/run/{manifest_name(32)}"


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs: a real filesystem that runs out of space on the first checkpoint."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_is_reported_and_training_goes_on(full_disk):
    args = SMALL.model_copy(update={"model": "mlp", "checkpoint_uri": str(full_disk / "ckpt")})
    result = run(python_cmd(args))
    failed = [e for e in events(result.stdout) if e["event"] == "checkpoint_failed"]
    assert failed and all("No space left on device" in e["error"] for e in failed)
    done = next(e for e in events(result.stdout) if e["event"] == "done")
    assert done["epochs"] == 2 and done["checkpoint"] is None
    assert result.returncode == 143  # trained, but nothing durable: the job is not reported as saved
    _one_line(result.stderr, "final checkpoint (step 32) is not durable; last durable checkpoint: none")
