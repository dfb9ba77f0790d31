"""``gpuyard render``: job manifests for a team, or every kind for every team of a stack."""

from __future__ import annotations

import enum
import json
import re
from datetime import timedelta

import typer

from infra.config import ConfigError, StackConfig, Team, load_stack
from jobs.cli.errors import fail
from jobs.cli.options import OutputFormat, Stack, checked_output_dir, provenance
from jobs.duration import DurationError, parse_duration
from jobs.placement import place
from jobs.render import default_specs, render_specs, to_yaml, write_manifests
from jobs.spec import (
    DEFAULT_EPOCHS,
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_NODES,
    ELASTIC_KINDS,
    KINDS,
    MAX_RESTARTS,
    SpecError,
    build_spec,
    parse_env,
    parse_nodes,
)

Kind = enum.Enum("Kind", [(kind, kind) for kind in KINDS], type=str)


class CapacityType(str, enum.Enum):
    on_demand = "on-demand"
    spot = "spot"


MAX_NODES = 10_000
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# An OCI image reference's characters: [host[:port]/]path[:tag][@digest] (distribution/reference grammar).
IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
MAX_TTL = timedelta(days=30)
# JobSpec fields as the flags that set them, so an error names what the user typed.
FLAG_OF_FIELD = {
    "name": "--name", "nodes": "--nodes", "min_nodes": "--nodes", "gpus_per_node": "--gpus-per-node", "cpu": "--cpu",
    "memory_gib": "--memory-gib", "efa_devices": "--efa", "image": "--image", "env": "--env",
    "max_restarts": "--max-restarts", "capacity_type": "--capacity-type", "node_pool": "--node-pool",
    "ttl_seconds_after_finished": "--ttl",
}
_FIELD = re.compile(r"\b(" + "|".join(sorted(FLAG_OF_FIELD, key=len, reverse=True)) + r")\b")


def in_flags(message: str) -> str:
    """A JobSpec error with field names as flags: the leading location or word, and any snake_case field."""
    head = re.split(r"[.: ]", message, maxsplit=1)[0]
    if head in FLAG_OF_FIELD:
        message = FLAG_OF_FIELD[head] + message[len(head):]
    return _FIELD.sub(lambda match: FLAG_OF_FIELD[match.group(1)] if "_" in match.group(1) else match.group(1),
                      message)


def node_range(text: str, kind: str) -> tuple[int, int]:
    """``--nodes`` as (min, max), each within 1..MAX_NODES; MIN:MAX only for an elastic kind."""
    try:
        low, high = parse_nodes(text)
    except SpecError as error:
        fail(f"--nodes: {error}")
    if not 1 <= low <= MAX_NODES or not 1 <= high <= MAX_NODES:
        fail(f"--nodes {text}: node counts go from 1 to {MAX_NODES}")
    if low > high:
        fail(f"--nodes {text}: MIN {low} is above MAX {high}")
    if low < high and kind not in ELASTIC_KINDS:
        fail(f"--nodes {text}: MIN:MAX (elastic) needs --kind {' or '.join(ELASTIC_KINDS)}, not {kind}")
    return low, high


def trainer_env(items: list[str]) -> dict[str, str] | None:
    try:
        env = parse_env(items)
    except SpecError as error:
        fail(f"--env: {error}")
    for key in env:
        if not ENV_NAME.fullmatch(key):
            fail(f"--env {key}=...: {key!r} is not a variable name (letters, digits and _, not starting with a digit)")
    return env or None


