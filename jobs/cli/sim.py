"""``gpuyard sim``: the stack's Kubernetes layer, Volcano and the training operators on simulated GPU nodes."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from infra.config import ConfigError
from jobs.cli.errors import fail

app = typer.Typer(help="A simulated cluster: the real control plane, Volcano and operators on kwok GPU nodes.",
                  no_args_is_help=True)

STACK = typer.Option("dev", "--stack", help="Stack file stacks/Pulumi.<stack>.yaml to simulate.")


def _sim(stack: str, karpenter: bool = False):
    from sim.build import go_available
    from sim.cluster import Sim

    if not go_available():
        fail("gpuyard sim builds its components with Go: no `go` on PATH", 1)
    return Sim(stack, karpenter=karpenter)


@app.command("up")
def up(
    stack: str = STACK,
    karpenter: bool = typer.Option(False, "--karpenter", help="GPU and CPU nodes only from Karpenter's NodePools."),
) -> None:
    """Build what is missing (cached) and start the simulated cluster; does nothing if it already runs."""
    from sim.build import BuildError

    try:
        kubeconfig = _sim(stack, karpenter).up(lambda line: typer.echo(line, err=True))
    except ConfigError as error:
        fail(str(error))
    except (BuildError, RuntimeError) as error:
        fail(str(error), 1)
    typer.echo(kubeconfig)


@app.command("kubeconfig")
def kubeconfig(stack: str = STACK) -> None:
    """Print the path of the simulated cluster's kubeconfig (last line)."""
    sim = _sim(stack)
    if not sim.running():
        fail(f"sim {stack} is not running (gpuyard sim up --stack {stack})", 1)
    typer.echo(sim.kubeconfig)


@app.command("status")
def status(stack: str = STACK, as_json: bool = typer.Option(False, "--json", help="Status as JSON.")) -> None:
    """Whether the simulated cluster runs, its processes, nodes by pool and PodGroups by queue."""
    from sim.report import cluster_report

    sim = _sim(stack)
    report = sim.status()
    if report["running"]:
        report.update(cluster_report(sim.kubectl()))
    if as_json:
        typer.echo(json.dumps(report, indent=1))
        return
    typer.echo(f"sim {stack}: {'running' if report['running'] else 'not running'} ({report['state']})")
    for name, process in report["processes"].items():
        typer.echo(f"  {name:28} pid {process['pid']:>7}  {'alive' if process['alive'] else 'exited'}")
    if report["running"]:
        _echo_cluster(report)


def _echo_cluster(report: dict) -> None:
    typer.echo("nodes (pool / capacity type: instance types):")
    for pool, by_capacity in report["nodes"].items():
        for capacity_type, types in by_capacity.items():
            listed = ", ".join(f"{count} {instance_type}" for instance_type, count in types.items())
            typer.echo(f"  {pool:20} {capacity_type or '-':10} {listed}")
    typer.echo("podgroups (queue: podgroup phase, pods bound / gang):")
    for queue, groups in report["podgroups"].items():
        for group in groups:
            typer.echo(f"  {queue:12} {group['podgroup']:48} {group['phase']:10} {group['bound']}/{group['min_member']}")
            for reason in group.get("pending_reasons", []):
                typer.echo(f"      waiting: {reason}")


@app.command("down")
def down(stack: str = STACK) -> None:
    """Stop every process of the simulated cluster and remove its state folder."""
    _sim(stack).down()
    typer.echo(f"sim {stack}: down")


@app.command("submit")
def submit(
    files: list[Path] = typer.Argument(..., help="Manifests to apply (gpuyard render output)."),
    stack: str = STACK,
    wait: float = typer.Option(120, "--wait", help="Seconds to wait for the gang to run."),
) -> None:
    """Server-side apply, then follow each job until its gang runs (exit 0) or fails or times out (exit 1)."""
    from sim.submit import SubmitFailed, submit as submit_jobs

    sim = _sim(stack)
    if not sim.running():
        fail(f"sim {stack} is not running (gpuyard sim up --stack {stack})", 1)
    for path in files:
        if not path.is_file():
            fail(f"FILE {path}: no such file")
    try:
        submit_jobs(sim, files, wait, lambda line: typer.echo(line, err=True))
    except SubmitFailed as error:
        fail(str(error), 1)
