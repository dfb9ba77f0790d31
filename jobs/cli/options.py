"""What several commands share: the stack option, strict numbers, formats, folder checks, the provenance header.

Each form a user types has one parser here, used by every command: a stack is a valid stack name with a stack
file (``--stack ../..`` never reaches the file system), a count is ASCII digits (``1_0``, ``3.0``, `` 3`` and
``٣`` are not counts), a number is a finite decimal (not ``nan``, ``inf`` or ``0x10``). A parser's ValueError
becomes ``Invalid value for '--flag': ...`` naming the flag.
"""

from __future__ import annotations

import enum
import os
import re
import shlex
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import typer

from pydantic import ValidationError

from gpuyard.infra.config import ConfigError, StackConfig, available_stacks, stack_file
from gpuyard.jobs.cli.errors import fail

INTEGER = re.compile(r"[-+]?[0-9]{1,30}")
DECIMAL = re.compile(r"[-+]?([0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30})([eE][-+]?[0-9]{1,3})?")
MAX_SHOWN = 40  # characters of a bad value quoted back
STAGING_EXTRA = len(".") + len(".12345678")
MANIFEST_NAME_MAX = 1 + 63 + len(".yaml")  # "/<job name>.yaml"


def gpuyard_version() -> str:
    try:
        return version("gpuyard")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _shown(text: str) -> str:
    return repr(text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "...")


def stack_name(text: str) -> str:
    """A stack of stacks/ (or $GPUYARD_STACKS_DIR): a valid stack name whose file exists."""
    try:
        path = stack_file(text)
    except ConfigError as error:
        raise ValueError(str(error)) from None
    if not path.is_file():
        raise ValueError(f"unknown stack {_shown(text)} (stacks: {', '.join(available_stacks()) or 'none'} in "
                         f"{path.parent})")
    return text


def stack_option(help_text: str, default: str = "dev") -> typer.models.OptionInfo:
    """``--stack NAME``; --help lists the stacks there are (stray files in the folder are left out)."""
    return typer.Option(default, "--stack", parser=stack_name, metavar=f"<{'|'.join(available_stacks() or [default])}>",
                        autocompletion=lambda: available_stacks(), help=help_text)


def _plain(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _range(low: float | None, high: float | None) -> str:
    if low is None:
        return f"at most {_plain(high)}"
    return f"at least {_plain(low)}" if high is None else f"from {_plain(low)} to {_plain(high)}"


def count(low: int | None = None, high: int | None = None) -> Callable[[str | int | None], int | None]:
    """A parser of whole numbers written in ASCII digits, within [low, high] (a bound of None: unbounded)."""
    def parse(text: str | int | None) -> int | None:
        if text is None or isinstance(text, int):  # the option's default
            return text
        if not INTEGER.fullmatch(text):
            raise ValueError(f"{_shown(text)} is not a whole number")
        value = int(text)
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{text} is out of range: {_range(low, high)}")
        return value
    return parse


def number(low: float | None = None, high: float | None = None) -> Callable[[str | float | None], float | None]:
    """A parser of finite decimal numbers (``2``, ``0.5``, ``1e3``), within [low, high]."""
    def parse(text: str | float | None) -> float | None:
        if text is None or isinstance(text, (int, float)):
            return text
        if not DECIMAL.fullmatch(text):
            raise ValueError(f"{_shown(text)} is not a number (like 2, 0.5 or 1e3)")
        value = float(text)
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{text} is out of range: {_range(low, high)}")
        return value
    return parse


class OutputFormat(str, enum.Enum):
    """kubectl's ``-o``: a format on stdout."""

    yaml = "yaml"
    json = "json"


def checked_output_dir(text: str, flag: str = "--output-dir") -> Path:
    """The folder ``flag`` names, refused (one line, exit 2) if it could not be written: checked before any work."""
    if not text.strip():
        fail(f"{flag} is empty: name a folder (e.g. {flag} out/manifests)")
    path = Path(text)
    # write_manifests stages ".<name>.<8 random>" beside the folder, and puts files of up to 68 bytes in it
    name_max = os.pathconf(".", "PC_NAME_MAX") - STAGING_EXTRA
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            fail(f"{flag} {_shown(text)}: the name {_shown(part)} is too long ({len(os.fsencode(part))} bytes; "
                 f"at most {name_max} here)")
    path_max = os.pathconf(".", "PC_PATH_MAX") - STAGING_EXTRA - MANIFEST_NAME_MAX
    if len(os.fsencode(os.path.abspath(text))) > path_max:
        fail(f"{flag} {_shown(text)}: the path is too long (at most {path_max} bytes here)")
    try:
        if path.exists() and not path.is_dir():
            fail(f"{flag} {text}: is not a folder")
        existing = path
        while not existing.exists():
            existing = existing.parent
    except OSError as error:
        fail(f"{flag} {_shown(text)}: {error.strerror or error}")
    if not existing.is_dir():
        fail(f"{flag} {text}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        fail(f"{flag} {text}: {existing} is not writable")
    return path


def provenance(stack: str) -> str:
    """The comment every rendered file starts with: stack, gpuyard version, the command line."""
    command = shlex.join(["gpuyard", *sys.argv[1:]])
    return f"# Rendered by gpuyard {gpuyard_version()} from stack {stack}: {command}\n"


def with_registry(config: StackConfig, registry: str) -> StackConfig:
    """``config`` with ``--registry`` as its gpuyard:image_registry, checked as the stack file's value is."""
    try:
        return StackConfig.model_validate({**config.model_dump(), "image_registry": registry})
    except ValidationError:
        fail(f"--registry {registry!r}: not a registry prefix (like 127.0.0.1:5000/gpuyard-dev or "
             "<account>.dkr.ecr.<region>.amazonaws.com/<cluster>)")


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the user typed the option of parameter ``name`` (not its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def flag_of(ctx: typer.Context, name: str) -> str:
    """The option parameter ``name`` is typed as (its first spelling)."""
    return next(param.opts[0] for param in ctx.command.params if param.name == name)
