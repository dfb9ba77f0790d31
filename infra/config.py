"""Typed stack configuration: the one reading of ``stacks/Pulumi.<stack>.yaml``.

Both the Pulumi program (``parse_stack`` over the runtime's config) and the job renderers
(``load_stack(name)``) go through :class:`StackConfig`, so the team list has one
source of truth. Components and renderers never read raw config themselves.
"""

from __future__ import annotations

import ipaddress
import json
import os
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from gpuyard.infra.instance_types import GPU_INSTANCE_TYPES, check_instance_type
from gpuyard.infra.eks_versions import check_version
from gpuyard.infra.conventions import PRIORITY_CLASSES, RESERVED_NAMESPACE_PREFIX, RESERVED_NAMESPACES, RESERVED_QUEUES
from gpuyard.infra.image_reference import ImageReference
from gpuyard.infra.regions import COMMERCIAL_REGIONS
from gpuyard.infra.stack_file import STACK_NAME, StackFileError, check_stack_name, read_config
from gpuyard.infra.validation import as_typed, validation_message

PROJECT = "gpuyard"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
STACKS_DIR_ENV = "GPUYARD_STACKS_DIR"

ROLE_ARN = r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/.+$"
Label = Annotated[str, Field(pattern=DNS1123_LABEL, max_length=63)]
RoleArn = Annotated[str, Field(pattern=ROLE_ARN)]
# The largest cluster Kubernetes supports is 5,000 nodes (kubernetes.io/docs/setup/best-practices/cluster-large);
# the largest nodes gpuyard knows have 8 GPUs, 192 vCPUs and 2 TiB: sizes, limits and quotas beyond those are typos.
MAX_NODES = 5000
MAX_GPUS = MAX_NODES * 8
MAX_CPUS = MAX_NODES * 192
MAX_MEMORY_GIB = MAX_NODES * 2048


class ConfigError(ValueError):
    """A stack configuration problem, phrased as one line for the user."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Team(Frozen):
    """A tenant: its namespace, Volcano queue, quota, identity and checkpoint prefix."""

    name: Annotated[str, Field(pattern=DNS1123_LABEL, max_length=30)]
    namespace: Label | None = None
    queue: Label | None = None
    # the team's share of the GPU pool is queue_weight / all teams' (its Volcano Queue's ``deserved``)
    queue_weight: Annotated[int, Field(ge=1, le=1000)] = 1
    # what the team holds at most at once: its Volcano Queue's ``capability`` (infra/tenancy.py team_quota says why
    # not a ResourceQuota)
    gpu_quota: Annotated[int, Field(ge=0, le=MAX_GPUS)] = 8
    cpu_quota: Annotated[int, Field(ge=1, le=MAX_CPUS)] = 64
    memory_quota_gib: Annotated[int, Field(ge=1, le=MAX_MEMORY_GIB)] = 256
    image: ImageReference | None = None
    service_account: Label | None = None
    checkpoint_prefix: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9/_.-]*$")] | None = None
    # where the team's training data lies in the checkpoint bucket: its role reads it, never writes it
    data_prefix: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9/_.-]*$")] | None = None
    priority_class: Literal[tuple(PRIORITY_CLASSES)] = "gpuyard-normal"
    member_role_arns: tuple[RoleArn, ...] = ()  # IAM roles mapped to the team's Kubernetes group
    # Pod Security Standard the namespace enforces; ``baseline`` only with ``pod_security_reason`` saying why.
    pod_security: Literal["restricted", "baseline"] = "restricted"
    pod_security_reason: Annotated[str, Field(min_length=10)] | None = None

    @model_validator(mode="after")
    def _baseline_has_a_reason(self) -> "Team":
        if self.pod_security == "baseline" and not self.pod_security_reason:
            raise ValueError(
                f"team {self.name!r}: pod_security baseline needs pod_security_reason (why not restricted)")
        return self

    @model_validator(mode="after")
    def _fill_defaults(self) -> "Team":
        defaults = {
            "namespace": f"team-{self.name}",
            "queue": self.name,
            "service_account": f"{self.name}-trainer",
            "checkpoint_prefix": f"teams/{self.name}",
            "data_prefix": f"data/{self.name}",
        }
        for field, value in defaults.items():
            if getattr(self, field) is None:
                object.__setattr__(self, field, value)
        # ends at "/": an IAM ``s3:prefix`` of teams/nlp would also match teams/nlp-2/ (infra/policies.py)
        for prefix in ("checkpoint_prefix", "data_prefix"):
            object.__setattr__(self, prefix, getattr(self, prefix).strip("/") + "/")
        return self

    @model_validator(mode="after")
    def _not_reserved(self) -> "Team":
        if self.namespace in RESERVED_NAMESPACES or self.namespace.startswith(RESERVED_NAMESPACE_PREFIX):
            raise ValueError(f"team {self.name!r}: namespace {self.namespace!r} is reserved (kube-*, "
                             f"{', '.join(n for n in RESERVED_NAMESPACES if not n.startswith('kube-'))})")
        if self.queue in RESERVED_QUEUES:
            raise ValueError(f"team {self.name!r}: queue {self.queue!r} is Volcano's own "
                             f"({', '.join(RESERVED_QUEUES)} are reserved)")
        return self

    def checkpoint_uri(self, bucket: str, job: str) -> str:
        """A job's checkpoint folder (``GPUYARD_CHECKPOINT_URI``): the team's prefix plus the job's name."""
        return f"s3://{bucket}/{self.checkpoint_prefix}{job}"

    def data_uri(self, bucket: str) -> str:
        """The team's data (``GPUYARD_DATA_URI``), which its role may read, never write."""
        return f"s3://{bucket}/{self.data_prefix}"

    @property
    def priority_classes(self) -> tuple[str, ...]:
        """The PriorityClasses the team's pods may use: its own and every lower one (admission enforces it)."""
        ceiling = PRIORITY_CLASSES[self.priority_class]
        return tuple(name for name, value in PRIORITY_CLASSES.items() if value <= ceiling)


