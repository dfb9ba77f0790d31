"""``gpuyard images build``: the buildx and ECR login calls with a Docker engine, BuildKit without one.

The docker CLI is replaced by a recording stand-in on PATH (this machine has no engine); the ECR token
comes from a real moto_server. Without an engine BuildKit builds for real (tests/test_images_containers.py
runs what it builds).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuyard.infra.config import load_stack, stack_file
from gpuyard.infra.conventions import IMAGE_NAMES
from gpuyard.jobs.image_build import REPO_ROOT
from gpuyard.infra.images import image_ref

GPUYARD = Path(sys.executable).parent / "gpuyard"
ECR_REGISTRY = "123456789012.dkr.ecr.us-west-2.amazonaws.com/gpuyard-dev"
FAKE_DOCKER = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
step = "buildx-version" if args[:2] == ["buildx", "version"] else "build" if args[:2] == ["buildx", "build"] else args[0]
stdin = sys.stdin.read() if step == "login" else None
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({{"args": args, "stdin": stdin}}) + "\\n")
if step in os.environ.get("FAKE_DOCKER_FAIL", "").split(","):
    sys.stderr.write("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\\n")
    sys.exit(1)
print("27.0.0" if step == "info" else "ok")
"""


@pytest.fixture
def docker(tmp_path):
    """A recording ``docker`` first on PATH; returns (env, calls) where calls() reads what it was asked."""
    bin_dir, log = tmp_path / "bin", tmp_path / "docker.log"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_DOCKER_LOG": str(log)}

    def calls() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return env, calls


