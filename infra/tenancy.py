"""Tenancy: per team a namespace with quota, limits, a Volcano queue, RBAC, an IRSA identity, isolation and (with
Trainer v2) the team's TrainingRuntime.

Isolation: the namespace enforces a Pod Security Standard, NetworkPolicies deny what jobs do not need, and one
ValidatingAdmissionPolicy refuses privileged and host-reaching pods in every team namespace, whoever creates them
(people, or the operators that turn a team's job objects into pods).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes

from gpuyard.infra.admission import LANES, lane_binding_spec, lane_policy_name, lane_policy_spec
from gpuyard.infra.config import Team
from gpuyard.infra.conventions import (ANNOTATION_QUEUE_NAME, GPU_RESOURCE, LABEL_PART_OF, LABEL_PRIORITY_CLASS_PREFIX,
                               LABEL_TEAM, METRICS_PORT_NAME, PART_OF, PRIORITY_CLASSES, TRAINING_RUNTIME)
from gpuyard.infra.monitoring import NAMESPACE as MONITORING_NAMESPACE
from gpuyard.infra.policies import irsa_assume_role_policy, team_checkpoint_policy
from gpuyard.infra import trainer_runtime

# What team members create (each kind has its admission lane, infra/admission.py); TrainingRuntimes they only read:
# a runtime of their own could name any queue, priority and scheduler for the team's TrainJobs.
JOB_RESOURCES = {
    "kubeflow.org": ("pytorchjobs", "mpijobs"),
    "ray.io": ("rayjobs", "rayclusters"),
    "batch.volcano.sh": ("jobs",),
    "trainer.kubeflow.org": ("trainjobs",),
}
READ_ONLY_JOB_RESOURCES = {"trainer.kubeflow.org": ("trainingruntimes",)}
PSS_LABEL = "pod-security.kubernetes.io"  # kubernetes/pod-security-admission, api/constants.go
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
KUBE_DNS = {"k8s-app": "kube-dns"}  # CoreDNS pods of the EKS coredns add-on
KUBERAY_NAMESPACE = "kuberay-system"
# KubeRay's operator submits RayJobs to and polls the Ray head's dashboard
# (ray-project/kuberay v1.7, ray-operator/controllers/ray/utils/constant.go: DefaultDashboardPort).
RAY_DASHBOARD_PORT = 8265
RAY_HEAD = {"ray.io/node-type": "head"}
INSTANCE_METADATA = "169.254.169.254/32"
POD_ADMISSION_POLICY = "gpuyard-team-pods"


def team_labels(team: Team) -> dict[str, str]:
    return {LABEL_TEAM: team.name, LABEL_PART_OF: PART_OF}


def team_namespace_labels(team: Team) -> dict[str, str]:
    """The team labels (the admission policies select namespaces by ``LABEL_TEAM``), one label per PriorityClass the
    team may use (infra/admission.py), and the enforced Pod Security Standard, also audited and warned about so
    ``kubectl`` says why a pod is refused."""
    pss = {f"{PSS_LABEL}/{mode}": team.pod_security for mode in ("enforce", "audit", "warn")}
    priorities = {f"{LABEL_PRIORITY_CLASS_PREFIX}{name}": "allowed" for name in team.priority_classes}
    return {**team_labels(team), **priorities, **pss, f"{PSS_LABEL}/enforce-version": "latest"}


def team_namespace_annotations(team: Team) -> dict[str, str]:
    """The team's queue, where Volcano's PodGroup webhook reads a namespace's queue and the admission policies
    read the team's."""
    return {ANNOTATION_QUEUE_NAME: team.queue}


