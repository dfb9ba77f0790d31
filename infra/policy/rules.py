"""CrossGuard rules as pure checks of a resource's properties, wired into pulumi-policy policies.

Each ``check_*`` takes (resource type, props) - or, for the stack rules, every resource of the stack - and
returns violation messages; an empty list means compliant.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Mapping
from typing import Any

from pulumi_policy import (
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra.config import GPU_FAMILIES, instance_family
from infra.conventions import GPU_TAINT_KEY

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
BUCKET = "aws:s3/bucket:Bucket"
PUBLIC_ACCESS_BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
ENCRYPTION = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
BUCKET_ACL = "aws:s3/bucketAcl:BucketAcl"
BLOCK_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
NAMESPACE = "kubernetes:core/v1:Namespace"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
EKS_ADDON = "aws:eks/addon:Addon"
IAM_POLICIES = ("aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy", "aws:iam/userPolicy:UserPolicy",
                "aws:iam/groupPolicy:GroupPolicy")
# What Karpenter's controller does to instances, launch templates and instance profiles: v1.14.1's policy
# allows each only with aws:RequestTag / aws:ResourceTag conditions on the cluster and NodePool tags.
KARPENTER_ACTIONS = ("ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate", "ec2:CreateTags",
                     "ec2:TerminateInstances", "ec2:DeleteLaunchTemplate", "iam:CreateInstanceProfile",
                     "iam:TagInstanceProfile", "iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile",
                     "iam:DeleteInstanceProfile")
# Resources an instance is launched from, which that policy names without tag conditions.
LAUNCH_INPUTS = ("image/*", "snapshot/*", "security-group/*", "subnet/*", "capacity-reservation/*", "placement-group/*")
PSS_ENFORCE = "pod-security.kubernetes.io/enforce"
ANYWHERE = ("0.0.0.0/0", "::/0")
SSH = 22

Props = Mapping[str, Any]


def _is_gpu_node_group(props: Props) -> bool:
    return "NVIDIA" in str(props.get("amiType", "")) or any(
        instance_family(t) in GPU_FAMILIES for t in props.get("instanceTypes") or []
    )


def _pool_selects_gpus(props: Props) -> bool:
    requirements = (((props.get("spec") or {}).get("template") or {}).get("spec") or {}).get("requirements") or []
    for requirement in requirements:
        key, values = requirement.get("key"), requirement.get("values") or []
        if key == "karpenter.k8s.aws/instance-family" and any(v in GPU_FAMILIES for v in values):
            return True
        if key in ("karpenter.k8s.aws/instance-gpu-count", "karpenter.k8s.aws/instance-gpu-manufacturer"):
            return True
    return False


def check_gpu_nodes_tainted(resource_type: str, props: Props) -> list[str]:
    """GPU node groups and GPU NodePools carry the ``nvidia.com/gpu`` NoSchedule taint."""
    if resource_type == NODE_GROUP and _is_gpu_node_group(props):
        taints = props.get("taints") or []
        if not any(t.get("key") == GPU_TAINT_KEY and t.get("effect") == "NO_SCHEDULE" for t in taints):
            return [f"GPU node group must have the taint {GPU_TAINT_KEY}=true:NoSchedule"]
    if resource_type == NODE_POOL and _pool_selects_gpus(props):
        taints = props["spec"]["template"]["spec"].get("taints") or []
        if not any(t.get("key") == GPU_TAINT_KEY and t.get("effect") == "NoSchedule" for t in taints):
            return [f"GPU NodePool must have the taint {GPU_TAINT_KEY}=true:NoSchedule"]
    return []


def check_imdsv2(resource_type: str, props: Props) -> list[str]:
    """Launch templates and instances require IMDSv2 tokens; Karpenter node classes must not make them optional."""
    if resource_type in ("aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/instance:Instance"):
        if (props.get("metadataOptions") or {}).get("httpTokens") != "required":
            return ["IMDSv2 required: set metadataOptions.httpTokens to 'required'"]
    if resource_type == "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass":
        if ((props.get("spec") or {}).get("metadataOptions") or {}).get("httpTokens", "required") != "required":
            return ["IMDSv2 required: EC2NodeClass spec.metadataOptions.httpTokens must be 'required'"]
    return []


def check_imds_hop_limit(resource_type: str, props: Props) -> list[str]:
    """Every node answers IMDS to itself only (hop limit 1): a pod cannot read the node role's credentials."""
    message = "IMDS hop limit must be 1 (pods use IRSA; a higher limit hands them the node role's credentials)"
    if resource_type in (LAUNCH_TEMPLATE, INSTANCE):
        if (props.get("metadataOptions") or {}).get("httpPutResponseHopLimit") != 1:
            return [f"{message}: set metadataOptions.httpPutResponseHopLimit to 1"]
    if resource_type == NODE_CLASS:  # the CRD defaults it to 1
        if ((props.get("spec") or {}).get("metadataOptions") or {}).get("httpPutResponseHopLimit", 1) != 1:
            return [f"{message}: EC2NodeClass spec.metadataOptions.httpPutResponseHopLimit"]
    return []


