"""Build the ``images/`` Dockerfiles with docker buildx and push them to the stack's registry.

Images are tagged ``gpuyard.infra.images.image_ref`` (``<registry>/<image>:<tag>``), the same
references the job templates use. Pushing needs ``gpuyard:image_registry`` (the host
and cluster prefix of the stack's ECR repositories); an ECR host gets a
``docker login`` with a token from the ECR API first.
"""

from __future__ import annotations

import base64
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from gpuyard.infra.config import StackConfig
from gpuyard.infra.conventions import IMAGE_NAMES
from gpuyard.infra.images import image_ref
from gpuyard.jobs.processes import run_child

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PLATFORM = "linux/amd64"
ECR_HOST = re.compile(r"^\d{12}\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?$")
_DOCKER_TIMEOUT_S = 60


class BuildError(RuntimeError):
    """Why images cannot be built or pushed, as one line; the CLI exits with ``exit_code``."""

    exit_code = 2


class BuildFailed(BuildError):
    """docker itself failed while building, pushing or logging in."""

    exit_code = 1


def dockerfile(image: str) -> Path:
    return REPO_ROOT / "images" / image / "Dockerfile"


def docker_problem(docker: str = "docker") -> str | None:
    """None when a Docker engine with buildx answers, else what is missing (one line)."""
    if shutil.which(docker) is None:
        return f"no Docker engine: `{docker}` is not installed"
    info = _run([docker, "info", "--format", "{{.ServerVersion}}"])
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker engine: `{docker} info` failed ({reason})"
    if _run([docker, "buildx", "version"]).returncode != 0:
        return f"docker buildx is not installed (`{docker} buildx version` failed)"
    return None


def source_revision(root: Path = REPO_ROOT) -> str:
    """The checkout's short commit, ``unknown`` outside git."""
    try:
        result = _run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"])
    except FileNotFoundError:
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def build_args(revision: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The Dockerfiles' build arguments: the package version, the source revision, then the user's own."""
    return {"GPUYARD_VERSION": version("gpuyard"), "VCS_REF": revision, **(extra or {})}


def buildx_command(config: StackConfig, image: str, *, push: bool, platform: str, revision: str,
                   extra_args: dict[str, str] | None = None) -> list[str]:
    """``docker buildx build`` of one image with the repository root as context."""
    return [
        "docker", "buildx", "build",
        "--file", str(dockerfile(image)),
        "--tag", image_ref(config, image),
        "--platform", platform,
        *(arg for key, value in build_args(revision, extra_args).items() for arg in ("--build-arg", f"{key}={value}")),
        "--push" if push else "--load",
        str(REPO_ROOT),
    ]


def push_host(config: StackConfig) -> str:
    """The registry host images are pushed to; a BuildError when the stack names none."""
    if not config.image_registry:
        raise BuildError(f"stack {config.stack!r} sets no gpuyard:image_registry to push to "
                         "(set it to the stack's ecr_repositories output, <account>.dkr.ecr.<region>.amazonaws.com/<cluster>)")
    return config.image_registry.split("/", 1)[0]


def ecr_authorization(host: str) -> str | None:
    """The ECR API's token for an ECR host (base64 of ``user:password``, a registry's basic auth); None for
    another host."""
    match = ECR_HOST.match(host)
    if match is None:
        return None
    try:
        ecr = boto3.client("ecr", region_name=match["region"])
        return ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    except (BotoCoreError, ClientError) as error:
        raise BuildError(f"no ECR login token for {host}: {error}") from None


def ecr_login(host: str) -> None:
    """``docker login`` to an ECR host with a token from the ECR API (nothing is written here)."""
    token = ecr_authorization(host)
    if token is None:
        return
    user, password = base64.b64decode(token).decode().split(":", 1)
    login = subprocess.run(["docker", "login", "--username", user, "--password-stdin", host],
                           input=password, capture_output=True, text=True, timeout=_DOCKER_TIMEOUT_S)
    if login.returncode != 0:
        raise BuildFailed(f"docker login to {host} failed: {(login.stderr.strip().splitlines() or ['no output'])[-1]}")


def check_images(images: Sequence[str]) -> None:
    unknown = [image for image in images if image not in IMAGE_NAMES]
    if unknown:
        raise BuildError(f"unknown image {unknown[0]!r} (images: {', '.join(IMAGE_NAMES)})")


def build_images(config: StackConfig, images: Sequence[str], *, push: bool, platform: str = DEFAULT_PLATFORM,
                 echo: Callable[[str], None] = print, dry_run: bool = False,
                 extra_args: dict[str, str] | None = None) -> list[str]:
    """Build (and push) each image in turn with docker buildx; returns their references. Stops at the first failure.

    With ``dry_run``, prints the buildx commands (one per line, shell-quoted) and runs nothing.
    """
    check_images(images)
    host = push_host(config) if push else None
    if dry_run:
        revision = source_revision()
        for image in images:
            echo(shlex.join(buildx_command(config, image, push=push, platform=platform, revision=revision,
                                           extra_args=extra_args)))
        return [image_ref(config, image) for image in images]
    problem = docker_problem()
    if problem:
        raise BuildError(problem)
    if host:
        ecr_login(host)
    revision = source_revision()
    built = []
    for image in images:
        command = buildx_command(config, image, push=push, platform=platform, revision=revision,
                                 extra_args=extra_args)
        echo(f"building {image}: {' '.join(command)}")
        if run_child(command) != 0:
            raise BuildFailed(f"docker buildx build of {image} failed (see the output above)")
        built.append(image_ref(config, image))
        echo(f"{'pushed' if push else 'built'} {built[-1]}")
    return built


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=_DOCKER_TIMEOUT_S)