# Instance type families (the part before the first dot) the cluster knows how to run.
GPU_FAMILIES = frozenset({"g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"})
EFA_FAMILIES = frozenset({"g6e", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"})
CPU_FAMILIES = frozenset({"c6i", "c7i", "m5", "m6a", "m6i", "m7a", "m7i", "r6i", "r7i", "t3"})
CONTROL_PLANE_LOGS = ("api", "audit", "authenticator", "controllerManager", "scheduler")
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                      3288, 3653)  # what CloudWatch Logs accepts


def instance_family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def _check_families(instance_types: tuple[str, ...], known: frozenset[str], kind: str) -> None:
    for instance_type in instance_types:
        if instance_family(instance_type) not in known:
            raise ValueError(
                f"unknown {kind} instance type family {instance_family(instance_type)!r} in {instance_type!r} "
                f"(known: {', '.join(sorted(known))})"
            )
        check_instance_type(instance_type)
    duplicates = sorted({t for t in instance_types if instance_types.count(t) > 1})
    if duplicates:
        raise ValueError(f"instance type {duplicates[0]!r} listed twice")


class NetworkConfig(Frozen):
    """The VPC: its CIDR, how many AZs it spans and whether each AZ gets its own NAT gateway."""

    cidr: str = "10.0.0.0/16"
    az_count: Annotated[int, Field(ge=2, le=6)] = 2
    nat: Literal["single", "per_az"] = "single"

    @model_validator(mode="after")
    def _cidr_fits_subnets(self) -> "NetworkConfig":
        network = _network("cidr", self.cidr)
        # AWS: a VPC's IPv4 block is /16 to /28 (VPC user guide, "VPC CIDR blocks"); network.subnet_cidrs cuts
        # eighths of eighths, so the smallest VPC with /28 public subnets would be /22, and pods need /20.
        if network.version != 4 or not 16 <= network.prefixlen <= 20:
            raise ValueError(f"cidr {self.cidr!r} must be an IPv4 network from /16 (the largest VPC AWS "
                             "allows) to /20 (the smallest gpuyard's subnets fit)")
        return self


class NodeGroupConfig(Frozen):
    """A managed node group: instance types and a min <= desired <= max size."""

    name: Label
    instance_types: Annotated[tuple[str, ...], Field(min_length=1)]
    min_size: Annotated[int, Field(ge=0, le=MAX_NODES)] = 1
    desired_size: Annotated[int, Field(ge=0, le=MAX_NODES)] = 1
    max_size: Annotated[int, Field(ge=1, le=MAX_NODES)] = 3
    disk_gib: Annotated[int, Field(ge=20, le=16384)] = 100
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _sizes_ordered(self) -> "NodeGroupConfig":
        if self.min_size > self.max_size:
            raise ValueError(f"node group {self.name!r}: min_size {self.min_size} > max_size {self.max_size}")
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError(
                f"node group {self.name!r}: desired_size {self.desired_size} outside "
                f"[{self.min_size}, {self.max_size}]"
            )
        return self


class SystemNodeGroupConfig(NodeGroupConfig):
    """CPU nodes for the controllers (Karpenter, Volcano, operators, monitoring)."""

    name: Label = "system"
    instance_types: Annotated[tuple[str, ...], Field(min_length=1)] = ("m6i.xlarge",)
    min_size: Annotated[int, Field(ge=1, le=MAX_NODES)] = 2
    desired_size: Annotated[int, Field(ge=1, le=MAX_NODES)] = 2

    @model_validator(mode="after")
    def _cpu_families(self) -> "SystemNodeGroupConfig":
        _check_families(self.instance_types, CPU_FAMILIES, "CPU")
        return self


class GpuNodeGroupConfig(NodeGroupConfig):
    """GPU nodes, tainted; with ``efa`` they get EFA interfaces in one AZ and a cluster placement group."""

    min_size: Annotated[int, Field(ge=0, le=MAX_NODES)] = 0
    desired_size: Annotated[int, Field(ge=0, le=MAX_NODES)] = 0
    efa: bool = False

    @model_validator(mode="after")
    def _gpu_families(self) -> "GpuNodeGroupConfig":
        _check_families(self.instance_types, GPU_FAMILIES, "GPU")
        if self.efa:
            _check_families(self.instance_types, EFA_FAMILIES, "EFA-capable GPU")
            efa_types = sorted(name for name, t in GPU_INSTANCE_TYPES.items() if t.efa)
            for instance_type in self.instance_types:
                if instance_type not in efa_types:
                    raise ValueError(
                        f"node group {self.name!r}: no EFA interface count known for {instance_type!r} "
                        f"(EFA types: {', '.join(efa_types)})"
                    )
            if len({GPU_INSTANCE_TYPES[t].efa for t in self.instance_types}) > 1:
                raise ValueError(f"node group {self.name!r}: EFA instance types with different network card counts")
        return self

    @property
    def efa_interfaces(self) -> int:
        """EFA interfaces per node: one per network card of its instance type, 0 without EFA."""
        return GPU_INSTANCE_TYPES[self.instance_types[0]].efa if self.efa else 0


def _network(key: str, cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(cidr)
    except ValueError:
        raise ValueError(f"{key}: {cidr!r} is not a CIDR network (like 10.0.0.0/16, no host bits set)") from None


def _networks(key: str, cidrs: tuple[str, ...], vpc: str | None = None) -> None:
    """Each a network that is not the whole internet; none repeating or inside another (nor inside ``vpc``, which
    is admitted already): AWS refuses a duplicate security group rule (InvalidPermission.Duplicate)."""
    networks = []
    for cidr in cidrs:
        network = _network(key, cidr)
        if network.prefixlen == 0:
            raise ValueError(f"{key}: {cidr!r} opens the Kubernetes API to the whole internet; list your networks")
        if network.version != 4:
            raise ValueError(f"{key}: {cidr!r} is not an IPv4 network (the cluster's rules and endpoint take IPv4)")
        for other in networks:
            if network.overlaps(other):
                raise ValueError(f"{key}: {cidr!r} overlaps {str(other)!r} listed before it; list each network once")
        if vpc is not None and network.overlaps(ipaddress.ip_network(vpc)):
            raise ValueError(f"{key}: {cidr!r} overlaps the VPC {vpc}, which reaches the endpoint already")
        networks.append(network)


class ClusterConfig(Frozen):
    """The EKS control plane, its endpoint access and its managed node groups.

    By default the endpoint is private. A public endpoint admits only ``public_access_cidrs``, which the stack must
    list. The private endpoint is reached from the VPC or from networks routed into it (VPN, peering, Transit
    Gateway), ``private_access_cidrs``: the cluster security group admits both on 443, so ``pulumi up`` and kubectl
    work from there.
    """

    kubernetes_version: str = "1.35"
    allow_extended_support: bool = False  # EKS extended support: extra cost per cluster hour
    endpoint_public: bool = False
    endpoint_private: bool = True
    public_access_cidrs: tuple[str, ...] = ()
    private_access_cidrs: tuple[str, ...] = ()
    log_types: tuple[Literal[CONTROL_PLANE_LOGS], ...] = CONTROL_PLANE_LOGS
    log_retention_days: Literal[LOG_RETENTION_DAYS] = 90  # the control-plane log group's, which the stack owns
    admin_role_arns: tuple[RoleArn, ...] = ()
    system_node_group: SystemNodeGroupConfig = SystemNodeGroupConfig()
    gpu_node_groups: tuple[GpuNodeGroupConfig, ...] = ()

    @field_validator("log_retention_days", mode="before")
    @classmethod
    def _days_not_true(cls, value: Any) -> Any:
        if isinstance(value, bool):  # pydantic matches true to the literal 1
            raise ValueError(f"cluster.log_retention_days must be one of {', '.join(map(str, LOG_RETENTION_DAYS))}")
        return value

    @model_validator(mode="after")
    def _supported_version(self, info: ValidationInfo) -> "ClusterConfig":
        today = (info.context or {}).get("today") or datetime.now(UTC).date()
        check_version(self.kubernetes_version, today, self.allow_extended_support)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> "ClusterConfig":
        if not (self.endpoint_public or self.endpoint_private):
            raise ValueError("endpoint_public and endpoint_private are both false: the API would be unreachable")
        _networks("cluster.public_access_cidrs", self.public_access_cidrs)
        _networks("cluster.private_access_cidrs", self.private_access_cidrs)
        if self.endpoint_public and not self.public_access_cidrs:
            raise ValueError("cluster.endpoint_public needs cluster.public_access_cidrs: the networks that may reach "
                             "the Kubernetes API (never 0.0.0.0/0)")
        if self.public_access_cidrs and not self.endpoint_public:
            raise ValueError("cluster.public_access_cidrs needs cluster.endpoint_public: true")
        if self.private_access_cidrs and not self.endpoint_private:
            raise ValueError("cluster.private_access_cidrs needs cluster.endpoint_private: true")
        names = [self.system_node_group.name] + [group.name for group in self.gpu_node_groups]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate node group name {duplicates[0]!r}")
        return self

    def endpoint_notice(self, vpc_cidr: str) -> str:
        """One line on where ``pulumi up`` and kubectl can reach the Kubernetes API from."""
        private = ", ".join((vpc_cidr, *self.private_access_cidrs))
        if not self.endpoint_public:
            return (f"private EKS endpoint: run `pulumi up` and kubectl from {private} (the VPC, or networks routed "
                    "into it by VPN, peering or Transit Gateway, listed in cluster.private_access_cidrs)")
        reach = f"public EKS endpoint open to {', '.join(self.public_access_cidrs)}"
        return f"{reach}; private endpoint from {private}" if self.endpoint_private else reach


class KarpenterConfig(Frozen):
    """What Karpenter may launch: instance families per NodePool and the pools' limits."""

    gpu_families: Annotated[tuple[str, ...], Field(min_length=1)] = ("g5", "g6", "g6e", "p4d", "p5")
    cpu_families: Annotated[tuple[str, ...], Field(min_length=1)] = ("c7i", "m7i", "r7i")
    gpu_limit: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 64
    cpu_limit: Annotated[int, Field(ge=1, le=MAX_CPUS)] = 1000
    spot: bool = True

    @model_validator(mode="after")
    def _known_families(self) -> "KarpenterConfig":
        for family in self.gpu_families:
            if family not in GPU_FAMILIES:
                raise ValueError(f"unknown GPU instance type family {family!r} (known: {', '.join(sorted(GPU_FAMILIES))})")
        for family in self.cpu_families:
            if family not in CPU_FAMILIES:
                raise ValueError(f"unknown CPU instance type family {family!r} (known: {', '.join(sorted(CPU_FAMILIES))})")
        return self


class AddonsConfig(Frozen):
    """Optional add-ons; the rest (Volcano, operators, monitoring) is always installed."""

    trainer_v2: bool = False


class StorageConfig(Frozen):
    """Checkpoint bucket lifecycle; what ``pulumi destroy`` does with the bucket and the image registries.

    ``force_destroy`` empties them on destroy (short-lived stacks); ``protect`` makes destroy stop at them.
    """

    noncurrent_days: Annotated[int, Field(ge=1, le=36500)] = 30  # S3 lifecycle NoncurrentDays: a century at most
    force_destroy: bool = False
    protect: bool = False

    @model_validator(mode="after")
    def _one_fate(self) -> "StorageConfig":
        if self.force_destroy and self.protect:
            raise ValueError("storage.force_destroy and storage.protect are both true: choose one")
        return self


class Lease(Frozen):
    """Owner and expiry of a short-lived stack (``gpuyard:lease``, written by ``gpuyard env create``)."""

    owner: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$")]
    team: Label | None = None
    expires_at: AwareDatetime


class StackConfig(Frozen):
    """Everything a stack configures; ``teams`` is the tenant list."""

    stack: Label
    region: str = "us-west-2"
    cluster_name: Label
    # host[:port][/path], e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com or ghcr.io/org
    image_registry: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9._-]+)*$")] | None = None
    image_tag: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")] = "0.1.0"
    teams: Annotated[tuple[Team, ...], Field(min_length=1)] = ()
    network: NetworkConfig = NetworkConfig()
    cluster: ClusterConfig = ClusterConfig()
    karpenter: KarpenterConfig = KarpenterConfig()
    addons: AddonsConfig = AddonsConfig()
    storage: StorageConfig = StorageConfig()
    lease: Lease | None = None
    # S3 bucket for every team's checkpoints (teams write under their checkpoint_prefix);
    # defaults to "<cluster_name>-checkpoints". The stack creates it, the job templates point at it.
    checkpoint_bucket: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")] | None = None

    @field_validator("region")
    @classmethod
    def _known_region(cls, region: str) -> str:
        if region not in COMMERCIAL_REGIONS:
            raise ValueError(f"unknown AWS region {region!r} (e.g. us-east-1, us-west-2, eu-west-1)")
        return region

    @model_validator(mode="after")
    def _default_checkpoint_bucket(self) -> "StackConfig":
        if self.checkpoint_bucket is None:
            bucket = default_checkpoint_bucket(self.cluster_name)
            if len(bucket) > MAX_BUCKET_NAME:
                raise ValueError(f"{PROJECT}:cluster_name {self.cluster_name!r} makes the checkpoint bucket {bucket} "
                                 f"({len(bucket)} characters; S3 takes {MAX_BUCKET_NAME}): shorten it or set "
                                 f"{PROJECT}:checkpoint_bucket")
            object.__setattr__(self, "checkpoint_bucket", bucket)
        return self

    @model_validator(mode="after")
    def _private_access_outside_the_vpc(self) -> "StackConfig":
        _networks(f"{PROJECT}:cluster.private_access_cidrs", self.cluster.private_access_cidrs, vpc=self.network.cidr)
        return self

    @model_validator(mode="after")
    def _unique_teams(self) -> "StackConfig":
        for field in ("name", "namespace", "queue", "checkpoint_prefix"):
            seen: set[str] = set()
            for team in self.teams:
                value = getattr(team, field)
                if value in seen:
                    raise ValueError(f"duplicate team {field} {value!r}")
                seen.add(value)
        return self

    @model_validator(mode="after")
    def _prefixes_apart(self) -> "StackConfig":
        """No team's checkpoint prefix lies inside another's prefix (checkpoints or data: the outer team could read,
        and for checkpoints delete, the inner's), and no data prefix inside another team's checkpoints."""
        for outer in self.teams:
            for inner in self.teams:
                if inner is outer:
                    continue
                for inner_field, outer_field in (("checkpoint_prefix", "checkpoint_prefix"),
                                                 ("checkpoint_prefix", "data_prefix"),
                                                 ("data_prefix", "checkpoint_prefix")):
                    inside, around = getattr(inner, inner_field), getattr(outer, outer_field)
                    if inside.startswith(around):
                        raise ValueError(f"team {inner.name!r}: {inner_field} {inside!r} lies inside {outer_field} "
                                         f"{around!r} of team {outer.name!r}")
        return self

    def team(self, name: str) -> Team:
        for team in self.teams:
            if team.name == name:
                return team
        known = ", ".join(t.name for t in self.teams) or "none"
        raise ConfigError(f"unknown team {name!r} in stack {self.stack!r} (teams: {known})")


