"""Simulated nodes shaped like the stack's: one kwok Node per machine the stack's pools could hold.

Managed node groups contribute ``max_size`` nodes (cycling through their instance types), Karpenter NodePools as
many nodes of their families' shapes as their ``limits`` allow. Labels and taints are the ones the stack puts on
real nodes (the group's / NodePool template's) plus the well-known ones EKS and Karpenter set.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterator

from gpuyard.infra.conventions import EFA_RESOURCE, GPU_RESOURCE, LABEL_CAPACITY_TYPE, LABEL_NODEPOOL


@dataclass(frozen=True)
class Shape:
    """An EC2 instance type as the kubelet reports it: vCPUs, memory, GPUs and EFA interfaces, and EKS's max pods."""

    cpu: int
    memory_gib: int
    gpus: int = 0
    gpu_model: str = ""
    efa: int = 0
    max_pods: int = 110
    price: float = 0.0  # on-demand USD per hour; Karpenter's simulated provider offers it (sim/karpenter.py)


# vCPU / memory / accelerators from the EC2 instance type pages (aws.amazon.com/ec2/instance-types); max pods from
# the EKS AMI's eni-max-pods.txt (awslabs/amazon-eks-ami, templates/shared/runtime/eni-max-pods.txt), capped at 250
# as EKS recommends for large instances. One size per family Karpenter may pick: the smallest with a GPU.
# On-demand prices (USD/hour) from Karpenter's AWS provider (aws/karpenter-provider-aws v1.14.1,
# pkg/providers/pricing/zz_generated.pricing_aws.go: the us-east-1 table it starts from).
SHAPES: dict[str, Shape] = {
    "m6i.large": Shape(2, 8, max_pods=29, price=0.096),
    "m6i.xlarge": Shape(4, 16, max_pods=58, price=0.192),
    "m6i.2xlarge": Shape(8, 32, max_pods=58, price=0.384),  # prod's system group
    "t3.large": Shape(2, 8, max_pods=35, price=0.0832),  # ephemeral's system group
    "c7i.2xlarge": Shape(8, 16, max_pods=58, price=0.357),
    "m7i.2xlarge": Shape(8, 32, max_pods=58, price=0.4032),
    "r7i.2xlarge": Shape(8, 64, max_pods=58, price=0.5292),
    "g5.xlarge": Shape(4, 16, 1, "NVIDIA-A10G", max_pods=58, price=1.006),
    "g6.xlarge": Shape(4, 16, 1, "NVIDIA-L4", max_pods=58, price=0.8048),
    "g6e.xlarge": Shape(4, 32, 1, "NVIDIA-L40S", max_pods=58, price=1.861),
    "p4d.24xlarge": Shape(96, 1152, 8, "NVIDIA-A100-SXM4-40GB", efa=4, max_pods=250, price=21.957642),
    "p5.48xlarge": Shape(192, 2048, 8, "NVIDIA-H100-80GB-HBM3", efa=32, max_pods=250, price=55.04),
    # The other sizes of the dev stack's NodePool families, which Karpenter chooses from (static nodes keep the
    # first size of each family above). g5 and g6 have the same layout; one EFA interface from 8xlarge up.
    **{f"{family}.{size}": Shape(cpu, 4 * cpu, gpus, model, efa=int(cpu >= 32), max_pods=pods, price=price)
       for family, model, sizes in (
           ("g5", "NVIDIA-A10G", (1.212, 1.624, 2.448, 5.672, 4.096, 8.144, 16.288)),
           ("g6", "NVIDIA-L4", (0.9776, 1.3232, 2.0144, 4.6016, 3.3968, 6.6752, 13.3504)))
       for (size, cpu, gpus, pods), price in zip((
           ("2xlarge", 8, 1, 58), ("4xlarge", 16, 1, 234), ("8xlarge", 32, 1, 234), ("12xlarge", 48, 4, 250),
           ("16xlarge", 64, 1, 234), ("24xlarge", 96, 4, 250), ("48xlarge", 192, 8, 250)), sizes)},
    # c7i / m7i / r7i: 2 / 4 / 8 GiB per vCPU, priced in proportion to vCPUs (metal sizes left out).
    **{f"{family}.{size}": Shape(cpu, gib * cpu, max_pods=pods, price=round(per_vcpu * cpu, 6))
       for family, gib, per_vcpu in (("c7i", 2, 0.044625), ("m7i", 4, 0.0504), ("r7i", 8, 0.06615))
       for size, cpu, pods in (("large", 2, 29), ("xlarge", 4, 58), ("4xlarge", 16, 234), ("8xlarge", 32, 234),
                               ("12xlarge", 48, 250), ("16xlarge", 64, 250), ("24xlarge", 96, 250),
                               ("48xlarge", 192, 250))},
}


def family_of(instance_type: str) -> str:
    return instance_type.split(".")[0]


FAMILY_SHAPE = {family_of(name): name for name in reversed(SHAPES)}  # the first size listed for each family

NODE_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}  # the kwok controller manages nodes with this annotation


def reserved(shape: Shape) -> tuple[int, int]:
    """(millicores, MiB) the EKS AMI reserves for the kubelet and system plus the eviction threshold
    (awslabs/amazon-eks-ami bootstrap: CPU 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% above;
    memory 11 MiB per pod + 255 MiB, eviction 100 MiB)."""
    cores = shape.cpu
    millicores = 60 + (10 if cores > 1 else 0) + 5 * min(max(cores - 2, 0), 2) + (max(cores - 4, 0) * 25) // 10
    return millicores, 11 * shape.max_pods + 255 + 100


