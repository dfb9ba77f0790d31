"""``gpuyard submit``, ``status``, ``list``, ``cancel`` and ``logs``: a team's jobs on the cluster of a kubeconfig.

``submit`` takes every ``gpuyard render`` option and the command after ``--``, renders one job (a new name for
each submission unless ``--name``) and creates it; the others find the team's jobs by gpuyard's labels.
What the user typed is checked first (exit 2), then the cluster (exit 1, one line: ``gpuyard.jobs.cli.cluster``).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import typer
import yaml

from gpuyard.infra.config import ConfigError, load_stack
from gpuyard.jobs.cli.cluster import ClusterError, Jobs, kubeconfig_path, kubectl_for
from gpuyard.jobs.cli.errors import fail
from gpuyard.jobs.cli.options import count, number, stack_option
from gpuyard.jobs.cli.render import render_command

MAX_WAIT_SECONDS = 3600
RENDER_ONLY = ("-o", "--output", "-d", "--output-dir", "--all", "--explain")
STACK = stack_option("Stack whose teams and images to use.")
TEAM = typer.Option(..., "--team", help="Team (from gpuyard:teams) whose namespace the jobs are in.")
RENDER = typer.Typer(pretty_exceptions_enable=False, rich_markup_mode=None)
RENDER.command()(render_command)
KUBECONFIG = typer.Option(None, "--kubeconfig", envvar="KUBECONFIG", metavar="FILE",
                          help="The cluster [default: $KUBECONFIG, else ~/.kube/config].")


def team_jobs(stack: str, team: str, kubeconfig: Path | None) -> Jobs:
    """The team's jobs on the kubeconfig's cluster: stack and team checked (exit 2), then the cluster (exit 1)."""
    try:
        config = load_stack(stack)
        found = config.team(team)
    except ConfigError as error:
        fail(str(error))
    try:
        path = kubeconfig_path(kubeconfig)
    except ClusterError as error:
        fail(str(error))
    try:
        return Jobs(kubectl_for(config, path), found)
    except ClusterError as error:
        fail(str(error), 1)


def submit_command(
    ctx: typer.Context,
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Render one job and create it on the cluster; prints its name.

    Takes every option of `gpuyard render` but -o, -d, --all and --explain (see gpuyard render -h), and your
    command after --. Without --name the job gets a new name <team>-<kind>-<random>."""
    command = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv[1:] else []
    options = ctx.args[:len(ctx.args) - len(command)]
    for word in options:
        if word.split("=", 1)[0] in RENDER_ONLY:
            fail(f"{word.split('=', 1)[0]}: submit creates one job; render writes or explains manifests")
    stack, team = _value(options, "--stack") or "dev", _value(options, "--team")
    if not team:
        fail("--team is required: the team whose namespace and queue the job uses")
    jobs = team_jobs(stack, team, kubeconfig)
    with tempfile.TemporaryDirectory(prefix="gpuyard-submit-") as folder:
        out = Path(folder) / "job"
        code = _render([*options, "-d", str(out), *(["--", *command] if "--" in sys.argv[1:] else [])])
        if code:
            raise typer.Exit(code)  # render said why on stderr
        [manifest] = out.iterdir()
        name = yaml.safe_load(manifest.read_text())["metadata"]["name"]
        try:
            jobs.resources()
            typer.echo(jobs.create(manifest), err=True)
        except ClusterError as error:
            fail(str(error), 1)
    typer.echo(name)


def _render(args: list[str]) -> int:
    """``gpuyard render ARGS`` in this process, its stdout (the file it wrote) dropped; its exit status."""
    command = typer.main.get_command(RENDER)
    with contextlib.redirect_stdout(io.StringIO()):
        return command.main(args=args, prog_name="gpuyard render", standalone_mode=False) or 0


