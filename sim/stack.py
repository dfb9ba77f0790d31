"""The stack's Kubernetes layer as the offline plan (``gpuyard.infra.plan``) registers it: every object the Pulumi program
creates directly, for server-side apply. Helm releases, the kustomize directory and the upstream manifest are stood
in for by the components `gpuyard sim` builds and runs (sim/addons.py); Karpenter's NodePools and EC2NodeClass by
the simulated nodes (sim/nodes.py; Karpenter itself is part 2); the PodMonitor needs Prometheus Operator's CRD,
which the simulation does not install."""

from __future__ import annotations

from typing import Any

from gpuyard.infra.plan import PlannedResource

# Pulumi resource types that install upstream software rather than declare an object.
INSTALLERS = ("kubernetes:helm.sh/v3:Release", "kubernetes:kustomize/v2:Directory", "kubernetes:yaml/v2:ConfigFile")
NOT_SIMULATED = {
    "karpenter.sh/v1": "Karpenter (part 2): its NodePools become simulated nodes",
    "karpenter.k8s.aws/v1": "Karpenter (part 2): its EC2NodeClass has no simulated counterpart",
    "monitoring.coreos.com/v1": "Prometheus Operator is not simulated",
}


def kubernetes_objects(resources: list[PlannedResource]) -> list[dict[str, Any]]:
    """The manifests of every Kubernetes object the plan declares, in plan order."""
    return [
        resource.inputs for resource in resources
        if resource.type.startswith("kubernetes:") and resource.type not in INSTALLERS
    ]


def simulated(manifest: dict[str, Any]) -> bool:
    return manifest["apiVersion"] not in NOT_SIMULATED


def release_namespaces(resources: list[PlannedResource], objects: list[dict[str, Any]]) -> list[str]:
    """Namespaces that Helm releases create (``create_namespace``) and the stack's objects live in."""
    declared = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    released = {r.inputs.get("namespace") for r in resources if r.type == "kubernetes:helm.sh/v3:Release"}
    used = {o["metadata"].get("namespace") for o in objects}
    return sorted(n for n in (released | used) - declared if n)