def resources(shape: Shape) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of a node of this shape."""
    capacity = {"cpu": str(shape.cpu), "memory": f"{shape.memory_gib}Gi", "pods": str(shape.max_pods),
                "ephemeral-storage": "100Gi", "hugepages-2Mi": "0", "hugepages-1Gi": "0"}
    if shape.gpus:
        capacity[GPU_RESOURCE] = str(shape.gpus)
    if shape.efa:
        capacity[EFA_RESOURCE] = str(shape.efa)
    millicores, mebibytes = reserved(shape)
    allocatable = {**capacity, "cpu": f"{shape.cpu * 1000 - millicores}m",
                   "memory": f"{shape.memory_gib * 1024 - mebibytes}Mi", "ephemeral-storage": "90Gi"}
    return capacity, allocatable


@dataclass(frozen=True)
class Pool:
    """Where nodes come from: a managed node group or a Karpenter NodePool, with the nodes' labels and taints."""

    name: str
    instance_types: tuple[str, ...]
    count: int
    labels: dict[str, str]
    taints: tuple[dict[str, str], ...]
    capacity_types: tuple[str, ...] = ()  # a NodePool's nodes take these in turn (karpenter.sh/capacity-type)


def _taint(taint: dict[str, Any]) -> dict[str, str]:
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    return {"key": taint["key"], "value": taint.get("value", ""), "effect": effects.get(taint["effect"], taint["effect"])}


def _shape_of(instance_type: str) -> Shape:
    try:
        return SHAPES[instance_type]
    except KeyError:
        raise ValueError(f"no simulated shape for instance type {instance_type!r} (sim/nodes.py SHAPES)") from None


def managed_group_pool(inputs: dict[str, Any], size: str = "maxSize") -> Pool:
    labels = {**inputs.get("labels", {}), "eks.amazonaws.com/nodegroup": inputs["nodeGroupName"],
              "eks.amazonaws.com/capacityType": "ON_DEMAND"}
    return Pool(inputs["nodeGroupName"], tuple(inputs["instanceTypes"]), inputs["scalingConfig"][size], labels,
                tuple(_taint(t) for t in inputs.get("taints", [])))


def _requirement(requirements: list[dict[str, Any]], key: str) -> list[str]:
    return next((r.get("values", []) for r in requirements if r["key"] == key and r["operator"] == "In"), [])


def nodepool_pool(manifest: dict[str, Any]) -> Pool:
    """A NodePool's nodes: its families' shapes in turn, until the next one would exceed one of its ``limits``."""
    spec = manifest["spec"]
    template = spec["template"]
    requirements = template["spec"].get("requirements", [])
    types = tuple(FAMILY_SHAPE[f] for f in _requirement(requirements, "karpenter.k8s.aws/instance-family") if f in FAMILY_SHAPE)
    if not types:
        raise ValueError(f"NodePool {manifest['metadata']['name']}: no simulated shape for its instance families")
    limits = {key: float(str(value).removesuffix("Gi")) for key, value in spec.get("limits", {}).items()}
    used = {key: 0.0 for key in limits}
    count = 0
    for instance_type in itertools.cycle(types):
        shape = SHAPES[instance_type]
        adds = {"cpu": shape.cpu, GPU_RESOURCE: shape.gpus, "memory": shape.memory_gib}
        if any(used[key] + adds.get(key, 0) > limit for key, limit in limits.items()) or count >= 64:
            break
        for key in used:
            used[key] += adds.get(key, 0)
        count += 1
    capacity_types = tuple(_requirement(requirements, LABEL_CAPACITY_TYPE) or ["on-demand"])
    labels = {**template.get("metadata", {}).get("labels", {}), LABEL_NODEPOOL: manifest["metadata"]["name"]}
    return Pool(manifest["metadata"]["name"], types, count, labels, tuple(template["spec"].get("taints", [])),
                capacity_types)


def pools(resources: list, karpenter: bool = False) -> list[Pool]:
    """The node pools of a plan (``gpuyard.infra.plan.plan(stack).resources``). With ``karpenter`` (sim/karpenter.py runs
    it), NodePools have no static nodes and managed groups their ``desiredSize`` (no autoscaler resizes them)."""
    found = []
    for resource in resources:
        if resource.type == "aws:eks/nodeGroup:NodeGroup":
            found.append(managed_group_pool(resource.inputs, "desiredSize" if karpenter else "maxSize"))
        elif resource.type == "kubernetes:karpenter.sh/v1:NodePool" and not karpenter:
            found.append(nodepool_pool(resource.inputs))
    return found


def node_manifests(pool_list: list[Pool], region: str, zones: list[str]) -> Iterator[dict[str, Any]]:
    """Node objects (with status) for every pool, spread over the zones."""
    for pool in pool_list:
        for index, instance_type in zip(range(pool.count), itertools.cycle(pool.instance_types)):
            shape = _shape_of(instance_type)
            name = f"{pool.name}-{instance_type.replace('.', '-')}-{index}"
            zone = zones[index % len(zones)]
            labels = {
                **pool.labels,
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": instance_type, "topology.kubernetes.io/region": region,
                "topology.kubernetes.io/zone": zone, "karpenter.k8s.aws/instance-family": instance_type.split(".")[0],
                "type": "kwok",
            }
            if pool.capacity_types:
                labels[LABEL_CAPACITY_TYPE] = pool.capacity_types[index % len(pool.capacity_types)]
            if shape.gpus:
                labels["nvidia.com/gpu.product"] = shape.gpu_model
                labels["nvidia.com/gpu.count"] = str(shape.gpus)
            if shape.efa:
                labels["vpc.amazonaws.com/efa.present"] = "true"
            capacity, allocatable = resources(shape)
            yield {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels, "annotations": dict(NODE_ANNOTATION)},
                "spec": {"taints": [dict(t) for t in pool.taints]} if pool.taints else {},
                "status": {"capacity": capacity, "allocatable": allocatable},
            }
