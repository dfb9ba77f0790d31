"""The built images run the trainer in real containers (runc), checkpointing to a real S3 endpoint (moto_server).

The images are built from images/*/Dockerfile by BuildKit on the bases made here and pushed to the registry
(sim/images.py; cached by their inputs, so after `python -m gpuyard.sim.images` this only reads them). Each container is
unpacked from the pushed image and started with its own PID namespace (tests/oci_containers.py): the ddp image's
torchrun with 2 processes, the MPIJob's launcher mpirun reaching two worker containers' sshd, the Ray entry with 2
Ray workers. What a pod network would give, the host's loopback stands in for: each worker has its own 127.0.0.x
address in every container's /etc/hosts, Open MPI and gloo are kept on the loopback interface.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import with_registry
from gpuyard.infra.config import load_stack
from gpuyard.jobs.local_aws import LocalAWS, free_port
from gpuyard.jobs.render import render
from gpuyard.jobs.spec import GRACE_PERIOD_SECONDS, build_spec
from gpuyard.jobs.workload.args import TORCHRUN_MODULE, TRAIN_MODULE
from gpuyard.jobs.workload.checkpoint import manifest_name
from oci_containers import Image, container, wait_for
from gpuyard.sim.build import build_component
from gpuyard.sim.images import build_images
from gpuyard.sim.registry import serving
from gpuyard.sim.versions import IMAGE_COMPONENTS

pytestmark = pytest.mark.slow

BUCKET = "gpuyard-images-test"
LOOPBACK_ONLY = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
# Open MPI on the loopback interface only: orted reaches mpirun, and ranks each other, on 127.0.0.x
MPI_LOOPBACK = ["--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo"]
WORKERS = {"worker-0": "127.0.0.2", "worker-1": "127.0.0.3"}
UID = 1000  # the images' user


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Image]:
    """The dev stack's three images in the cache's registry (built first if their inputs changed)."""
    binary = build_component(next(c for c in IMAGE_COMPONENTS if c.name == "registry"), print) / "registry"
    with serving(tmp_path_factory.mktemp("registry"), binary) as registry:
        refs = build_images(registry, "dev")
        yield {image: Image.pull(ref) for image, ref in refs.items()}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with LocalAWS(log_path=tmp_path_factory.mktemp("moto") / "moto.log") as aws:
        aws.client("s3").create_bucket(Bucket=BUCKET)
        yield aws


def events(output: Path) -> list[dict]:
    """The trainer's JSON events in a container's output (mpirun may prefix them with terminal codes)."""
    lines = output.read_text(errors="replace").splitlines()
    return [json.loads(line[line.index('{"event"'):]) for line in lines if '{"event"' in line]


def done(output: Path) -> dict:
    found = [event for event in events(output) if event["event"] == "done"]
    assert len(found) == 1, output.read_text(errors="replace")[-4000:]
    return found[0]


def manifests(s3: LocalAWS, prefix: str) -> list[str]:
    listed = s3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/")
    return [item["Key"] for item in listed.get("Contents", []) if item["Key"].endswith(".json")]


def run_to_end(run, output: Path, timeout: float = 900) -> int:
    try:
        return run.wait(timeout)
    finally:
        print(output.read_text(errors="replace")[-3000:])


@pytest.fixture(scope="module")
def ddp_done(images, s3, tmp_path_factory) -> dict:
    """The ddp image's ENTRYPOINT + CMD under torchrun with 2 processes (PET_* as the operators set them)."""
    folder = tmp_path_factory.mktemp("ddp")
    image = images["ddp"]
    command = image.config["config"]["Entrypoint"] + image.config["config"]["Cmd"]
    assert command[:5] == ["python3", "-m", TORCHRUN_MODULE, "-m", TRAIN_MODULE]
    env = {**s3.env, **LOOPBACK_ONLY, "PET_NPROC_PER_NODE": "2", "PET_NNODES": "1", "PET_STANDALONE": "1"}
    output = folder / "output.log"
    with container(image, "ddp", folder / "bundle", output, env=env,
                   args=[*command, "--checkpoint-uri", f"s3://{BUCKET}/ddp"]) as run:
        assert run_to_end(run, output) == 0
    return done(output)


def test_ddp_image_trains_under_torchrun_with_2_processes_and_checkpoints_to_s3(ddp_done, s3):
    assert ddp_done["epochs"] == 2 and len(ddp_done["weights_sha256"]) == 64
    assert ddp_done["checkpoint"] and manifests(s3, "ddp")


