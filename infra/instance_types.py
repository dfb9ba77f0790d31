"""The GPU instance types gpuyard schedules on: GPUs, vCPUs, memory and EFA interfaces per node.

Figures from the AWS EC2 accelerated-computing specifications (docs.aws.amazon.com/ec2/latest/instancetypes/
ac.html: accelerators, vCPUs, memory, network cards), which Karpenter v1.14 advertises as ``nvidia.com/gpu`` and
``vpc.amazonaws.com/efa`` (aws/karpenter-provider-aws v1.14.1, website/content/en/docs/reference/instance-types.md).
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


# The sizes of every family gpuyard accepts in a node group, as EC2 offers them: the instance types of Karpenter's
# AWS provider's generated on-demand price table (aws/karpenter-provider-aws, pkg/providers/pricing/
# zz_generated.pricing_aws.go, us-east-1, generated 2026-01-19), plus p5e.48xlarge (offered in other regions).
_XL = ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge")
_G_SIZES = (*_XL, "48xlarge")
SIZES: dict[str, tuple[str, ...]] = {
    "c6i": ("large", *_XL, "32xlarge", "metal"),
    "c7i": ("large", *_XL, "48xlarge", "metal-24xl", "metal-48xl"),
    "m5": ("large", *_XL, "metal"),
    "m6a": ("large", *_XL, "32xlarge", "48xlarge", "metal"),
    "m6i": ("large", *_XL, "32xlarge", "metal"),
    "m7a": ("medium", "large", *_XL, "32xlarge", "48xlarge", "metal-48xl"),
    "m7i": ("large", *_XL, "48xlarge", "metal-24xl", "metal-48xl"),
    "r6i": ("large", *_XL, "32xlarge", "metal"),
    "r7i": ("large", *_XL, "48xlarge", "metal-24xl", "metal-48xl"),
    "t3": ("nano", "micro", "small", "medium", "large", "xlarge", "2xlarge"),
    "g4dn": ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "metal"),
    "g5": _G_SIZES,
    "g6": _G_SIZES,
    "g6e": _G_SIZES,
    "gr6": ("4xlarge", "8xlarge"),
    "p3": ("2xlarge", "8xlarge", "16xlarge"),
    "p3dn": ("24xlarge",),
    "p4d": ("24xlarge",),
    "p4de": ("24xlarge",),
    "p5": ("4xlarge", "48xlarge"),
    "p5e": ("48xlarge",),
    "p5en": ("48xlarge",),
    "p6-b200": ("48xlarge",),
}


def check_instance_type(name: str) -> None:
    """A ValueError unless ``name`` is a size EC2 offers in one of the families of SIZES."""
    family, _, size = name.partition(".")
    sizes = SIZES.get(family)
    if sizes is not None and size not in sizes:
        raise ValueError(f"instance type {name!r} does not exist: {family} comes in {', '.join(sizes)}")


_SMALLEST_FIRST = sorted(GPU_INSTANCE_TYPES.values(), key=lambda t: (t.gpus, t.vcpus, t.name))


def types_of_families(families: tuple[str, ...]) -> list[InstanceType]:
    """The known instance types of ``families``, smallest first."""
    return [t for t in _SMALLEST_FIRST if t.family in families]


def efa_types(families: tuple[str, ...]) -> list[InstanceType]:
    """The instance types of ``families`` gpuyard runs EFA on."""
    return [t for t in types_of_families(families) if t.efa]
