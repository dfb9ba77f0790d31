"""The CrossGuard pack: each rule on good and bad samples, through pulumi-policy's validate, and on the real plans."""

from __future__ import annotations

import copy
import json

import pytest
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
)

from gpuyard.infra.policy.rules import (
    POLICIES,
    check_bucket_settings,
    check_buckets_encrypted_and_private,
    check_eks_endpoint_not_open,
    check_gpu_nodes_tainted,
    check_imds_hop_limit,
    check_imdsv2,
    check_karpenter_actions_scoped,
    check_namespace_pod_security,
    check_network_policies_enforced,
    check_no_ssh_from_anywhere,
)
from infra_plans import named, planned

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
POLICY = {p.name: p for p in POLICIES}


def pool(families, taints=None):
    spec = {"requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": families}]}
    if taints is not None:
        spec["taints"] = taints
    return {"spec": {"template": {"spec": spec}}}


@pytest.mark.parametrize(
    ("resource_type", "props", "violations"),
    [
        (NODE_GROUP, {"amiType": "AL2023_x86_64_NVIDIA", "taints": [TAINT]}, 0),
        (NODE_GROUP, {"amiType": "AL2023_x86_64_NVIDIA"}, 1),
        (NODE_GROUP, {"amiType": "AL2023_x86_64_STANDARD", "instanceTypes": ["p5.48xlarge"], "taints": []}, 1),
        (NODE_GROUP, {"amiType": "AL2023_x86_64_STANDARD", "instanceTypes": ["m6i.large"]}, 0),
        (NODE_GROUP, {"amiType": "AL2023_x86_64_NVIDIA", "taints": [{**TAINT, "effect": "PREFER_NO_SCHEDULE"}]}, 1),
        (NODE_POOL, pool(["g5"], [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]), 0),
        (NODE_POOL, pool(["g5", "p5"]), 1),
        (NODE_POOL, pool(["m7i"]), 0),
    ],
)
def test_gpu_nodes_tainted(resource_type, props, violations):
    assert len(check_gpu_nodes_tainted(resource_type, props)) == violations


@pytest.mark.parametrize(
    ("resource_type", "props", "violations"),
    [
        ("aws:ec2/launchTemplate:LaunchTemplate", {"metadataOptions": {"httpTokens": "required"}}, 0),
        ("aws:ec2/launchTemplate:LaunchTemplate", {"metadataOptions": {"httpTokens": "optional"}}, 1),
        ("aws:ec2/launchTemplate:LaunchTemplate", {}, 1),
        ("aws:ec2/instance:Instance", {"metadataOptions": {"httpTokens": "required"}}, 0),
        ("aws:ec2/instance:Instance", {"ami": "ami-1"}, 1),
        ("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass", {"spec": {}}, 0),
        ("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass", {"spec": {"metadataOptions": {"httpTokens": "optional"}}}, 1),
    ],
)
def test_imdsv2_required(resource_type, props, violations):
    assert len(check_imdsv2(resource_type, props)) == violations


