"""``gpuyard sim replay`` and ``gpuyard sim trace``: replay a trace of gangs on the simulated cluster with Karpenter,
and make traces (synthetic, or from a cluster's own history)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import typer

from gpuyard.infra.config import ConfigError, StackConfig, load_stack
from gpuyard.jobs.cli.errors import fail, usage_without_command

trace_app = typer.Typer(help="Traces of gangs for `gpuyard sim replay` (JSON Lines on stdout).",
                        invoke_without_command=True, callback=usage_without_command)


def _config(stack: str) -> StackConfig:
    try:
        return load_stack(stack)
    except ConfigError as error:
        fail(str(error))


def replay_command(
    trace: Path = typer.Argument(..., metavar="TRACE", help="JSON Lines, one gang a line (gpuyard sim trace ...)."),
    stacks: list[str] = typer.Option(["dev"], "--stack", metavar="STACK",
                                     help="Stack to replay on; repeat to compare (before, after)."),
    speed: float = typer.Option(120.0, "--speed", min=1, max=100_000,
                                help="Cluster seconds per wall second (a day at 120x takes 12 minutes)."),
    max_wall: float | None = typer.Option(None, "--max-wall", min=10, metavar="SECONDS",
                                          help="Stop after this long [default: 3x the trace's span + 5 min]."),
    as_json: bool = typer.Option(False, "--json", help="The report as JSON (one object by stack)."),
) -> None:
    """Replay TRACE on a fresh simulated cluster with Karpenter for each --stack, then report per team: waits,
    reclaim evictions, GPU-hours, idle GPU-hours, utilization and cost."""
    from gpuyard.sim.build import BuildError, go_available
    from gpuyard.sim.cluster import Sim
    from gpuyard.sim.paths import state_dir
    from gpuyard.sim.replay import consolidation, run
    from gpuyard.sim.trace import TraceError, read_trace

    if not trace.is_file():
        fail(f"TRACE {trace}: no such file")
    configs = [_config(stack) for stack in stacks]
    try:
        traces = [read_trace(trace, config) for config in configs]
    except TraceError as error:
        fail(str(error))
    if not go_available():
        fail("gpuyard sim builds its components with Go: no `go` on PATH", 1)
    reports = {}
    for config, gangs in zip(configs, traces):
        if Sim(config.stack).running():
            fail(f"sim {config.stack} is running: a replay starts its own (gpuyard sim down --stack {config.stack})", 1)
        sim = Sim(config.stack, state_dir(f"replay-{config.stack}"), karpenter=True,
                  consolidate_after=consolidation(speed))
        try:
            sim.up(lambda line: typer.echo(line, err=True))
            reports[config.stack] = run(sim, config, gangs, speed, lambda line: typer.echo(line, err=True), max_wall)
        except (BuildError, RuntimeError) as error:
            fail(str(error), 1)
        finally:
            sim.down()
    if as_json:
        typer.echo(json.dumps(reports, indent=1))
        return
    for report in reports.values():
        typer.echo("\n".join(table(report)))


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f}h"


def table(report: dict) -> list[str]:
    """The report as a table: one row per team, then the cluster."""
    lines = [f"stack {report['stack']}: {report['gangs']} gangs, {report['admitted']} admitted, "
             f"{report['explained']} explained, {report['unexplained']} unexplained; {report['simulated_s'] / 3600:.1f}h "
             f"simulated in {report['wall_s']:.0f}s ({report['speed']:g}x)",
             f"{'team':16} {'gangs':>5} {'ran':>5} {'failed':>6} {'wait p50':>9} {'wait p95':>9} {'evicted':>7} {'GPU-h':>9} "
             f"{'idle GPU-h':>10} {'util':>6} {'USD':>10}"]
    for name, team in report["teams"].items():
        util = "-" if team["gpu_utilization"] is None else f"{team['gpu_utilization']:.0%}"
        lines.append(f"{name:16} {team['gangs']:>5} {team['admitted']:>5} {team['failed']:>6} {_hours(team['wait_p50_s']):>9} "
                     f"{_hours(team['wait_p95_s']):>9} {team['reclaim_evictions']:>7} {team['gpu_hours']:>9.1f} "
                     f"{team['idle_gpu_hours']:>10.1f} {util:>6} {team['cost_usd']:>10,.0f}")
    util = "-" if report["gpu_utilization"] is None else f"{report['gpu_utilization']:.0%}"
    lines.append(f"{'cluster':16} {report['gangs']:>5} {report['admitted']:>5} {report['failed']:>6} {'':>9} {'':>9} "
                 f"{report['reclaim_evictions']:>7} {report['gpu_hours']:>9.1f} {report['idle_gpu_hours']:>10.1f} "
                 f"{util:>6} {report['cost_usd']:>10,.0f}")
    lines += [f"  not run: {e['gang']} ({e['gpus']} GPUs): {e['reason'] or 'no reason reported'}"
              for e in report["explanations"]]
    return lines


@trace_app.command("synthetic")
def synthetic(
    stack: str = typer.Option("dev", "--stack", help="Stack whose teams submit (in proportion to their weights)."),
    gangs: int = typer.Option(100, "--gangs", min=1, max=100_000, help="Gangs in the trace."),
    hours: float = typer.Option(24, "--hours", min=0.01, max=24 * 365, help="Arrivals spread over this long."),
    seed: int = typer.Option(0, "--seed", help="Random seed: the same seed, the same trace."),
    shapes: str = typer.Option("1x1,1x8,2x8,4x8", "--shapes", metavar="NODESxGPUS,...",
                               help="Gang shapes drawn from: nodes x GPUs per node."),
    mean_hours: float = typer.Option(2.0, "--mean-hours", min=0.01, max=1000, help="Mean gang duration."),
) -> None:
    """A synthetic trace: Poisson arrivals, teams by weight, shapes and kinds uniformly, exponential durations."""
    from gpuyard.sim.trace import synthetic_trace, write_trace

    try:
        drawn = tuple(tuple(int(n) for n in shape.split("x")) for shape in shapes.split(","))
    except ValueError:
        fail(f"--shapes {shapes}: not NODESxGPUS,... (like 1x1,2x8)")
    if any(len(shape) != 2 or shape[0] < 1 or not 0 <= shape[1] <= 16 for shape in drawn):
        fail(f"--shapes {shapes}: each shape is NODESxGPUS with NODES >= 1 and GPUS 0..16")
    config = _config(stack)
    typer.echo(write_trace(synthetic_trace(config, gangs, hours, seed, drawn, mean_hours * 3600)), nl=False)


@trace_app.command("history")
def history(
    stack: str = typer.Option("dev", "--stack", help="Stack whose team namespaces to read."),
    kubeconfig: Path = typer.Option(..., "--kubeconfig", envvar="KUBECONFIG", metavar="FILE",
                                    help="The cluster to read [default: $KUBECONFIG]."),
    speed: float = typer.Option(1.0, "--speed", min=1, help="Multiply times by this (a replay's speed)."),
) -> None:
    """A trace from a cluster's own history: its PyTorchJobs, MPIJobs and Volcano Jobs that ran."""
    from gpuyard.sim.cluster import Sim
    from gpuyard.sim.kube import Kubectl, KubectlError
    from gpuyard.sim.report import everywhere
    from gpuyard.sim.trace import JOB_RESOURCES, cluster_history, write_trace

    config = _config(stack)
    if not kubeconfig.is_file():
        fail(f"--kubeconfig {kubeconfig}: no such file")
    found = shutil.which("kubectl")
    kubectl = Kubectl(Path(found) if found else Sim(stack).kubectl_binary(), kubeconfig)
    jobs = []
    for resource in JOB_RESOURCES.values():
        try:
            jobs += everywhere(kubectl, resource)
        except KubectlError as error:
            if "the server doesn't have a resource type" not in str(error):
                fail(f"reading {resource}: {error}", 1)
    typer.echo(write_trace(cluster_history(jobs, config, speed)), nl=False)
