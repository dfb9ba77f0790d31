"""Bad input fails in one line with exit 2 before any process group; launcher env, data and metrics."""

import io
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch.distributed

from gpuyard.jobs.local_aws import free_port
from gpuyard.jobs.workload import train
from gpuyard.jobs.workload.data import build_model, synthetic_dataset, weights_sha256
from gpuyard.jobs.workload.dist import DistEnv, LaunchError, launcher_env
from gpuyard.jobs.workload.metrics import TrainMetrics
from gpuyard.jobs.workload.progress import Reporter
from workload_launch import REPO

GOOD = ["2", "1", "--batch_size", "8"]


@pytest.mark.parametrize("argv, message", [
    (["0", "1"], "TOTAL_EPOCHS: Input should be greater than or equal to 1 (got 0)"),
    (["2", "0"], "SAVE_EVERY: Input should be greater than or equal to 1 (got 0)"),
    (["2", "1", "--batch_size", "0"], "--batch_size: Input should be greater than or equal to 1 (got 0)"),
    ([*GOOD, "--model", "resnet"], "--model: Input should be 'linear' or 'mlp' (got 'resnet')"),
    ([*GOOD, "--checkpoint-uri", "gs://b/p"], "unsupported scheme 'gs'"),
    (["two", "1"], "argument TOTAL_EPOCHS: 'two' is not a whole number"),
    ([*GOOD, "--save-every-steps", "0"], "--save-every-steps: Input should be greater than or equal to 1 (got 0)"),
    ([*GOOD, "--grace-period", "0"], "--grace-period: Input should be greater than 0 (got 0.0)"),
    ([*GOOD, "--lease-seconds", "-1"], "--lease-seconds: Input should be greater than or equal to 1 (got -1.0)"),
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
    result = subprocess.run([sys.executable, "-m", "gpuyard.jobs.workload.train", "3", "0", "--batch_size", "4"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "train: error: SAVE_EVERY: Input should be greater than or equal to 1 (got 0)\n"


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
    process = subprocess.Popen([sys.executable, "-m", "gpuyard.jobs.workload.train", "2", "1", "--batch_size", "64"],
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
    (["2", "1", "--num-workers", "0"], "ray_entry: error: --num-workers must be from 1 to 10000 (got 0)\n"),
    (["2", "1", "--num-workers", "1_0"], "ray_entry: error: argument --num-workers: '1_0' is not a whole number\n"),
    (["2", "1", "--num-workers", str(10**9)], "ray_entry: error: --num-workers must be from 1 to 10000 (got 1000000000)\n"),
    (["2", "1", "--max-restarts", "-1"], "ray_entry: error: --max-restarts must be >= 0 (got -1)\n"),
    (["2", "1", "--max-restarts", "1.5"], "ray_entry: error: argument --max-restarts: '1.5' is not a whole number\n"),
    (["2", "0", "--num-workers", "2"], "train: error: SAVE_EVERY: Input should be greater than or equal to 1 (got 0)\n"),
])
def test_ray_entry_bad_input_exits_2_before_ray_starts(argv, message):
    result = subprocess.run([sys.executable, "-m", "gpuyard.jobs.workload.ray_entry", *argv],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", message)


# Classes of bad trainer input: forms that are typos (1_0, nan, inf), sizes no machine allocates, seeds torch refuses
# an epoch later, periods a thread cannot wait, launcher variables that are not numbers or out of range.
ARGS = [
    (["1_0", "1"], "argument TOTAL_EPOCHS: '1_0' is not a whole number"),
    (["2", "x"], "argument SAVE_EVERY: 'x' is not a whole number"),
    (["2.0", "1"], "argument TOTAL_EPOCHS: '2.0' is not a whole number"),
    (["٣", "1"], "argument TOTAL_EPOCHS: '٣' is not a whole number"),
    (["1000001", "1"], "TOTAL_EPOCHS: Input should be less than or equal to 1000000"),
    (["2", "1", "--batch_size", "1_6"], "argument --batch_size/--batch-size: '1_6' is not a whole number"),
    (["2", "1", "--batch_size", str(10**12)], "--batch_size: Input should be less than or equal to 10000000"),
    ([*GOOD, "--dataset-size", str(10**11)], "--dataset-size: Input should be less than or equal to 10000000"),
    ([*GOOD, "--dataset-size", "0"], "--dataset-size: Input should be greater than or equal to 1"),
    ([*GOOD, "--seed", str(2**64)], "--seed: Input should be less than or equal to 9223372036854775807"),
    ([*GOOD, "--seed", str(2**63)], "--seed: Input should be less than or equal to"),
    ([*GOOD, "--seed", "-1"], "--seed: Input should be greater than or equal to 0"),
    ([*GOOD, "--seed", "1e3"], "argument --seed: '1e3' is not a whole number"),
    ([*GOOD, "--lr", "inf"], "argument --lr: 'inf' is not a number"),
    ([*GOOD, "--lr", "nan"], "argument --lr: 'nan' is not a number"),
    ([*GOOD, "--lr", "1e999"], "--lr: Input should be a finite number"),
    ([*GOOD, "--lr", "0"], "--lr: Input should be greater than 0"),
    ([*GOOD, "--lr", "-0.1"], "--lr: Input should be greater than 0"),
    ([*GOOD, "--lr", "0x1"], "argument --lr: '0x1' is not a number"),
    ([*GOOD, "--grace-period", "inf"], "argument --grace-period: 'inf' is not a number"),
    ([*GOOD, "--grace-period", "1e10"], "--grace-period: Input should be less than or equal to 86400"),
    ([*GOOD, "--grace-period", "-5"], "--grace-period: Input should be greater than 0"),
    ([*GOOD, "--lease-seconds", "nan"], "argument --lease-seconds: 'nan' is not a number"),
    ([*GOOD, "--lease-seconds", "1e12"], "--lease-seconds: Input should be less than or equal to 86400"),
    ([*GOOD, "--lease-seconds", "0.001"], "--lease-seconds: Input should be greater than or equal to 1"),
    ([*GOOD, "--metrics-port", "0"], "--metrics-port: Input should be greater than or equal to 1"),
    ([*GOOD, "--metrics-port", "65536"], "--metrics-port: Input should be less than or equal to 65535"),
    ([*GOOD, "--metrics-port", "http"], "argument --metrics-port: 'http' is not a whole number"),
    ([*GOOD, "--save-every-steps", "1_0"], "argument --save-every-steps: '1_0' is not a whole number"),
    ([*GOOD, "--model", "MLP"], "--model: Input should be 'linear' or 'mlp' (got 'MLP')"),
    ([*GOOD, "--modle", "mlp"], "unrecognized arguments: --modle mlp"),
    (["2"], "the following arguments are required: SAVE_EVERY"),
]
ENVIRON = [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not a whole number from 0 to"),
    ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a whole number from 1 to"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not a whole number from 1 to"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' is not a whole number"),
    ({"RANK": "1_0", "WORLD_SIZE": "20"}, "RANK='1_0' is not a whole number"),
    ({"RANK": " 1", "WORLD_SIZE": "2"}, "RANK=' 1' is not a whole number"),
    ({"RANK": "0", "WORLD_SIZE": "9" * 20}, "WORLD_SIZE='99999999999999999999' is not a whole number"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=3 is not below LOCAL_WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE='x'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "http"}, "MASTER_PORT='http' is not a whole number from 1 to 65535"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT='70000'"),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "OMPI_COMM_WORLD_RANK=5 is not below OMPI_COMM_WORLD_SIZE=2"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, "mpirun: pass MASTER_ADDR and MASTER_PORT with -x"),
    ({"OMP_NUM_THREADS": "4,2"}, "OMP_NUM_THREADS='4,2' is not a whole number from 1 to"),
    ({"OMP_NUM_THREADS": "0"}, "OMP_NUM_THREADS='0'"),
]
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "OMP_NUM_THREADS")


def _refused_before_anything(argv, message, capsys, tmp_path):
    checkpoints = tmp_path / "ckpt"
    threads = threading.active_count()
    with pytest.raises(SystemExit) as exit_:
        train.check_inputs([*argv, "--checkpoint-uri", str(checkpoints)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("train: error: ") and message in err, err
    assert not torch.distributed.is_initialized() and not checkpoints.exists()
    assert threading.active_count() == threads


@pytest.mark.parametrize("argv, message", ARGS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_arguments_are_refused_before_any_process_group_folder_or_thread(argv, message, capsys, tmp_path):
    _refused_before_anything(argv, message, capsys, tmp_path)


@pytest.mark.parametrize("environ, message", ENVIRON, ids=lambda v: ",".join(f"{k}={v}" for k, v in v.items())
                         if isinstance(v, dict) else None)
def test_bad_launcher_variables_are_refused_before_any_process_group(environ, message, capsys, tmp_path, monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    _refused_before_anything(GOOD, message, capsys, tmp_path)


def test_a_metrics_port_in_use_is_refused_before_the_checkpoint_folder_exists(capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _refused_before_anything([*GOOD, "--metrics-port", str(port)], f"--metrics-port {port}: in use", capsys,
                                 tmp_path)


def test_a_good_launch_environment_still_reads():
    assert launcher_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500",
                         "OMP_NUM_THREADS": "1"}) == DistEnv(1, 2, 0, 1)


def test_the_largest_seed_trains_past_an_epoch():
    """The sampler seeds every epoch with seed + epoch: the largest accepted seed still works two epochs on."""
    result = subprocess.run([sys.executable, "-m", "gpuyard.jobs.workload.train", "2", "1", "--batch_size", "64",
                             "--dataset-size", "128", "--seed", str(2**63 - 1)], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert '"event": "done", "epochs": 2' in result.stdout


@pytest.mark.parametrize("exit_codes, status", [
    ([1, 1], 1),  # the ranks agreed the loss diverged: final
    ([2], 2),  # another run holds the prefix: final
    ([143, 143], 143),  # stopped: retried
    ([-9, 1], 137),  # a rank killed (its node went) outranks the others' crash on the broken collective
    ([-15], 143),
])
def test_torchrun_as_templated_exits_with_its_workers_status(exit_codes, status):
    from gpuyard.jobs.workload.torchrun import worker_status

    assert worker_status(exit_codes) == status


# torchrun under gpuyard.jobs.workload.torchrun, with the kubelet's SIGTERM arriving as torch's ``prof`` wrapper
# reads its clock (torch/distributed/elastic/metrics/api.py: ``start = time.time()`` inside the try its finally
# reads ``start`` from): the one SIGTERM is sent from that clock read, once torchrun's handler is installed
SIGTERM_AT_PROF_CLOCK = """
import os, signal, sys, time
from torch.distributed.elastic.metrics import api as metrics
class Clock:
    sent = False
    def time(self):
        handler = signal.getsignal(signal.SIGTERM)
        starting = sys._getframe(1).f_code.co_name == "wrapper"  # not get_elapsed_time_ms, in the finally
        if starting and not self.sent and callable(handler) and handler.__name__ == "_terminate_process_handler":
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return time.time()
metrics.time = Clock()
from gpuyard.jobs.workload.torchrun import main
main(sys.argv[1:])
"""
RANK_STOPPED_BY_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, lambda *_: exit(143)); time.sleep(120)"


def test_torchrun_as_templated_exits_143_when_its_sigterm_lands_in_torchs_metrics_wrapper(tmp_path):
    """There the SignalException becomes an UnboundLocalError (torch 2.13: ``start`` unassigned), which torchrun
    alone ends with 1, the final status; measured in the sim, a TrainJob rank's pod deleted mid-run exited 1 and its
    JobSet failed instead of restarting. The stop itself still happens (the agent's ``run`` stops its workers in its
    ``finally``), so the status is the signal's."""
    (tmp_path / "rank.py").write_text(RANK_STOPPED_BY_SIGTERM)
    result = subprocess.run([sys.executable, "-c", SIGTERM_AT_PROF_CLOCK, "--standalone", "--nproc-per-node", "1",
                             "--monitor-interval", "0.1", str(tmp_path / "rank.py")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 143, result.stderr[-3000:]
    assert re.search(r"Sending process \d+ closing signal SIGTERM\n(.*\n)*torchrun: stopped by signal 15, exit 143\n$",
                     result.stderr), result.stderr[-3000:]


def test_the_launch_supervisor_needs_a_command_after_a_double_dash():
    result = subprocess.run([sys.executable, "-m", "gpuyard.jobs.workload.launch", "--restarts", "2"], capture_output=True,
                            text=True, cwd=REPO, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", "launch: error: give the command after --\n")


@pytest.mark.parametrize("status", [0, 1, 2, 143])
def test_the_launch_supervisor_exits_with_its_command_s_status_and_reruns_only_retryable_ones(status, tmp_path):
    runs = tmp_path / "runs"
    script = f"import pathlib; p = pathlib.Path({str(runs)!r}); p.write_text(p.read_text() + 'x' if p.exists() else 'x'); raise SystemExit({status})"
    result = subprocess.run([sys.executable, "-m", "gpuyard.jobs.workload.launch", "--restarts", "2", "--", sys.executable, "-c",
                             script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == status
    assert runs.read_text() == ("xxx" if status >= 128 else "x")



SIGNAL_RECORDER = """
import os, signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
def record(signum, frame):
    log.write(f"{signal.Signals(signum).name} {time.monotonic():.3f}\\n")
    if signum == signal.SIGTERM:
        os._exit(143)
signal.signal(signal.SIGUSR1, record)
signal.signal(signal.SIGTERM, record)
log.write(f"ready {time.monotonic():.3f}\\n")
while True:
    time.sleep(0.05)
"""


def _supervise_and_signal(options: list[str], log, signals: int) -> list[str]:
    """The supervisor over the signal recorder; SIGTERM to the supervisor ``signals`` times, one after the other's
    arrival; what the recorder received, in order."""
    job = subprocess.Popen([sys.executable, "-m", "gpuyard.jobs.workload.launch", *options, "--", sys.executable,
                            "-c", SIGNAL_RECORDER, str(log)], cwd=REPO, start_new_session=True)
    try:
        for expected in range(1, signals + 1):
            deadline = time.monotonic() + 60
            while len(log.read_text().splitlines() if log.exists() else []) < expected:
                assert time.monotonic() < deadline and job.poll() is None
                time.sleep(0.05)
            job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=60) == 143
    finally:
        if job.poll() is None:
            child = [int(pid) for pid in Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()]
            for pid in [job.pid, *child]:
                os.killpg(pid, signal.SIGKILL)
    return [line.split()[0] for line in log.read_text().splitlines()]


def test_the_launch_supervisor_passes_a_sigterm_on_as_the_trainer_s_stop_request_and_a_second_one_as_sigterm(
        tmp_path):
    """Open MPI's mpirun forwards SIGUSR1 to every rank at once, but a SIGTERM of its own only after
    odls_base_sigkill_timeout, reading none of the ranks' output meanwhile (jobs/workload/launch.py)."""
    received = _supervise_and_signal(["--stop-signal", "USR1"], tmp_path / "signals", signals=2)
    assert received == ["ready", "SIGUSR1", "SIGTERM"]


def test_the_launch_supervisor_sends_the_reference_trainer_s_mpirun_sigusr1_and_other_commands_sigterm():
    from gpuyard.jobs.workload.args import TRAIN_MODULE
    from gpuyard.jobs.workload.launch import stop_signal

    assert stop_signal(["mpirun", "-np", "2", "python3", "-m", TRAIN_MODULE, "8", "4"]) == signal.SIGUSR1
    assert stop_signal(["mpirun", "-np", "2", "python3", "-m", "gpuyard.jobs.command.mpi_rank", "train.py"]) is None


def test_a_user_command_under_the_launch_supervisor_gets_the_sigterm_itself(tmp_path):
    assert _supervise_and_signal([], tmp_path / "signals", signals=1) == ["ready", "SIGTERM"]
