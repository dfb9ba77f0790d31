"""Where a job runs on a stack, and whether it ever can: checked before anything is rendered.

The stack's pools are its Karpenter NodePools (``gpuyard.infra.karpenter.node_pools``) and its managed GPU node
groups (``gpuyard:cluster.gpu_node_groups``). ``place(config, spec)`` checks the job against them — the pool
exists for that capacity type, an instance type of the pool has the GPUs, EFA interfaces, CPUs and memory
per node, the gang fits the pool's limit and the team's Volcano queue's capability — and
returns the spec pinned to one instance family (NodePools) so the gang never mixes GPU generations; a job
that breaks a limit raises SpecError naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuyard.infra.config import StackConfig, Team
from gpuyard.infra.conventions import (
    GPU_RESOURCE,
    LABEL_CAPACITY_TYPE,
    LABEL_EFA_PRESENT,
    LABEL_INSTANCE_TYPE,
    NODEPOOL_GPU_EFA,
    NODEPOOL_GPU_SPOT,
)
from gpuyard.infra.instance_types import GPU_INSTANCE_TYPES, InstanceType, types_of_families
from gpuyard.infra.karpenter import node_pools
from gpuyard.jobs.spec import HELPER_CPU, HELPER_MEMORY_GIB, JobSpec, SpecError

KNOWN_FAMILIES = tuple(sorted({t.family for t in GPU_INSTANCE_TYPES.values()}))

# Pods besides the training nodes in a gang: the MPI launcher, the Ray head (CPU pods of a fixed size).
HELPER_PODS = {"mpijob": 1, "volcanojob": 1, "rayjob": 1}


@dataclass(frozen=True)
class Pool:
    """A place GPU jobs run: its capacity types, instance types, GPU limit (and the setting behind it), EFA."""

    name: str
    node_group: bool
    capacity_types: tuple[str, ...]
    instance_types: tuple[InstanceType, ...]
    gpu_limit: int
    limit_setting: str
    efa: bool


def _requirement(spec: dict, key: str) -> list[str]:
    return next(r["values"] for r in spec["template"]["spec"]["requirements"] if r["key"] == key)


def stack_pools(config: StackConfig) -> dict[str, Pool]:
    """The stack's GPU pools by name: Karpenter NodePools, then managed GPU node groups."""
    pools = {}
    for name, spec in node_pools(config.karpenter).items():
        if GPU_RESOURCE not in spec["limits"]:
            continue
        explicit = [r for r in spec["template"]["spec"]["requirements"] if r["key"] == LABEL_INSTANCE_TYPE]
        types = ([GPU_INSTANCE_TYPES[t] for t in explicit[0]["values"]] if explicit
                 else types_of_families(config.karpenter.gpu_families))
        pools[name] = Pool(
            name, False, tuple(_requirement(spec, LABEL_CAPACITY_TYPE)), tuple(types),
            int(spec["limits"][GPU_RESOURCE]), "gpuyard:karpenter.gpu_limit",
            LABEL_EFA_PRESENT in spec["template"]["metadata"]["labels"],
        )
    for group in config.cluster.gpu_node_groups:
        types = tuple(GPU_INSTANCE_TYPES[t] for t in group.instance_types if t in GPU_INSTANCE_TYPES)
        pools[group.name] = Pool(
            group.name, True, ("on-demand",), types, group.max_size * min((t.gpus for t in types), default=0),
            f"gpuyard:cluster.gpu_node_groups[{group.name}].max_size", group.efa,
        )
    return pools


def _pool(config: StackConfig, spec: JobSpec, pools: dict[str, Pool]) -> Pool:
    pool = pools.get(spec.node_pool)
    if pool is None:
        known = ", ".join(sorted(pools)) or "none"
        if spec.node_pool == NODEPOOL_GPU_SPOT:
            raise SpecError(f"--capacity-type spot: stack {config.stack!r} has no spot GPU NodePool "
                            f"(gpuyard:karpenter.spot is off; pools: {known})")
        if spec.node_pool == NODEPOOL_GPU_EFA:
            efa = ", ".join(sorted(p.name for p in pools.values() if p.efa)) or "none"
            raise SpecError(f"--efa {spec.efa_devices}: stack {config.stack!r} has no EFA NodePool "
                            f"(no EFA instance type in gpuyard:karpenter.gpu_families; EFA pools: {efa})")
        raise SpecError(f"--node-pool {spec.node_pool}: stack {config.stack!r} has no GPU pool of that name (pools: {known})")
    if spec.capacity_type not in pool.capacity_types:
        offering = [p.name for p in pools.values() if spec.capacity_type in p.capacity_types]
        raise SpecError(
            f"--capacity-type {spec.capacity_type}: pool {pool.name} launches {', '.join(pool.capacity_types)} only "
            f"(pools with {spec.capacity_type}: {', '.join(offering) or 'none'})"
        )
    return pool


