"""One-line user errors with exit code 2."""

from typing import NoReturn

import typer

from gpuyard.infra.validation import one_line

USAGE_EXIT = 2


def fail(message: str, code: int = USAGE_EXIT) -> NoReturn:
    """Print ``gpuyard: error: MESSAGE`` on stderr, folded into one line (botocore's and YAML's messages have
    newlines), and exit with ``code``."""
    typer.echo(f"gpuyard: error: {one_line(message)}", err=True)
    raise typer.Exit(code)


def usage_without_command(ctx: typer.Context) -> None:
    """A command group's callback: without a command, print its usage on stderr and exit 2 (what click does for
    ``no_args_is_help``), rather than an error line holding the whole help."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help(), err=True)
        raise typer.Exit(USAGE_EXIT)
