"""``gpuyard sim``: the stack's Kubernetes layer, Volcano and the training operators on simulated GPU nodes.

Every command checks what the user typed first (the stack, the files, ``--wait``: exit 2), then the machine (Go,
exit 1), then the cluster's state (not running: exit 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml

from gpuyard.infra.config import ConfigError, load_stack
from gpuyard.jobs.cli import replay
from gpuyard.jobs.cli.errors import fail, usage_without_command
from gpuyard.jobs.cli.options import number, stack_option

app = typer.Typer(help="A simulated cluster: the real control plane, Volcano and operators on kwok GPU nodes.",
                  invoke_without_command=True, callback=usage_without_command)

STACK = stack_option("Stack file stacks/Pulumi.<stack>.yaml to simulate.")
MAX_WAIT_SECONDS = 86_400
MAX_MANIFEST_BYTES = 10 << 20
app.command("replay")(replay.replay_command)
app.add_typer(replay.trace_app, name="trace")


def _sim(stack: str, karpenter: bool = False, needs_go: bool = False, monitoring: bool = False, real_nodes: int = 0):
    from gpuyard.sim.build import go_available
    from gpuyard.sim.cluster import Sim

    if needs_go and not go_available():
        fail("gpuyard sim builds its components with Go: no `go` on PATH", 1)
    return Sim(stack, karpenter=karpenter, monitoring=monitoring, real_nodes=real_nodes)


def _running(stack: str):
    sim = _sim(stack)
    if not sim.running():
        fail(f"sim {stack} is not running (gpuyard sim up --stack {stack})", 1)
    return sim


@app.command("up")
def up(
    stack: str = STACK,
    karpenter: bool = typer.Option(False, "--karpenter", help="GPU and CPU nodes only from Karpenter's NodePools."),
    with_monitoring: bool = typer.Option(False, "--monitoring",
                                         help="kube-state-metrics and Prometheus with the stack's showback rules."),
    real_nodes: bool = typer.Option(False, "--real-nodes",
                                    help="The stack's first GPU node and first on-demand CPU node are real kubelets "
                                         "(containerd, runc) running real containers, with cluster DNS (CoreDNS); "
                                         "needs root and cgroup v1."),
) -> None:
    """Build what is missing (cached) and start the simulated cluster; does nothing if it already runs."""
    from gpuyard.sim.build import BuildError
    from gpuyard.sim.cluster import NotOurs

    try:
        kubeconfig = _sim(stack, karpenter, needs_go=True, monitoring=with_monitoring, real_nodes=int(real_nodes)).up(
            lambda line: typer.echo(line, err=True))
    except ConfigError as error:
        fail(str(error))
    except (BuildError, NotOurs, RuntimeError) as error:
        fail(str(error), 1)
    typer.echo(kubeconfig)


@app.command("kubeconfig")
def kubeconfig(stack: str = STACK) -> None:
    """Print the path of the simulated cluster's kubeconfig (last line)."""
    typer.echo(_running(stack).kubeconfig)


@app.command("registry")
def registry(stack: str = STACK) -> None:
    """Print the image prefix of the simulated cluster's registry (for gpuyard render --registry)."""
    sim = _sim(stack)
    found = sim.registry() if sim.running() else None
    if found is None:
        fail(f"sim {stack} is not running (gpuyard sim up --stack {stack})", 1)
    typer.echo(found.prefix(load_stack(stack)))


@app.command("images")
def images(stack: str = STACK) -> None:
    """Build the job images (cached by their inputs) on bases made here and push them to the sim's registry."""
    from gpuyard.sim.buildkit import BuildFailed
    from gpuyard.sim.images import build_images

    sim = _sim(stack)
    found = sim.registry() if sim.running() else None
    if found is None:
        fail(f"sim {stack} is not running (gpuyard sim up --stack {stack})", 1)
    try:
        refs = build_images(found, stack, lambda line: typer.echo(line, err=True))
    except BuildFailed as error:
        fail(str(error), 1)
    for ref in refs.values():
        typer.echo(ref)


@app.command("status")
def status(stack: str = STACK, as_json: bool = typer.Option(False, "--json", help="Status as JSON.")) -> None:
    """Whether the simulated cluster runs, its processes, nodes by pool and PodGroups by queue."""
    from gpuyard.sim.report import cluster_report

    sim = _sim(stack)
    report = sim.status()
    if report["running"]:
        report.update(cluster_report(sim.kubectl()))
    if as_json:
        typer.echo(json.dumps(report, indent=1))
        return
    typer.echo(f"sim {stack}: {'running' if report['running'] else 'not running'} ({report['state']})")
    if report["registry"]:
        typer.echo(f"  images: {report['registry']}")
    if report["s3_endpoint"]:
        typer.echo(f"  s3: {report['s3_endpoint']} (the pods' bucket, IRSA credentials)")
    if report["prometheus"]:
        typer.echo(f"  prometheus: {report['prometheus']}")
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
    """Stop every process of the simulated cluster and remove its state folder (only one `sim up` made)."""
    from gpuyard.sim.cluster import NotOurs

    try:
        _sim(stack).down()
    except NotOurs as error:
        fail(str(error), 1)
    typer.echo(f"sim {stack}: down")


def checked_manifests(path: Path) -> None:
    """Refuse (one line, exit 2) a FILE that is not a readable YAML file of Kubernetes objects."""
    if not path.is_file():
        fail(f"FILE {path}: {'is not a file' if path.exists() else 'no such file'}")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        fail(f"FILE {path}: larger than {MAX_MANIFEST_BYTES >> 20} MiB: not a job's manifests")
    try:
        documents = list(yaml.safe_load_all(path.read_text()))
    except OSError as error:
        fail(f"FILE {path}: cannot read it ({error.strerror or error})")
    except UnicodeDecodeError as error:
        fail(f"FILE {path}: not UTF-8 text (byte {error.start})")
    except (yaml.YAMLError, RecursionError) as error:
        fail(f"FILE {path}: not valid YAML ({error})")
    objects = [document for document in documents if document is not None]
    if not objects:
        fail(f"FILE {path}: holds no Kubernetes object")
    for document in objects:
        metadata = document.get("metadata") if isinstance(document, dict) else None
        if not (isinstance(metadata, dict) and all(isinstance(document.get(key), str) for key in ("apiVersion", "kind"))
                and isinstance(metadata.get("name"), str)):
            fail(f"FILE {path}: every document must be a Kubernetes object (apiVersion, kind, metadata.name)")


@app.command("submit")
def submit(
    files: list[Path] = typer.Argument(..., help="Manifests to apply (gpuyard render output)."),
    stack: str = STACK,
    wait: float = typer.Option(120, "--wait", parser=number(0, MAX_WAIT_SECONDS), metavar="SECONDS",
                               help=f"Seconds to wait for the gang to run (with real nodes: for the job to end), "
                                    f"0 to {MAX_WAIT_SECONDS}."),
) -> None:
    """Server-side apply, then follow each job until its gang runs (exit 0) or fails or times out (exit 1); with real
    nodes (`sim up --real-nodes`) until it ends: exit 0 only when it succeeded there, else what the kubelet, the
    operator or the container said (exit 1)."""
    from gpuyard.sim.submit import SubmitFailed, submit as submit_jobs

    for path in files:
        checked_manifests(path)
    sim = _running(stack)
    try:
        submit_jobs(sim, files, wait, lambda line: typer.echo(line, err=True))
    except SubmitFailed as error:
        fail(str(error), 1)
