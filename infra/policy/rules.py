"""CrossGuard rules as pure checks of a resource's properties, wired into pulumi-policy policies.

Each ``check_*`` takes (resource type, props) - or, for the stack rules, every resource of the stack - and
returns violation messages; an empty list means compliant.
"""

from __future__ import annotations

import base64
import binascii
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

from gpuyard.infra.config import GPU_FAMILIES, instance_family
from gpuyard.infra.conventions import (ANNOTATION_QUEUE_NAME, GPU_TAINT_KEY, LABEL_PRIORITY_CLASS_PREFIX, LABEL_TEAM,
                               RESERVED_NAMESPACE_PREFIX, RESERVED_NAMESPACES, RESERVED_QUEUES)

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
QUEUE = "kubernetes:scheduling.volcano.sh/v1beta1:Queue"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
QUOTA = "kubernetes:core/v1:ResourceQuota"
RELEASE = "kubernetes:helm.sh/v3:Release"
ADMISSION_POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
ADMISSION_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
# What a team's pods come from (issue 21): each must be checked by an admission policy bound to team namespaces.
LANE_RESOURCES = (("", "pods"), ("scheduling.volcano.sh", "podgroups"), ("kubeflow.org", "pytorchjobs"),
                  ("kubeflow.org", "mpijobs"), ("batch.volcano.sh", "jobs"), ("ray.io", "rayjobs"),
                  ("ray.io", "rayclusters"), ("trainer.kubeflow.org", "trainjobs"), ("", "services"))
WRITE_VERBS = ("*", "create", "update", "patch")
RUNTIMES = ("*", "trainingruntimes", "clustertrainingruntimes")
# The NVIDIA container toolkit setting that stops NVIDIA_VISIBLE_DEVICES from unprivileged containers
# (NVIDIA/nvidia-container-toolkit v1.18.2 internal/config/config.go) and the device plugin strategies that do not
# depend on it (NVIDIA/k8s-device-plugin v0.17.4 api/config/v1/consts.go).
TOOLKIT_ENVVAR_OFF = "accept-nvidia-visible-devices-envvar-when-unprivileged=false"
SAFE_DEVICE_LISTS = ("volume-mounts", "cdi-annotations", "cdi-cri")
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


def _team_namespace(props: Props) -> bool:
    return LABEL_TEAM in ((props.get("metadata") or {}).get("labels") or {})


def check_tenant_names_not_reserved(resource_type: str, props: Props) -> list[str]:
    """No team namespace is Kubernetes' or an operator's; no team queue is one Volcano creates itself."""
    name = (props.get("metadata") or {}).get("name", "")
    if resource_type == NAMESPACE and _team_namespace(props):
        if name in RESERVED_NAMESPACES or name.startswith(RESERVED_NAMESPACE_PREFIX):
            return [f"team namespace {name!r} is reserved"]
    if resource_type == QUEUE and name in RESERVED_QUEUES:
        return [f"queue {name!r} is Volcano's own"]
    return []


def check_team_role_writes_no_runtime(resource_type: str, props: Props) -> list[str]:
    """A team's Role cannot write TrainingRuntimes: a runtime of its own could name any queue, priority and
    scheduler for its TrainJobs."""
    if resource_type != ROLE or not _team_namespace(props):
        return []
    for rule in props.get("rules") or []:
        groups, resources, verbs = (rule.get(key) or [] for key in ("apiGroups", "resources", "verbs"))
        if ({"*", "trainer.kubeflow.org"} & set(groups) and set(RUNTIMES) & set(resources)
                and set(WRITE_VERBS) & set(verbs)):
            return ["team role may write TrainingRuntimes"]
    return []


def _object_key_patterns(document: Mapping[str, Any]) -> list[str]:
    patterns = []
    for statement in _as_list(document.get("Statement")):
        if statement.get("Effect") != "Allow":
            continue
        patterns += [str(r).split("/", 1)[1] for r in _as_list(statement.get("Resource"))
                     if str(r).startswith("arn:aws:s3:::") and "/" in str(r)]
        for operator in (statement.get("Condition") or {}).values():
            if isinstance(operator, Mapping):
                patterns += [str(v) for v in _as_list(operator.get("s3:prefix"))]
    return patterns


def check_s3_prefixes_end_at_slash(resource_type: str, props: Props) -> list[str]:
    """S3 object ARNs and ``s3:prefix`` conditions end their prefix at ``/``: ``teams/nlp*`` also grants
    ``teams/nlp-2/``."""
    if resource_type not in IAM_POLICIES:
        return []
    document = props.get("policy")
    try:
        document = json.loads(document) if isinstance(document, str) else document or {}
    except json.JSONDecodeError:
        return []
    loose = sorted({p for p in _object_key_patterns(document) if p not in ("", "*") and not p.rstrip("*").endswith("/")})
    return [f"S3 prefix {p!r} does not end at '/'" for p in loose]


def _team_namespaces(resources: list) -> list[tuple[str, Props]]:
    return [((props.get("metadata") or {}).get("name", ""), props) for _, type_, props, _ in resources
            if type_ == NAMESPACE and _team_namespace(props)]