MAX_BUCKET_NAME = 63  # S3 bucket naming rules: 3 to 63 characters


def default_checkpoint_bucket(cluster_name: str) -> str:
    """The bucket a stack that names none gets: ``<cluster_name>-checkpoints``."""
    return f"{cluster_name}-checkpoints"


def _decoded(value: Any) -> Any:
    """Structured values (lists, objects) arrive JSON-encoded from the Pulumi runtime and
    from stack files written by the Automation API; YAML-written ones are already decoded."""
    if isinstance(value, str) and value.startswith(("[", "{")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


# What the regular expressions of the fields demand, in words.
RULES = {
    DNS1123_LABEL: "a DNS label: lower-case letters, digits and '-', starting and ending with a letter or digit",
    ROLE_ARN: "an IAM role ARN (arn:aws:iam::<12-digit account>:role/<name>)",
    r"^[^\x00-\x1f\x7f]+$": "text without control characters (newlines, tabs)",
}
NOT_STACK_KEYS = ("stack", "region")  # StackConfig fields that come from the stack's name and aws:region


def parse_stack(stack: str, values: dict[str, Any], today: date | None = None) -> StackConfig:
    """Build a StackConfig from the ``gpuyard:`` and ``aws:`` keys of a stack's config (EKS version support judged
    on ``today``, UTC, by default the real one).

    Validated strictly, as JSON: ``true`` is no number and ``"8"`` no count (Pulumi hands the program structured
    values as JSON, so both readings of a stack see the same types)."""
    ours = {k.split(":", 1)[1]: _decoded(v) for k, v in values.items() if k.startswith(f"{PROJECT}:")}
    for key in NOT_STACK_KEYS:
        if key in ours:
            raise ConfigError(f"stack {stack!r}: {PROJECT}:{key}: unknown key (the stack's name and aws:region "
                              "set it)")
    if "aws:region" in values:
        ours["region"] = values["aws:region"]
    ours["stack"] = stack
    try:
        document = json.dumps(ours, allow_nan=False)
    except ValueError:
        raise ConfigError(f"stack {stack!r}: .nan and .inf are no config values") from None
    try:
        return StackConfig.model_validate_json(document, strict=True, context={"today": today})
    except ValidationError as error:
        message = validation_message(error, where=stack_key, rules=RULES, shown=as_typed)
        raise ConfigError(f"stack {stack!r}: {message}") from None


def stack_key(location: tuple) -> str:
    """A pydantic location as the key the stack file spells: ``gpuyard:teams[0].priority_class``."""
    if not location:
        return ""
    head = {"region": "aws:region", "stack": "stack name"}.get(location[0], f"{PROJECT}:{location[0]}")
    return head + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location[1:])