def check_eks_endpoint_not_open(resource_type: str, props: Props) -> list[str]:
    """A public EKS endpoint admits listed networks only; EKS's defaults (public, 0.0.0.0/0) count as open."""
    if resource_type != EKS_CLUSTER:
        return []
    vpc = props.get("vpcConfig") or {}
    if vpc.get("endpointPublicAccess", True) is False:
        return []
    cidrs = vpc.get("publicAccessCidrs") or ["0.0.0.0/0"]
    if any(cidr in ANYWHERE for cidr in cidrs):
        return ["EKS API endpoint is public to 0.0.0.0/0: set vpcConfig.publicAccessCidrs or make it private"]
    return []


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value] if value is not None else []


def _covers(pattern: str, action: str) -> bool:
    """Whether an IAM action pattern (``*``, ``ec2:*``, ``iam:*InstanceProfile``, any case) grants ``action``."""
    return fnmatch.fnmatchcase(action.lower(), pattern.lower())


def _tag_scoped(condition: Mapping[str, Any]) -> bool:
    keys = [key for operator in condition.values() if isinstance(operator, Mapping) for key in operator]
    return any(key.startswith(("aws:RequestTag/", "aws:ResourceTag/")) for key in keys)


def check_karpenter_actions_scoped(resource_type: str, props: Props) -> list[str]:
    """IAM policies grant Karpenter's launch, terminate and instance-profile actions only under tag conditions
    (or, for launches, on the images, subnets and security groups an instance is launched from)."""
    if resource_type not in IAM_POLICIES:
        return []
    document = props.get("policy")
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except json.JSONDecodeError:
            return []
    violations = []
    for statement in _as_list((document or {}).get("Statement")):
        if statement.get("Effect") != "Allow":
            continue
        granted = sorted({action for pattern in _as_list(statement.get("Action")) for action in KARPENTER_ACTIONS
                          if _covers(str(pattern), action)})
        resources = [str(r) for r in _as_list(statement.get("Resource"))]
        if not granted or _tag_scoped(statement.get("Condition") or {}):
            continue
        if resources and all(r.endswith(LAUNCH_INPUTS) for r in resources):
            continue
        violations.append(f"statement {statement.get('Sid', '(no Sid)')} allows {', '.join(granted)} "
                          "without aws:RequestTag/aws:ResourceTag conditions")
    return violations


def check_namespace_pod_security(resource_type: str, props: Props) -> list[str]:
    """Namespaces the stack creates enforce a Pod Security Standard (restricted, or baseline)."""
    if resource_type != NAMESPACE:
        return []
    labels = (props.get("metadata") or {}).get("labels") or {}
    if labels.get(PSS_ENFORCE) not in ("restricted", "baseline"):
        return [f"namespace must enforce Pod Security restricted or baseline (label {PSS_ENFORCE})"]
    return []


def check_network_policies_enforced(resources: list[tuple[str, str, Props, dict[str, list[str]]]]) -> list[str]:
    """A stack with NetworkPolicies turns on their enforcement in its vpc-cni add-on (else they are decoration)."""
    if not any(type_ == NETWORK_POLICY for _, type_, _, _ in resources):
        return []
    for _, type_, props, _ in resources:
        if type_ == EKS_ADDON and props.get("addonName") == "vpc-cni":
            configuration = props.get("configurationValues")
            try:
                values = json.loads(configuration) if isinstance(configuration, str) else configuration or {}
            except json.JSONDecodeError:
                values = {}
            if str(values.get("enableNetworkPolicy", "")).lower() == "true":
                return []
    return ["NetworkPolicies are not enforced: set the vpc-cni add-on's configurationValues "
            'enableNetworkPolicy to "true"']


def _opens_ssh_to_anywhere(rule: Props, cidr_keys: tuple[str, ...]) -> bool:
    cidrs = []
    for key in cidr_keys:
        value = rule.get(key)
        cidrs.extend(value if isinstance(value, list) else [value] if value else [])
    if not any(cidr in ANYWHERE for cidr in cidrs):
        return False
    if str(rule.get("protocol", rule.get("ipProtocol", ""))) in ("-1", "all"):
        return True
    low, high = rule.get("fromPort"), rule.get("toPort")
    return low is not None and high is not None and low <= SSH <= high


