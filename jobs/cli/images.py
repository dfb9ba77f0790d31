"""``gpuyard images build``: the job images with docker buildx, pushed to the stack's ECR."""

from __future__ import annotations

import enum
import re

import typer

from infra.config import ConfigError, load_stack
from infra.conventions import IMAGE_NAMES
from jobs.cli.errors import fail
from jobs.cli.options import Stack
from jobs.image_build import DEFAULT_PLATFORM, BuildError, build_images

PLATFORM = re.compile(r"[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?(,[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?)*")
Image = enum.Enum("Image", [(name, name) for name in IMAGE_NAMES], type=str)

app = typer.Typer(help="Container images of the training jobs (images/<name>/Dockerfile).",
                         no_args_is_help=True)


@app.command()
def build(
    stack: Stack = typer.Option("dev", "--stack", help="Stack whose registry and tag name the images."),
    image: list[Image] = typer.Option(list(Image), "--image", "-i", help="Image to build, repeatable."),
    push: bool = typer.Option(False, "--push", help="Push to the stack's registry (gpuyard:image_registry)."),
    platform: str = typer.Option(DEFAULT_PLATFORM, "--platform", help="Target platform for buildx."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the buildx commands; run nothing."),
) -> None:
    """Build each image with docker buildx from the repository root; with --push, push it to ECR."""
    if not PLATFORM.fullmatch(platform):
        fail(f"--platform {platform!r}: expected OS/ARCH[/VARIANT], comma-separated (like linux/amd64,linux/arm64)")
    try:
        build_images(load_stack(stack.value), [i.value for i in image], push=push, platform=platform,
                     echo=typer.echo, dry_run=dry_run)
    except ConfigError as error:
        fail(str(error))
    except BuildError as error:
        fail(str(error), code=error.exit_code)