def team_quota() -> dict[str, str]:
    """ResourceQuota ``hard``: no Service reaches outside the cluster (no load balancer, no node port) and no Ingress
    is made (KubeRay makes one for ``enableIngress``).

    No GPUs, CPUs or memory: a team's compute limit is its Volcano queue's capability alone (``team_queue_spec``). A
    ResourceQuota charges a pod when it is created, Pending or not (kubernetes/kubernetes v1.35.4
    pkg/quota/v1/evaluator/core/pods.go, ``QuotaV1Pod``: every pod not Succeeded or Failed), one pod at a time; the
    operators create a gang's pods as soon as its PodGroup is Inqueue, which without the ``enqueue`` action
    (infra/operators.py) is at once for every gang, and the MPI Operator does not wait for it at all
    (kubeflow/mpi-operator v0.8.0 pkg/controller/mpi_job_controller.go: workers right after the PodGroup). A quota
    on compute then refuses the rest of gangs already half-created, and no gang of the team can become whole
    (volcano-sh/volcano#1387, #2534). The queue charges a pod only when Volcano places it, and the gang plugin
    places a gang whole or not at all. Every team pod is scheduled by Volcano (infra/admission.py), so none escapes
    its queue."""
    return {
        "services.loadbalancers": "0",
        "services.nodeports": "0",
        "count/ingresses.networking.k8s.io": "0",
    }


def team_limit_range() -> list[dict]:
    """Defaults for containers that set no requests/limits, so the team's queue can account for them."""
    return [
        {
            "type": "Container",
            "default": {"cpu": "1", "memory": "2Gi"},
            "defaultRequest": {"cpu": "250m", "memory": "512Mi"},
        }
    ]


def deserved_gpus(teams: tuple[Team, ...], supply: int) -> dict[str, int]:
    """Each team's weighted share of ``supply`` GPUs in whole GPUs (largest remainder), never above its quota."""
    total = sum(team.queue_weight for team in teams)
    exact = {team.name: Fraction(supply * team.queue_weight, total) for team in teams}
    shares = {name: int(share) for name, share in exact.items()}
    for name in sorted(exact, key=lambda n: shares[n] - exact[n])[: supply - sum(shares.values())]:
        shares[name] += 1
    return {team.name: min(shares[team.name], team.gpu_quota) for team in teams}


def team_queue_spec(team: Team, deserved_gpus: int) -> dict:
    """Volcano Queue: the team's compute limit (its GPUs, CPUs and memory: ``capability``, not the ResourceQuota's,
    see ``team_quota``), entitled to ``deserved_gpus``, reclaimable above that.

    The ``capacity`` plugin (infra/operators.py) lets a queue allocate up to its capability (bounded by what the
    cluster holds) and lets a starved queue reclaim from queues above their ``deserved`` (volcano-sh/volcano
    v1.14.1 pkg/scheduler/plugins/capacity/capacity.go, Reclaimable: ``checkDeservedExceedance``). CPU and memory
    are deserved up to the quota: a dimension missing from ``deserved`` makes every pod asking for it an immediate
    victim (``isImmediateVictim``), so only GPUs above the share are ever taken back. ``weight`` is what the
    share was computed from; the capacity plugin itself does not read it.
    """
    capability = {GPU_RESOURCE: str(team.gpu_quota), "cpu": str(team.cpu_quota), "memory": f"{team.memory_quota_gib}Gi"}
    return {
        "weight": team.queue_weight,
        "reclaimable": True,
        "capability": capability,
        "deserved": capability | {GPU_RESOURCE: str(min(deserved_gpus, team.gpu_quota))},
    }


def team_role_rules() -> list[dict]:
    """What team members may do in their namespace: run and inspect training jobs and their pods."""
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    return [
        *({"apiGroups": [group], "resources": list(resources), "verbs": verbs} for group, resources in JOB_RESOURCES.items()),
        *({"apiGroups": [group], "resources": list(resources), "verbs": ["get", "list", "watch"]}
          for group, resources in READ_ONLY_JOB_RESOURCES.items()),
        {
            "apiGroups": [""],
            "resources": ["pods", "pods/log", "services", "configmaps", "events"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
    ]


def team_group(team: Team) -> str:
    """The Kubernetes group a team's people are mapped to (via EKS access entries)."""
    return f"gpuyard:{team.name}"


def _namespace(name: str) -> dict:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}


def team_network_policies() -> dict[str, dict]:
    """NetworkPolicy name -> spec: deny by default, then what jobs need. Enforced by the vpc-cni add-on's
    ``enableNetworkPolicy`` (gpuyard.infra.cluster); policies add up, so each opens one path."""
    return {
        "default-deny": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        # ranks of one job (and a RayJob's submitter and head) talk to each other: NCCL, gloo, ssh, Ray GCS
        "allow-same-namespace": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
            "egress": [{"to": [{"podSelector": {}}]}],
        },
        "allow-dns": {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [{**_namespace("kube-system"), "podSelector": {"matchLabels": KUBE_DNS}}],
                "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
            }],
        },
        # S3 checkpoints, STS for IRSA: HTTPS anywhere but the instance metadata service
        "allow-https-egress": {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [INSTANCE_METADATA]}}],
                "ports": [{"port": 443, "protocol": "TCP"}],
            }],
        },
        "allow-metrics-scrape": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [_namespace(MONITORING_NAMESPACE)],
                "ports": [{"port": METRICS_PORT_NAME, "protocol": "TCP"}],
            }],
        },
        "allow-kuberay-operator": {
            "podSelector": {"matchLabels": RAY_HEAD},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [_namespace(KUBERAY_NAMESPACE)],
                "ports": [{"port": RAY_DASHBOARD_PORT, "protocol": "TCP"}],
            }],
        },
    }