def check_no_ssh_from_anywhere(resource_type: str, props: Props) -> list[str]:
    """No security group rule opens port 22 to 0.0.0.0/0 or ::/0."""
    message = "security group must not open port 22 to 0.0.0.0/0"
    if resource_type == "aws:ec2/securityGroup:SecurityGroup":
        if any(_opens_ssh_to_anywhere(rule, ("cidrBlocks", "ipv6CidrBlocks")) for rule in props.get("ingress") or []):
            return [message]
    if resource_type == "aws:ec2/securityGroupRule:SecurityGroupRule" and props.get("type") == "ingress":
        if _opens_ssh_to_anywhere(props, ("cidrBlocks", "ipv6CidrBlocks")):
            return [message]
    if resource_type == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
        if _opens_ssh_to_anywhere(props, ("cidrIpv4", "cidrIpv6")):
            return [message]
    return []


def check_bucket_settings(resource_type: str, props: Props) -> list[str]:
    """Public access blocks block everything, encryption is SSE-S3 or SSE-KMS, ACLs are never public."""
    if resource_type == PUBLIC_ACCESS_BLOCK:
        off = [flag for flag in BLOCK_FLAGS if props.get(flag) is not True]
        if off:
            return [f"bucket public access block must set {', '.join(off)} to true"]
    if resource_type == ENCRYPTION:
        for rule in props.get("rules") or []:
            algorithm = (rule.get("applyServerSideEncryptionByDefault") or {}).get("sseAlgorithm")
            if algorithm not in ("aws:kms", "aws:kms:dsse", "AES256"):
                return [f"bucket encryption must be SSE-S3 or SSE-KMS, not {algorithm!r}"]
    if resource_type == BUCKET_ACL and str(props.get("acl", "")).startswith("public"):
        return [f"bucket ACL {props['acl']!r} makes the bucket public"]
    return []


def check_buckets_encrypted_and_private(resources: list[tuple[str, str, Props, dict[str, list[str]]]]) -> list[str]:
    """Every bucket has an encryption configuration and a public access block attached to it.

    ``resources`` are (urn, type, props, property dependencies as urn lists) for the whole stack.
    """
    covered: dict[str, set[str]] = {ENCRYPTION: set(), PUBLIC_ACCESS_BLOCK: set()}
    for _, type_, _, dependencies in resources:
        if type_ in covered:
            covered[type_].update(dependencies.get("bucket", []))
    violations = []
    for urn, type_, _, _ in resources:
        if type_ != BUCKET:
            continue
        if urn not in covered[ENCRYPTION]:
            violations.append(f"bucket {urn.rsplit('::', 1)[-1]} has no server-side encryption configuration")
        if urn not in covered[PUBLIC_ACCESS_BLOCK]:
            violations.append(f"bucket {urn.rsplit('::', 1)[-1]} has no public access block")
    return violations


def resource_policy(name: str, description: str, check: Callable[[str, Props], list[str]]) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in check(args.resource_type, args.props):
            report_violation(message, None)

    return ResourceValidationPolicy(name=name, description=description, validate=validate)


def stack_policy(name: str, description: str, check: Callable[[list], list[str]]) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [
            (r.urn, r.resource_type, r.props,
             {key: [d.urn for d in deps] for key, deps in r.property_dependencies.items()})
            for r in args.resources
        ]
        for message in check(resources):
            report_violation(message, None)

    return StackValidationPolicy(name=name, description=description, validate=validate)


# name: (description, check) of each rule; ``gpuyard plan`` runs them on the offline plan too.
RESOURCE_CHECKS: dict[str, tuple[str, Callable[[str, Props], list[str]]]] = {
    "gpu-nodes-tainted": ("GPU node groups and NodePools carry the nvidia.com/gpu NoSchedule taint.",
                          check_gpu_nodes_tainted),
    "bucket-settings-private-encrypted": ("Bucket access blocks, encryption and ACLs keep data private.",
                                          check_bucket_settings),
    "imdsv2-required": ("Nodes require IMDSv2 session tokens.", check_imdsv2),
    "no-ssh-from-anywhere": ("No ingress on port 22 from 0.0.0.0/0.", check_no_ssh_from_anywhere),
    "imds-hop-limit-one": ("Nodes answer IMDS with hop limit 1.", check_imds_hop_limit),
    "eks-endpoint-not-open": ("The EKS API endpoint is never public to 0.0.0.0/0.", check_eks_endpoint_not_open),
    "karpenter-actions-tag-scoped": ("Instance, launch template and instance profile actions carry tag conditions.",
                                     check_karpenter_actions_scoped),
    "namespace-pod-security": ("Namespaces enforce a Pod Security Standard.", check_namespace_pod_security),
}
STACK_CHECKS: dict[str, tuple[str, Callable[[list], list[str]]]] = {
    "buckets-encrypted-and-private": ("Every S3 bucket has encryption and a public access block.",
                                      check_buckets_encrypted_and_private),
    "network-policies-enforced": ("NetworkPolicies come with the vpc-cni add-on enforcing them.",
                                  check_network_policies_enforced),
}

POLICIES = [
    *(resource_policy(name, description, check) for name, (description, check) in RESOURCE_CHECKS.items()),
    *(stack_policy(name, description, check) for name, (description, check) in STACK_CHECKS.items()),
]
