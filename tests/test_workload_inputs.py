"""Bad input fails in one line with exit 2 before any process group; launcher env, data and metrics."""

import io
import json
import os
import pty
import subprocess
import sys
import urllib.request

import pytest
import torch.distributed

from jobs.local_aws import free_port
from jobs.workload import train
from jobs.workload.data import build_model, synthetic_dataset, weights_sha256
from jobs.workload.dist import DistEnv, LaunchError, launcher_env
from jobs.workload.metrics import TrainMetrics
from jobs.workload.progress import Reporter
from workload_launch import REPO

GOOD = ["2", "1", "--batch_size", "8"]


@pytest.mark.parametrize("argv, message", [
    (["0", "1"], "total_epochs: Input should be greater than or equal to 1 (got 0)"),
    (["2", "0"], "save_every: Input should be greater than or equal to 1 (got 0)"),
    (["2", "1", "--batch_size", "0"], "batch_size: Input should be greater than or equal to 1 (got 0)"),
    ([*GOOD, "--model", "resnet"], "model: Input should be 'linear' or 'mlp' (got 'resnet')"),
    ([*GOOD, "--checkpoint-uri", "gs://b/p"], "unsupported scheme 'gs'"),
    (["two", "1"], "argument total_epochs: invalid int value: 'two'"),
    ([*GOOD, "--save-every-steps", "0"], "save_every_steps: Input should be greater than or equal to 1 (got 0)"),
    ([*GOOD, "--grace-period", "0"], "grace_period: Input should be greater than 0 (got 0.0)"),
    ([*GOOD, "--lease-seconds", "-1"], "lease_seconds: Input should be greater than 0 (got -1.0)"),
])
def test_bad_input_is_one_line_exit_2_before_any_process_group(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        train.check_inputs(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train: error: ") and message in err
    assert not torch.distributed.is_initialized()


def test_missing_bucket_and_unreachable_endpoint_fail_at_start(local_aws, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        train.check_inputs([*GOOD, "--checkpoint-uri", "s3://absent/run"])
    assert exit_.value.code == 2 and "bucket 'absent' not found" in capsys.readouterr().err
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SystemExit) as exit_:
        train.check_inputs([*GOOD, "--checkpoint-uri", "s3://ckpt/run"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "head bucket failed after 2 attempts" in err


def test_bad_input_exits_2_as_a_process():
    result = subprocess.run([sys.executable, "-m", "jobs.workload.train", "3", "0", "--batch_size", "4"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "train: error: save_every: Input should be greater than or equal to 1 (got 0)\n"


@pytest.mark.parametrize("environ, expected", [
    ({}, DistEnv(0, 1, 0, 1)),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, DistEnv(3, 4, 1, 2)),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, DistEnv(1, 2, 1, 2)),
])
def test_launcher_env(environ, expected):
    assert launcher_env(environ) == expected


def test_mpirun_without_master_address_is_a_launch_error():
    with pytest.raises(LaunchError, match="pass MASTER_ADDR and MASTER_PORT with -x"):
        launcher_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})


def test_data_and_initial_weights_come_from_the_seed():
    first, again, other = synthetic_dataset(64, 7), synthetic_dataset(64, 7), synthetic_dataset(64, 8)
    assert all(a.equal(b) for a, b in zip(first.tensors, again.tensors))
    assert not first.tensors[0].equal(other.tensors[0])
    assert weights_sha256(build_model("mlp", 1)) == weights_sha256(build_model("mlp", 1))
    assert weights_sha256(build_model("linear", 1)) != weights_sha256(build_model("linear", 2))


def test_metrics_are_served_for_prometheus():
    metrics, port = TrainMetrics(), free_port()
    metrics.serve(port)
    metrics.record({"event": "epoch", "epoch": 3, "loss": 0.5, "samples_per_s": 1200.0})
    metrics.record({"event": "checkpoint", "seconds": 0.02})
    metrics.record({"event": "checkpoint_failed"})
    metrics.step_seconds.observe(0.001)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in ("gpuyard_train_epoch 3.0", "gpuyard_train_loss 0.5", "gpuyard_train_samples_per_second 1200.0",
                 "gpuyard_checkpoint_save_seconds_count 1.0", "gpuyard_checkpoint_save_failures_total 1.0",
                 "gpuyard_train_step_seconds_count 1.0"):
        assert line in body


def test_progress_is_json_lines_off_a_terminal_and_silent_off_rank_0():
    stream = io.StringIO()
    Reporter(enabled=True, stream=stream).event({"event": "epoch", "epoch": 1, "loss": 1.0})
    Reporter(enabled=False, stream=stream).event({"event": "epoch", "epoch": 2, "loss": 1.0})
    assert [json.loads(line) for line in stream.getvalue().splitlines()] == [{"event": "epoch", "epoch": 1, "loss": 1.0}]


def test_progress_is_a_bar_on_a_terminal_and_done_stays_one_json_line():
    leader, follower = pty.openpty()
    env = {key: value for key, value in os.environ.items() if not key.startswith("TTY_")}
    process = subprocess.Popen([sys.executable, "-m", "jobs.workload.train", "2", "1", "--batch_size", "64"],
                               stdout=follower, stderr=subprocess.DEVNULL, cwd=REPO, env={**env, "TERM": "xterm"})
    os.close(follower)
    output = b""
    while chunk := _read(leader):
        output += chunk
    assert process.wait(timeout=60) == 0
    text = output.decode()
    assert "━" in text and "epoch 2 loss" in text
    assert '{"event": "done", "epochs": 2, "global_step": 64, "weights_sha256": ' in text


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO once the child has closed the pty
        return b""


@pytest.mark.parametrize("argv, message", [
    (["2", "1", "--num-workers", "0"], "ray_entry: error: --num-workers must be >= 1 (got 0)\n"),
    (["2", "0", "--num-workers", "2"], "train: error: save_every: Input should be greater than or equal to 1 (got 0)\n"),
])
def test_ray_entry_bad_input_exits_2_before_ray_starts(argv, message):
    result = subprocess.run([sys.executable, "-m", "jobs.workload.ray_entry", *argv],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", message)