@pytest.mark.parametrize(
    ("resource_type", "props", "violations"),
    [
        (SG, {"ingress": [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}]}, 1),
        (SG, {"ingress": [{"protocol": "tcp", "fromPort": 0, "toPort": 1024, "ipv6CidrBlocks": ["::/0"]}]}, 1),
        (SG, {"ingress": [{"protocol": "-1", "fromPort": 0, "toPort": 0, "cidrBlocks": ["0.0.0.0/0"]}]}, 1),
        (SG, {"ingress": [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["10.0.0.0/8"]}]}, 0),
        (SG, {"ingress": [{"protocol": "tcp", "fromPort": 443, "toPort": 443, "cidrBlocks": ["0.0.0.0/0"]}]}, 0),
        ("aws:ec2/securityGroupRule:SecurityGroupRule",
         {"type": "ingress", "protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}, 1),
        ("aws:ec2/securityGroupRule:SecurityGroupRule",
         {"type": "egress", "protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}, 0),
        (INGRESS_RULE, {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": "0.0.0.0/0"}, 1),
        (INGRESS_RULE, {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": "192.168.0.0/16"}, 0),
    ],
)
def test_no_ssh_from_anywhere(resource_type, props, violations):
    assert len(check_no_ssh_from_anywhere(resource_type, props)) == violations


BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
ALL_BLOCKED = {"blockPublicAcls": True, "blockPublicPolicy": True, "ignorePublicAcls": True, "restrictPublicBuckets": True}


@pytest.mark.parametrize(
    ("resource_type", "props", "violations"),
    [
        (BLOCK, ALL_BLOCKED, 0),
        (BLOCK, {**ALL_BLOCKED, "restrictPublicBuckets": False}, 1),
        (SSE, {"rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}]}, 0),
        (SSE, {"rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]}, 0),
        (SSE, {"rules": [{"applyServerSideEncryptionByDefault": {}}]}, 1),
        ("aws:s3/bucketAcl:BucketAcl", {"acl": "public-read"}, 1),
        ("aws:s3/bucketAcl:BucketAcl", {"acl": "private"}, 0),
    ],
)
def test_bucket_settings(resource_type, props, violations):
    assert len(check_bucket_settings(resource_type, props)) == violations


def test_every_bucket_needs_encryption_and_access_block():
    bucket = ("urn:b", "aws:s3/bucket:Bucket", {}, {})
    other = ("urn:other", "aws:s3/bucket:Bucket", {}, {})
    sse = ("urn:sse", SSE, {}, {"bucket": ["urn:b"]})
    block = ("urn:block", BLOCK, ALL_BLOCKED, {"bucket": ["urn:b"]})
    assert check_buckets_encrypted_and_private([bucket, sse, block]) == []
    assert check_buckets_encrypted_and_private([bucket, sse]) == ["bucket urn:b has no public access block"]
    assert len(check_buckets_encrypted_and_private([bucket, other, sse, block])) == 2


def _options() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def _validate(policy_name: str, resource_type: str, props: dict) -> list[str]:
    reported: list[str] = []
    args = ResourceValidationArgs(resource_type, props, f"urn:{resource_type}", "sample", _options(), None)
    POLICY[policy_name].validate(args, lambda message, urn=None: reported.append(message))
    return reported


def test_policies_report_through_pulumi_policy():
    assert _validate("gpu-nodes-tainted", NODE_GROUP, {"amiType": "AL2023_x86_64_NVIDIA"})
    assert not _validate("gpu-nodes-tainted", NODE_GROUP, {"amiType": "AL2023_x86_64_NVIDIA", "taints": [TAINT]})
    assert _validate("imdsv2-required", "aws:ec2/launchTemplate:LaunchTemplate", {})
    assert _validate("no-ssh-from-anywhere", INGRESS_RULE, {"ipProtocol": "-1", "cidrIpv4": "0.0.0.0/0"})
    assert _validate("bucket-settings-private-encrypted", BLOCK, {})


def _stack_args(resources) -> StackValidationArgs:
    by_urn: dict[str, PolicyResource] = {}
    for r in resources:
        by_urn[r.urn] = PolicyResource(r.type, r.inputs, r.urn, r.name, _options(), None, None, [], {})
    for r in resources:
        by_urn[r.urn].property_dependencies = {
            key: [by_urn[urn] for urn in urns if urn in by_urn] for key, urns in r.property_dependencies.items()
        }
    return StackValidationArgs(list(by_urn.values()))


def violations(resources) -> list[str]:
    """Every policy of the pack on these planned resources, as pulumi-policy runs them."""
    reported: list[str] = []
    for policy in POLICIES:
        if isinstance(policy, ResourceValidationPolicy):
            for r in resources:
                args = ResourceValidationArgs(r.type, r.inputs, r.urn, r.name, _options(), None)
                policy.validate(args, lambda message, urn=None, r=r, p=policy: reported.append(f"{p.name}: {r.name}"))
        else:
            policy.validate(_stack_args(resources), lambda message, urn=None, p=policy: reported.append(f"{p.name}"))
    return reported


@pytest.mark.parametrize("stack", ["dev", "prod", "ephemeral"])
def test_the_real_program_complies(stack):
    assert violations(planned(stack)) == []


def test_stack_policy_catches_a_bucket_without_its_guards():
    resources = [r for r in planned("dev") if "BucketPublicAccessBlock" not in r.type]
    reported: list[str] = []
    POLICY["buckets-encrypted-and-private"].validate(_stack_args(resources), lambda m, urn=None: reported.append(m))
    assert reported == ["bucket storage-checkpoints has no public access block"]


LT = "aws:ec2/launchTemplate:LaunchTemplate"
QUEUE = "kubernetes:scheduling.volcano.sh/v1beta1:Queue"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
QUOTA = "kubernetes:core/v1:ResourceQuota"
RELEASE = "kubernetes:helm.sh/v3:Release"
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"


@pytest.mark.parametrize(
    ("resource_type", "props", "count"),
    [
        (LT, {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1}}, 0),
        (LT, {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2}}, 1),
        (LT, {"metadataOptions": {"httpTokens": "required"}}, 1),
        ("aws:ec2/instance:Instance", {"metadataOptions": {"httpPutResponseHopLimit": 3}}, 1),
        (NODE_CLASS, {"spec": {}}, 0),
        (NODE_CLASS, {"spec": {"metadataOptions": {"httpPutResponseHopLimit": 2}}}, 1),
    ],
)
def test_imds_hop_limit(resource_type, props, count):
    assert len(check_imds_hop_limit(resource_type, props)) == count


EKS = "aws:eks/cluster:Cluster"


@pytest.mark.parametrize(
    ("vpc", "count"),
    [
        ({"endpointPublicAccess": False}, 0),
        ({"endpointPublicAccess": True, "publicAccessCidrs": ["198.51.100.0/24"]}, 0),
        ({"endpointPublicAccess": True, "publicAccessCidrs": ["198.51.100.0/24", "0.0.0.0/0"]}, 1),
        ({"endpointPublicAccess": True}, 1),  # EKS's default CIDR list is 0.0.0.0/0
        ({}, 1),  # and its default endpoint is public
    ],
)
def test_eks_endpoint_not_open(vpc, count):
    assert len(check_eks_endpoint_not_open(EKS, {"vpcConfig": vpc})) == count


ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
TAGGED = {"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/c": "owned"}}


def iam(*statements) -> dict:
    return {"policy": json.dumps({"Version": "2012-10-17", "Statement": list(statements)})}


@pytest.mark.parametrize(
    ("props", "count"),
    [
        (iam({"Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateTags"], "Resource": "*",
              "Condition": {"StringEquals": {"aws:RequestedRegion": "us-west-2"}}}), 1),  # region is no scope
        (iam({"Effect": "Allow", "Action": "ec2:TerminateInstances", "Resource": "*", "Condition": TAGGED}), 0),
        (iam({"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}), 1),
        (iam({"Effect": "Allow", "Action": "*", "Resource": "*"}), 1),
        (iam({"Effect": "Allow", "Action": "iam:*InstanceProfile", "Resource": "*"}), 1),
        (iam({"Effect": "Allow", "Action": "ec2:Run?nstances", "Resource": "*"}), 1),
        (iam({"Effect": "Allow", "Action": "iam:AddRoleToInstanceProfile", "Resource": "*"}), 1),
        (iam({"Effect": "Allow", "Action": ["ec2:RunInstances"], "Resource": [
            "arn:aws:ec2:us-west-2::image/*", "arn:aws:ec2:us-west-2:*:subnet/*"]}), 0),
        (iam({"Effect": "Allow", "Action": ["ec2:RunInstances"], "Resource": ["arn:aws:ec2:us-west-2:*:instance/*"]}), 1),
        (iam({"Effect": "Deny", "Action": "ec2:*", "Resource": "*"}), 0),
        (iam({"Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"}), 0),
    ],
)
def test_karpenter_actions_need_tag_conditions(props, count):
    assert len(check_karpenter_actions_scoped(ROLE_POLICY, props)) == count


@pytest.mark.parametrize(
    ("labels", "count"),
    [
        ({"pod-security.kubernetes.io/enforce": "restricted"}, 0),
        ({"pod-security.kubernetes.io/enforce": "baseline"}, 0),
        ({"pod-security.kubernetes.io/enforce": "privileged"}, 1),
        ({"pod-security.kubernetes.io/warn": "restricted"}, 1),
        ({}, 1),
    ],
)
def test_namespaces_enforce_pod_security(labels, count):
    props = {"metadata": {"name": "team-a", "labels": labels}}
    assert len(check_namespace_pod_security("kubernetes:core/v1:Namespace", props)) == count


def test_network_policies_need_the_vpc_cni_to_enforce_them():
    policy = ("urn:np", "kubernetes:networking.k8s.io/v1:NetworkPolicy", {}, {})
    addon = ("urn:cni", "aws:eks/addon:Addon", {"addonName": "vpc-cni"}, {})
    enforcing = ("urn:cni", "aws:eks/addon:Addon",
                 {"addonName": "vpc-cni", "configurationValues": '{"enableNetworkPolicy": "true"}'}, {})
    assert check_network_policies_enforced([policy, enforcing]) == []
    assert len(check_network_policies_enforced([policy, addon])) == 1
    assert len(check_network_policies_enforced([policy])) == 1
    assert check_network_policies_enforced([addon]) == []


def _mutated(stack: str, name: str, type_: str, change) -> list:
    resources = list(planned(stack))
    index = resources.index(named(resources, name, type_))
    original = resources[index]
    inputs = copy.deepcopy(original.inputs)
    change(inputs)
    resources[index] = type(original)(**{**original.__dict__, "inputs": inputs})
    return resources


@pytest.mark.parametrize(
    ("name", "type_", "change", "policy"),
    [
        ("cluster-system", LT, lambda i: i["metadataOptions"].update(httpPutResponseHopLimit=2), "imds-hop-limit-one"),
        ("karpenter-default", NODE_CLASS, lambda i: i["spec"]["metadataOptions"].update(httpPutResponseHopLimit=2),
         "imds-hop-limit-one"),
        ("cluster-eks", EKS, lambda i: i["vpcConfig"].update(publicAccessCidrs=["0.0.0.0/0"]), "eks-endpoint-not-open"),
        ("karpenter-controller", ROLE_POLICY, lambda i: i.update(policy=json.dumps({"Statement": [
            {"Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*"}]})), "karpenter-actions-tag-scoped"),
        ("team-vision-namespace", "kubernetes:core/v1:Namespace",
         lambda i: i["metadata"]["labels"].pop("pod-security.kubernetes.io/enforce"), "namespace-pod-security"),
        ("cluster-vpc-cni", "aws:eks/addon:Addon", lambda i: i.pop("configurationValues"), "network-policies-enforced"),
        # issue 21: tenants stay in their lane
        ("team-nlp-queue", QUEUE, lambda i: i["metadata"].update(name="default"), "tenant-names-not-reserved"),
        ("team-vision-role", ROLE, lambda i: i["rules"].append(
            {"apiGroups": ["trainer.kubeflow.org"], "resources": ["*"], "verbs": ["*"]}), "team-role-writes-no-runtime"),
        ("team-vision-checkpoints", ROLE_POLICY, lambda i: i.update(policy=json.dumps({"Statement": [
            {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b",
             "Condition": {"StringLike": {"s3:prefix": ["teams/vision*"]}}}]})), "s3-prefixes-end-at-slash"),
        ("team-vision-checkpoints", ROLE_POLICY, lambda i: i.update(policy=json.dumps({"Statement": [
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/teams/vision*"}]})),
         "s3-prefixes-end-at-slash"),
        ("team-nlp-namespace", "kubernetes:core/v1:Namespace",
         lambda i: i["metadata"]["annotations"].clear(), "team-lanes-admitted"),
        ("pod-admission-rayjobs-binding", BINDING, lambda i: i["spec"].update(validationActions=["Warn"]),
         "team-lanes-admitted"),
        ("pod-admission-podgroups-policy", VAP, lambda i: i["spec"].update(
            matchConditions=[{"name": "people", "expression": "!request.userInfo.username.startsWith('system:')"}]),
         "team-lanes-admitted"),
        ("team-nlp-quota", QUOTA, lambda i: i["spec"]["hard"].pop("services.loadbalancers"), "team-services-in-cluster"),
        ("addons-nvidia-device-plugin", RELEASE, lambda i: i["values"].pop("deviceListStrategy"), "gpus-only-by-request"),
        ("cluster-gpu-small", LT, lambda i: i.pop("userData"), "gpus-only-by-request"),
        ("karpenter-default", NODE_CLASS, lambda i: i["spec"].pop("userData"), "gpus-only-by-request"),
    ],
)
def test_the_pack_catches_each_mistake_in_the_real_plan(name, type_, change, policy):
    stack_rules = ("network-policies-enforced", "team-lanes-admitted", "team-services-in-cluster", "gpus-only-by-request")
    assert violations(_mutated("dev", name, type_, change)) == [policy if policy in stack_rules
                                                                 else f"{policy}: {name}"]


def test_a_reserved_team_namespace_is_caught_with_the_quota_it_no_longer_has():
    resources = _mutated("dev", "team-vision-namespace", "kubernetes:core/v1:Namespace",
                         lambda i: i["metadata"].update(name="kube-vision"))
    assert violations(resources) == ["tenant-names-not-reserved: team-vision-namespace", "team-services-in-cluster"]
