"""Entry point of the ``gpuyard`` command: assembles the commands each module of ``gpuyard.jobs.cli`` defines."""

import os
import signal
import sys
import traceback

import typer

from gpuyard.infra.validation import one_line
from gpuyard.jobs.cli import demo, env, follow, images, plan, render, sim
from gpuyard.jobs.cli.errors import USAGE_EXIT, usage_without_command
from gpuyard.jobs.cli.options import gpuyard_version
from gpuyard.jobs.processes import interrupt_on_sigterm

INTERRUPTED = 128 + signal.SIGINT
TRACEBACK_ENV = "GPUYARD_TRACEBACK"  # set to see the traceback of an unexpected error

app = typer.Typer(
    name="gpuyard",
    help="From a local PyTorch experiment to gang-scheduled distributed training on EKS.",
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: flags without a <bool> metavar, choices as [a|b]
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
app.command("demo")(demo.demo)
app.command("plan")(plan.plan_command)
app.command("render")(render.render_command)
app.command("submit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    follow.submit_command)
app.command("status")(follow.status_command)
app.command("list")(follow.list_command)
app.command("cancel")(follow.cancel_command)
app.command("logs")(follow.logs_command)
app.add_typer(env.app, name="env")
app.add_typer(images.app, name="images")
app.add_typer(sim.app, name="sim")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gpuyard {gpuyard_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    _version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                  help="Print gpuyard's version and exit."),
) -> None:
    """From a local PyTorch experiment to gang-scheduled distributed training on EKS."""
    usage_without_command(ctx)


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
        message = one_line(error.format_message().replace("Value error, ", ""))
        if message:  # empty when the help was shown instead
            typer.echo(f"gpuyard: error: {message}", err=True)
        sys.exit(USAGE_EXIT)
    except Exception as error:  # a bug: one line, not a traceback, unless asked for
        if os.environ.get(TRACEBACK_ENV):
            traceback.print_exc()
        typer.echo(f"gpuyard: internal error: {type(error).__name__}: {one_line(error)} (a bug in gpuyard; set "
                   f"{TRACEBACK_ENV}=1 for the traceback)", err=True)
        sys.exit(1)
    if code == INTERRUPTED:  # typer turns KeyboardInterrupt into this code, silently
        typer.echo("gpuyard: interrupted", err=True)
        _exit_interrupted()
    sys.exit(code or 0)


def _exit_interrupted() -> None:
    """Exit 130 now: every ``finally`` has run and every child is stopped, so nothing is left but Python's own
    teardown. That teardown must not turn a handled Ctrl-C or SIGTERM into a death by SIGINT: CPython kills itself
    with SIGINT at exit when a flag says a KeyboardInterrupt went unhandled (Modules/main.c, ``Py_RunMain`` ->
    ``exit_sigint``), and a KeyboardInterrupt raised while ``exec``/``eval`` runs a string (a dataclass or namedtuple
    being made during an import) sets that flag even when it is caught later (Python/pythonrun.c,
    ``run_eval_code_obj``). That was `test_cli_signals[after-render-*]`'s exit -2 after "interrupted"."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(INTERRUPTED)


if __name__ == "__main__":
    main()
