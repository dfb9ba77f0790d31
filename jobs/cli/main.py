"""Entry point of the ``gpuyard`` command: assembles the commands each module of ``jobs.cli`` defines."""

import sys

import typer

from jobs.cli import demo, env, images, plan, render, sim
from jobs.cli.errors import USAGE_EXIT

app = typer.Typer(
    name="gpuyard",
    help="From a local PyTorch experiment to gang-scheduled distributed training on EKS.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("demo")(demo.demo)
app.command("plan")(plan.plan_command)
app.command("render")(render.render_command)
app.add_typer(env.app, name="env")
app.add_typer(images.app, name="images")
app.add_typer(sim.app, name="sim")


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