def stacks_dir() -> Path:
    """Where the stack files live: $GPUYARD_STACKS_DIR, else ``stacks/`` of this checkout."""
    env = os.environ.get(STACKS_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parent.parent / "stacks"


def stack_file(stack: str, directory: Path | None = None) -> Path:
    """``Pulumi.<stack>.yaml`` in ``directory`` (default: stacks_dir()); ConfigError unless ``stack`` is a valid name."""
    try:
        return (directory or stacks_dir()) / f"Pulumi.{check_stack_name(stack)}.yaml"
    except StackFileError as error:
        raise ConfigError(str(error)) from None


def available_stacks(directory: Path | None = None) -> list[str]:
    """The stacks of ``directory`` (default: stacks_dir()): every regular file ``Pulumi.<valid name>.yaml``;
    anything else there (editor backups, folders, other names) is ignored."""
    folder = directory or stacks_dir()
    try:
        names = [entry.name for entry in folder.iterdir()]
    except OSError:
        return []
    stacks = [name[len("Pulumi."):-len(".yaml")] for name in names
              if name.startswith("Pulumi.") and name.endswith(".yaml")]
    return sorted(name for name in stacks if STACK_NAME.fullmatch(name) and (folder / f"Pulumi.{name}.yaml").is_file())


def load_stack(stack: str, directory: Path | None = None) -> StackConfig:
    """Read and validate ``Pulumi.<stack>.yaml``; a ConfigError names what is wrong."""
    path = stack_file(stack, directory)
    if not path.is_file():
        known = ", ".join(available_stacks(path.parent)) or "none"
        what = "is not a regular file" if path.exists() or path.is_symlink() else "does not exist"
        raise ConfigError(f"unknown stack {stack!r}: {path} {what} (stacks: {known})")
    try:
        return parse_stack(stack, read_config(path))
    except StackFileError as error:
        raise ConfigError(str(error)) from None