POD_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _every_container(condition: str) -> str:
    """CEL: ``condition`` (over ``c``) holds for every container, init and ephemeral container of the pod."""
    return " && ".join(
        f"(!has(object.spec.{field}) || object.spec.{field}.all(c, {condition}))" for field in POD_CONTAINER_LISTS
    )


def pod_admission_validations() -> list[dict[str, str]]:
    """CEL validations of a pod: what no team pod may do, whatever Pod Security level its namespace has."""
    security = "!has(c.securityContext)"
    return [
        {
            "expression": _every_container(
                f"{security} || !has(c.securityContext.privileged) || c.securityContext.privileged == false"),
            "message": "privileged containers are not allowed in team namespaces",
        },
        {
            "expression": _every_container(
                f"{security} || !has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.add)"
                " || size(c.securityContext.capabilities.add) == 0"),
            "message": "containers in team namespaces may not add Linux capabilities",
        },
        {
            "expression": "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))",
            "message": "hostPath volumes are not allowed in team namespaces",
        },
        *(
            {
                "expression": f"!has(object.spec.{field}) || object.spec.{field} == false",
                "message": f"{field} is not allowed in team namespaces",
            }
            for field in ("hostNetwork", "hostPID", "hostIPC")
        ),
    ]


def pod_admission_policy_spec() -> dict:
    """ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1): pods created or updated, by anyone."""
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [{
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["pods", "pods/ephemeralcontainers"],
            }]
        },
        "validations": pod_admission_validations(),
    }


def pod_admission_binding_spec() -> dict:
    """Binds the policy to every namespace carrying a team label, denying (not just warning)."""
    return {
        "policyName": POD_ADMISSION_POLICY,
        "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchExpressions": [{"key": LABEL_TEAM, "operator": "Exists"}]}},
    }


@dataclass(frozen=True)
class TeamArgs:
    team: Team
    cluster_name: pulumi.Input[str]
    bucket_arn: pulumi.Input[str]
    oidc_provider_arn: pulumi.Input[str]
    oidc_issuer: pulumi.Input[str]
    operators: pulumi.Resource  # Volcano and the job operators: their finalizers sit on the team's jobs
    aws_provider: aws.Provider
    k8s_provider: kubernetes.Provider
    trainer: pulumi.Resource | None = None  # the Trainer v2 release: the team gets a TrainingRuntime per pool
    trainer_image: pulumi.Input[str] = ""
    runtime_pools: tuple[trainer_runtime.RuntimePool, ...] = ()
    checkpoint_bucket: str = ""  # the runtimes' checkpoint folders: s3://<bucket>/<team's prefix><job name>
    deserved_gpus: int = 0  # the team's share of the GPU pool (``deserved_gpus``)


