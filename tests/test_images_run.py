"""Each image's ENTRYPOINT + CMD, parsed from its Dockerfile, runs here outside Docker.

The image never runs a command these tests did not: torchrun with 2 processes for ``ddp``,
the ``mpi`` worker's sshd (reached with the image's ssh client config) and the MPIJob
launcher's mpirun with 2 ranks, Ray Train with 2 workers for ``ray``. All reach the same weights.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import with_registry
from dockerfile_parse import IMAGES, Dockerfile
from infra.config import load_stack
from jobs.local_aws import free_port
from jobs.render import render
from jobs.spec import build_spec
from jobs.workload.args import TRAIN_MODULE

pytestmark = pytest.mark.slow

BIN = str(Path(sys.executable).parent)
SSHD = Path("/usr/sbin/sshd")



def image_env(dockerfile: Dockerfile, tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment with the image's ENV on top, the test venv first on PATH, one thread per rank."""
    return {**os.environ, **dockerfile.env(), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), **extra}


def run(command: list[str], env: dict[str, str], cwd: Path, timeout: int = 300) -> dict:
    """Run to completion; return the trainer's ``done`` event."""
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return done_event(result.stdout)


def done_event(stdout: str) -> dict:
    """The one ``done`` line (mpirun gives ranks a pty, so it may follow progress bar codes)."""
    events = [json.loads(line[line.index('{"event"'):]) for line in stdout.splitlines() if '{"event"' in line]
    done = [event for event in events if event.get("event") == "done"]
    assert len(done) == 1, stdout[-3000:]
    return done[0]


def trainer_argv(command: list[str], module: str) -> list[str]:
    return command[command.index(module) + 1:]


@pytest.fixture(scope="module")
def ddp_done(tmp_path_factory) -> dict:
    """The ddp image's command under torchrun with 2 local processes (PET_* as the operators set them)."""
    dockerfile, tmp_path = Dockerfile.of("ddp"), tmp_path_factory.mktemp("ddp")
    command = dockerfile.local_command()
    assert command[0] == "torchrun"
    env = image_env(dockerfile, tmp_path, PET_NPROC_PER_NODE="2", PET_NNODES="1", PET_STANDALONE="1")
    return run(command, env, tmp_path)


def test_ddp_image_command_trains_under_torchrun_with_2_processes(ddp_done):
    epochs = int(trainer_argv(Dockerfile.of("ddp").command(), TRAIN_MODULE)[0])
    assert ddp_done["epochs"] == epochs and len(ddp_done["weights_sha256"]) == 64


def test_mpijob_launcher_command_runs_2_ranks_to_the_ddp_weights(ddp_done, tmp_path):
    """The rendered MPIJob launcher's mpirun, as the mpi image runs it, here on 127.0.0.1.

    Only what cannot work outside a cluster changes: root needs --allow-run-as-root, 2 ranks
    on this machine --oversubscribe, the rendezvous is local, and the checkpoint and metrics
    go to a temporary folder and a free port.
    """
    config = with_registry(load_stack("dev"))
    team = config.teams[0]
    spec = build_spec(config, team, "mpijob", epochs=int(trainer_argv(Dockerfile.of("ddp").command(), TRAIN_MODULE)[0]),
                      checkpoint_uri=str(tmp_path / "ckpt"))
    launcher = render(spec, team)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", *launcher["command"][1:], *launcher["args"]]
    assert command[command.index("-np") + 1] == "2"
    command[command.index("--metrics-port") + 1] = str(free_port())
    env = {item["name"]: item["value"] for item in launcher["env"]}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    done = run(command, image_env(Dockerfile.of("mpi"), tmp_path, **env), tmp_path)
    assert (done["epochs"], done["weights_sha256"]) == (ddp_done["epochs"], ddp_done["weights_sha256"])
    assert any((tmp_path / "ckpt").iterdir()), "rank 0 wrote no checkpoint"


def test_ray_image_command_trains_with_2_ray_workers_to_the_ddp_weights(ddp_done, tmp_path):
    dockerfile = Dockerfile.of("ray")
    command = dockerfile.local_command()
    assert command[:2] == ["python", "-m"] and command[-2:] == ["--num-workers", "2"]
    with tempfile.TemporaryDirectory(prefix="gy-ray-") as ray_tmp:  # short: Ray's socket paths must fit 107 bytes
        env = image_env(dockerfile, tmp_path, RAY_TMPDIR=ray_tmp)
        env.pop("RAY_ADDRESS", None)
        assert run(command, env, tmp_path, timeout=480)["weights_sha256"] == ddp_done["weights_sha256"]


def _wait_for_port(port: int, process: subprocess.Popen, deadline_s: float = 20) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"sshd did not listen on {port}")


@pytest.mark.skipif(not SSHD.exists() or not shutil.which("ssh-keygen"),
                    reason="openssh-server is not installed (apt-get install openssh-server)")
def test_mpi_worker_command_serves_ssh_with_the_mounted_job_key(tmp_path):
    """The worker's ENTRYPOINT + CMD runs sshd with the key laid out as MPI Operator mounts it
    (id_rsa, id_rsa.pub, authorized_keys in ~/.ssh); the image's ssh client config gets a
    rank started through it, as mpirun does."""
    ssh_dir = tmp_path / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(ssh_dir / "id_rsa")], check=True)
    shutil.copy(ssh_dir / "id_rsa.pub", ssh_dir / "authorized_keys")
    if os.geteuid() == 0:  # the image runs sshd unprivileged; as root sshd needs its privilege separation dir
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    dockerfile, port = Dockerfile.of("mpi"), free_port()
    command = [*dockerfile.local_command(), "-o", "ListenAddress=127.0.0.1", "-p", str(port)]
    assert Path(command[0]).is_relative_to(IMAGES) and command[1] == "worker"
    sshd = subprocess.Popen(command, env=image_env(dockerfile, tmp_path, HOME=str(tmp_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_port(port, sshd)
        rank = subprocess.run(
            ["ssh", "-F", str(IMAGES / "mpi" / "ssh_config"), "-p", str(port), "-i", str(ssh_dir / "id_rsa"),
             "-o", "BatchMode=yes", "127.0.0.1", f"OMP_NUM_THREADS=1 {sys.executable} -m {TRAIN_MODULE} 1 1 --dataset-size 64"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert rank.returncode == 0, rank.stderr
        assert done_event(rank.stdout)["epochs"] == 1
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)


def test_mpi_entrypoint_refuses_an_unknown_role(tmp_path):
    result = subprocess.run([*Dockerfile.of("mpi").local_command()[:1], "launcher"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "usage" in result.stderr
