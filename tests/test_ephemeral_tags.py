"""Which tags make a resource a cluster's leftover: never without the cluster's tags, never the stack's own, never
one tagged ``kubernetes.io/cluster/<c>=shared`` (kubernetes/cloud-provider-aws v1.36.1 pkg/providers/v1/tags.go)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuyard.infra.conventions import TAG_STACK
from gpuyard.jobs.ephemeral.cleanup import (cluster_owned, cluster_security_group, karpenter_instance,
                                    load_balancer_controller_resource, not_ours, references_revocable)

C = "alpha"
OWNED = {"kubernetes.io/cluster/alpha": "owned"}


@pytest.mark.parametrize("tags, expected", [
    ({"karpenter.sh/nodepool": "gpu", **OWNED}, True),
    ({"karpenter.sh/nodepool": "gpu", "eks:eks-cluster-name": C}, True),
    ({"karpenter.sh/nodepool": "gpu", "eks:eks-cluster-name": "alpha-2"}, False),
    ({"karpenter.sh/nodepool": "gpu", "kubernetes.io/cluster/beta": "owned"}, False),
    ({"karpenter.sh/nodepool": "gpu"}, False),
    (OWNED, False),  # a managed node group's instance
    ({"karpenter.sh/nodepool": "gpu", **OWNED, TAG_STACK: "eph"}, False),
    ({"karpenter.sh/nodepool": "gpu", "kubernetes.io/cluster/alpha": "shared", "eks:eks-cluster-name": C}, False),
])
def test_karpenter_instance(tags, expected):
    assert karpenter_instance(tags, C) is expected


@pytest.mark.parametrize("predicate, tags, expected", [
    (load_balancer_controller_resource, {"elbv2.k8s.aws/cluster": C}, True),
    (load_balancer_controller_resource, {"elbv2.k8s.aws/cluster": "alphabet"}, False),
    (load_balancer_controller_resource, {"elbv2.k8s.aws/cluster": C, TAG_STACK: "eph"}, False),
    (load_balancer_controller_resource, {"elbv2.k8s.aws/cluster": C, "kubernetes.io/cluster/alpha": "shared"}, False),
    (cluster_security_group, {"elbv2.k8s.aws/cluster": C, "elbv2.k8s.aws/resource": "backend-sg"}, True),
    (cluster_security_group, OWNED, True),
    (cluster_security_group, {"kubernetes.io/cluster/alpha": "shared"}, False),
    (cluster_security_group, {"kubernetes.io/cluster/alpha": "owned", "aws:eks:cluster-name": C}, False),
    (cluster_security_group, {"kubernetes.io/cluster/alpha-x": "owned"}, False),
    (references_revocable, {"kubernetes.io/cluster/alpha": "owned", "aws:eks:cluster-name": C}, True),
    (references_revocable, {"kubernetes.io/cluster/beta": "owned", "aws:eks:cluster-name": "beta"}, False),
    (references_revocable, {"kubernetes.io/cluster/alpha": "shared", "aws:eks:cluster-name": C}, False),
    (cluster_owned, OWNED, True),
    (cluster_owned, {"kubernetes.io/cluster/alpha": "shared"}, False),
    (cluster_owned, {**OWNED, TAG_STACK: "eph"}, False),
])
def test_tag_predicates(predicate, tags, expected):
    assert predicate(tags, C) is expected


KEYS = st.sampled_from(["karpenter.sh/nodepool", "eks:eks-cluster-name", "elbv2.k8s.aws/cluster", TAG_STACK,
                        "aws:eks:cluster-name", "kubernetes.io/cluster/alpha", "kubernetes.io/cluster/beta", "Name"])
VALUES = st.sampled_from(["alpha", "beta", "owned", "shared", ""])


@given(st.dictionaries(KEYS, VALUES))
def test_nothing_is_a_leftover_without_the_clusters_tag_or_with_the_stacks(tags):
    mentions_cluster = "kubernetes.io/cluster/alpha" in tags or C in (tags.get("eks:eks-cluster-name"),
                                                                     tags.get("elbv2.k8s.aws/cluster"))
    for predicate in (karpenter_instance, load_balancer_controller_resource, cluster_security_group, cluster_owned):
        if predicate(tags, C):
            assert mentions_cluster and not not_ours(tags, C)
            assert tags.get("kubernetes.io/cluster/alpha") != "shared" and TAG_STACK not in tags