class TeamTenancy(pulumi.ComponentResource):
    """One team's slice of the cluster; its service account may touch only its checkpoint prefix."""

    namespace: pulumi.Output[str]
    service_account: pulumi.Output[str]
    queue: pulumi.Output[str]
    role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: TeamArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:tenancy:Team", name, None, opts)
        self._name = name
        self._args = args
        self._team = args.team
        namespace = self._create_namespace()
        self._create_quota(namespace)
        self._create_limit_range(namespace)
        queue = self._create_queue()
        self._create_rbac(namespace)
        self._create_member_access()
        role = self._create_irsa_role()
        account = self._create_service_account(namespace, role)
        self._create_network_policies(namespace)
        if args.trainer is not None:
            self._create_training_runtime(namespace, args.trainer)
        self.namespace = namespace.metadata.name
        self.service_account = account.metadata.name
        self.queue = queue.metadata["name"]
        self.role_arn = role.arn
        self.register_outputs(
            {
                "namespace": self.namespace,
                "service_account": self.service_account,
                "queue": self.queue,
                "role_arn": self.role_arn,
            }
        )

    def _k8s(self, *depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self._args.k8s_provider, depends_on=list(depends_on))

    def _metadata(self, name: str) -> dict:
        return {"name": name, "namespace": self._team.namespace, "labels": team_labels(self._team)}

    def _create_namespace(self) -> kubernetes.core.v1.Namespace:
        """Depends on the operators, so destroy deletes it (and its jobs) while they can still clear the jobs'
        finalizers; the other way round the namespace hangs in Terminating."""
        return kubernetes.core.v1.Namespace(
            f"{self._name}-namespace",
            metadata={"name": self._team.namespace, "labels": team_namespace_labels(self._team),
                      "annotations": team_namespace_annotations(self._team)},
            opts=self._k8s(self._args.operators),
        )

    def _create_quota(self, namespace: kubernetes.core.v1.Namespace) -> None:
        kubernetes.core.v1.ResourceQuota(
            f"{self._name}-quota", metadata=self._metadata("team-quota"), spec={"hard": team_quota()},
            opts=self._k8s(namespace),
        )

    def _create_limit_range(self, namespace: kubernetes.core.v1.Namespace) -> None:
        kubernetes.core.v1.LimitRange(
            f"{self._name}-limits", metadata=self._metadata("team-defaults"), spec={"limits": team_limit_range()},
            opts=self._k8s(namespace),
        )

    def _create_queue(self) -> kubernetes.apiextensions.CustomResource:
        return kubernetes.apiextensions.CustomResource(
            f"{self._name}-queue",
            api_version="scheduling.volcano.sh/v1beta1",
            kind="Queue",
            metadata={"name": self._team.queue, "labels": team_labels(self._team)},
            spec=team_queue_spec(self._team, self._args.deserved_gpus),
            opts=self._k8s(self._args.operators),
        )

    def _create_rbac(self, namespace: kubernetes.core.v1.Namespace) -> None:
        role = kubernetes.rbac.v1.Role(
            f"{self._name}-role", metadata=self._metadata("team-member"), rules=team_role_rules(), opts=self._k8s(namespace)
        )
        kubernetes.rbac.v1.RoleBinding(
            f"{self._name}-role",
            metadata=self._metadata("team-member"),
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "team-member"},
            subjects=[{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": team_group(self._team)}],
            opts=self._k8s(role),
        )

    def _aws(self) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self._args.aws_provider)

    def _create_member_access(self) -> None:
        """EKS access entries putting the team's IAM roles in its Kubernetes group (bound to ``team-member``)."""
        for index, principal in enumerate(self._team.member_role_arns):
            aws.eks.AccessEntry(
                f"{self._name}-member-{index}",
                cluster_name=self._args.cluster_name,
                principal_arn=principal,
                kubernetes_groups=[team_group(self._team)],
                type="STANDARD",
                opts=self._aws(),
            )

    def _create_irsa_role(self) -> aws.iam.Role:
        team = self._team
        aws_opts = self._aws()
        role = aws.iam.Role(
            f"{self._name}-irsa",
            assume_role_policy=pulumi.Output.all(self._args.oidc_provider_arn, self._args.oidc_issuer).apply(
                lambda v: json.dumps(irsa_assume_role_policy(v[0], v[1], team.namespace, team.service_account))
            ),
            opts=aws_opts,
        )
        aws.iam.RolePolicy(
            f"{self._name}-checkpoints",
            role=role.id,
            policy=pulumi.Output.from_input(self._args.bucket_arn).apply(
                lambda arn: json.dumps(team_checkpoint_policy(arn, team.checkpoint_prefix, team.data_prefix))
            ),
            opts=aws_opts,
        )
        return role

    def _create_service_account(
        self, namespace: kubernetes.core.v1.Namespace, role: aws.iam.Role
    ) -> kubernetes.core.v1.ServiceAccount:
        return kubernetes.core.v1.ServiceAccount(
            f"{self._name}-sa",
            metadata={**self._metadata(self._team.service_account), "annotations": {"eks.amazonaws.com/role-arn": role.arn}},
            opts=self._k8s(namespace),
        )

    def _create_network_policies(self, namespace: kubernetes.core.v1.Namespace) -> None:
        for policy, spec in team_network_policies().items():
            kubernetes.networking.v1.NetworkPolicy(
                f"{self._name}-{policy}", metadata=self._metadata(policy), spec=spec, opts=self._k8s(namespace)
            )

    def _create_training_runtime(self, namespace: kubernetes.core.v1.Namespace, trainer: pulumi.Resource) -> None:
        team, args = self._team, self._args
        for pool in args.runtime_pools:
            kubernetes.apiextensions.CustomResource(
                f"{self._name}-training-runtime" + ("" if pool.runtime == TRAINING_RUNTIME
                                                    else f"-{pool.name}"),
                api_version=trainer_runtime.API_VERSION,
                kind=trainer_runtime.KIND,
                metadata=trainer_runtime.training_runtime_metadata(team, pool),
                spec=pulumi.Output.from_input(args.trainer_image).apply(
                    lambda image, pool=pool: trainer_runtime.training_runtime_spec(
                        team, pool, image, args.checkpoint_bucket)
                ),
                opts=self._k8s(namespace, trainer),
            )


