"""What a job will land on and cost, before anything is applied (``gpuyard render --explain``).

Pure: from the stack file and the job's spec only. The pool and its checks are ``gpuyard.jobs.placement``'s; the instance
type is the smallest of the pool (of the pinned family, on a NodePool) that one training node fits, which is what
Karpenter launches for one pod per node (it may pack several of a gang's pods onto a larger size of the family);
prices are the on-demand table of ``gpuyard.infra.prices``. A spot price is only known on a cluster (Karpenter's estimate):
offline the on-demand price is its ceiling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpuyard.infra.config import StackConfig
from gpuyard.infra.prices import on_demand_price
from gpuyard.jobs.placement import Pool, fitting_types, place, stack_pools
from gpuyard.jobs.spec import JobSpec


@dataclass(frozen=True)
class Landing:
    """Where a gang's training nodes land and what they cost per hour."""

    team: str
    queue: str
    kind: str
    name: str
    pool: str
    pool_kind: str  # "NodePool" or "managed node group"
    capacity_type: str
    instance_type: str
    nodes: int
    gpus: int
    usd_per_node_hour: float | None
    usd_per_hour: float | None
    price_note: str
    efa_interfaces: int  # per node, 0 without EFA
    placement_group: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _price_note(capacity_type: str, price: float | None, instance_type: str) -> str:
    if price is None:
        return f"no on-demand price known for {instance_type} (infra/prices.py)"
    if capacity_type == "spot":
        return "spot: at most the on-demand price; Karpenter's spot estimate is on the cluster"
    return "on-demand list price (Karpenter's AWS provider table, us-east-1)"


def landing(config: StackConfig, spec: JobSpec, pools: dict[str, Pool] | None = None) -> Landing:
    """The pool, instance type, $/hour, EFA and placement group of ``spec``'s training nodes; SpecError if the stack
    can never run it (``gpuyard.jobs.placement.place``)."""
    pools = stack_pools(config) if pools is None else pools
    placed = place(config, spec, pools)
    team = config.team(spec.team)
    pool = pools[placed.node_pool]
    types = [t for t in fitting_types(pool, placed)
             if placed.instance_family is None or t.family == placed.instance_family]
    chosen = types[0]
    price = on_demand_price(chosen.name)
    efa = placed.efa_devices if pool.efa and placed.efa_devices else 0
    return Landing(
        team=team.name, queue=team.queue, kind=placed.kind, name=placed.name, pool=pool.name,
        pool_kind="managed node group" if pool.node_group else "NodePool", capacity_type=placed.capacity_type,
        instance_type=chosen.name, nodes=placed.nodes, gpus=placed.nodes * placed.gpus_per_node,
        usd_per_node_hour=price, usd_per_hour=None if price is None else round(price * placed.nodes, 4),
        price_note=_price_note(placed.capacity_type, price, chosen.name), efa_interfaces=efa,
        # the stack puts managed EFA node groups in a cluster placement group (infra/cluster.py) and the EFA
        # NodePool's EC2NodeClass selects one (infra/karpenter.py placementGroupSelector)
        placement_group=pool.efa,
    )


def describe(land: Landing) -> list[str]:
    """The landing as lines for a person."""
    price = "unknown" if land.usd_per_hour is None else (
        f"${land.usd_per_hour:,.2f}/hour ({land.nodes} x ${land.usd_per_node_hour:,.4f})")
    return [
        f"{land.kind} {land.name}: team {land.team}, queue {land.queue}",
        f"  lands on: {land.pool_kind} {land.pool}, {land.capacity_type}, {land.nodes} x {land.instance_type} "
        f"({land.gpus} GPUs)",
        f"  costs: {price}; {land.price_note}",
        f"  EFA: {f'{land.efa_interfaces} interfaces per node' if land.efa_interfaces else 'no'}; "
        f"placement group: {'yes (cluster strategy, one AZ)' if land.placement_group else 'no'}",
    ]
