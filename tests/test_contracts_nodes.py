"""Contract: every node the stacks can bring up is served by the DaemonSets it needs (device plugins, GPU metrics).

Node shapes come from the real plans (managed node groups, Karpenter NodePools), with the labels EKS and
Karpenter add themselves; each DaemonSet's placement comes from its pinned chart's defaults (tests/
chart_constraints.py, cited) merged with the values the plan installs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuyard.infra.charts import DCGM_EXPORTER, EFA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN
from gpuyard.infra.conventions import GRACE_PERIOD_SECONDS, SPOT_NOTICE_SECONDS
from gpuyard.infra.instance_types import GPU_INSTANCE_TYPES, types_of_families
from chart_constraints import admits, pod_placement
from infra_plans import of_type, planned
from gpuyard.jobs.duration import parse_duration

STACKS = ("dev", "prod", "ephemeral")
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
RELEASE = "kubernetes:helm.sh/v3:Release"
GPU_AMI = "AL2023_x86_64_NVIDIA"
EKS_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


@dataclass(frozen=True)
class Node:
    """One kind of node a shape brings up: its labels (ours plus the platform's) and taints."""

    shape: str
    instance_type: str
    labels: dict
    taints: list
    gpu: bool
    efa: bool


def managed_nodes(resources) -> list[Node]:
    """Nodes of the managed node groups: EKS adds the node group and instance type labels."""
    templates = {r.name: r for r in of_type(resources, LAUNCH_TEMPLATE)}
    nodes = []
    for group in of_type(resources, NODE_GROUP):
        template = templates[group.name].inputs
        efa = any(i.get("interfaceType") == "efa" for i in template.get("networkInterfaces", []))
        taints = [{**t, "effect": EKS_EFFECTS[t["effect"]]} for t in group.inputs.get("taints") or []]
        for instance_type in group.inputs["instanceTypes"]:
            labels = {**group.inputs["labels"], "eks.amazonaws.com/nodegroup": group.inputs["nodeGroupName"],
                      "node.kubernetes.io/instance-type": instance_type}
            nodes.append(Node(f"node group {group.inputs['nodeGroupName']}", instance_type, labels, taints,
                              group.inputs["amiType"] == GPU_AMI, efa))
    return nodes


def _requirement(spec: dict, key: str) -> list[str] | None:
    values = [r["values"] for r in spec["requirements"] if r["key"] == key and r["operator"] == "In"]
    return values[0] if values else None


def pool_nodes(resources) -> list[Node]:
    """Nodes of the GPU NodePools, one per instance type Karpenter may pick; Karpenter adds the well-known labels.

    A pool is a GPU pool when it limits ``nvidia.com/gpu``; pods requesting ``vpc.amazonaws.com/efa`` (only EFA
    jobs, which select the pool labelled for EFA) get EFA interfaces on any EFA-capable type.
    """
    nodes = []
    for pool in of_type(resources, NODEPOOL):
        spec = pool.inputs["spec"]
        if "nvidia.com/gpu" not in spec["limits"]:
            continue
        name = pool.inputs["metadata"]["name"]
        template = spec["template"]
        types = _requirement(template["spec"], "node.kubernetes.io/instance-type")
        families = tuple(_requirement(template["spec"], "karpenter.k8s.aws/instance-family"))
        names = types or [t.name for t in types_of_families(families)]
        efa = "vpc.amazonaws.com/efa.present" in template["metadata"]["labels"]
        (capacity,) = _requirement(template["spec"], "karpenter.sh/capacity-type")  # one per GPU pool
        for instance_type in names:
            labels = {**template["metadata"]["labels"], "karpenter.sh/nodepool": name, "karpenter.sh/capacity-type": capacity,
                      "node.kubernetes.io/instance-type": instance_type,
                      "karpenter.k8s.aws/instance-family": instance_type.split(".")[0]}
            nodes.append(Node(f"NodePool {name}", instance_type, labels, template["spec"].get("taints", []), True, efa))
    return nodes


def releases(resources) -> dict[str, dict]:
    return {r.inputs["chart"]: r.inputs for r in of_type(resources, RELEASE)}


def gpu_nodes(stack: str) -> list[Node]:
    resources = planned(stack)
    return [n for n in managed_nodes(resources) + pool_nodes(resources) if n.gpu]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("chart", [NVIDIA_DEVICE_PLUGIN.name, DCGM_EXPORTER.name])
def test_every_gpu_node_runs_the_device_plugin_and_the_dcgm_exporter(stack, chart):
    resources = planned(stack)
    placement = pod_placement(chart, releases(resources)[chart]["values"])
    nodes = gpu_nodes(stack)
    assert nodes, f"{stack} has no GPU node shape"
    refused = [f"{n.shape} ({n.instance_type})" for n in nodes if not admits(placement, n.labels, n.taints)]
    assert not refused, f"{chart} never runs on: {', '.join(refused)}"


@pytest.mark.parametrize("stack", STACKS)
def test_the_device_plugin_stays_off_cpu_nodes(stack):
    resources = planned(stack)
    placement = pod_placement(NVIDIA_DEVICE_PLUGIN.name, releases(resources)[NVIDIA_DEVICE_PLUGIN.name]["values"])
    cpu = [n for n in managed_nodes(resources) if not n.gpu]
    assert cpu and not any(admits(placement, n.labels, n.taints) for n in cpu)


@pytest.mark.parametrize("stack", STACKS)
def test_every_efa_node_runs_the_efa_plugin_and_only_efa_nodes_do(stack):
    resources = planned(stack)
    placement = pod_placement(EFA_DEVICE_PLUGIN.name, releases(resources)[EFA_DEVICE_PLUGIN.name]["values"])
    nodes = gpu_nodes(stack)
    for node in nodes:
        assert admits(placement, node.labels, node.taints) is node.efa, f"{node.shape} ({node.instance_type})"
    if stack == "prod":
        assert {n.shape for n in nodes if n.efa} == {"node group gpu-a100", "node group gpu-h100", "NodePool gpu-efa"}


def test_efa_node_groups_get_one_efa_interface_per_network_card():
    resources = planned("prod")
    templates = {r.name: r.inputs for r in of_type(resources, LAUNCH_TEMPLATE)}
    for group in of_type(resources, NODE_GROUP):
        interfaces = templates[group.name].get("networkInterfaces", [])
        if not interfaces:
            continue
        (instance_type,) = group.inputs["instanceTypes"]
        assert len(interfaces) == GPU_INSTANCE_TYPES[instance_type].efa
        assert [i["networkCardIndex"] for i in interfaces] == list(range(len(interfaces)))
        assert {i["interfaceType"] for i in interfaces} == {"efa"}
    cards = {g.inputs["nodeGroupName"]: len(templates[g.name].get("networkInterfaces", [])) for g in of_type(resources, NODE_GROUP)}
    assert (cards["gpu-a100"], cards["gpu-h100"]) == (4, 32)


@pytest.mark.parametrize(("labels", "taints", "admitted"), [
    ({"nvidia.com/gpu.present": "true"}, [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}], True),
    ({}, [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}], False),
    ({"feature.node.kubernetes.io/pci-10de.present": "true"}, [], True),
    ({"nvidia.com/gpu.present": "true"}, [{"key": "other", "value": "x", "effect": "NoSchedule"}], False),
])
def test_the_admission_check_follows_the_chart_defaults(labels, taints, admitted):
    assert admits(pod_placement(NVIDIA_DEVICE_PLUGIN.name, {}), labels, taints) is admitted


@pytest.mark.parametrize("stack", ["dev", "prod", "ephemeral"])
def test_gpu_pools_give_training_pods_their_grace_period_before_the_node_goes(stack):
    """Karpenter v1.14.1 deletes a do-not-disrupt pod at the NodePool's terminationGracePeriod less the pod's
    (terminator.go DeleteExpiringPods): at least the pod's grace fits, and on spot the whole drain fits the notice."""
    pools = [p.inputs["spec"] for p in of_type(planned(stack), NODEPOOL) if "nvidia.com/gpu" in p.inputs["spec"]["limits"]]
    assert pools
    for spec in pools:
        template = spec["template"]["spec"]
        (capacity,) = _requirement(template, "karpenter.sh/capacity-type")
        node_grace = parse_duration(template["terminationGracePeriod"]).total_seconds()
        assert node_grace >= GRACE_PERIOD_SECONDS[capacity], (capacity, node_grace)
        if capacity == "spot":
            assert node_grace <= SPOT_NOTICE_SECONDS, node_grace
