"""Entry point of the ``gpuyard`` command: one sub-command per module."""

import sys

import typer

from jobs.cli.errors import USAGE_EXIT

app = typer.Typer(
    name="gpuyard",
    help="From a local PyTorch experiment to gang-scheduled distributed training on EKS.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """From a local PyTorch experiment to gang-scheduled distributed training on EKS."""

# sub-commands register themselves on `app` when imported
from jobs.cli import demo  # noqa: E402,F401
from jobs.cli import env  # noqa: E402,F401
from jobs.cli import images  # noqa: E402,F401
from jobs.cli import plan  # noqa: E402,F401
from jobs.cli import render  # noqa: E402,F401


def main() -> None:
    """Run the CLI; usage errors become one line on stderr and exit code 2."""
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        typer.echo("gpuyard: aborted", err=True)
        sys.exit(1)
    except typer.TyperException as error:
        if error.format_message():  # empty when the help was shown instead
            typer.echo(f"gpuyard: error: {error.format_message()}", err=True)
        sys.exit(USAGE_EXIT)
    sys.exit(code or 0)