def _value(options: list[str], flag: str) -> str | None:
    """The value of ``flag`` in forwarded options (``--flag V`` or ``--flag=V``), the last one winning."""
    value = None
    for index, word in enumerate(options):
        if word == flag and index + 1 < len(options):
            value = options[index + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def status_command(
    name: str | None = typer.Argument(None, help="Job name [default: every job of the team]."),
    stack: str = STACK, team: str = TEAM, kubeconfig: Path | None = KUBECONFIG,
    as_json: bool = typer.Option(False, "--json", help="Status as JSON."),
) -> None:
    """Phase, gang, queue (and what the job waits for), restarts."""
    jobs = team_jobs(stack, team, kubeconfig)
    try:
        found = [jobs.one(name)] if name else jobs.all()
        described = [jobs.describe(job) for job in found]
    except ClusterError as error:
        fail(str(error), 1)
    if as_json:
        typer.echo(json.dumps(described, indent=1))
        return
    for job in described:
        typer.echo("\n".join(status_lines(job)))


def status_lines(job: dict) -> list[str]:
    lines = [f"{job['name']} ({job['kind']}): {job['phase']}, restarts {job['restarts']}"]
    gang = job["gang"]
    if gang:
        lines.append(f"  gang {gang['podgroup']}: {gang['phase']} in queue {job['queue']}, pods bound "
                     f"{job['bound']}/{job['pods']} (gang of {gang['min_member']})")
    else:
        lines.append(f"  no gang yet in queue {job['queue']}, pods {job['pods']}")
    if job["ahead"] is not None:
        lines.append(f"  waiting in queue {job['queue']}: {job['ahead']} gang(s) ahead")
    lines += [f"  waiting: {reason}" for reason in job["waiting"]]
    return lines


def list_command(stack: str = STACK, team: str = TEAM, kubeconfig: Path | None = KUBECONFIG) -> None:
    """The team's jobs, oldest first: name, kind, phase, created."""
    from gpuyard.sim.submit import job_phase

    jobs = team_jobs(stack, team, kubeconfig)
    try:
        found = jobs.all()
    except ClusterError as error:
        fail(str(error), 1)
    for job in found:
        meta = job["metadata"]
        typer.echo(f"{meta['name']:40} {job['kind']:11} {job_phase(job) or 'Created':12} {meta['creationTimestamp']}")


def cancel_command(
    name: str = typer.Argument(..., help="Job name."),
    stack: str = STACK, team: str = TEAM, kubeconfig: Path | None = KUBECONFIG,
    wait: float = typer.Option(120, "--wait", parser=number(0, MAX_WAIT_SECONDS), metavar="SECONDS",
                               help=f"Seconds to wait until every pod is gone, 0 to {MAX_WAIT_SECONDS}."),
) -> None:
    """Delete a job gpuyard made; its pods get their grace period to save, then exit 0 once all are gone."""
    jobs = team_jobs(stack, team, kubeconfig)
    try:
        left = jobs.cancel(jobs.one(name), wait)
    except ClusterError as error:
        fail(str(error), 1)
    if left:
        fail(f"job {name} cancelled, but {left} object(s) still there after {wait:g}s (pods in their grace period)", 1)
    typer.echo(f"{name}: cancelled, every pod gone")


def logs_command(
    name: str = typer.Argument(..., help="Job name."),
    stack: str = STACK, team: str = TEAM, kubeconfig: Path | None = KUBECONFIG,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    rank: int | None = typer.Option(None, "--rank", parser=count(0, 1_000_000), metavar="N",
                                    help="Only rank N's pod (torchrun kinds) or lines (RayJob)."),
) -> None:
    """The job's output: each node's pod (PyTorchJob, TrainJob), the launcher (MPI) or the Ray driver (RayJob)."""
    jobs = team_jobs(stack, team, kubeconfig)
    try:
        job = jobs.one(name)
        pods = jobs.output_pods(job, rank)
    except ClusterError as error:
        fail(str(error), 1)
    if not pods:
        fail(f"job {name} has no pods yet: gpuyard status {name} says what it waits for", 1)
    prefix = f"[rank {rank}] " if rank is not None and job["kind"] == "RayJob" else ""
    for pod in pods:
        try:
            for line in jobs.logs(pod, follow):
                if line.startswith(prefix):
                    typer.echo(f"[{pod}] {line}" if len(pods) > 1 else line, nl=False)
        except ClusterError as error:
            fail(f"no logs of pod {pod} of job {name}: {error}", 1)