def gpuyard(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPUYARD), "images", "build", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert result.stderr.startswith("gpuyard: error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_without_docker_nor_go_says_so_in_one_line(tmp_path):
    """No Docker engine means BuildKit, built from its Go module: with neither, one line."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "GPUYARD_CACHE": str(tmp_path / "cache")}
    assert "no Docker engine, and no `go` to build BuildKit with" in one_line_error(gpuyard(env=env))


def test_without_a_docker_engine_dry_run_prints_buildctl_commands(docker):
    env, calls = docker
    result = gpuyard("--dry-run", "-i", "ddp", "--build-arg", "EFA=skip", env={**env, "FAKE_DOCKER_FAIL": "info"})
    assert result.returncode == 0, result.stderr
    [command] = [shlex.split(line) for line in result.stdout.splitlines()]
    assert Path(command[0]).name == "buildctl" and command[command.index("--addr") + 2] == "build"
    assert f"dockerfile={REPO_ROOT / 'images' / 'ddp'}" in command and f"context={REPO_ROOT}" in command
    assert "--opt=build-arg:EFA=skip" in command
    assert command[command.index("--output") + 1] == "type=image,name=gpuyard-dev/ddp:0.1.0"
    assert [call["args"][0] for call in calls()] == ["info"]


def test_without_buildx_builds_with_buildkit_too(docker):
    env, calls = docker
    result = gpuyard("--dry-run", "-i", "mpi", env={**env, "FAKE_DOCKER_FAIL": "buildx-version"})
    assert result.returncode == 0 and Path(shlex.split(result.stdout)[0]).name == "buildctl", result.stderr
    assert not [call for call in calls() if call["args"][:2] == ["buildx", "build"]]


@pytest.mark.slow
def test_without_a_docker_engine_a_failed_buildkit_build_is_exit_1_after_its_output(docker, tmp_path):
    """BuildKit for real: the public base (pytorch/pytorch) cannot be pulled here, so the build fails."""
    env, _ = docker
    result = gpuyard("-i", "ddp", env={**env, "FAKE_DOCKER_FAIL": "info"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == "gpuyard: error: buildctl build of ddp failed (see the output above)"
    assert "pytorch/pytorch:2.13.0-cuda13.2-cudnn9-runtime" in result.stdout + result.stderr


def test_builds_each_image_from_the_repo_root_tagged_with_the_stack_reference(docker):
    env, calls = docker
    result = gpuyard("--stack", "dev", env=env)
    assert result.returncode == 0, result.stderr
    config = load_stack("dev")
    builds = [call["args"] for call in calls() if call["args"][:2] == ["buildx", "build"]]
    assert len(builds) == len(IMAGE_NAMES)
    revision = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    for image, build in zip(IMAGE_NAMES, builds, strict=True):
        assert build[build.index("--file") + 1] == str(REPO_ROOT / "images" / image / "Dockerfile")
        assert build[build.index("--tag") + 1] == image_ref(config, image)
        assert f"VCS_REF={revision}" in build and "--load" in build and "--push" not in build
        assert build[-1] == str(REPO_ROOT)
        assert f"built {image_ref(config, image)}" in result.stdout


def test_push_needs_a_registry_in_the_stack(docker):
    env, calls = docker
    assert "gpuyard:image_registry" in one_line_error(gpuyard("--push", "--stack", "dev", env=env))
    assert calls() == []


@pytest.fixture
def ecr_stack(tmp_path):
    """The dev stack with its ECR registry set, in a stacks dir of its own."""
    document = yaml.safe_load(stack_file("dev").read_text())
    document["config"]["gpuyard:image_registry"] = ECR_REGISTRY
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document))
    return stacks


def test_push_logs_in_to_ecr_then_pushes_each_image(docker, ecr_stack, local_aws):
    env, calls = docker
    env = {**env, **local_aws.env, "GPUYARD_STACKS_DIR": str(ecr_stack)}
    result = gpuyard("--push", "-i", "ddp", env=env)
    assert result.returncode == 0, result.stderr
    steps = [call for call in calls() if call["args"][0] in ("login", "buildx") and call["args"][1] != "version"]
    login, build = steps
    assert login["args"] == ["login", "--username", "AWS", "--password-stdin", ECR_REGISTRY.split("/")[0]]
    assert login["stdin"]
    assert "--push" in build["args"] and f"{ECR_REGISTRY}/ddp:" in build["args"][build["args"].index("--tag") + 1]


def test_a_failed_build_stops_with_exit_1_after_docker_s_own_output(docker):
    env, calls = docker
    result = gpuyard("-i", "mpi", "-i", "ray", env={**env, "FAKE_DOCKER_FAIL": "build"})
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "gpuyard: error: docker buildx build of mpi failed (see the output above)"
    assert len([call for call in calls() if call["args"][:2] == ["buildx", "build"]]) == 1


def test_unknown_image_is_a_usage_error(docker):
    env, calls = docker
    assert "Invalid value for '--image' / '-i': 'cuda' is not one of 'ddp', 'mpi', 'ray'" in one_line_error(
        gpuyard("-i", "cuda", env=env))
    assert calls() == []


def test_dry_run_prints_the_buildx_commands_and_runs_nothing(docker):
    env, calls = docker
    result = gpuyard("--dry-run", "-i", "ddp", "-i", "ray", env=env)
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line) for line in result.stdout.splitlines()]
    assert [command[:3] for command in commands] == [["docker", "buildx", "build"]] * 2
    assert [command[command.index("--tag") + 1] for command in commands] == ["gpuyard-dev/ddp:0.1.0",
                                                                             "gpuyard-dev/ray:0.1.0"]
    assert [call["args"][:2] for call in calls()] == [["info", "--format"], ["buildx", "version"]]  # which builder


@pytest.mark.slow
def test_without_a_docker_engine_buildkit_builds_and_pushes_to_the_stacks_registry(docker, tmp_path):
    """BuildKit for real, on the base `gpuyard sim images` makes, pushing to a registry on loopback."""
    from gpuyard.sim.build import build_component
    from gpuyard.sim.images import base_build, build_images
    from gpuyard.sim.registry import serving
    from gpuyard.sim.versions import IMAGE_COMPONENTS

    env, _ = docker
    binary = build_component(next(c for c in IMAGE_COMPONENTS if c.name == "registry"), print) / "registry"
    with serving(tmp_path / "registry", binary) as registry:
        build_images(registry, "dev")  # the bases (cached by their inputs)
        base = base_build("torch")
        document = yaml.safe_load(stack_file("dev").read_text())
        document["config"]["gpuyard:image_registry"] = f"{registry.address}/gpuyard-images-build-test"
        stacks = tmp_path / "stacks"
        stacks.mkdir()
        (stacks / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document))
        result = gpuyard("--push", "-i", "ddp", "--build-arg", f"BASE_IMAGE={registry.address}/{base.repository}:{base.tag}",
                         # the sim's own build arguments, so BuildKit's cache from `sim images` serves every step
                         "--build-arg", "EFA=skip", "--build-arg", "VCS_REF=unknown",
                         env={**env, "FAKE_DOCKER_FAIL": "info", "GPUYARD_STACKS_DIR": str(stacks)})
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        ref = f"{registry.address}/gpuyard-images-build-test/ddp:0.1.0"
        assert f"pushed {ref}" in result.stdout
        assert registry.manifest("gpuyard-images-build-test/ddp", "0.1.0") is not None