def ttl_seconds(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(parse_duration(text, maximum=MAX_TTL).total_seconds())
    except DurationError as error:
        fail(f"--ttl: {error}")


def render_command(
    stack: Stack = typer.Option("dev", "--stack", help="Stack whose teams, images and bucket to use."),
    team: str | None = typer.Option(None, "--team", help="Team (from gpuyard:teams) submitting the job."),
    kind: Kind | None = typer.Option(None, "--kind", help="Job kind."),
    all_: bool = typer.Option(False, "--all", help="Every kind for every team, default sizes."),
    name: str | None = typer.Option(None, "--name", help="Job name (DNS-1035 label; default <team>-<kind>)."),
    nodes: str = typer.Option(str(DEFAULT_NODES), "--nodes", metavar="N|MIN:MAX",
                              help="Nodes, or MIN:MAX for an elastic PyTorchJob."),
    gpus_per_node: int = typer.Option(DEFAULT_GPUS_PER_NODE, "--gpus-per-node", min=0, max=16, metavar="N",
                                      help="GPUs per node (0 = CPU)."),
    cpu: float | None = typer.Option(None, "--cpu", min=0.001, max=1024, metavar="CPUS",
                                     help="CPUs per node [default: 3 per GPU, 2 on CPU]."),
    memory_gib: int | None = typer.Option(None, "--memory-gib", min=1, max=65536, metavar="GIB",
                                          help="Memory per node [default: 12 per GPU, 8 on CPU]."),
    efa: int | None = typer.Option(None, "--efa", min=0, max=32, metavar="N",
                                   help="EFA devices per node (sets FI_PROVIDER=efa)."),
    capacity_type: CapacityType = typer.Option(CapacityType.on_demand, "--capacity-type", help="Capacity type."),
    node_pool: str | None = typer.Option(
        None, "--node-pool", help="Karpenter NodePool or managed GPU node group [default: from GPUs/EFA/capacity]."
    ),
    image: str | None = typer.Option(None, "--image", help="Container image [default: the kind's gpuyard image]."),
    epochs: int = typer.Option(DEFAULT_EPOCHS, "--epochs", min=1, max=1_000_000, metavar="N", help="Trainer epochs."),
    max_restarts: int | None = typer.Option(None, "--max-restarts", min=0, max=MAX_RESTARTS, metavar="N",
                                            help="Restarts before the job fails [default: 3]."),
    ttl: str | None = typer.Option(None, "--ttl", metavar="DURATION",
                                   help="Keep the finished job this long: 90s, 30m, 8h, 2d [default: 1h]."),
    env: list[str] = typer.Option([], "--env", "-e", metavar="KEY=VALUE", help="Trainer variable, repeatable."),
    output: OutputFormat = typer.Option(OutputFormat.yaml, "--output", "-o", help="Format on stdout."),
    output_dir: str | None = typer.Option(None, "--output-dir", "-d", metavar="DIR",
                                          help="Write one <name>.yaml per manifest into DIR instead."),
) -> None:
    """Render job manifests: YAML (or JSON) on stdout, or one file per manifest in --output-dir."""
    out_dir = checked_output_dir(output_dir) if output_dir is not None else None
    if all_ and (team or kind):
        fail("--all renders every team and kind: drop --team/--kind")
    if not all_ and (not team or not kind):
        fail("--team and --kind are required (or --all)")
    if efa and not gpus_per_node:
        fail("--efa needs GPU nodes (--gpus-per-node > 0)")
    for flag, value in (("--name", name), ("--node-pool", node_pool), ("--image", image)):
        if value is not None and not value.strip():
            fail(f"{flag} is empty: leave it out for the default")
    if image and not IMAGE_REF.fullmatch(image):
        fail(f"--image {image!r}: not an image reference (like registry.example.com/team/trainer:1.2)")
    try:
        config = load_stack(stack.value)
    except ConfigError as error:
        fail(str(error))
    try:
        if all_:
            specs = default_specs(config)
        else:
            min_nodes, max_nodes = node_range(nodes, kind.value)
            specs = [place(config, build_spec(
                config, _team(config, team), kind.value, name=name, nodes=max_nodes, min_nodes=min_nodes,
                gpus_per_node=gpus_per_node, capacity_type=capacity_type.value, epochs=epochs, cpu=cpu,
                memory_gib=memory_gib, efa_devices=efa, node_pool=node_pool, image=image,
                max_restarts=max_restarts, ttl_seconds_after_finished=ttl_seconds(ttl), env=trainer_env(env),
            ))]
        rendered = render_specs(config, specs)
    except (ConfigError, SpecError, ValueError) as error:
        fail(in_flags(str(error)))
    if out_dir is None:
        typer.echo(_as_text(list(rendered.values()), output, provenance(config.stack)), nl=False)
        return
    try:
        written = write_manifests(rendered, out_dir, provenance(config.stack))
    except OSError as error:
        fail(f"--output-dir {output_dir}: cannot write: {error.strerror or error} ({error.filename or out_dir})")
    for path in written:
        typer.echo(str(path))


def _team(config: StackConfig, name: str) -> Team:
    try:
        return config.team(name)
    except ConfigError as error:
        fail(f"--team: {error}")


def _as_text(manifests: list[dict], output: OutputFormat, header: str) -> str:
    """kubectl's shapes: one object, or a ``List`` of them in JSON; YAML documents after the header comment."""
    if output is OutputFormat.json:
        document = manifests[0] if len(manifests) == 1 else {"apiVersion": "v1", "kind": "List", "items": manifests}
        return json.dumps(document, indent=2) + "\n"
    return header + "---\n".join(to_yaml(manifest) for manifest in manifests)