def fitting_types(pool: Pool, spec: JobSpec) -> list[InstanceType]:
    """The pool's instance types one training node fits on, smallest first; SpecError names what none has."""
    if spec.efa_devices and not pool.efa:
        raise SpecError(f"--efa {spec.efa_devices}: pool {pool.name} has no EFA interfaces")
    checks = (
        ("--gpus-per-node", spec.gpus_per_node, "GPUs", lambda t: t.gpus),
        ("--efa", spec.efa_devices, "EFA interfaces", lambda t: t.efa),
        ("--cpu", spec.cpu, "vCPUs", lambda t: t.vcpus),
        ("--memory-gib", spec.memory_gib, "GiB of memory", lambda t: t.memory_gib),
    )
    types = list(pool.instance_types)
    if not types:
        raise SpecError(f"pool {pool.name}: gpuyard knows the GPUs, CPUs and memory of none of its instance types, so "
                        f"no job can be sized for it (known families: {', '.join(KNOWN_FAMILIES)})")
    for flag, wanted, what, amount in checks:
        fits = [t for t in types if amount(t) >= wanted]
        if not fits:
            most = max(types, key=amount)
            raise SpecError(
                f"{flag} {wanted:g}: no instance type of pool {pool.name} has that many {what} per node "
                f"(at most {amount(most)}: {most.name})"
            )
        types = fits
    return types


def gang_totals(spec: JobSpec) -> dict[str, float]:
    """GPUs, CPUs and GiB of memory the whole gang requests at its largest size."""
    helpers = HELPER_PODS.get(spec.kind, 0)
    return {
        "gpus": spec.nodes * spec.gpus_per_node,
        "cpu": spec.nodes * spec.cpu + helpers * float(HELPER_CPU),
        "memory_gib": spec.nodes * spec.memory_gib + helpers * HELPER_MEMORY_GIB,
    }


def limit_breaches(pool: Pool | None, team: Team, spec: JobSpec) -> list[str]:
    """Every limit the gang breaks: the pool's GPU limit (GPU jobs) and the team's queue capability (its compute
    limit, infra/tenancy.py)."""
    totals = gang_totals(spec)
    breaches = []
    if pool is not None and totals["gpus"] > pool.gpu_limit:
        breaches.append(f"pool {pool.name} holds at most {pool.gpu_limit} GPUs ({pool.limit_setting})")
    quota = {"gpus": (team.gpu_quota, "GPUs"), "cpu": (team.cpu_quota, "CPUs"),
             "memory_gib": (team.memory_quota_gib, "GiB of memory")}
    for key, (limit, what) in quota.items():
        if totals[key] > limit:
            breaches.append(
                f"team {team.name}'s queue {team.queue} allows {limit} {what} (gang: {totals[key]:g})"
            )
    return breaches


def place(config: StackConfig, spec: JobSpec, pools: dict[str, Pool] | None = None) -> JobSpec:
    """``spec`` checked against ``config`` (whose ``stack_pools`` may be passed in when placing many) and
    pinned to its pool's kind and one instance family."""
    team = config.team(spec.team)
    pool = _pool(config, spec, stack_pools(config) if pools is None else pools) if spec.gpus_per_node else None
    types = fitting_types(pool, spec) if pool else []
    breaches = limit_breaches(pool, team, spec)
    if breaches:
        nodes = f"{spec.min_nodes}:{spec.nodes}" if spec.elastic else str(spec.nodes)
        totals = gang_totals(spec)
        sizes, gang = ((f"--gpus-per-node {spec.gpus_per_node}", f"{totals['gpus']} GPUs") if pool else
                       (f"--cpu {spec.cpu:g} --memory-gib {spec.memory_gib}", f"{totals['cpu']:g} CPUs"))
        raise SpecError(f"--nodes {nodes} {sizes}: the gang of {gang} never fits: {'; '.join(breaches)}")
    if pool is None:
        return spec
    family = None if pool.node_group else types[0].family
    return spec.model_copy(update={"node_group": pool.node_group, "instance_family": family})
