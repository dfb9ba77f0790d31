"""``gpuyard images build``: the job images, or (``--context DIR``) a user's folder on the kind's image, with docker
buildx, or with BuildKit where there is no Docker engine, pushed to the stack's registry."""

from __future__ import annotations

import enum
import re
from pathlib import Path

import typer

from gpuyard.infra.config import ConfigError, StackConfig, load_stack
from gpuyard.infra.conventions import IMAGE_NAMES
from gpuyard.jobs.cli.errors import fail, usage_without_command
from gpuyard.jobs.cli.options import flag_of, given, stack_option, with_registry
from gpuyard.jobs.context_image import build_with_docker, context_build
from gpuyard.jobs.image_build import DEFAULT_PLATFORM, BuildError, build_images, docker_problem, push_host
from gpuyard.jobs.spec import KINDS, stack_kinds

PLATFORM = re.compile(r"[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?(,[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?)*")
BUILD_ARG = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # distribution/reference's tag (infra/image_reference.py)
Image = enum.Enum("Image", [(name, name) for name in IMAGE_NAMES], type=str)
Kind = enum.Enum("Kind", [(kind, kind) for kind in KINDS], type=str)
CONTEXT_ONLY = ("team", "kind", "tag")  # options of --context builds
IMAGES_ONLY = ("image", "build_arg")  # options of the three images' builds

app = typer.Typer(help="Container images of the training jobs (images/<name>/Dockerfile).",
                  invoke_without_command=True, callback=usage_without_command)


def parse_build_args(items: list[str]) -> dict[str, str]:
    args = {}
    for item in items:
        match = BUILD_ARG.fullmatch(item)
        if match is None:
            fail(f"--build-arg {item!r}: expected KEY=VALUE (like BASE_IMAGE=registry.example/base:1)")
        args[match["key"]] = match["value"]
    return args


@app.command()
def build(
    ctx: typer.Context,
    stack: str = stack_option("Stack whose registry and tag name the images."),
    image: list[Image] = typer.Option(list(Image), "--image", "-i", help="Image to build, repeatable."),
    context: str | None = typer.Option(None, "--context", metavar="DIR",
                                       help="Build DIR (and its requirements.txt) on the kind's image instead."),
    team: str | None = typer.Option(None, "--team", help="With --context: the team whose image it is."),
    kind: Kind | None = typer.Option(None, "--kind", help="With --context: the kind of job that runs it."),
    tag: str | None = typer.Option(None, "--tag", help="With --context: the image's tag [default: <team>-<digest "
                                   "of the base and the folder>]."),
    registry: str | None = typer.Option(None, "--registry", metavar="PREFIX",
                                        help="Image registry prefix, over gpuyard:image_registry (gpuyard sim registry)."),
    push: bool = typer.Option(False, "--push", help="Push to the stack's registry (gpuyard:image_registry)."),
    platform: str = typer.Option(DEFAULT_PLATFORM, "--platform", help="Target platform."),
    build_arg: list[str] = typer.Option([], "--build-arg", metavar="KEY=VALUE",
                                        help="Dockerfile build argument, repeatable (like BASE_IMAGE=..., EFA=skip)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the build commands; run nothing."),
) -> None:
    """Build each image from the repository root with docker buildx, or with BuildKit (built from its Go module)
    where there is no Docker engine; with --push, push it to the stack's registry (an ECR host logs in first).

    With --context DIR, build DIR on the image of --kind instead (as --team's; the reference is the last line)."""
    if not PLATFORM.fullmatch(platform):
        fail(f"--platform {platform!r}: expected OS/ARCH[/VARIANT], comma-separated (like linux/amd64,linux/arm64)")
    for name in (*CONTEXT_ONLY, *IMAGES_ONLY):
        if not given(ctx, name):
            continue
        if (name in CONTEXT_ONLY) != (context is not None):
            fail(f"{flag_of(ctx, name)} {'needs --context DIR' if name in CONTEXT_ONLY else 'is not for --context'}")
    extra_args = parse_build_args(build_arg)
    try:
        config = load_stack(stack)
        if registry is not None:
            config = with_registry(config, registry)
        if push:
            push_host(config)  # a stack without a registry fails before anything runs
        if context is not None:
            return build_context(config, context, team, kind, tag, push=push, platform=platform,
                                 dry_run=dry_run)
        builder = build_images
        if docker_problem() is not None:
            from gpuyard.sim.stack_images import build_images as builder
        builder(config, [i.value for i in image], push=push, platform=platform, echo=typer.echo, dry_run=dry_run,
                extra_args=extra_args)
    except ConfigError as error:
        fail(str(error))
    except BuildError as error:
        fail(str(error), code=error.exit_code)


def build_context(config: StackConfig, text: str, team: str | None, kind: Kind | None, tag: str | None, *,
                  push: bool, platform: str, dry_run: bool) -> None:
    """``--context``: the checks, then the build of the folder with docker buildx or BuildKit."""
    if not text.strip():
        fail("--context is empty: name your project's folder")
    context = Path(text)
    if not context.exists():
        fail(f"--context {text}: no such folder")
    if not context.is_dir():
        fail(f"--context {text}: is not a folder")
    if team is None or kind is None:
        fail(f"--context needs {'--team' if team is None else '--kind'} (whose image, for which kind of job)")
    if kind.value not in stack_kinds(config):
        fail(f"--kind {kind.value}: stack {config.stack!r} does not install Kubeflow Trainer v2 "
             "(gpuyard:addons.trainer_v2)")
    if tag is not None and not TAG.fullmatch(tag):
        fail(f"--tag {tag!r}: not an image tag (letters, digits, _ . and -, at most 128, not starting with . or -)")
    try:
        planned = context_build(config, config.team(team), kind.value, context, tag)
    except ConfigError as error:
        fail(f"--team: {error}")
    except OSError as error:
        fail(f"--context {text}: cannot read {error.filename}: {error.strerror}")
    builder = build_with_docker
    if docker_problem() is not None:
        from gpuyard.sim.stack_images import build_context_image as builder
    builder(config, planned, push=push, platform=platform, echo=typer.echo,
            say=lambda line: typer.echo(line, err=True), dry_run=dry_run)
