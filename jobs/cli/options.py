"""What several commands share: choices (stacks, output formats), folder checks, the provenance header."""

from __future__ import annotations

import enum
import os
import shlex
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from infra.config import stacks_dir
from jobs.cli.errors import fail


def gpuyard_version() -> str:
    try:
        return version("gpuyard")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def available_stacks() -> list[str]:
    return sorted(path.name[len("Pulumi."):-len(".yaml")] for path in stacks_dir().glob("Pulumi.*.yaml"))


# The stacks of stacks/ (or $GPUYARD_STACKS_DIR) as a click Choice, so --help lists them; with none there,
# "dev" stays a choice so load_stack can say where it looked.
Stack = enum.Enum("Stack", [(name, name) for name in available_stacks() or ["dev"]], type=str)


class OutputFormat(str, enum.Enum):
    """kubectl's ``-o``: a format on stdout."""

    yaml = "yaml"
    json = "json"


def checked_output_dir(text: str, flag: str = "--output-dir") -> Path:
    """The folder ``flag`` names, refused (one line, exit 2) if it could not be written: checked before any work."""
    if not text.strip():
        fail(f"{flag} is empty: name a folder (e.g. {flag} out/manifests)")
    path = Path(text)
    if path.exists() and not path.is_dir():
        fail(f"{flag} {text}: is not a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        fail(f"{flag} {text}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        fail(f"{flag} {text}: {existing} is not writable")
    return path


def provenance(stack: str) -> str:
    """The comment every rendered file starts with: stack, gpuyard version, the command line."""
    command = shlex.join(["gpuyard", *sys.argv[1:]])
    return f"# Rendered by gpuyard {gpuyard_version()} from stack {stack}: {command}\n"
