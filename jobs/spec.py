"""JobSpec: one distributed training job, independent of the operator that runs it.

``build_spec(config, team, kind, ...)`` fills every default from the stack and the
team (image, checkpoint URI, NodePool, trainer arguments), so a JobSpec is complete
and the renderers in ``gpuyard.jobs.render`` only translate it, never look anything up.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuyard.infra.config import DNS1123_LABEL, RULES, StackConfig, Team
from gpuyard.infra.validation import validation_message
from gpuyard.infra.conventions import (
    DEFAULT_MAX_RESTARTS,
    GRACE_PERIOD_SECONDS,
    METRICS_PORT,
    NODEPOOL_CPU,
    NODEPOOL_GPU_EFA,
    NODEPOOL_GPU_ON_DEMAND,
    NODEPOOL_GPU_SPOT,
)
from gpuyard.infra.images import template_image
from gpuyard.jobs.workload.args import RAY_MODULE, TRAIN_MODULE, TrainArgs

Kind = Literal["pytorchjob", "mpijob", "rayjob", "volcanojob", "trainjob"]
KINDS: tuple[Kind, ...] = get_args(Kind)
CapacityType = Literal["on-demand", "spot"]
ELASTIC_KINDS: tuple[Kind, ...] = ("pytorchjob",)  # torchrun rendezvous; MPI, Ray and TrainJob are fixed-size

# Which of gpuyard.infra.conventions.IMAGE_NAMES each kind runs.
KIND_IMAGE: dict[Kind, str] = {
    "pytorchjob": "ddp", "trainjob": "ddp", "mpijob": "mpi", "volcanojob": "mpi", "rayjob": "ray",
}

# Longest name each operator derives from the job's (pod hostnames, Services, RayCluster);
# all must stay DNS-1123 labels. {i} is the highest node index.
_DERIVED_NAME = {
    "pytorchjob": "{name}-worker-{i}",
    "mpijob": "{name}-launcher-xxxxx",  # the launcher Job's pod
    "rayjob": "{name}-xxxxx-head-svc",  # RayCluster "<job>-<5 random>", then its head Service
    "volcanojob": "{name}-mpiworker-{i}",
    "trainjob": "{name}-node-0-{i}",  # JobSet "<job>-<replicatedJob>-<jobIndex>-<podIndex>"
}
MAX_LABEL = 63
# Every operator validates the job's name as a DNS-1035 label (a letter first): Training Operator v1.9.4
# (pkg/webhooks/pytorch/pytorchjob_webhook.go, apimachinery NameIsDNS1035Label), MPI Operator v0.8.0
# (pkg/apis/kubeflow/validation/validation.go, "<name>-worker-<n>" as DNS-1035), KubeRay v1.7.0
# (ray-operator/controllers/ray/utils/validation.go, ValidateRayJobMetadata: DNS-1035 and at most
# MaxRayJobNameLength characters, utils/constant.go: MaxRayClusterNameLength 53 - 6 = 47, room for the
# RayCluster name's suffix).
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME = {"rayjob": 47}
# Volcano counts job restarts, not container restarts, toward maxRetry: a bound keeps a failing gang from
# holding its GPUs forever.
MAX_RESTARTS = 10

# Per-GPU defaults sized to fit the smallest GPU node (g5.xlarge: 4 vCPU, 16 GiB) after
# kubelet and DaemonSet reservations; CPU-only jobs get a small slice of a cpu node.
CPU_PER_GPU = 3
MEMORY_GIB_PER_GPU = 12
CPU_ONLY_CPU = 2
CPU_ONLY_MEMORY_GIB = 8
# Helper pods only coordinate (mpirun/ssh, the Ray GCS and driver): a small fixed slice.
HELPER_CPU = "1"
HELPER_MEMORY_GIB = 4

DEFAULT_NODES = 2
DEFAULT_GPUS_PER_NODE = 1
DEFAULT_EPOCHS = 10
DEFAULT_SAVE_EVERY = 2
DEFAULT_TTL_SECONDS = 3600

# What may follow ``--``: ``-m package.module`` or a relative path to a Python file inside the image's working
# folder (no ``..``, no leading ``-``, which the launchers would read as an option).
MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
SCRIPT_PATH = r"^(?!-)(?!.*(^|/)\.\.(/|$))[^/\x00-\x1f][^\x00-\x1f]*\.py$"

EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class SpecError(ValueError):
    """A job that cannot be rendered, as one line."""


class JobSpec(BaseModel):
    """A complete, scheduler-agnostic training job.

    ``nodes`` is the job's size; with ``min_nodes < nodes`` it is elastic between the two.
    ``program`` (``-m module`` or a ``script``) and ``args`` are what every launcher runs per rank
    (``torchrun``, ``mpirun python3``, the Ray entry); by default the reference trainer and
    ``TrainArgs(...).to_argv()``, else the user's command after ``gpuyard render ... --``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=MAX_LABEL)]
    team: Annotated[str, Field(pattern=DNS1123_LABEL)]
    kind: Kind
    nodes: Annotated[int, Field(ge=1)]
    min_nodes: Annotated[int, Field(ge=1)]
    gpus_per_node: Annotated[int, Field(ge=0, le=16)]
    cpu: Annotated[float, Field(gt=0)]
    memory_gib: Annotated[int, Field(ge=1)]
    efa_devices: Annotated[int, Field(ge=0, le=32)] = 0
    image: Annotated[str, Field(min_length=1)]
    module: Annotated[str, Field(pattern=MODULE_NAME)] | None = None
    script: str | None = None
    args: tuple[str, ...]
    env: dict[EnvName, str] = {}
    checkpoint_uri: str
    data_uri: str  # the team's data (``GPUYARD_DATA_URI``), read-only to its role
    max_restarts: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = DEFAULT_MAX_RESTARTS
    capacity_type: CapacityType = "on-demand"
    node_pool: Annotated[str, Field(pattern=DNS1123_LABEL)]
    # Set by gpuyard.jobs.placement from the stack: the pool is a managed node group (else a Karpenter NodePool),
    # and the instance family the whole gang stays on.
    node_group: bool = False
    instance_family: str | None = None
    ttl_seconds_after_finished: Annotated[int, Field(ge=0)] = DEFAULT_TTL_SECONDS

    @model_validator(mode="after")
    def _check(self) -> "JobSpec":
        if not re.fullmatch(DNS1035_LABEL, self.name):
            raise ValueError(
                f"name {self.name!r} is not a DNS-1035 label (lowercase letters, digits and '-', "
                "starting with a letter, ending with a letter or digit): the operators refuse it"
            )
        limit = MAX_NAME.get(self.kind)
        if limit and len(self.name) > limit:
            raise ValueError(f"name {self.name!r} has {len(self.name)} characters: a {self.kind} name has at most {limit}")
        if (self.module is None) == (self.script is None):
            raise ValueError("give the job either a module or a script to run")
        if self.script is not None and not re.fullmatch(SCRIPT_PATH, self.script):
            raise ValueError(f"script {self.script!r} is not a relative path to a .py file without '..'")
        if self.min_nodes > self.nodes:
            raise ValueError(f"elastic min nodes {self.min_nodes} > max nodes {self.nodes}")
        if self.elastic and self.kind not in ELASTIC_KINDS:
            raise ValueError(f"elastic nodes {self.min_nodes}:{self.nodes} need kind {' or '.join(ELASTIC_KINDS)}")
        if self.efa_devices and not self.gpus_per_node:
            raise ValueError("EFA devices need GPU nodes (gpus_per_node > 0)")
        derived = _DERIVED_NAME[self.kind].format(name=self.name, i=self.nodes - 1)
        if len(derived) > MAX_LABEL:
            raise ValueError(
                f"name {self.name!r} too long for a {self.kind}: {derived!r} would exceed {MAX_LABEL} characters"
            )
        return self

    @property
    def elastic(self) -> bool:
        return self.min_nodes < self.nodes

    @property
    def program(self) -> tuple[str, ...]:
        """What ``python`` runs per rank, before ``args``: ``("-m", module)`` or ``(script,)``."""
        return ("-m", self.module) if self.module else (self.script,)

    @property
    def user_command(self) -> bool:
        """Whether the job runs the user's own command rather than the reference trainer (or its Ray entry)."""
        return self.module not in (TRAIN_MODULE, RAY_MODULE)

    @property
    def procs_per_node(self) -> int:
        """Trainer processes per node: one per GPU, one on CPU nodes."""
        return self.gpus_per_node or 1


