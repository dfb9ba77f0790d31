"""Entry point of the ``gpuyard`` command: assembles the commands each module of ``jobs.cli`` defines."""

import signal
import sys

import typer

from jobs.cli import demo, env, images, plan, render, sim
from jobs.cli.errors import USAGE_EXIT
from jobs.cli.options import gpuyard_version
from jobs.processes import interrupt_on_sigterm

INTERRUPTED = 128 + signal.SIGINT

app = typer.Typer(
    name="gpuyard",
    help="From a local PyTorch experiment to gang-scheduled distributed training on EKS.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: flags without a <bool> metavar, choices as [a|b]
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
app.command("demo")(demo.demo)
app.command("plan")(plan.plan_command)
app.command("render")(render.render_command)
app.add_typer(env.app, name="env")
app.add_typer(images.app, name="images")
app.add_typer(sim.app, name="sim")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gpuyard {gpuyard_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    _version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                  help="Print gpuyard's version and exit."),
) -> None:
    """From a local PyTorch experiment to gang-scheduled distributed training on EKS."""


def main() -> None:
    """Run the CLI; usage errors become one line on stderr and exit code 2; SIGINT and SIGTERM stop it cleanly."""
    interrupt_on_sigterm()
    try:
        code = app(standalone_mode=False, prog_name="gpuyard")
    except KeyboardInterrupt:
        code = INTERRUPTED
    except typer.Abort:
        typer.echo("gpuyard: aborted", err=True)
        sys.exit(1)
    except typer.TyperException as error:
        message = " ".join(error.format_message().replace("Value error, ", "").split())
        if message:  # empty when the help was shown instead
            typer.echo(f"gpuyard: error: {message}", err=True)
        sys.exit(USAGE_EXIT)
    if code == INTERRUPTED:  # typer turns KeyboardInterrupt into this code, silently
        typer.echo("gpuyard: interrupted", err=True)
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
