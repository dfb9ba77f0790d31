"""A teardown that never hangs or leaks, read from the plans' dependencies: ``pulumi destroy`` deletes a resource
before everything it depends on, so what must outlive something is among that thing's dependencies."""

from __future__ import annotations

import pytest

from gpuyard.infra.config import ConfigError, load_stack, parse_stack
from infra_plans import named, of_type, planned

STACKS = ("dev", "prod", "ephemeral")
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"


def outlives(resources) -> dict[str, set[str]]:
    """urn -> every urn it depends on, directly or not, its explicit provider included (those are deleted after it)."""
    direct = {r.urn: set(r.dependencies) | {u for urns in r.property_dependencies.values() for u in urns}
              | ({r.provider.rsplit("::", 1)[0]} if r.provider else set()) for r in resources}
    closed: dict[str, set[str]] = {}

    def walk(urn: str) -> set[str]:
        if urn not in closed:
            closed[urn] = set()
            for dependency in direct.get(urn, ()):
                closed[urn] |= {dependency} | walk(dependency)
        return closed[urn]

    return {urn: walk(urn) for urn in direct}


@pytest.mark.parametrize("stack", STACKS)
def test_karpenter_iam_and_controller_outlive_its_node_pools_and_node_class(stack):
    resources = planned(stack)
    after = outlives(resources)
    karpenter_iam = [r.urn for r in resources if r.parent == "karpenter" and r.type in (
        "aws:iam/rolePolicy:RolePolicy", "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
        "aws:eks/accessEntry:AccessEntry")]
    assert len(karpenter_iam) == 6  # the controller policy, four node policy attachments, the node access entry
    controller = named(resources, "karpenter-chart").urn
    for resource in of_type(resources, NODE_CLASS) + of_type(resources, NODE_POOL):
        assert set(karpenter_iam) | {controller} <= after[resource.urn], resource.name
    assert set(karpenter_iam) <= after[controller]


@pytest.mark.parametrize("stack", STACKS)
def test_node_pools_bound_how_long_a_drain_may_take(stack):
    for pool in of_type(planned(stack), NODE_POOL):
        grace = pool.inputs["spec"]["template"]["spec"]["terminationGracePeriod"]
        assert grace in ("1h", "15m", "120s"), pool.name  # GPU on-demand, CPU, GPU spot (the interruption notice)


@pytest.mark.parametrize("stack", STACKS)
def test_team_namespaces_go_before_the_operators_that_finalize_their_jobs(stack):
    resources = planned(stack)
    after = outlives(resources)
    operators = [r.urn for r in resources if r.parent == "addons" and r.type in (
        "kubernetes:helm.sh/v3:Release", "kubernetes:yaml/v2:ConfigFile", "kubernetes:kustomize/v2:Directory")]
    charts = {r.inputs.get("chart") for r in resources if r.urn in operators}
    assert {"kuberay-operator", "volcano"} <= charts
    for team in load_stack(stack).teams:
        namespace = named(resources, f"team-{team.name}-namespace")
        assert set(operators) <= after[namespace.urn], team.name


@pytest.mark.parametrize("stack", STACKS)
def test_eks_addons_outlive_every_kubernetes_object(stack):
    """Operators, Karpenter and the teams' objects are deleted while pods still have networking (vpc-cni, kube-proxy)
    and DNS (coredns: Karpenter resolves the EC2 endpoint through it to terminate its nodes)."""
    resources = planned(stack)
    after = outlives(resources)
    addons = {r.urn for r in of_type(resources, "aws:eks/addon:Addon")}
    assert len(addons) == 3
    kubernetes_objects = [r for r in resources if r.type.startswith("kubernetes:") and r.type != "pulumi:providers:kubernetes"]
    assert len(kubernetes_objects) > 20
    for resource in kubernetes_objects:
        assert addons <= after[resource.urn], resource.name


@pytest.mark.parametrize("stack", STACKS)
def test_the_stack_owns_the_control_plane_log_group(stack):
    resources = planned(stack)
    config = load_stack(stack)
    (group,) = of_type(resources, "aws:cloudwatch/logGroup:LogGroup")
    assert group.inputs["name"] == f"/aws/eks/{config.cluster_name}/cluster"
    assert group.inputs["retentionInDays"] == config.cluster.log_retention_days
    (cluster,) = of_type(resources, "aws:eks/cluster:Cluster")
    assert group.urn in cluster.dependencies  # exists before EKS would create it, deleted after the cluster


STORAGE = ("aws:s3/bucket:Bucket", "aws:ecr/repository:Repository")


@pytest.mark.parametrize("stack", ["dev", "ephemeral"])
def test_short_lived_stacks_empty_their_bucket_and_registries_on_destroy(stack):
    resources = [r for r in planned(stack) if r.type in STORAGE]
    assert len(resources) == 4
    for resource in resources:
        assert resource.inputs.get("forceDestroy", resource.inputs.get("forceDelete")) is True, resource.name
        assert not resource.protect


LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


def test_prod_protects_its_bucket_registries_and_audit_logs():
    """The control-plane and audit log group is kept like the checkpoints: `pulumi destroy` stops at it."""
    resources = [r for r in planned("prod") if r.type in STORAGE]
    assert len(resources) == 4
    for resource in resources:
        assert resource.protect, resource.name
        assert not resource.inputs.get("forceDestroy", resource.inputs.get("forceDelete")), resource.name
    (logs,) = of_type(planned("prod"), LOG_GROUP)
    assert logs.protect and "audit" in load_stack("prod").cluster.log_types
    assert not [r for r in planned("prod") if r.protect and r.type not in (*STORAGE, LOG_GROUP)]
    for stack in ("dev", "ephemeral"):
        assert not [r.name for r in planned(stack) if r.protect]


def test_force_destroy_and_protect_exclude_each_other():
    with pytest.raises(ConfigError, match="storage.force_destroy and storage.protect are both true"):
        parse_stack("t", {"gpuyard:cluster_name": "t", "gpuyard:storage": {"force_destroy": True, "protect": True}})
