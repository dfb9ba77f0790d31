"""The rendered launch commands run the real trainer: torchrun and mpirun, their flags, the trainer args, and
the exit status each operator reads (143 retried, 1 final).

Only what a laptop cannot have is swapped: the rendezvous host (a Service in the cluster),
the metrics port (fixed in the cluster, free here) and the venv's executables.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuyard.infra.conventions import EXIT_NONFINITE, EXIT_RETRYABLE, METRICS_PORT
from gpuyard.jobs.local_aws import free_port
from gpuyard.jobs.render import render
from gpuyard.jobs.workload.checkpoint import data_name
from render_helpers import STACK, make_spec

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def pytorchjob_command(tmp_path: Path, **fields) -> list[str]:
    """The Master's command and args, with this venv's python and a local rendezvous."""
    spec = make_spec("pytorchjob", nodes=1, gpus_per_node=0, checkpoint_uri=str(tmp_path / "ckpt"), **fields)
    master = render(spec, STACK.team("vision"))["spec"]["pytorchReplicaSpecs"]["Master"]
    trainer = master["template"]["spec"]["containers"][0]
    command = [sys.executable] + ["--rdzv-endpoint=127.0.0.1:0" if arg.startswith("--rdzv-endpoint=") else arg
                                  for arg in trainer["command"][1:]]
    return command + [str(free_port()) if arg == str(METRICS_PORT) else arg for arg in trainer["args"]]


def test_rendered_pytorchjob_command_trains_and_checkpoints(tmp_path):
    result = subprocess.run(pytorchjob_command(tmp_path, epochs=2), capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    events = _events(result.stdout)
    assert events[-1]["event"] == "done" and events[-1]["epochs"] == 2
    assert sorted(path.name for path in (tmp_path / "ckpt").glob("*.pt")) == [data_name(128)]  # save_every=2


def test_rendered_pytorchjob_exits_1_when_the_loss_diverges_not_torchruns_1_for_anything(tmp_path):
    """torchrun alone exits 1 for every failure; the rendered command passes on the trainer's final 1 ..."""
    command = pytorchjob_command(tmp_path, epochs=2)
    command[command.index("--lr") + 1] = "5.0"
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == EXIT_NONFINITE, result.stderr[-2000:]
    assert "not finite" in result.stderr


def test_rendered_pytorchjob_exits_143_on_sigterm(tmp_path):
    """... and on SIGTERM (a preempted pod) 143, which ExitCode retries: torchrun alone exits 1 there too."""
    out = tmp_path / "out"
    job = subprocess.Popen(pytorchjob_command(tmp_path, epochs=400), stdout=out.open("w"), stderr=subprocess.STDOUT,
                           cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while '"event": "checkpoint"' not in out.read_text() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.1)
        assert job.poll() is None, out.read_text()[-2000:]
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=120) == EXIT_RETRYABLE, out.read_text()[-2000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert any(event["event"] == "stopped" and event["checkpoint"] for event in _events(out.read_text()))


@pytest.fixture
def sshd():
    """This test's stand-in for the workers' sshd, which the launcher waits for before each run: a listening port."""
    server = socket.create_server(("127.0.0.1", 0))
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def launcher_run(tmp_path: Path, sshd: str, **fields) -> tuple[list[str], dict[str, str]]:
    """The MPIJob launcher's supervised mpirun, on this host's two slots. Spot by default: when one rank ends,
    mpirun signals the others a third of the grace period later (jobs/render/pod.py shutdown_env), 30 s on spot
    rather than 100 s on demand."""
    fields.setdefault("capacity_type", "spot")
    spec = make_spec("mpijob", nodes=2, gpus_per_node=0, checkpoint_uri=str(tmp_path / "ckpt"), **fields)
    replicas = render(spec, STACK.team("vision"))["spec"]["mpiReplicaSpecs"]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in launcher["env"]}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),  # worker 0's Service in the cluster
            "PATH": f"{BIN}:{os.environ['PATH']}", "OMPI_MCA_rmaps_base_oversubscribe": "1",
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1"}
    command = list(launcher["command"])
    command[command.index("--wait-for") + 1] = sshd  # the workers' sshd in the cluster
    args = [str(free_port()) if arg == str(METRICS_PORT) else arg for arg in launcher["args"]]
    return command + args, env


def test_rendered_mpijob_launcher_command_trains(tmp_path, sshd):
    """The launcher's mpirun (-np, -x exports, python3 -m trainer) on this host's two slots."""
    command, env = launcher_run(tmp_path, sshd, epochs=2)
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    events = _events(result.stdout)
    assert events[-1]["event"] == "done" and events[-1]["epochs"] == 2  # JSON lines, no progress bar
    assert (tmp_path / "ckpt" / data_name(64)).exists()  # 2 epochs of 32 steps at world size 2


def test_rendered_mpijob_launcher_never_reruns_a_diverged_trainer(tmp_path, sshd):
    command, env = launcher_run(tmp_path, sshd, epochs=2)
    command[command.index("--lr") + 1] = "5.0"
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == EXIT_NONFINITE, result.stderr[-2000:]
    assert "running it again" not in result.stderr


def test_rendered_mpijob_launcher_reruns_a_stopped_rank_and_resumes(tmp_path, sshd):
    """SIGTERM to one rank (its pod is going): every rank stops at one step and exits 143, the supervisor
    reruns mpirun (the workers' sshd answers), which resumes at that step and finishes."""
    command, env = launcher_run(tmp_path, sshd, epochs=40)
    out = tmp_path / "out"
    job = subprocess.Popen(command, stdout=out.open("w"), stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while '"event": "checkpoint"' not in out.read_text() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.1)
        rank_1 = next(pid for pid in _descendants(job.pid) if _environ(pid).get("OMPI_COMM_WORLD_RANK") == "1")
        os.kill(rank_1, signal.SIGTERM)
        assert job.wait(timeout=600) == 0, out.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    events = _events(out.read_text())
    stopped = next(event for event in events if event["event"] == "stopped")
    assert f"exit {EXIT_RETRYABLE}, retryable: running it again (1 of 3)" in out.read_text()
    assert next(event for event in events if event["event"] == "resume")["global_step"] == stopped["global_step"]
    assert events[-1]["event"] == "done" and events[-1]["epochs"] == 40


def _descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *_descendants(int(child))]
    return found


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