def check_team_lanes_admitted(resources: list) -> list[str]:
    """Each team namespace names its queue and PriorityClasses, and every kind its pods come from is checked by a
    denying admission policy bound to team namespaces (infra/admission.py)."""
    teams = _team_namespaces(resources)
    if not teams:
        return []
    violations = []
    for name, props in teams:
        metadata = props.get("metadata") or {}
        if not (metadata.get("annotations") or {}).get(ANNOTATION_QUEUE_NAME):
            violations.append(f"team namespace {name} has no {ANNOTATION_QUEUE_NAME} annotation")
        if not any(key.startswith(LABEL_PRIORITY_CLASS_PREFIX) for key in metadata.get("labels") or {}):
            violations.append(f"team namespace {name} allows no PriorityClass ({LABEL_PRIORITY_CLASS_PREFIX}<class>)")
    denying = set()
    for _, type_, props, _ in resources:
        spec = props.get("spec") or {}
        selector = (spec.get("matchResources") or {}).get("namespaceSelector") or {}
        keys = {e.get("key") for e in selector.get("matchExpressions") or []} | set(selector.get("matchLabels") or {})
        if type_ == ADMISSION_BINDING and "Deny" in (spec.get("validationActions") or []) and LABEL_TEAM in keys:
            denying.add(spec.get("policyName"))
    covered = set()
    for _, type_, props, _ in resources:
        spec = props.get("spec") or {}
        if type_ != ADMISSION_POLICY or (props.get("metadata") or {}).get("name") not in denying:
            continue
        if spec.get("matchConditions") or not spec.get("validations"):
            continue
        for rule in (spec.get("matchConstraints") or {}).get("resourceRules") or []:
            covered |= {(g, r) for g in rule.get("apiGroups") or [] for r in rule.get("resources") or []}
    missing = [f"{group or 'core'}/{resource}" for group, resource in LANE_RESOURCES if (group, resource) not in covered]
    if missing:
        violations.append(f"no denying admission policy bound to team namespaces checks {', '.join(missing)}")
    return violations


def check_team_services_in_cluster(resources: list) -> list[str]:
    """Every team namespace's quota allows no load balancer and no node port."""
    hard = {(props.get("metadata") or {}).get("namespace"): (props.get("spec") or {}).get("hard") or {}
            for _, type_, props, _ in resources if type_ == QUOTA}
    return [f"team namespace {name} allows Services outside the cluster: its quota needs services.loadbalancers and "
            "services.nodeports 0" for name, _ in _team_namespaces(resources)
            if any(str(hard.get(name, {}).get(key)) != "0" for key in ("services.loadbalancers", "services.nodeports"))]


def _user_data(value: Any) -> str:
    """User data as text: launch templates carry it base64-encoded, EC2NodeClasses in clear."""
    text = str(value or "")
    try:
        return base64.b64decode(text, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return text


def check_gpus_only_by_request(resources: list) -> list[str]:
    """GPU nodes hand GPUs only to pods that request them: the device plugin passes devices as volume mounts or
    CDI, and every GPU node's container toolkit ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers."""
    by_urn = {urn: (type_, props) for urn, type_, props, _ in resources}
    violations = []
    for _, type_, props, _ in resources:
        if type_ == RELEASE and "nvidia-device-plugin" in str(props.get("chart", "")):
            strategies = _as_list((props.get("values") or {}).get("deviceListStrategy"))
            if not strategies or not set(strategies) <= set(SAFE_DEVICE_LISTS):
                violations.append(f"NVIDIA device plugin deviceListStrategy {strategies or 'envvar (default)'}: use "
                                  f"one of {', '.join(SAFE_DEVICE_LISTS)}")
    for urn, type_, props, dependencies in resources:
        if type_ == NODE_GROUP and _is_gpu_node_group(props):
            templates = [by_urn.get(u, ("", {}))[1] for u in dependencies.get("launchTemplate", [])]
            if not any(TOOLKIT_ENVVAR_OFF in _user_data(t.get("userData")) for t in templates):
                violations.append(f"GPU node group {urn.rsplit('::', 1)[-1]}: its launch template user data must set "
                                  f"{TOOLKIT_ENVVAR_OFF}")
    gpu_classes = {((((props.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeClassRef") or {})
                   .get("name") for _, type_, props, _ in resources if type_ == NODE_POOL and _pool_selects_gpus(props)}
    for _, type_, props, _ in resources:
        name = (props.get("metadata") or {}).get("name")
        if type_ == NODE_CLASS and name in gpu_classes:
            if TOOLKIT_ENVVAR_OFF not in _user_data((props.get("spec") or {}).get("userData")):
                violations.append(f"EC2NodeClass {name} serves GPU NodePools: its userData must set {TOOLKIT_ENVVAR_OFF}")
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
    "tenant-names-not-reserved": ("Team namespaces and queues are never Kubernetes', an operator's or Volcano's.",
                                  check_tenant_names_not_reserved),
    "team-role-writes-no-runtime": ("Team roles cannot write TrainingRuntimes.", check_team_role_writes_no_runtime),
    "s3-prefixes-end-at-slash": ("S3 object ARNs and s3:prefix conditions end their prefix at '/'.",
                                 check_s3_prefixes_end_at_slash),
}
STACK_CHECKS: dict[str, tuple[str, Callable[[list], list[str]]]] = {
    "buckets-encrypted-and-private": ("Every S3 bucket has encryption and a public access block.",
                                      check_buckets_encrypted_and_private),
    "network-policies-enforced": ("NetworkPolicies come with the vpc-cni add-on enforcing them.",
                                  check_network_policies_enforced),
    "team-lanes-admitted": ("Team pods, PodGroups, jobs and Services are tied to the team's queue, PriorityClasses "
                            "and Volcano by admission.", check_team_lanes_admitted),
    "team-services-in-cluster": ("Team quotas allow no load balancer and no node port.", check_team_services_in_cluster),
    "gpus-only-by-request": ("GPU nodes hand GPUs only to pods that request them.", check_gpus_only_by_request),
}

POLICIES = [
    *(resource_policy(name, description, check) for name, (description, check) in RESOURCE_CHECKS.items()),
    *(stack_policy(name, description, check) for name, (description, check) in STACK_CHECKS.items()),
]
