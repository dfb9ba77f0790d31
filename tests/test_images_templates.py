"""The job templates run the images as their Dockerfiles define them.

Every kind of every dev-stack team is rendered; its image references are the stack's
refs of the kind's image, and its commands are the Dockerfile's ENTRYPOINT/CMD (which
tests/test_images_containers.py runs in containers of the built images) or, for the MPI launcher, the
mpirun that test runs.
"""

from __future__ import annotations

import re
import shlex

import pytest

from dockerfile_parse import IMAGES, Dockerfile
from conftest import with_registry
from gpuyard.infra.config import load_stack
from gpuyard.infra.images import image_ref
from gpuyard.jobs.render import render
from gpuyard.jobs.render.mpi import SSH_DIR, SSH_PORT
from gpuyard.infra.conventions import RUN_AS_USER
from gpuyard.jobs.spec import KIND_IMAGE, KINDS, build_spec
from gpuyard.jobs.workload.args import RAY_MODULE, TRAIN_MODULE, parse_args

CONFIG = with_registry(load_stack("dev"))
CASES = [(team, kind) for team in CONFIG.teams for kind in KINDS]


def containers(node) -> list[dict]:
    """Every container (or TrainJob trainer) in a manifest: dicts that carry an ``image``."""
    if isinstance(node, dict):
        found = [node] if isinstance(node.get("image"), str) else []
        return found + [c for value in node.values() for c in containers(value)]
    if isinstance(node, list):
        return [c for item in node for c in containers(item)]
    return []


def rendered(team, kind) -> dict:
    return render(build_spec(CONFIG, team, kind), team)


def trainer_argv(argv: list[str]) -> list[str]:
    parse_args(argv)  # a bad trainer command line raises here
    return argv


@pytest.mark.parametrize(("team", "kind"), CASES, ids=[f"{t.name}-{k}" for t, k in CASES])
def test_every_container_runs_the_stack_image_of_its_kind(team, kind):
    images = {c["image"] for c in containers(rendered(team, kind))}
    expected = team.image if KIND_IMAGE[kind] == "ddp" and team.image else image_ref(CONFIG, KIND_IMAGE[kind])
    assert images == {expected}
    assert (IMAGES / KIND_IMAGE[kind] / "Dockerfile").exists()


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_torchrun_kinds_run_the_ddp_entrypoint_and_module(kind):
    entrypoint, cmd = Dockerfile.of("ddp").exec_form("ENTRYPOINT"), Dockerfile.of("ddp").exec_form("CMD")
    for trainer in containers(rendered(CONFIG.teams[0], kind)):
        command = trainer["command"]
        assert command[:len(entrypoint)] == entrypoint
        assert command[-2:] == cmd[:2] == ["-m", TRAIN_MODULE]
        trainer_argv(trainer["args"])


@pytest.mark.parametrize("kind", ["mpijob", "volcanojob"])
def test_mpi_workers_run_the_image_entrypoint_and_launchers_its_mpirun(kind):
    workers, launchers = [], []
    for c in containers(rendered(CONFIG.teams[0], kind)):
        (launchers if "mpirun" in c["command"] else workers).append(c)
    assert len(workers) == len(launchers) == 1
    image_command = Dockerfile.of("mpi").command()
    worker_command = workers[0]["command"] + workers[0].get("args", [])
    assert worker_command[:len(image_command)] == image_command and worker_command[len(image_command):] == [
        "-p", str(SSH_PORT)  # entrypoint.sh passes SSHD_OPTIONs on: the port, explicit
    ]
    launcher = launchers[0]
    assert launcher["command"][-3:] == ["python3", "-m", TRAIN_MODULE]
    exported = {launcher["command"][i + 1] for i, word in enumerate(launcher["command"]) if word == "-x"}
    assert {"MASTER_ADDR", "MASTER_PORT"} <= exported
    trainer_argv(launcher["args"])


def test_mpi_templates_mount_the_ssh_key_where_the_image_s_sshd_reads_it():
    dockerfile = Dockerfile.of("mpi")
    assert SSH_DIR == f"{dockerfile.all('WORKDIR')[-1]}/.ssh"  # ~/.ssh of the image's user
    port = re.search(r"^Port\s+(\d+)", (IMAGES / "mpi" / "sshd_config").read_text(), re.M)[1]
    assert SSH_PORT == int(port)
    mpijob, volcano = rendered(CONFIG.teams[0], "mpijob"), rendered(CONFIG.teams[0], "volcanojob")
    assert mpijob["spec"]["sshAuthMountPath"] == SSH_DIR
    assert volcano["spec"]["plugins"]["ssh"] == [f"--ssh-key-file-path={SSH_DIR}"]


def test_rayjob_entrypoint_is_the_ray_image_command_shape():
    cmd = Dockerfile.of("ray").command()
    entrypoint = shlex.split(rendered(CONFIG.teams[0], "rayjob")["spec"]["entrypoint"])
    assert entrypoint[:3] == cmd[:3] == ["python", "-m", RAY_MODULE]
    assert entrypoint[-5] == cmd[-2] == "--num-workers"
    assert entrypoint[-3] in ("--use-gpu", "--no-use-gpu") and entrypoint[-2] == "--max-restarts"
    trainer_argv(entrypoint[3:-5])


@pytest.mark.parametrize("image", sorted(set(KIND_IMAGE.values())))
def test_templates_run_as_the_image_s_user(image):
    dockerfile = Dockerfile.of(image)
    assert dockerfile.expand(dockerfile.all("USER")[-1]).split(":")[0] == str(RUN_AS_USER)

