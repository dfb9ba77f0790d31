"""The GPU instance types gpuyard schedules on: GPUs, vCPUs, memory and EFA interfaces per node.

Figures from the AWS EC2 accelerated-computing specifications (docs.aws.amazon.com/ec2/latest/instancetypes/
ac.html: accelerators, vCPUs, memory, network cards), which Karpenter v1.14 advertises as ``nvidia.com/gpu`` and
``vpc.amazonaws.com/efa`` (aws/karpenter-provider-aws, website/content/en/v1.14/reference/instance-types.md).
``efa`` is the number of network cards: one EFA interface per card gives the instance its full fabric
(terraform-aws-modules/terraform-aws-eks, modules/eks-managed-node-group/main.tf, ``network_interfaces``):
p4d/p4de 4 and p5/p5e 32 (../shared/UPSTREAM-FACTS.md), p5en 16 (AWS's p5en launch examples attach
NetworkCardIndex 0-15). 0 means gpuyard does not run EFA on that type (g-family EFA is left out until its card
counts are checked). The renderers check jobs against it; the stack builds launch templates and the EFA NodePool
from it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    vcpus: int
    memory_gib: int
    efa: int = 0

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


def _sizes(family: str, memory_per_vcpu: int) -> list[InstanceType]:
    """The g5/g6/g6e sizes: 1 GPU up to 16xlarge, 4 GPUs at 12xlarge and 24xlarge, 8 at 48xlarge."""
    sizes = {"xlarge": (1, 4), "2xlarge": (1, 8), "4xlarge": (1, 16), "8xlarge": (1, 32), "16xlarge": (1, 64),
             "12xlarge": (4, 48), "24xlarge": (4, 96), "48xlarge": (8, 192)}
    return [InstanceType(f"{family}.{size}", gpus, vcpus, vcpus * memory_per_vcpu) for size, (gpus, vcpus) in sizes.items()]


GPU_INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in [
        *_sizes("g5", 4),
        *_sizes("g6", 4),
        *_sizes("g6e", 8),
        InstanceType("p3dn.24xlarge", 8, 96, 768, efa=1),
        InstanceType("p4d.24xlarge", 8, 96, 1152, efa=4),
        InstanceType("p4de.24xlarge", 8, 96, 1152, efa=4),
        InstanceType("p5.48xlarge", 8, 192, 2048, efa=32),
        InstanceType("p5e.48xlarge", 8, 192, 2048, efa=32),
        InstanceType("p5en.48xlarge", 8, 192, 2048, efa=16),
    ]
}


def instance_type(name: str) -> InstanceType:
    """The known GPU instance type ``name``; a ValueError lists the known ones."""
    try:
        return GPU_INSTANCE_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown GPU instance type {name!r} (known: {', '.join(sorted(GPU_INSTANCE_TYPES))})") from None


_SMALLEST_FIRST = sorted(GPU_INSTANCE_TYPES.values(), key=lambda t: (t.gpus, t.vcpus, t.name))


def types_of_families(families: tuple[str, ...]) -> list[InstanceType]:
    """The known instance types of ``families``, smallest first."""
    return [t for t in _SMALLEST_FIRST if t.family in families]


def efa_types(families: tuple[str, ...]) -> list[InstanceType]:
    """The instance types of ``families`` gpuyard runs EFA on."""
    return [t for t in types_of_families(families) if t.efa]
