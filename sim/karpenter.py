"""Karpenter in the simulated cluster: the stack's pinned version (infra/charts.py KARPENTER 1.14.1) with its kwok
cloud provider (kubernetes-sigs/karpenter v1.14.1, kwok/), which launches kwok Nodes instead of EC2 instances.

It is offered exactly the instance types the plan's NodePools allow (their ``karpenter.k8s.aws/instance-family``
and ``karpenter.sh/capacity-type`` requirements), shaped like sim/nodes.py SHAPES, in the stack's zones. The
NodePools are the plan's, applied unchanged but for ``spec.template.spec.nodeClassRef``, which names the simulated
provider's KWOKNodeClass instead of the EC2NodeClass (there is no EC2 here).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

from gpuyard.infra.conventions import LABEL_CAPACITY_TYPE
from gpuyard.infra.karpenter import NAMESPACE
from gpuyard.sim.addons import Context, wait_crds
from gpuyard.sim.nodes import SHAPES, Shape, family_of, resources
from gpuyard.sim.processes import free_port
from gpuyard.sim.upstream import documents, documents_in, module_dir

KARPENTER_MODULE = "sigs.k8s.io/karpenter"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
FAMILY_LABEL = "karpenter.k8s.aws/instance-family"
# kubernetes-sigs/karpenter v1.14.1 kwok/apis/v1alpha1/kwoknodeclass.go: group karpenter.kwok.sh, cluster-scoped;
# the CRD defaults its status to Ready, which the provider requires before it launches (kwok/cloudprovider).
NODE_CLASS = {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": "gpuyard-sim"}}
NODE_CLASS_REF = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NODE_CLASS["metadata"]["name"]}
# aws/karpenter-provider-aws v1.14.1, pkg/providers/instancetype/types.go: (family letters)(generation).
_FAMILY = re.compile(r"^([a-z]+)(\d+)")


def nodepools(resources: Iterable[Any]) -> list[dict[str, Any]]:
    """The NodePool manifests of a plan (``gpuyard.infra.plan.plan(stack).resources``)."""
    return [r.inputs for r in resources if r.type == NODEPOOL]


def simulated_nodepool(manifest: dict[str, Any], consolidate_after: str | None = None) -> dict[str, Any]:
    """The plan's NodePool with its node class reference pointing at the KWOKNodeClass; ``consolidate_after``
    (tests only, so a pool's return to zero is seen in seconds rather than the stack's minutes) replaces
    ``spec.disruption.consolidateAfter``."""
    spec = manifest["spec"]
    template_spec = {**spec["template"]["spec"], "nodeClassRef": dict(NODE_CLASS_REF)}
    simulated = {**spec, "template": {**spec["template"], "spec": template_spec}}
    if consolidate_after:
        simulated["disruption"] = {**spec["disruption"], "consolidateAfter": consolidate_after}
    return {**manifest, "spec": simulated}


def _requirement(manifest: dict[str, Any], key: str) -> list[str]:
    requirements = manifest["spec"]["template"]["spec"].get("requirements", [])
    return next((r.get("values", []) for r in requirements if r["key"] == key and r["operator"] == "In"), [])


def aws_labels(name: str, shape: Shape) -> dict[str, str]:
    """The instance labels Karpenter's AWS provider derives from DescribeInstanceTypes (aws/karpenter-provider-aws
    v1.14.1, pkg/providers/instancetype/types.go computeRequirements; keys in pkg/apis/v1/labels.go)."""
    family, size = name.split(".", 1)
    letters, generation = _FAMILY.match(family).groups()
    labels = {
        "karpenter.k8s.aws/instance-category": letters, "karpenter.k8s.aws/instance-generation": generation,
        FAMILY_LABEL: family, "karpenter.k8s.aws/instance-size": size,
        "karpenter.k8s.aws/instance-cpu": str(shape.cpu),
        "karpenter.k8s.aws/instance-memory": str(shape.memory_gib * 1024),  # MiB
        "karpenter.k8s.aws/instance-hypervisor": "nitro",
    }
    if shape.gpus:
        manufacturer, gpu = shape.gpu_model.split("-")[:2]  # lowerKabobCase of EC2's GpuInfo name / manufacturer
        labels |= {"karpenter.k8s.aws/instance-gpu-name": gpu.lower(),
                   "karpenter.k8s.aws/instance-gpu-manufacturer": manufacturer.lower(),
                   "karpenter.k8s.aws/instance-gpu-count": str(shape.gpus)}
    return labels


def offered(pools: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Instance type -> capacity types: every size in SHAPES of the families some NodePool allows, with that
    pool's capacity types. A NodePool with a family no shape exists for is an error, not a silently smaller pool."""
    types: dict[str, set[str]] = {}
    for pool in pools:
        capacity_types = set(_requirement(pool, LABEL_CAPACITY_TYPE)) or {"on-demand"}
        for family in _requirement(pool, FAMILY_LABEL):
            names = [name for name in SHAPES if family_of(name) == family]
            if not names:
                raise ValueError(f"NodePool {pool['metadata']['name']}: no simulated shape for instance family "
                                 f"{family!r} (sim/nodes.py SHAPES)")
            for name in names:
                types.setdefault(name, set()).update(capacity_types)
    return types


