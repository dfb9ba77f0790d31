"""``gpuyard images build --context DIR``: a user's folder layered on the kind's gpuyard image.

The Dockerfile is generated into a folder of its own, never into ``DIR``: ``FROM`` the image ``gpuyard render`` gives
the kind (a team's own ``image`` for the ddp kinds), ``DIR/requirements.txt`` installed with pip as the image's user
(into its ``~/.local``), then ``DIR`` copied into the image's working folder, owned by that user. ``.git``,
``__pycache__`` and ``.venv`` stay out (``Dockerfile.dockerignore`` beside the Dockerfile, which both BuildKit and
docker buildx read before the context's ``.dockerignore``: moby/buildkit v0.34.2 frontend/dockerui/config.go; the
user's own ``.dockerignore`` is kept in it).

The image is named in the kind's repository of the stack (``<registry>/<image>``, where a team's ``image`` lives),
tagged ``<team>-<12 hex digits of the base reference and the folder's files>``: a change of either gives a new tag,
which ECR's immutable tags need.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuyard.infra.config import StackConfig, Team
from gpuyard.infra.images import image_ref
from gpuyard.jobs.image_build import BuildError, BuildFailed, docker_problem, ecr_login, push_host
from gpuyard.jobs.processes import run_child
from gpuyard.jobs.spec import KIND_IMAGE, default_image

EXCLUDED = (".git", "__pycache__", ".venv")  # folder names left out of the image, at any depth
REQUIREMENTS = "requirements.txt"
# Each image's working folder and user (images/*/Dockerfile: the last WORKDIR and USER; tests pin them).
HOME = {"ddp": "/home/gpuyard", "mpi": "/home/gpuyard", "ray": "/home/ray"}
USER = {"ddp": "1000:1000", "mpi": "1000:1000", "ray": "1000:100"}
GENERATED = Path("<generated>")  # what a dry run shows for the folder the Dockerfile would be written to

Say = Callable[[str], None]


@dataclass(frozen=True)
class ContextBuild:
    """``context`` layered on ``base`` (the kind's ``image``), named ``ref``."""

    context: Path
    image: str
    base: str
    ref: str

    def dockerfile(self) -> str:
        user = USER[self.image]
        lines = [f"FROM {self.base}", f'LABEL org.opencontainers.image.base.name="{self.base}"', f"USER {user}",
                 f"WORKDIR {HOME[self.image]}"]
        if (self.context / REQUIREMENTS).is_file():
            lines += [f"COPY --chown={user} {REQUIREMENTS} {REQUIREMENTS}",
                      f"RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --user -r {REQUIREMENTS}"]
        return "\n".join([*lines, f"COPY --chown={user} . ."]) + "\n"

    def dockerignore(self) -> str:
        own = self.context / ".dockerignore"
        kept = own.read_text().rstrip("\n") + "\n" if own.is_file() else ""
        return kept + "".join(f"**/{name}\n" for name in EXCLUDED)

    def write(self, folder: Path) -> Path:
        """Dockerfile and Dockerfile.dockerignore in ``folder``; returns the Dockerfile's path."""
        dockerfile = folder / "Dockerfile"
        dockerfile.write_text(self.dockerfile())
        (folder / "Dockerfile.dockerignore").write_text(self.dockerignore())
        return dockerfile

    def describe(self, command: list[str]) -> list[str]:
        """What a dry run prints: the Dockerfile, its ignore file, the build command, the reference (last)."""
        return ["# Dockerfile", *self.dockerfile().splitlines(), "# Dockerfile.dockerignore",
                *self.dockerignore().splitlines(), "# build", shlex.join(command), self.ref]


def context_files(context: Path) -> list[Path]:
    """The folder's files and links, ``EXCLUDED`` folders left out, in a stable order."""
    found = []
    for folder, subfolders, files in os.walk(context):
        subfolders[:] = sorted(name for name in subfolders if name not in EXCLUDED)
        found += [path for path in (Path(folder) / name for name in sorted(files))
                  if path.is_symlink() or path.is_file()]  # not a FIFO, whose read would wait forever
    return found


def content_tag(team: Team, base: str, context: Path) -> str:
    digest = hashlib.sha256(base.encode())
    for path in context_files(context):
        digest.update(f"\0{path.relative_to(context)}\0{path.lstat().st_mode & 0o7777:o}\0".encode())
        digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())  # copied as links
    return f"{team.name}-{digest.hexdigest()[:12]}"


def context_build(config: StackConfig, team: Team, kind: str, context: Path, tag: str | None = None) -> ContextBuild:
    """The build of ``context`` for ``team``'s jobs of ``kind``: the base ``gpuyard render`` would run (the stack's
    registry, or the local name ``gpuyard images build`` tags without one) and the reference in its repository."""
    image = KIND_IMAGE[kind]
    local = config.model_copy(update={"image_registry": config.image_registry or config.cluster_name})
    base = default_image(local, team, kind)
    repository = image_ref(config, image).rsplit(":", 1)[0]
    context = context.resolve()
    return ContextBuild(context, image, base, f"{repository}:{tag or content_tag(team, base, context)}")


def buildx_command(build: ContextBuild, dockerfile: Path, *, push: bool, platform: str) -> list[str]:
    return ["docker", "buildx", "build", "--file", str(dockerfile), "--tag", build.ref, "--platform", platform,
            "--push" if push else "--load", str(build.context)]


def build_with_docker(config: StackConfig, build: ContextBuild, *, push: bool, platform: str, echo: Say,
                      say: Say, dry_run: bool = False) -> str:
    """docker buildx build (and push) of ``build``; ``dry_run`` echoes what it would do and runs nothing."""
    host = push_host(config) if push else None
    if dry_run:
        for line in build.describe(buildx_command(build, GENERATED / "Dockerfile", push=push, platform=platform)):
            echo(line)
        return build.ref
    problem = docker_problem()
    if problem:
        raise BuildError(problem)
    for registry in sorted({build.base.split("/", 1)[0], host} - {None}):
        ecr_login(registry)
    with tempfile.TemporaryDirectory(prefix="gpuyard-context-") as folder:
        command = buildx_command(build, build.write(Path(folder)), push=push, platform=platform)
        say(f"building {build.context} on {build.base}: {shlex.join(command)}")
        if run_child(command) != 0:
            raise BuildFailed(f"docker buildx build of {build.context} failed (see the output above)")
    echo(build.ref)
    return build.ref
