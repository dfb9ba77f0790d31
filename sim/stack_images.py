"""``gpuyard images build`` where there is no Docker engine: the builds docker buildx would run (the Dockerfiles'
own bases unless a ``--build-arg`` names another, the same build arguments and tags), run by BuildKit
(sim/buildkit.py, the builder of ``gpuyard sim images``). A push to ECR logs in with the ECR API's token, given to
buildctl as a Docker config of its own; a registry on loopback is plain HTTP, its layers uncompressed.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from gpuyard.infra.config import StackConfig
from gpuyard.infra.images import image_ref
from gpuyard.jobs.context_image import GENERATED, ContextBuild
from gpuyard.jobs.image_build import (REPO_ROOT, BuildError, BuildFailed, build_args, check_images, dockerfile,
                              ecr_authorization, push_host, source_revision)
from gpuyard.sim import buildkit
from gpuyard.sim.build import build_component, go_available
from gpuyard.sim.paths import bin_dir
from gpuyard.sim.versions import IMAGE_COMPONENTS

BUILDER = ("runc", "buildkit")


def loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name == "localhost" or name.startswith("127.")


def output(ref: str, push: bool, plain_http: bool) -> str:
    """buildctl's --output: the image named ``ref``, pushed or left in BuildKit's cache; to a registry that speaks
    plain HTTP (a local one) with its layers uncompressed."""
    parts = ["type=image", f"name={ref}"]
    if push:
        parts.append("push=true")
        if plain_http:
            parts += ["registry.insecure=true", "compression=uncompressed"]
    return ",".join(parts)


def build_images(config: StackConfig, images: Sequence[str], *, push: bool, platform: str,
                 echo: Callable[[str], None] = print, dry_run: bool = False,
                 extra_args: dict[str, str] | None = None) -> list[str]:
    """Build (and push) each image with BuildKit; returns their references; ``dry_run`` prints buildctl's
    commands (shell-quoted, one a line) and runs nothing."""
    check_images(images)
    host = push_host(config) if push else None
    plain_http = bool(host) and loopback(host)
    args = build_args(source_revision(), extra_args)
    components = [c for c in IMAGE_COMPONENTS if c.name in BUILDER]
    planned = buildkit.builder({c.name: bin_dir(c.name, c.version) for c in components})
    outputs = {image: output(image_ref(config, image), push, plain_http) for image in images}
    commands = {image: planned.command(dockerfile(image), REPO_ROOT, output=outputs[image], build_args=args,
                                       platform=platform) for image in images}
    if dry_run:
        for command in commands.values():
            echo(shlex.join(command))
        return [image_ref(config, image) for image in images]
    if not go_available():
        raise BuildError("no Docker engine, and no `go` to build BuildKit with (sim/go/buildkit)")
    bins = {c.name: build_component(c, echo) for c in components}
    registries = {host, *(value.split("/", 1)[0] for value in args.values() if "/" in value)}
    with tempfile.TemporaryDirectory(prefix="gpuyard-buildctl-") as docker_config, \
            buildkit.running(bins, sorted(r for r in registries if r and loopback(r)), echo) as builder:
        token = ecr_authorization(host) if host else None
        if token:
            (Path(docker_config) / "config.json").write_text(json.dumps({"auths": {host: {"auth": token}}}))
        built = []
        for image in images:
            ref = image_ref(config, image)
            echo(f"building {image} with BuildKit (no Docker engine): {shlex.join(commands[image])}")
            try:
                builder.build(image, dockerfile(image), REPO_ROOT, output=outputs[image], build_args=args,
                              platform=platform, env={"DOCKER_CONFIG": docker_config}, logged=False)
            except buildkit.BuildFailed as error:
                raise BuildFailed(str(error)) from None
            built.append(ref)
            echo(f"pushed {ref}" if push else
                 f"built {ref} (kept in BuildKit's cache, {buildkit.root()}: no Docker engine to load it into)")
    return built


def plain_http_registries(stack: str, hosts: set[str]) -> list[str]:
    """Those of ``hosts`` that speak plain HTTP: on loopback, or the registry of the stack's sim (on its bridge
    with real nodes)."""
    from gpuyard.sim.cluster import Sim

    sim = Sim(stack).registry()
    return sorted(host for host in hosts if loopback(host) or (sim is not None and host == sim.address))


def build_context_image(config: StackConfig, build: ContextBuild, *, push: bool, platform: str,
                        echo: Callable[[str], None], say: Callable[[str], None], dry_run: bool = False) -> str:
    """BuildKit's build (and push) of a user's folder (gpuyard.jobs.context_image); returns its reference, which
    it echoes; ``dry_run`` echoes the Dockerfile and buildctl's command and runs nothing."""
    host = push_host(config) if push else None
    hosts = {build.base.split("/", 1)[0], *([host] if host else [])}
    plain_http = plain_http_registries(config.stack, hosts)
    target = output(build.ref, push, host in plain_http)
    components = [c for c in IMAGE_COMPONENTS if c.name in BUILDER]
    planned = buildkit.builder({c.name: bin_dir(c.name, c.version) for c in components})
    if dry_run:
        for line in build.describe(planned.command(GENERATED / "Dockerfile", build.context, output=target,
                                                   platform=platform)):
            echo(line)
        return build.ref
    if not go_available():
        raise BuildError("no Docker engine, and no `go` to build BuildKit with (sim/go/buildkit)")
    bins = {c.name: build_component(c, say) for c in components}
    with tempfile.TemporaryDirectory(prefix="gpuyard-context-") as folder, \
            buildkit.running(bins, plain_http, say) as builder:
        docker_config = Path(folder) / "docker"
        docker_config.mkdir()
        auths = {h: {"auth": token} for h in sorted(hosts) if (token := ecr_authorization(h))}
        (docker_config / "config.json").write_text(json.dumps({"auths": auths}))
        dockerfile = build.write(Path(folder))
        say(f"building {build.context} on {build.base} with BuildKit (no Docker engine)")
        try:
            builder.build(f"context-{build.ref.rsplit(':', 1)[1]}", dockerfile, build.context, output=target,
                          platform=platform, env={"DOCKER_CONFIG": str(docker_config)}, logged=False)
        except buildkit.BuildFailed as error:
            raise BuildFailed(str(error)) from None
    say(f"pushed {build.ref}" if push else
        f"built {build.ref} (kept in BuildKit's cache, {buildkit.root()}: no Docker engine to load it into)")
    echo(build.ref)
    return build.ref
