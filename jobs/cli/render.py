"""``gpuyard render``: job manifests for a team, or every kind for every team of a stack."""

from __future__ import annotations

import enum
import json
import re
import shlex
import secrets
import shutil
import string
import sys
from datetime import timedelta
from pathlib import Path

import typer

from gpuyard.infra.config import ConfigError, StackConfig, Team, load_stack
from gpuyard.infra.image_reference import check_image_reference
from gpuyard.infra.images import NoImageRegistry
from gpuyard.jobs.cli.errors import fail
from gpuyard.jobs.cli.options import (OutputFormat, checked_output_dir, count, flag_of, given, number, provenance,
                                      stack_option, with_registry)
from gpuyard.jobs.duration import DurationError, parse_duration
from gpuyard.jobs.placement import place
from gpuyard.jobs.render import default_specs, render_specs, to_yaml, write_manifests
from gpuyard.jobs.spec import (
    DEFAULT_EPOCHS,
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_NODES,
    ELASTIC_KINDS,
    KINDS,
    MAX_RESTARTS,
    SpecError,
    build_spec,
    parse_command,
    parse_env,
    parse_nodes,
)

Kind = enum.Enum("Kind", [(kind, kind) for kind in KINDS], type=str)


class CapacityType(str, enum.Enum):
    on_demand = "on-demand"
    spot = "spot"


MAX_NODES = 10_000
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_TTL = timedelta(days=30)
NAME_SUFFIX = string.ascii_lowercase + string.digits
EXPLAIN_IMAGE = "placeholder.invalid/explain"  # --explain renders nothing: the image is never shown or used
# What --all decides itself: every team, every kind, default sizes and images.
SIZING = ("team", "kind", "name", "nodes", "gpus_per_node", "cpu", "memory_gib", "efa", "capacity_type", "node_pool",
          "image", "epochs", "max_restarts", "ttl", "env")
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


def unique_name(team: str, kind: str) -> str:
    """A default job name no teammate's submission shares (nor its checkpoint folder): 36**5 suffixes."""
    return f"{team}-{kind}-{''.join(secrets.choice(NAME_SUFFIX) for _ in range(5))}"


def command_argument():
    return typer.Argument(None, metavar="[-- SCRIPT.py ARGS... | -- -m MODULE ARGS...]", show_default=False,
                          help="Your command for every rank [default: the reference trainer].")


def user_command(words: list[str] | None) -> list[str] | None:
    """The words after ``--``, checked; None without ``--`` (click drops ``--`` itself, so argv says whether it was
    there: ``gpuyard render ... --`` alone is an empty command, an error)."""
    if not words and "--" not in sys.argv[1:]:
        return None
    try:
        parse_command(words or [])
    except SpecError as error:
        fail(str(error))
    return list(words or [])