def stack_kinds(config: StackConfig) -> tuple[Kind, ...]:
    """The kinds whose operator the stack installs (Trainer v2 is an optional add-on)."""
    return tuple(kind for kind in KINDS if kind != "trainjob" or config.addons.trainer_v2)


NODES = re.compile(r"([0-9]{1,9})(?::([0-9]{1,9}))?")


def parse_nodes(text: str) -> tuple[int, int]:
    """``"4"`` -> (4, 4); ``"2:4"`` -> (2, 4) (elastic, min:max); ASCII digits only (``1_0`` is no 10)."""
    match = NODES.fullmatch(text)
    if match is None:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise SpecError(f"bad node count {shown!r}: expected N or MIN:MAX, e.g. 4 or 2:4")
    low, high = match.groups()
    return int(low), int(high or low)


def parse_env(items: list[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` -> ``{"KEY": "VALUE"}`` (the value may contain ``=``)."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"bad env {item!r}: expected KEY=VALUE, e.g. NCCL_DEBUG=INFO")
        if key in env:
            raise SpecError(f"{key} is set twice ({key}={env[key]!r}, {key}={value!r}): set it once")
        env[key] = value
    return env


def parse_command(command: list[str]) -> tuple[str | None, str | None, tuple[str, ...]]:
    """The words after ``--`` as (module, script, args): ``-m MODULE ARGS...`` or ``SCRIPT.py ARGS...``."""
    forms = "SCRIPT.py ARGS... or -m MODULE ARGS..."
    if not command:
        raise SpecError(f"nothing after --: give the command every rank runs, {forms}")
    first, *rest = command
    if first == "-m":
        if not rest or not re.fullmatch(MODULE_NAME, rest[0]):
            shown = f"-- -m {rest[0]!r}" if rest else "-- -m"
            raise SpecError(f"{shown}: -m takes a module name such as train or mypkg.train")
        return rest[0], None, tuple(rest[1:])
    if first.startswith("/"):
        raise SpecError(f"-- {first}: the script path must be relative to the image's working folder, e.g. train.py")
    if not re.fullmatch(SCRIPT_PATH, first):
        raise SpecError(f"-- {first!r}: expected {forms} (a relative path to a .py file, without '..')")
    return None, first, tuple(rest)


def default_image(config: StackConfig, team: Team, kind: Kind) -> str:
    """The kind's image in the stack's registry; a team's own image replaces the ``ddp`` one."""
    image = KIND_IMAGE[kind]
    if image == "ddp" and team.image:
        return team.image
    return template_image(config, image)


def default_node_pool(gpus_per_node: int, capacity_type: CapacityType, efa_devices: int = 0) -> str:
    if not gpus_per_node:
        return NODEPOOL_CPU
    if capacity_type == "spot":
        return NODEPOOL_GPU_SPOT
    return NODEPOOL_GPU_EFA if efa_devices else NODEPOOL_GPU_ON_DEMAND


def checkpoint_uri(config: StackConfig, team: Team, name: str) -> str:
    return team.checkpoint_uri(config.checkpoint_bucket, name)


def trainer_args(checkpoint: str, epochs: int = DEFAULT_EPOCHS, save_every: int = DEFAULT_SAVE_EVERY,
                 grace_period: int = GRACE_PERIOD_SECONDS["on-demand"]) -> TrainArgs:
    """The reference trainer's arguments in a template: checkpoints to S3, metrics on rank 0, the pod's grace."""
    return TrainArgs(total_epochs=epochs, save_every=save_every, checkpoint_uri=checkpoint, metrics_port=METRICS_PORT,
                     grace_period=grace_period)


def build_spec(
    config: StackConfig,
    team: Team,
    kind: Kind,
    *,
    name: str | None = None,
    nodes: int = DEFAULT_NODES,
    min_nodes: int | None = None,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    capacity_type: CapacityType = "on-demand",
    epochs: int = DEFAULT_EPOCHS,
    command: list[str] | None = None,
    **fields,
) -> JobSpec:
    """A JobSpec for ``team`` with every unset field defaulted; raises SpecError (one line).

    ``command`` (the words after ``--``) replaces the reference trainer and its arguments."""
    if kind not in KINDS:
        raise SpecError(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    if kind not in stack_kinds(config):
        raise SpecError(f"stack {config.stack!r} does not install Kubeflow Trainer v2 (gpuyard:addons.trainer_v2)")
    name = name or f"{team.name}-{kind}"
    ckpt = fields.pop("checkpoint_uri", None) or checkpoint_uri(config, team, name)
    args = tuple(trainer_args(ckpt, epochs, grace_period=GRACE_PERIOD_SECONDS[capacity_type]).to_argv())
    module, script = TRAIN_MODULE, None
    if command is not None:
        module, script, args = parse_command(command)
    elif kind == "rayjob":
        module = RAY_MODULE
        # explicit: the Ray driver runs on the CPU-only head pod, so it cannot detect the workers' GPUs
        args += ("--num-workers", str(nodes * (gpus_per_node or 1)), "--use-gpu" if gpus_per_node else "--no-use-gpu")
    values = {
        "name": name, "team": team.name, "kind": kind, "nodes": nodes,
        "min_nodes": nodes if min_nodes is None else min_nodes,
        "gpus_per_node": gpus_per_node,
        "cpu": CPU_PER_GPU * gpus_per_node if gpus_per_node else CPU_ONLY_CPU,
        "memory_gib": MEMORY_GIB_PER_GPU * gpus_per_node if gpus_per_node else CPU_ONLY_MEMORY_GIB,
        "image": fields.pop("image", None) or default_image(config, team, kind), "module": module, "script": script,
        "args": args,
        "checkpoint_uri": ckpt, "data_uri": team.data_uri(config.checkpoint_bucket),
        "capacity_type": capacity_type,
        "node_pool": default_node_pool(gpus_per_node, capacity_type, fields.get("efa_devices") or 0),
    }
    values.update({key: value for key, value in fields.items() if value is not None})
    try:
        return JobSpec.model_validate(values)
    except ValidationError as error:
        raise SpecError(validation_message(error, rules=RULES)) from None