def instance_types(pools: list[dict[str, Any]], region: str, zones: list[str]) -> list[dict[str, Any]]:
    """The kwok provider's instance types file (``INSTANCE_TYPES_FILE_PATH``; kubernetes-sigs/karpenter v1.14.1,
    kwok/cloudprovider/helpers.go InstanceTypeOptions). An offering's single-valued requirements become labels of
    the nodes launched from it and well-known labels NodePools may select on (newInstanceType, addInstanceLabels),
    so the AWS labels ride on the offerings. Spot is priced like on-demand, as the AWS provider does until it has
    read the spot price history (pkg/providers/pricing/pricing.go populateInitialSpotPricing)."""
    listed = []
    for name, capacity_types in sorted(offered(pools).items()):
        shape = SHAPES[name]
        capacity, _ = resources(shape)
        labels = {**aws_labels(name, shape), "topology.kubernetes.io/region": region}
        listed.append({
            "name": name, "architecture": "amd64", "operatingSystems": ["linux"],
            "resources": {key: value for key, value in capacity.items() if not key.startswith("hugepages")},
            "offerings": [
                {"Price": shape.price, "Available": True, "Requirements": [
                    {"key": key, "operator": "In", "values": [value]}
                    for key, value in {LABEL_CAPACITY_TYPE: capacity_type, "topology.kubernetes.io/zone": zone,
                                       **labels}.items()
                ]}
                for capacity_type in sorted(capacity_types) for zone in zones
            ],
        })
    return listed


def crds() -> list[dict[str, Any]]:
    """NodePool, NodeClaim, NodeOverlay, CapacityBuffer (the kwok chart's crds/) and KWOKNodeClass."""
    root = module_dir("karpenter", KARPENTER_MODULE) / "kwok"
    return [*documents_in(root / "charts" / "crds"),
            *documents(root / "apis" / "crds" / "karpenter.kwok.sh_kwoknodeclasses.yaml")]


def environment(context: Context, instance_types_file: Path) -> dict[str, str]:
    """The controller's settings (kubernetes-sigs/karpenter v1.14.1, pkg/operator/options/options.go and
    kwok/options/options.go read them from these variables; kwok/charts/templates/deployment.yaml sets them)."""
    return {
        "KUBECONFIG": str(context.kubeconfig), "SYSTEM_NAMESPACE": NAMESPACE,
        "DISABLE_LEADER_ELECTION": "true",  # one replica here (the stack's chart runs two with a lease)
        # on 127.0.0.1: the build patches pkg/operator/operator.go's ":<port>" (sim/versions.py)
        "METRICS_PORT": str(free_port()), "HEALTH_PROBE_PORT": str(free_port()),
        "INSTANCE_TYPES_FILE_PATH": str(instance_types_file), "LOG_LEVEL": "debug",
    }


def start_karpenter(context: Context, resources: list[Any], region: str, zones: list[str],
                    consolidate_after: str | None = None) -> None:
    """Karpenter's CRDs, the KWOKNodeClass and the plan's NodePools, then the controller with its instance types."""
    pools = nodepools(resources)
    folder = context.folder("karpenter")
    types_file = folder / "instance-types.json"
    types_file.write_text(json.dumps(instance_types(pools, region, zones), indent=1) + "\n")
    definitions = crds()
    context.kubectl.apply(definitions)
    wait_crds(context.kubectl, definitions)
    context.kubectl.apply([NODE_CLASS, *(simulated_nodepool(p, consolidate_after) for p in pools)])
    context.supervisor.start("karpenter", [context.binary("karpenter", "karpenter")],
                             env=environment(context, types_file))

