"""Where the pinned charts place their DaemonSets, read from the charts' sources, and a node-admission check.

``pod_placement(chart, values)`` gives the nodeSelector, affinity and tolerations a chart's DaemonSet pod gets
from our values at the version ``infra/charts.py`` pins; ``admits(placement, labels, taints)`` decides, as the
Kubernetes scheduler and the DaemonSet controller do, whether such a pod may run on a node with those labels
and taints.
"""

from __future__ import annotations

import copy

from gpuyard.infra.charts import DCGM_EXPORTER, EFA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN

# NVIDIA/k8s-device-plugin v0.17.4, deployments/helm/nvidia-device-plugin/values.yaml: nodeSelector {}, this
# default affinity (NFD's PCI vendor label, Tegra's CPU vendor label, or the label anyone can set), and these
# tolerations. values' nodeSelector adds to the affinity; values' tolerations replace the list.
NVIDIA_DEVICE_PLUGIN_DEFAULTS = {
    "nodeSelector": {},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}]},
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/cpu-model.vendor_id", "operator": "In", "values": ["NVIDIA"]}]},
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
    ]}}},
    "tolerations": [
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ],
}

# NVIDIA/dcgm-exporter 4.6.0, deployment/values.yaml: nodeSelector {}, tolerations [], affinity {}: without
# values the exporter would run on every node and never on a tainted GPU node.
DCGM_EXPORTER_DEFAULTS = {"nodeSelector": {}, "affinity": {}, "tolerations": []}

# aws/eks-charts, stable/aws-efa-k8s-device-plugin chart v0.5.8 (repository tag v0.0.194, commit 8b25c60),
# templates/daemonset.yaml: tolerations are CriticalAddonsOnly plus values' tolerations; the affinity requires
# ``node.kubernetes.io/instance-type`` in values.yaml's supportedInstanceLabels (the EC2 EFA-capable types, the GPU
# entries below) and ``eks.amazonaws.com/compute-type`` not ``auto``; values' nodeSelector adds to it.
EFA_SUPPORTED_GPU_INSTANCE_TYPES = (
    "g4dn.8xlarge", "g4dn.12xlarge", "g4dn.16xlarge", "g4dn.metal",
    "g5.8xlarge", "g5.12xlarge", "g5.16xlarge", "g5.24xlarge", "g5.48xlarge",
    "g6.8xlarge", "g6.12xlarge", "g6.16xlarge", "g6.24xlarge", "g6.48xlarge",
    "g6e.8xlarge", "g6e.12xlarge", "g6e.16xlarge", "g6e.24xlarge", "g6e.48xlarge", "gr6.8xlarge",
    "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
)
EFA_DEVICE_PLUGIN_DEFAULTS = {
    "nodeSelector": {},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(EFA_SUPPORTED_GPU_INSTANCE_TYPES)},
            {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["auto"]},
        ]},
    ]}}},
    "tolerations": [],
}
EFA_TEMPLATE_TOLERATIONS = [{"key": "CriticalAddonsOnly", "operator": "Exists"}]

CHART_DEFAULTS = {
    NVIDIA_DEVICE_PLUGIN.name: NVIDIA_DEVICE_PLUGIN_DEFAULTS,
    DCGM_EXPORTER.name: DCGM_EXPORTER_DEFAULTS,
    EFA_DEVICE_PLUGIN.name: EFA_DEVICE_PLUGIN_DEFAULTS,
}


def _merge(default, override):
    """Helm's values coalescing: maps merge key by key, anything else (lists included) is replaced."""
    if isinstance(default, dict) and isinstance(override, dict):
        merged = copy.deepcopy(default)
        for key, value in override.items():
            merged[key] = _merge(merged.get(key), value) if key in merged else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def pod_placement(chart: str, values: dict) -> dict:
    """nodeSelector, affinity and tolerations of the chart's DaemonSet pod with ``values``."""
    defaults = CHART_DEFAULTS[chart]
    placement = {key: _merge(defaults[key], values[key]) if key in values else copy.deepcopy(defaults[key])
                 for key in ("nodeSelector", "affinity", "tolerations")}
    if chart == EFA_DEVICE_PLUGIN.name:
        placement["tolerations"] = EFA_TEMPLATE_TOLERATIONS + placement["tolerations"]
    return placement


def _expression_holds(expression: dict, labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise ValueError(f"operator {operator} not modelled")


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint["effect"]):
            continue
        if toleration.get("operator") == "Exists" and toleration.get("key") in (None, "", taint["key"]):
            return True
        if toleration.get("key") == taint["key"] and toleration.get("value") == taint.get("value"):
            return True
    return False


def admits(placement: dict, labels: dict[str, str], taints: list[dict]) -> bool:
    """Whether a pod with ``placement`` can be scheduled on a node with ``labels`` and ``taints``."""
    if any(labels.get(key) != value for key, value in placement["nodeSelector"].items()):
        return False
    required = placement["affinity"].get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required and not any(
        all(_expression_holds(e, labels) for e in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    ):
        return False
    blocking = [t for t in taints if t["effect"] in ("NoSchedule", "NoExecute")]
    return all(_tolerated(taint, placement["tolerations"]) for taint in blocking)
