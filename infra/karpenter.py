"""Karpenter: controller identity, node role, interruption queue, the pinned chart, EC2NodeClass and NodePools."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes

from gpuyard.infra.charts import KARPENTER, release_args
from gpuyard.infra.cluster import LABEL_GPU_NODE, MANAGED, NODE_POLICIES, SYSTEM_NODES
from gpuyard.infra.config import KarpenterConfig
from gpuyard.infra.conventions import (
    GPU_RESOURCE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    LABEL_CAPACITY_TYPE,
    LABEL_EFA_PRESENT,
    LABEL_GPU_PRESENT,
    LABEL_INSTANCE_FAMILY,
    LABEL_INSTANCE_TYPE,
    NODEPOOL_CPU,
    NODEPOOL_GPU_EFA,
    NODEPOOL_GPU_ON_DEMAND,
    NODEPOOL_GPU_SPOT,
    SPOT_NOTICE_SECONDS,
)
from gpuyard.infra.gpu_access import toolkit_script
from gpuyard.infra.instance_types import efa_types
from gpuyard.infra.policies import (
    interruption_queue_policy,
    irsa_assume_role_policy,
    karpenter_controller_policy,
    service_assume_role_policy,
)

NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "karpenter"
NODE_CLASS = "default"
# The EFA pool's own EC2NodeClass: an EC2NodeClass selects at most one placement group, and every instance launched
# from it goes into that group (aws/karpenter-provider-aws v1.14.1, pkg/apis/v1/ec2nodeclass.go
# PlacementGroupSelector, name or id; website/content/en/docs/concepts/nodeclasses.md, spec.placementGroupSelector:
# "Cluster — instances are placed in a single AZ ... (e.g., EFA workloads)").
EFA_NODE_CLASS = NODEPOOL_GPU_EFA
LABEL_ZONE = "topology.kubernetes.io/zone"
# The chart's own replica count; its required hostname anti-affinity puts each replica on its own node
# (aws/karpenter-provider-aws v1.14.1, charts/karpenter/values.yaml: replicas 2, affinity.podAntiAffinity
# requiredDuringSchedulingIgnoredDuringExecution topologyKey kubernetes.io/hostname), and the controllers run on
# the system node group only, so a stack gets no more replicas than it always has system nodes.
CHART_REPLICAS = 2
AMI_ALIAS = "al2023@latest"
INTERRUPTION_EVENTS = {
    "health": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "spot": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    "capacity-reservation": {
        "source": ["aws.ec2"], "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"]
    },
}  # the rules of aws/karpenter-provider-aws v1.14.1
# website/content/en/docs/getting-started/getting-started-with-karpenter/cloudformation.yaml
# EC2 needs this service-linked role to launch spot instances; a fresh account has none (Karpenter's getting started).
SPOT_ROLE_NAME = "AWSServiceRoleForEC2Spot"
SPOT_ROLE_PATH = "/aws-service-role/spot.amazonaws.com/"
# How long a node may drain before Karpenter deletes its pods anyway (karpenter.sh/v1 NodePool
# spec.template.spec.terminationGracePeriod): long enough for a job to write its checkpoint, short enough that
# teardown ends. Karpenter v1.14.1 never evicts a karpenter.sh/do-not-disrupt pod (every training pod) while
# draining; it deletes each pod at the node's deadline less the pod's terminationGracePeriodSeconds
# (kubernetes-sigs/karpenter v1.14.1 pkg/controllers/node/termination/terminator/terminator.go,
# DeleteExpiringPods). A spot pool's deadline is the interruption notice, so its pods get their whole grace period
# (GRACE_PERIOD_SECONDS["spot"]) before the instance goes; without it they would be force-deleted afterwards.
GPU_TERMINATION_GRACE = "1h"
SPOT_GPU_TERMINATION_GRACE = f"{SPOT_NOTICE_SECONDS}s"
CPU_TERMINATION_GRACE = "15m"


def termination_grace(gpu: bool, capacity_types: list[str]) -> str:
    if not gpu:
        return CPU_TERMINATION_GRACE
    return SPOT_GPU_TERMINATION_GRACE if capacity_types == ["spot"] else GPU_TERMINATION_GRACE


def gpu_taint() -> dict[str, str]:
    """The GPU taint in Kubernetes spelling (NodePools); pods carry the matching toleration."""
    return {"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT}


# The weekly maintenance window (UTC; Karpenter budgets have no time zones) in which drifted GPU nodes, busy ones
# included, are replaced: a new AMI (al2023@latest) or a changed node class drifts every node, and GPU nodes never
# expire (expireAfter Never). Budgets (kubernetes-sigs/karpenter v1.14.1, pkg/apis/v1/nodepool.go): a budget with
# a schedule is active from each schedule hit for its duration; an inactive one allows any number
# (Budget.GetAllowedDisruptions), and the smallest active budget for the reason wins
# (NodePool.GetAllowedDisruptionsByReason). So "0 drifted nodes" is active from the window's end until its next
# start, and "10%" always: 10% of the pool at a time in the window, none outside. Drift is "eventual" disruption
# (pkg/controllers/disruption/drift.go, types.go EventualDisruptionClass): with a terminationGracePeriod on the
# NodeClaim (every GPU pool has one) a node whose pods carry karpenter.sh/do-not-disrupt is still a candidate, and
# its pods get their grace period (checkpoint, exit 143, the operator restarts the gang) before the deadline.
MAINTENANCE_WINDOW_START = "0 2 * * 0"  # Sunday 02:00 UTC
MAINTENANCE_WINDOW_HOURS = 4
MAINTENANCE_BLACKOUT = {"schedule": "0 6 * * 0", "duration": f"{7 * 24 - MAINTENANCE_WINDOW_HOURS}h"}  # window end
MAINTENANCE_DRIFT_BUDGET = "10%"


def gpu_disruption() -> dict:
    """GPU nodes are reclaimed when empty; consolidation never evicts a running job, and drift replaces nodes (busy
    ones too) only in the weekly maintenance window."""
    return {
        "consolidationPolicy": "WhenEmpty",
        "consolidateAfter": "10m",
        "budgets": [
            {"nodes": "0", "reasons": ["Underutilized"]},
            {"nodes": "0", "reasons": ["Drifted"], **MAINTENANCE_BLACKOUT},
            {"nodes": MAINTENANCE_DRIFT_BUDGET, "reasons": ["Drifted"]},
            {"nodes": "10%", "reasons": ["Empty"]},
        ],
    }


def cpu_disruption() -> dict:
    return {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "1m", "budgets": [{"nodes": "10%"}]}


def node_pool_spec(
    name: str,
    *,
    capacity_types: list[str],
    families: tuple[str, ...],
    gpu: bool,
    limit: int,
    weight: int,
    efa_instance_types: tuple[str, ...] = (),
    zone: str | None = None,
) -> dict:
    """The ``spec`` of one Karpenter NodePool: what it may launch, its taint, labels, limits and disruption rules.

    GPU pools label their nodes ``nvidia.com/gpu.present`` for the device plugin and the DCGM exporter.
    With ``efa_instance_types`` the pool launches only those types and labels its nodes
    ``vpc.amazonaws.com/efa.present`` for the EFA device plugin. Karpenter v1.14 attaches EFA interfaces (all of
    the instance's, one per network card) to instances it launches for pods requesting ``vpc.amazonaws.com/efa``
    (aws/karpenter-provider-aws v1.14.1, website/content/en/docs/concepts/scheduling.md; EKS user guide
    "Manage EFA devices": "instances created for Pods that request vpc.amazonaws.com/efa have all interfaces
    configured as EFA"), so only EFA jobs, which select this pool, land on it. EFA pools launch from their own
    node class (a cluster placement group) and only in ``zone``: Karpenter v1.14.1 does not keep a placement group's
    instances in one zone itself, and EC2 cannot place a cluster placement group across zones (nor EFA traffic cross
    them), so the zone requirement is what keeps every node of the pool, and so every gang on it, together.
    """
    requirements = [
        {"key": LABEL_CAPACITY_TYPE, "operator": "In", "values": capacity_types},
        {"key": LABEL_INSTANCE_FAMILY, "operator": "In", "values": list(families)},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
    ]
    if efa_instance_types:
        requirements.append({"key": LABEL_INSTANCE_TYPE, "operator": "In", "values": list(efa_instance_types)})
        if zone:
            requirements.append({"key": LABEL_ZONE, "operator": "In", "values": [zone]})
    node_class = EFA_NODE_CLASS if efa_instance_types else NODE_CLASS
    template_spec: dict = {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class},
        "requirements": requirements,
        "expireAfter": "Never" if gpu else "720h",
        "terminationGracePeriod": termination_grace(gpu, capacity_types),
    }
    labels = {"gpuyard.io/nodepool": name}
    if gpu:
        template_spec["taints"] = [gpu_taint()]
        labels.update({LABEL_GPU_NODE: "true", LABEL_GPU_PRESENT: "true"})
    if efa_instance_types:
        labels[LABEL_EFA_PRESENT] = "true"
    return {
        "weight": weight,
        "template": {"metadata": {"labels": labels}, "spec": template_spec},
        "limits": {GPU_RESOURCE: str(limit)} if gpu else {"cpu": str(limit)},
        "disruption": gpu_disruption() if gpu else cpu_disruption(),
    }


def node_pools(config: KarpenterConfig, efa_zone: str | None = None) -> dict[str, dict]:
    """NodePool name -> spec: on-demand GPUs, spot GPUs (when enabled), EFA GPUs (when the families have
    EFA types; in ``efa_zone``) and general CPU."""
    pools = {
        NODEPOOL_GPU_ON_DEMAND: node_pool_spec(
            NODEPOOL_GPU_ON_DEMAND, capacity_types=["on-demand"], families=config.gpu_families, gpu=True,
            limit=config.gpu_limit, weight=50,
        ),
        NODEPOOL_CPU: node_pool_spec(
            NODEPOOL_CPU, capacity_types=["spot", "on-demand"] if config.spot else ["on-demand"],
            families=config.cpu_families, gpu=False, limit=config.cpu_limit, weight=10,
        ),
    }
    if config.spot:
        pools[NODEPOOL_GPU_SPOT] = node_pool_spec(
            NODEPOOL_GPU_SPOT, capacity_types=["spot"], families=config.gpu_families, gpu=True,
            limit=config.gpu_limit, weight=10,
        )
    efa = efa_types(config.gpu_families)
    if efa:
        pools[NODEPOOL_GPU_EFA] = node_pool_spec(
            NODEPOOL_GPU_EFA, capacity_types=["on-demand"], families=tuple(sorted({t.family for t in efa})),
            gpu=True, limit=config.gpu_limit, weight=5, efa_instance_types=tuple(t.name for t in efa), zone=efa_zone,
        )
    return pools


def ec2_node_class_spec(
    cluster_name: str, node_role: str, security_group_id: str, placement_group: str | None = None
) -> dict:
    """The EC2NodeClass: AL2023 (NVIDIA variant picked per instance), discovery-tagged subnets, IMDSv2 only, and
    with ``placement_group`` every instance in that placement group.

    Hop limit 1: pods (IRSA) cannot reach the node role's credentials through IMDS (aws/karpenter-provider-aws
    v1.14.1, ``website/content/en/docs/concepts/nodeclasses.md``, metadataOptions).
    """
    placement = {"placementGroupSelector": {"name": placement_group}} if placement_group else {}
    return {
        "role": node_role,
        "amiSelectorTerms": [{"alias": AMI_ALIAS}],
        "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": cluster_name}}],
        "securityGroupSelectorTerms": [{"id": security_group_id}],
        "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1},
        "blockDeviceMappings": [
            {"deviceName": "/dev/xvda", "ebs": {"volumeSize": "200Gi", "volumeType": "gp3", "encrypted": True}}
        ],
        "tags": {"karpenter.sh/discovery": cluster_name},
        "userData": toolkit_script(),  # GPUs only to pods that request them (infra/gpu_access.py)
        **placement,
    }


def controller_replicas(system_nodes: int) -> int:
    """The chart's replicas, but never more than the system nodes that always exist (each needs its own)."""
    return max(1, min(CHART_REPLICAS, system_nodes))


def karpenter_values(
    cluster_name: str, endpoint: str, queue_name: str, role_arn: str, region: str, system_nodes: int
) -> dict:
    """Helm values: cluster settings, the IRSA annotation, controllers on the system node group (at most one per
    node: ``controller_replicas``; a second replica with no node of its own would stay Pending).

    The region is given (chart value ``controller.env``): without AWS_REGION the controller asks IMDS
    (aws/karpenter-provider-aws v1.14.1, pkg/operator/operator.go), which hop limit 1 keeps pods from reaching.
    """
    return {
        "settings": {"clusterName": cluster_name, "clusterEndpoint": endpoint, "interruptionQueue": queue_name},
        "controller": {"env": [{"name": "AWS_REGION", "value": region}]},
        "serviceAccount": {"name": SERVICE_ACCOUNT, "annotations": {"eks.amazonaws.com/role-arn": role_arn}},
        "nodeSelector": SYSTEM_NODES,
        "replicas": controller_replicas(system_nodes),
    }


@dataclass(frozen=True)
class KarpenterArgs:
    cluster_name: str
    region: str
    config: KarpenterConfig
    cluster_endpoint: pulumi.Input[str]
    cluster_arn: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    oidc_provider_arn: pulumi.Input[str]
    oidc_issuer: pulumi.Input[str]
    aws_provider: aws.Provider
    k8s_provider: kubernetes.Provider
    efa_zone: str  # the one zone of every EFA node (the managed EFA groups' subnet too)
    system_nodes: int  # the system node group's min_size: nodes that always exist for the controllers


class Karpenter(pulumi.ComponentResource):
    """Everything Karpenter needs, then the node class and pools it provisions from."""

    controller_role_arn: pulumi.Output[str]
    node_role_name: pulumi.Output[str]
    queue_name: pulumi.Output[str]

    def __init__(self, name: str, args: KarpenterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:karpenter:Karpenter", name, None, opts)
        self._name = name
        self._args = args
        self._aws = pulumi.ResourceOptions(parent=self, provider=args.aws_provider)
        node_role, node_access = self._create_node_role()
        queue = self._create_interruption_queue()
        controller_role, controller_policy = self._create_controller_role(queue, node_role)
        iam = [controller_policy, *node_access, *self._create_spot_service_linked_role()]
        release = self._create_release(queue, controller_role, iam)
        pools = node_pools(args.config, args.efa_zone)
        node_classes = {NODE_CLASS: self._create_node_class(NODE_CLASS, node_role, release, iam)}
        if NODEPOOL_GPU_EFA in pools:
            placement = self._create_placement_group()
            node_classes[EFA_NODE_CLASS] = self._create_node_class(EFA_NODE_CLASS, node_role, release, iam, placement)
        self._create_node_pools(pools, node_classes)
        self.controller_role_arn = controller_role.arn
        self.node_role_name = node_role.name
        self.queue_name = queue.name
        self.register_outputs(
            {
                "controller_role_arn": self.controller_role_arn,
                "node_role_name": self.node_role_name,
                "queue_name": self.queue_name,
            }
        )

    def _k8s(self, *depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self._args.k8s_provider, depends_on=list(depends_on))

    def _create_node_role(self) -> tuple[aws.iam.Role, list[pulumi.Resource]]:
        """The node role, and what lets its nodes join (policy attachments, the access entry)."""
        role = aws.iam.Role(
            f"{self._name}-node",
            assume_role_policy=json.dumps(service_assume_role_policy("ec2.amazonaws.com")),
            opts=self._aws,
        )
        access: list[pulumi.Resource] = [
            aws.iam.RolePolicyAttachment(
                f"{self._name}-node-{policy}", role=role.name, policy_arn=f"{MANAGED}/{policy}", opts=self._aws
            )
            for policy in NODE_POLICIES
        ]
        access.append(aws.eks.AccessEntry(
            f"{self._name}-node",
            cluster_name=self._args.cluster_name,
            principal_arn=role.arn,
            type="EC2_LINUX",
            opts=self._aws,
        ))
        return role, access

    def _create_interruption_queue(self) -> aws.sqs.Queue:
        queue = aws.sqs.Queue(
            f"{self._name}-interruption",
            name=f"{self._args.cluster_name}-karpenter",
            message_retention_seconds=300,
            sqs_managed_sse_enabled=True,
            opts=self._aws,
        )
        aws.sqs.QueuePolicy(
            f"{self._name}-interruption",
            queue_url=queue.url,
            policy=queue.arn.apply(lambda arn: json.dumps(interruption_queue_policy(arn))),
            opts=self._aws,
        )
        for event, pattern in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(f"{self._name}-{event}", event_pattern=json.dumps(pattern), opts=self._aws)
            aws.cloudwatch.EventTarget(f"{self._name}-{event}", rule=rule.name, arn=queue.arn, opts=self._aws)
        return queue

    def _create_controller_role(
        self, queue: aws.sqs.Queue, node_role: aws.iam.Role
    ) -> tuple[aws.iam.Role, aws.iam.RolePolicy]:
        args = self._args
        role = aws.iam.Role(
            f"{self._name}-controller",
            assume_role_policy=pulumi.Output.all(args.oidc_provider_arn, args.oidc_issuer).apply(
                lambda v: json.dumps(irsa_assume_role_policy(v[0], v[1], NAMESPACE, SERVICE_ACCOUNT))
            ),
            opts=self._aws,
        )
        policy = aws.iam.RolePolicy(
            f"{self._name}-controller",
            role=role.id,
            policy=pulumi.Output.all(args.cluster_arn, queue.arn, node_role.arn).apply(
                lambda v: json.dumps(karpenter_controller_policy(args.cluster_name, v[0], v[1], v[2], args.region))
            ),
            opts=self._aws,
        )
        return role, policy

    def _create_spot_service_linked_role(self) -> list[aws.iam.ServiceLinkedRole]:
        """EC2's spot service-linked role, when spot is used and the account lacks it.

        The role is account-wide and cannot be created twice, so the program looks it up first and creates it only
        when absent, retained on delete: other stacks' spot nodes depend on it. The next run finds it and drops it
        from this stack's state without deleting it, so ``pulumi up`` never fails on an account that has it.
        """
        if not self._args.config.spot:
            return []
        existing = aws.iam.get_roles(
            name_regex=f"^{SPOT_ROLE_NAME}$", path_prefix=SPOT_ROLE_PATH,
            opts=pulumi.InvokeOptions(provider=self._args.aws_provider),
        )
        if existing.names:
            return []
        return [aws.iam.ServiceLinkedRole(
            f"{self._name}-spot-service-role", aws_service_name="spot.amazonaws.com",
            opts=pulumi.ResourceOptions.merge(self._aws, pulumi.ResourceOptions(retain_on_delete=True)),
        )]

    def _create_release(
        self, queue: aws.sqs.Queue, role: aws.iam.Role, iam: list[pulumi.Resource]
    ) -> kubernetes.helm.v3.Release:
        values = pulumi.Output.all(self._args.cluster_endpoint, queue.name, role.arn).apply(
            lambda v: karpenter_values(self._args.cluster_name, v[0], v[1], v[2], self._args.region,
                                       self._args.system_nodes)
        )
        return kubernetes.helm.v3.Release(
            f"{self._name}-chart", **release_args(KARPENTER, NAMESPACE), values=values, opts=self._k8s(*iam)
        )

    def _create_placement_group(self) -> aws.ec2.PlacementGroup:
        """The EFA pool's cluster placement group; EC2 fixes its zone at the first launch, the pool's zone
        requirement keeps every later one there."""
        return aws.ec2.PlacementGroup(
            f"{self._name}-{EFA_NODE_CLASS}", name=f"{self._args.cluster_name}-{EFA_NODE_CLASS}", strategy="cluster",
            opts=self._aws,
        )

    def _create_node_class(
        self, name: str, node_role: aws.iam.Role, release: kubernetes.helm.v3.Release, iam: list[pulumi.Resource],
        placement: aws.ec2.PlacementGroup | None = None,
    ) -> kubernetes.apiextensions.CustomResource:
        """Depends on the controller and its IAM (and its placement group), so destroy removes it (and the
        NodePools) while the controller can still terminate their instances, delete its instance profile and clear
        their finalizers."""
        spec = pulumi.Output.all(node_role.name, self._args.security_group_id, placement.name if placement else None)
        return kubernetes.apiextensions.CustomResource(
            f"{self._name}-{name}",
            api_version="karpenter.k8s.aws/v1",
            kind="EC2NodeClass",
            metadata={"name": name},
            spec=spec.apply(lambda v: ec2_node_class_spec(self._args.cluster_name, v[0], v[1], v[2])),
            opts=self._k8s(release, *iam, *([placement] if placement else [])),
        )

    def _create_node_pools(
        self, pools: dict[str, dict], node_classes: dict[str, kubernetes.apiextensions.CustomResource]
    ) -> None:
        for pool, spec in pools.items():
            kubernetes.apiextensions.CustomResource(
                f"{self._name}-{pool}",
                api_version="karpenter.sh/v1",
                kind="NodePool",
                metadata={"name": pool},
                spec=spec,
                opts=self._k8s(node_classes[spec["template"]["spec"]["nodeClassRef"]["name"]]),
            )