def test_ray_image_trains_with_2_ray_workers_to_the_ddp_weights(images, s3, ddp_done, tmp_path):
    image = images["ray"]
    command = image.config["config"]["Cmd"]
    assert command[:3] == ["python", "-m", "gpuyard.jobs.workload.ray_entry"] and image.config["config"]["User"] == "1000:100"
    output = tmp_path / "output.log"
    with container(image, "ray", tmp_path / "bundle", output, env={**s3.env, **LOOPBACK_ONLY},
                   args=[*command, "--checkpoint-uri", f"s3://{BUCKET}/ray"]) as run:
        assert run_to_end(run, output) == 0
    assert done(output)["weights_sha256"] == ddp_done["weights_sha256"]
    assert manifests(s3, "ray")


def job_key(folder: Path) -> Path:
    """The job's SSH secret as MPI Operator mounts it (id_rsa, id_rsa.pub, authorized_keys), readable by uid 1000."""
    ssh = folder / "ssh"
    ssh.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(ssh / "id_rsa")], check=True)
    shutil.copy(ssh / "id_rsa.pub", ssh / "authorized_keys")
    for path in (ssh, *ssh.iterdir()):
        os.chown(path, UID, UID)
    return ssh


class MPIJob:
    """The rendered MPIJob's launcher and two workers as containers of the mpi image; the launcher's hostfile
    and environment as MPI Operator v0.8.0 gives them (pkg/controller/mpi_job_controller.go: /etc/mpi/hostfile,
    OMPI_MCA_orte_default_hostfile, OMPI_MCA_orte_keep_fqdn_hostnames)."""

    def __init__(self, image: Image, s3: LocalAWS, folder: Path, prefix: str, epochs: int, extra_args=(),
                 capacity_type: str = "on-demand"):
        config = with_registry(load_stack("dev"))
        spec = build_spec(config, config.teams[0], "mpijob", epochs=epochs, checkpoint_uri=f"s3://{BUCKET}/{prefix}",
                          env={**s3.env, **LOOPBACK_ONLY}, capacity_type=capacity_type)
        self.grace = GRACE_PERIOD_SECONDS[capacity_type]
        replicas = render(spec, config.teams[0])["spec"]["mpiReplicaSpecs"]
        self.image, self.folder, self.port = image, folder, free_port()
        self.key = job_key(folder)
        hostfile = folder / "hostfile"
        hostfile.write_text("".join(f"{name} slots=1\n" for name in WORKERS))
        worker = replicas["Worker"]["template"]["spec"]["containers"][0]
        self.worker_command = [*worker["command"], *self._port(worker["args"])]
        launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
        command = self._port([*launcher["command"], *launcher["args"]])
        command[command.index("--metrics-port") + 1] = str(free_port())
        # the launcher waits for the workers' sshd before each run: here at the names the hostfile gives them
        command[command.index("--wait-for") + 1] = ",".join(f"{name}:{self.port}" for name in WORKERS)
        mpirun = command.index("mpirun") + 1  # the launcher's supervisor (gpuyard.jobs.workload.launch) runs mpirun
        self.launcher_command = [*command[:mpirun], *MPI_LOOPBACK, *command[mpirun:], *extra_args]
        self.launcher_env = {**{e["name"]: e["value"] for e in launcher["env"]}, "MASTER_ADDR": "worker-0",
                             "MASTER_PORT": str(free_port()), "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                             "OMPI_MCA_orte_keep_fqdn_hostnames": "true"}
        self.mounts = {"/home/gpuyard/.ssh": self.key}
        self.hostfile = hostfile

    def _port(self, words: list[str]) -> list[str]:
        """The templates' sshd port 2222 as a free one (the containers share the host's loopback)."""
        return [word.replace("2222", str(self.port)) for word in words]

    def worker(self, name: str, command: list[str] | None = None):
        args = [*(command or self.worker_command), "-o", f"ListenAddress={WORKERS[name]}"]
        return container(self.image, name, self.folder / name, self.folder / f"{name}.log", args=args,
                         mounts=self.mounts, hosts=WORKERS)

    def launcher(self):
        return container(self.image, "launcher", self.folder / "launcher", self.folder / "launcher.log",
                         args=self.launcher_command, env=self.launcher_env, hosts=WORKERS,
                         mounts={**self.mounts, "/etc/mpi/hostfile": self.hostfile})


def sshd_listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def test_mpijob_launcher_reaches_2_worker_containers_sshd_and_trains_to_the_ddp_weights(images, s3, ddp_done,
                                                                                       tmp_path):
    job = MPIJob(images["mpi"], s3, tmp_path, "mpi", epochs=ddp_done["epochs"])
    with job.worker("worker-0") as worker_0, job.worker("worker-1") as worker_1:
        for name, address in WORKERS.items():
            wait_for(lambda: sshd_listening(address, job.port), 180, f"sshd of {name}")
        assert {worker_0.pid1_command(), worker_1.pid1_command()} == {"tini"}
        with job.launcher() as launcher:
            assert run_to_end(launcher, job.folder / "launcher.log") == 0
    assert done(job.folder / "launcher.log")["weights_sha256"] == ddp_done["weights_sha256"]
    assert manifests(s3, "mpi")


# Enough epochs that the stop falls well before the end
PREEMPTION_EPOCHS = 40


def test_a_sigterm_to_a_worker_container_reaches_its_rank_which_stops_and_rank_0_saves(images, s3, tmp_path):
    """The kubelet's stop of one spot worker pod (SIGTERM to its PID 1): tini passes it to entrypoint.sh, which sends
    it to the rank on that worker (rank 1); the ranks agree to stop, rank 0 (on the other worker) saves that step,
    rank 1 exits 143, and the worker container exits 143 once Open MPI's daemon is gone, within the grace period."""
    job = MPIJob(images["mpi"], s3, tmp_path, "mpi-preempted", epochs=PREEMPTION_EPOCHS, capacity_type="spot")
    with job.worker("worker-0"), job.worker("worker-1") as worker_1:
        for name, address in WORKERS.items():
            wait_for(lambda: sshd_listening(address, job.port), 180, f"sshd of {name}")
        with job.launcher() as launcher:
            launcher_log = job.folder / "launcher.log"
            wait_for(lambda: any(e["event"] == "epoch" for e in events(launcher_log)), 300, "the first epoch")
            worker_1.kill("TERM")
            assert worker_1.wait(job.grace) == 143
            # mpirun ends with rank 1's 143, which the launcher's supervisor reruns once the workers' sshd answers
            # again (their new pods, in a cluster): here no new worker-1 comes, so the rerun either waits and is
            # stopped, or reaches worker-1's sshd before its container has exited and may train to the end
            wait_for(lambda: "retryable: running it again" in launcher_log.read_text(), job.grace, "mpirun's end")
    assert "entrypoint.sh: SIGTERM to ranks" in (tmp_path / "worker-1.log").read_text()
    [stopped] = [event for event in events(launcher_log) if event["event"] == "stopped"]  # rank 0's
    step = stopped["global_step"]
    assert stopped["checkpoint"].endswith(manifest_name(step))
    # the stop's checkpoint is in the bucket, or a rerun resumed from it (and, trained to the end, pruned it)
    resumed = [event["global_step"] for event in events(launcher_log) if event["event"] == "resume"]
    assert resumed == [step] or any(key.endswith(manifest_name(step)) for key in manifests(s3, "mpi-preempted"))
    assert "Exit code:    143" in launcher_log.read_text()  # mpirun names rank 1's status


def test_with_sshd_as_pid_1_as_the_upstream_examples_run_it_the_stop_kills_the_rank_unsaved(images, s3, tmp_path):
    """The same stop with the worker started as MPI Operator's example does (sshd -De as PID 1): sshd exits at
    once, the kernel SIGKILLs the rank, and no rank saves the step it reached."""
    job = MPIJob(images["mpi"], s3, tmp_path, "mpi-sshd-pid-1", epochs=PREEMPTION_EPOCHS, capacity_type="spot")
    sshd = ["/usr/sbin/sshd", "-De", "-f", "/opt/gpuyard/mpi/sshd_config", "-h", "/home/gpuyard/.ssh/id_rsa",
            "-o", "AuthorizedKeysFile=/home/gpuyard/.ssh/authorized_keys", "-o", "PidFile=/tmp/sshd.pid",
            "-p", str(job.port)]
    with job.worker("worker-0"), job.worker("worker-1", command=sshd) as worker_1:
        for name, address in WORKERS.items():
            wait_for(lambda: sshd_listening(address, job.port), 180, f"sshd of {name}")
        assert worker_1.pid1_command() == "sshd"
        with job.launcher() as launcher:
            launcher_log = job.folder / "launcher.log"
            wait_for(lambda: any(e["event"] == "epoch" for e in events(launcher_log)), 300, "the first epoch")
            worker_1.kill("TERM")
            assert worker_1.wait(10) != 143
            wait_for(lambda: "launch: exit" in launcher_log.read_text() or launcher.process.poll() is not None,
                     job.grace, "mpirun's end")
    assert not [event for event in events(launcher_log) if event["event"] == "stopped"], launcher_log.read_text()


def test_mpi_entrypoint_outside_a_container_refuses_an_unknown_role():
    entrypoint = Path(__file__).resolve().parent.parent / "images" / "mpi" / "entrypoint.sh"
    result = subprocess.run([str(entrypoint), "launcher"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "usage" in result.stderr
