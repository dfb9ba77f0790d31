"""CrossGuard rules as pure checks of a resource's properties, wired into pulumi-policy policies.

Each ``check_*`` takes (resource type, props) - or, for the bucket rule, every resource of the stack - and
returns violation messages; an empty list means compliant.
"""

from __future__ import annotations

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


def _validate_stack(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = [
        (r.urn, r.resource_type, r.props, {key: [d.urn for d in deps] for key, deps in r.property_dependencies.items()})
        for r in args.resources
    ]
    for message in check_buckets_encrypted_and_private(resources):
        report_violation(message, None)


# name: (description, check) of each per-resource rule; ``gpuyard plan`` runs them on the offline plan too.
RESOURCE_CHECKS: dict[str, tuple[str, Callable[[str, Props], list[str]]]] = {
    "gpu-nodes-tainted": ("GPU node groups and NodePools carry the nvidia.com/gpu NoSchedule taint.",
                          check_gpu_nodes_tainted),
    "bucket-settings-private-encrypted": ("Bucket access blocks, encryption and ACLs keep data private.",
                                          check_bucket_settings),
    "imdsv2-required": ("Nodes require IMDSv2 session tokens.", check_imdsv2),
    "no-ssh-from-anywhere": ("No ingress on port 22 from 0.0.0.0/0.", check_no_ssh_from_anywhere),
}
STACK_CHECK = "buckets-encrypted-and-private"

POLICIES = [
    *(resource_policy(name, description, check) for name, (description, check) in RESOURCE_CHECKS.items()),
    StackValidationPolicy(
        name=STACK_CHECK,
        description="Every S3 bucket has encryption and a public access block.",
        validate=_validate_stack,
    ),
]
