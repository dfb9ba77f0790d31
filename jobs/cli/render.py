"""``gpuyard render``: job manifests for a team, or every kind for every team of a stack."""

from __future__ import annotations

from pathlib import Path

import typer

from infra.config import ConfigError, load_stack
from jobs.cli.errors import fail
from jobs.placement import place
from jobs.render import default_specs, render_specs, to_yaml, write_manifests
from jobs.spec import (
    DEFAULT_EPOCHS,
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_NODES,
    KINDS,
    SpecError,
    build_spec,
    parse_env,
    parse_nodes,
)


def render_command(
    stack: str = typer.Option("dev", "--stack", help="Stack whose teams, images and bucket to use."),
    team: str | None = typer.Option(None, "--team", help="Team (from gpuyard:teams) submitting the job."),
    kind: str | None = typer.Option(None, "--kind", help=f"Job kind: {' | '.join(KINDS)}."),
    all_: bool = typer.Option(False, "--all", help="Every kind for every team, default sizes."),
    name: str | None = typer.Option(None, "--name", help="Job name (DNS-1035 label; default <team>-<kind>)."),
    nodes: str = typer.Option(str(DEFAULT_NODES), "--nodes", help="Nodes N, or MIN:MAX for an elastic PyTorchJob."),
    gpus_per_node: int = typer.Option(DEFAULT_GPUS_PER_NODE, "--gpus-per-node", min=0, help="GPUs per node (0 = CPU)."),
    cpu: float | None = typer.Option(None, "--cpu", help="CPUs per node (default 3 per GPU, 2 on CPU)."),
    memory_gib: int | None = typer.Option(None, "--memory-gib", help="Memory per node in GiB."),
    efa: int | None = typer.Option(None, "--efa", help="EFA devices per node (sets FI_PROVIDER=efa)."),
    capacity_type: str = typer.Option("on-demand", "--capacity-type", help="on-demand | spot."),
    node_pool: str | None = typer.Option(
        None, "--node-pool", help="Karpenter NodePool or managed GPU node group (default from GPUs/EFA/capacity)."
    ),
    image: str | None = typer.Option(None, "--image", help="Container image (default the kind's gpuyard image)."),
    epochs: int = typer.Option(DEFAULT_EPOCHS, "--epochs", help="Trainer epochs."),
    max_restarts: int | None = typer.Option(None, "--max-restarts", help="Restarts before the job fails."),
    ttl: int | None = typer.Option(None, "--ttl", help="Seconds to keep the finished job."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for the trainer, repeatable."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Folder for one file per manifest."),
) -> None:
    """Render job manifests: YAML on stdout, or <team>/<name>.yaml files in --output."""
    try:
        config = load_stack(stack)
        if all_:
            if team or kind:
                raise SpecError("--all renders every team and kind: drop --team/--kind")
            specs = default_specs(config)
        else:
            if not team or not kind:
                raise SpecError("--team and --kind are required (or --all)")
            min_nodes, max_nodes = parse_nodes(nodes)
            specs = [place(config, build_spec(
                config, config.team(team), kind, name=name, nodes=max_nodes, min_nodes=min_nodes,
                gpus_per_node=gpus_per_node, capacity_type=capacity_type, epochs=epochs, cpu=cpu,
                memory_gib=memory_gib, efa_devices=efa, node_pool=node_pool, image=image,
                max_restarts=max_restarts, ttl_seconds_after_finished=ttl, env=parse_env(env) or None,
            ))]
        rendered = render_specs(config, specs)
    except (ConfigError, SpecError) as error:
        fail(str(error))
    if output is None:
        typer.echo("---\n".join(to_yaml(manifest) for manifest in rendered.values()), nl=False)
        return
    if output.exists() and not output.is_dir():
        fail(f"--output {output} is not a folder")
    try:
        written = write_manifests(rendered, output)
    except OSError as error:
        fail(f"cannot write {output}: {error.strerror or error}")
    for path in written:
        typer.echo(str(path))