@dataclass(frozen=True)
class PodAdmissionArgs:
    k8s_provider: kubernetes.Provider


class PodAdmission(pulumi.ComponentResource):
    """The admission policies and bindings of every team namespace: pods off the host, and each team's pods,
    PodGroups, jobs and Services in its lane (infra/admission.py)."""

    def __init__(self, name: str, args: PodAdmissionArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:tenancy:PodAdmission", name, None, opts)
        self._name = name
        self._k8s = pulumi.ResourceOptions(parent=self, provider=args.k8s_provider)
        self._create_policy("", POD_ADMISSION_POLICY, pod_admission_policy_spec(), pod_admission_binding_spec())
        for lane in LANES:
            self._create_policy(f"-{lane.name}", lane_policy_name(lane), lane_policy_spec(lane), lane_binding_spec(lane))
        self.register_outputs({})

    def _create_policy(self, suffix: str, policy_name: str, spec: dict, binding: dict) -> None:
        metadata = {"name": policy_name, "labels": {LABEL_PART_OF: PART_OF}}
        policy = kubernetes.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{self._name}{suffix}-policy", metadata=metadata, spec=spec, opts=self._k8s
        )
        kubernetes.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{self._name}{suffix}-binding", metadata=metadata, spec=binding,
            opts=pulumi.ResourceOptions.merge(self._k8s, pulumi.ResourceOptions(depends_on=[policy])),
        )


@dataclass(frozen=True)
class PriorityClassesArgs:
    k8s_provider: kubernetes.Provider


class PriorityClasses(pulumi.ComponentResource):
    """The cluster-wide PriorityClasses teams' jobs pick from (``gpuyard.infra.conventions.PRIORITY_CLASSES``)."""

    def __init__(self, name: str, args: PriorityClassesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:tenancy:PriorityClasses", name, None, opts)
        for class_name, value in PRIORITY_CLASSES.items():
            kubernetes.scheduling.v1.PriorityClass(
                f"{name}-{class_name}",
                metadata={"name": class_name, "labels": {LABEL_PART_OF: PART_OF}},
                value=value,
                global_default=False,
                preemption_policy="PreemptLowerPriority",
                description=f"gpuyard training priority {class_name}",
                opts=pulumi.ResourceOptions(parent=self, provider=args.k8s_provider),
            )
        self.register_outputs({})
