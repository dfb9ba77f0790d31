"""The simulated cluster's inputs, without starting it: node shapes and counts from the stack's plan, versions."""

from __future__ import annotations

import pytest

from gpuyard.infra.config import ConfigError
from gpuyard.infra.plan import plan
from gpuyard.sim import nodes
from gpuyard.sim.versions import components, kubernetes_tag


@pytest.fixture(scope="module")
def dev_pools():
    return {pool.name: pool for pool in nodes.pools(plan("dev").resources)}


def test_dev_pools_follow_the_stack(dev_pools):
    assert dev_pools["system"].count == 3 and dev_pools["system"].instance_types == ("m6i.large",)
    assert dev_pools["gpu-small"].count == 2 and dev_pools["gpu-small"].instance_types == ("g5.xlarge", "g6.xlarge")
    # NodePools: as many 1-GPU nodes as their nvidia.com/gpu limit (8), cpu as many 8-vCPU nodes as 64 vCPUs
    assert dev_pools["gpu-on-demand"].count == 8 and dev_pools["gpu-spot"].count == 8 and dev_pools["cpu"].count == 8
    assert dev_pools["gpu-spot"].capacity_types == ("spot",)
    cpu_nodes = nodes.node_manifests([dev_pools["cpu"]], "us-west-2", ["us-west-2a"])
    assert {n["metadata"]["labels"]["karpenter.sh/capacity-type"] for n in cpu_nodes} == {"spot", "on-demand"}
    assert dev_pools["gpu-small"].taints == ({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},)
    assert dev_pools["cpu"].taints == ()


def test_node_manifests_carry_shape_labels_and_taints(dev_pools):
    [node, *_] = nodes.node_manifests([dev_pools["gpu-small"]], "us-west-2", ["us-west-2a", "us-west-2b"])
    labels = node["metadata"]["labels"]
    assert labels["node.kubernetes.io/instance-type"] == "g5.xlarge"
    assert labels["topology.kubernetes.io/zone"] == "us-west-2a"
    assert labels["gpuyard.io/gpu-class"] == "small" and labels["eks.amazonaws.com/nodegroup"] == "gpu-small"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "1"
    # EKS reserves 11 MiB per pod + 255 MiB + 100 MiB eviction: 16 GiB - (58*11 + 355) MiB
    assert node["status"]["allocatable"]["memory"] == f"{16 * 1024 - 58 * 11 - 355}Mi"


def test_big_gpu_shapes():
    capacity, _ = nodes.resources(nodes.SHAPES["p5.48xlarge"])
    assert capacity["nvidia.com/gpu"] == "8" and capacity["vpc.amazonaws.com/efa"] == "32" and capacity["cpu"] == "192"
    capacity, _ = nodes.resources(nodes.SHAPES["p4d.24xlarge"])
    assert capacity["vpc.amazonaws.com/efa"] == "4" and capacity["memory"] == "1152Gi"


def test_kubernetes_minor_without_a_build_is_one_clear_error():
    assert kubernetes_tag("1.35") == "v1.35.4"
    with pytest.raises(ConfigError, match=r"cluster.kubernetes_version '1.29' has no simulated build \(supported: 1.35\)"):
        components("1.29")


@pytest.mark.parametrize("stack", ["dev", "prod", "ephemeral"])
def test_every_stack_pool_has_a_simulated_shape(stack):
    """`gpuyard sim up --stack prod` once failed at start: prod's system group (m6i.2xlarge) had no shape."""
    for pool in nodes.pools(plan(stack).resources):
        for instance_type in pool.instance_types:
            assert instance_type in nodes.SHAPES, (stack, pool.name, instance_type)


def test_simulated_prices_are_karpenters_on_demand_prices():
    from gpuyard.infra.prices import ON_DEMAND_USD_PER_HOUR

    assert {name: shape.price for name, shape in nodes.SHAPES.items()} == {
        name: ON_DEMAND_USD_PER_HOUR[name] for name in nodes.SHAPES}