def ttl_seconds(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(parse_duration(text, maximum=MAX_TTL).total_seconds())
    except DurationError as error:
        fail(f"--ttl: {error}")


def render_command(
    ctx: typer.Context,
    stack: str = stack_option("Stack whose teams, images and bucket to use."),
    team: str | None = typer.Option(None, "--team", help="Team (from gpuyard:teams) submitting the job."),
    kind: Kind | None = typer.Option(None, "--kind", help="Job kind."),
    all_: bool = typer.Option(False, "--all", help="Every kind for every team, default sizes."),
    name: str | None = typer.Option(None, "--name", help="Job name (DNS-1035 label) [default: "
                                    "<team>-<kind>-<random>, new each time]."),
    nodes: str = typer.Option(str(DEFAULT_NODES), "--nodes", metavar="N|MIN:MAX",
                              help="Nodes, or MIN:MAX for an elastic PyTorchJob."),
    gpus_per_node: int = typer.Option(DEFAULT_GPUS_PER_NODE, "--gpus-per-node", parser=count(0, 16), metavar="N",
                                      help="GPUs per node, 0 to 16 (0 = CPU)."),
    cpu: float | None = typer.Option(None, "--cpu", parser=number(0.001, 1024), metavar="CPUS",
                                     help="CPUs per node, 0.001 to 1024 [default: 3 per GPU, 2 on CPU]."),
    memory_gib: int | None = typer.Option(None, "--memory-gib", parser=count(1, 65536), metavar="GIB",
                                          help="Memory per node, 1 to 65536 [default: 12 per GPU, 8 on CPU]."),
    efa: int | None = typer.Option(None, "--efa", parser=count(0, 32), metavar="N",
                                   help="EFA devices per node, 0 to 32 (sets FI_PROVIDER=efa)."),
    capacity_type: CapacityType = typer.Option(CapacityType.on_demand, "--capacity-type", help="Capacity type."),
    node_pool: str | None = typer.Option(
        None, "--node-pool", help="Karpenter NodePool or managed GPU node group [default: from GPUs/EFA/capacity]."
    ),
    image: str | None = typer.Option(None, "--image", help="Container image [default: the kind's gpuyard image]."),
    registry: str | None = typer.Option(None, "--registry", metavar="PREFIX",
                                        help="Image registry prefix, over gpuyard:image_registry (gpuyard sim registry)."),
    epochs: int = typer.Option(DEFAULT_EPOCHS, "--epochs", parser=count(1, 1_000_000), metavar="N",
                               help="Trainer epochs, 1 to 1000000."),
    max_restarts: int | None = typer.Option(None, "--max-restarts", parser=count(0, MAX_RESTARTS), metavar="N",
                                            help=f"Restarts before the job fails, 0 to {MAX_RESTARTS} [default: 3]."),
    ttl: str | None = typer.Option(None, "--ttl", metavar="DURATION",
                                   help="Keep the finished job this long: 90s, 30m, 8h, 2d [default: 1h]."),
    env: list[str] = typer.Option([], "--env", "-e", metavar="KEY=VALUE", help="Trainer variable, repeatable."),
    output: OutputFormat = typer.Option(OutputFormat.yaml, "--output", "-o", help="Format on stdout."),
    output_dir: str | None = typer.Option(None, "--output-dir", "-d", metavar="DIR",
                                          help="Write one <name>.yaml per manifest into DIR instead."),
    explain: bool = typer.Option(False, "--explain", help="Render nothing: say which pool and instance type the "
                                 "gang lands on, its $/hour, EFA and placement group, and (with a cluster) the "
                                 "team's queue."),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", envvar="KUBECONFIG", metavar="FILE",
                                           help="With --explain: the cluster whose queue to read [default: "
                                           "$KUBECONFIG]."),
    command: list[str] | None = command_argument(),
) -> None:
    """Render job manifests: YAML (or JSON) on stdout, or one file per manifest in --output-dir.

    After --, your own command replaces the reference trainer: every rank runs it under the kind's launcher."""
    command = user_command(command)
    out_dir = checked_output_dir(output_dir) if output_dir is not None else None
    for flag, value in (("--name", name), ("--node-pool", node_pool), ("--image", image), ("--team", team)):
        if value is not None and not value.strip():
            fail(f"{flag} is empty: " + ("name a team" if flag == "--team" else "leave it out for the default"))
    if all_:
        typed = [flag_of(ctx, param) for param in SIZING if given(ctx, param)]
        if typed:
            fail(f"--all renders every team and kind at the default sizes and images: drop {typed[0]}")
        if command is not None:
            fail(f"--all renders the reference trainer: drop the command after -- ({shlex.join(command) or 'empty'})")
    elif not team or not kind:
        fail("--team and --kind are required (or --all)")
    if explain and (all_ or out_dir is not None):
        fail("--explain explains one job: drop --all/--output-dir")
    if command is not None and given(ctx, "epochs"):
        fail("--epochs is the reference trainer's: pass your command its own arguments after --")
    if efa and not gpus_per_node:
        fail("--efa needs GPU nodes (--gpus-per-node > 0)")
    if image:
        try:
            check_image_reference(image)
        except ValueError as error:
            fail(f"--image {error}")
    try:
        config = load_stack(stack)
    except ConfigError as error:
        fail(str(error))
    if registry is not None:
        config = with_registry(config, registry)
    try:
        if all_:
            specs = default_specs(config)
        else:
            min_nodes, max_nodes = node_range(nodes, kind.value)
            specs = [place(config, build_spec(
                config, _team(config, team), kind.value, name=name or unique_name(team, kind.value),
                nodes=max_nodes, min_nodes=min_nodes,
                gpus_per_node=gpus_per_node, capacity_type=capacity_type.value, epochs=epochs, cpu=cpu,
                memory_gib=memory_gib, efa_devices=efa, node_pool=node_pool,
                image=image or (EXPLAIN_IMAGE if explain else None),
                max_restarts=max_restarts, ttl_seconds_after_finished=ttl_seconds(ttl), env=trainer_env(env),
                command=command,
            ))]
        if explain:
            return _explain(config, specs[0], output, kubeconfig)
        rendered = render_specs(config, specs)
    except NoImageRegistry as error:
        fail(f"{error}{'' if all_ else ', or pass --image'}")
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


def _explain(config: StackConfig, spec, output: OutputFormat, kubeconfig: Path | None) -> None:
    """Where the job lands and what it costs; the team's queue on the cluster when there is one."""
    from gpuyard.jobs.preflight import describe, landing

    land = landing(config, spec)
    queue = _queue(config, land.queue, kubeconfig) if kubeconfig else None
    if output is OutputFormat.json:
        typer.echo(json.dumps({**land.as_dict(), "queue_state": queue}, indent=2))
        return
    from gpuyard.sim.queues import describe_queue

    lines = describe(land) + (describe_queue(queue) if queue else ["  queue: no cluster (--kubeconfig or KUBECONFIG)"])
    typer.echo("\n".join(lines))


def _queue(config: StackConfig, queue: str, kubeconfig: Path) -> dict:
    from gpuyard.sim.cluster import Sim
    from gpuyard.sim.kube import Kubectl, KubectlError
    from gpuyard.sim.queues import queue_state

    if not kubeconfig.is_file():
        fail(f"--kubeconfig {kubeconfig}: no such file")
    found = shutil.which("kubectl")
    binary = Path(found) if found else Sim(config.stack).kubectl_binary()  # gpuyard sim's own kubectl
    if not binary.is_file():
        fail("--explain reads the queue with kubectl: none on PATH (nor a gpuyard sim build)", 1)
    try:
        return queue_state(Kubectl(binary, kubeconfig), queue)
    except KubectlError as error:
        fail(f"queue {queue} on the cluster of {kubeconfig}: {error}", 1)


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
