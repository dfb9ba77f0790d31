"""One-line user errors with exit code 2."""

from typing import NoReturn

import typer

USAGE_EXIT = 2


def fail(message: str, code: int = USAGE_EXIT) -> NoReturn:
    """Print ``gpuyard: error: MESSAGE`` on stderr and exit with ``code``."""
    typer.echo(f"gpuyard: error: {message}", err=True)
    raise typer.Exit(code)
