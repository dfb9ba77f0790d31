"""``gpuyard images build``: the job images with docker buildx, or with BuildKit where there is no Docker engine,
pushed to the stack's registry."""

from __future__ import annotations

import enum
import re

import typer

from infra.config import ConfigError, load_stack
from infra.conventions import IMAGE_NAMES
from jobs.cli.errors import fail, usage_without_command
from jobs.cli.options import stack_option
from jobs.image_build import DEFAULT_PLATFORM, BuildError, build_images, docker_problem, push_host

PLATFORM = re.compile(r"[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?(,[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?)*")
BUILD_ARG = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)")
Image = enum.Enum("Image", [(name, name) for name in IMAGE_NAMES], type=str)

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
    stack: str = stack_option("Stack whose registry and tag name the images."),
    image: list[Image] = typer.Option(list(Image), "--image", "-i", help="Image to build, repeatable."),
    push: bool = typer.Option(False, "--push", help="Push to the stack's registry (gpuyard:image_registry)."),
    platform: str = typer.Option(DEFAULT_PLATFORM, "--platform", help="Target platform."),
    build_arg: list[str] = typer.Option([], "--build-arg", metavar="KEY=VALUE",
                                        help="Dockerfile build argument, repeatable (like BASE_IMAGE=..., EFA=skip)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the build commands; run nothing."),
) -> None:
    """Build each image from the repository root with docker buildx, or with BuildKit (built from its Go module)
    where there is no Docker engine; with --push, push it to the stack's registry (an ECR host logs in first)."""
    if not PLATFORM.fullmatch(platform):
        fail(f"--platform {platform!r}: expected OS/ARCH[/VARIANT], comma-separated (like linux/amd64,linux/arm64)")
    extra_args = parse_build_args(build_arg)
    try:
        config = load_stack(stack)
        if push:
            push_host(config)  # a stack without a registry fails before anything runs
        builder = build_images
        if docker_problem() is not None:
            from sim.stack_images import build_images as builder
        builder(config, [i.value for i in image], push=push, platform=platform, echo=typer.echo, dry_run=dry_run,
                extra_args=extra_args)
    except ConfigError as error:
        fail(str(error))
    except BuildError as error:
        fail(str(error), code=error.exit_code)
