"""Delete what Kubernetes and Karpenter left in AWS for a cluster, in dependency order.

``pulumi destroy`` removes what the stack created. It cannot remove what controllers
created at run time: instances, launch templates and instance profiles Karpenter made,
load balancers and target groups of the AWS Load Balancer Controller and of the in-tree
Service controller (classic and network), their security groups, ENIs the VPC CNI left,
PVC volumes. Those block VPC deletion and keep billing. :class:`Cleaner` finds them by
the tags those controllers put on them, skips anything the stack or EKS itself owns
(``TAG_STACK``, ``aws:eks:cluster-name``) and anything tagged ``kubernetes.io/cluster/<c>=shared``
(someone else's, used by the cluster), re-reads every resource's tags right before
deleting it, and deletes kind by kind:

instances (waits for termination) -> launch templates -> instance profiles ->
classic load balancers -> load balancers (listeners go with them) -> target groups ->
available ENIs -> security groups -> available volumes.

A security group that this cluster's security groups still reference (the in-tree Service
controller opens the node security group, EKS's cluster security group, to its ``k8s-elb-*``
group; the load balancer controller does the same for its groups) cannot be deleted: those
rules are revoked first. A reference from any other group is left alone, and the group with it.

:meth:`Cleaner.refusal` says why a cluster must not be cleaned without ``--force``: it still
exists, or it is not an ephemeral environment's.

Each step lists its kind again, so ENIs and volumes that an earlier step freed are
included. Throttling is retried by botocore (standard mode); ``DependencyViolation``
and ``ResourceInUse`` by rounds with our own backoff. A lost endpoint stops the run;
the report says what is left, and a rerun picks up from there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import boto3
import botocore.config
import botocore.exceptions
from botocore.exceptions import ClientError

from gpuyard.infra.conventions import LABEL_NODEPOOL, TAG_STACK

Tags = Mapping[str, str]
Described = dict[str, tuple[dict[str, str], str]]  # id -> (tags, state, or the name or path a check needs)

EKS_CLUSTER_NAME_TAG = "eks:eks-cluster-name"  # Karpenter v1 puts it on the instances it launches
# The AWS Load Balancer Controller tags everything it creates, its security groups included, with the cluster's name
# (kubernetes-sigs/aws-load-balancer-controller v3.5.0, pkg/shared_constants/tag_keys.go TagKeyK8sCluster;
# pkg/deploy/tracking/provider.go "applied on all AWS resources"; pkg/networking/backend_sg_provider.go tags its
# shared backend group so, with elbv2.k8s.aws/resource=backend-sg), and no kubernetes.io/cluster tag.
LBC_CLUSTER_TAG = "elbv2.k8s.aws/cluster"
EKS_MANAGED_TAG = "aws:eks:cluster-name"  # EKS's own cluster security group: deleted with the cluster
# The VPC CNI tags the ENIs it creates with the cluster's name (aws/amazon-vpc-cni-k8s, pkg/awsutils/awsutils.go).
VPC_CNI_CLUSTER_TAG = "cluster.k8s.amazonaws.com/name"
# Karpenter v1.14.1 (aws/karpenter-provider-aws): launch templates are named karpenter.k8s.aws/<hash>
# (pkg/providers/launchtemplate/launchtemplate.go, LaunchTemplateNamePrefix = apis.Group) and tagged like its
# instances; instance profiles live under /karpenter/<region>/<cluster>/<EC2NodeClass uid>/
# (pkg/providers/instanceprofile/instanceprofile.go), tagged kubernetes.io/cluster/<cluster>=owned,
# topology.kubernetes.io/region and karpenter.k8s.aws/ec2nodeclass (the request tags its IAM policy demands,
# website/content/en/docs/getting-started/getting-started-with-karpenter/cloudformation.yaml, at v1.14.1).
KARPENTER_LAUNCH_TEMPLATE_PREFIX = "karpenter.k8s.aws/"
REGION_TAG = "topology.kubernetes.io/region"
LIVE_INSTANCE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")
NOT_FOUND_CODES = frozenset({
    "InvalidInstanceID.NotFound", "LoadBalancerNotFound", "TargetGroupNotFound",
    "InvalidNetworkInterfaceID.NotFound", "InvalidGroup.NotFound", "InvalidVolume.NotFound",
    "InvalidLaunchTemplateId.NotFound", "NoSuchEntity",
})
ENDPOINT_ERRORS = (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)
DEFAULT_MAX_ATTEMPTS = 10  # botocore standard retries (throttling, 5xx, connection); AWS_MAX_ATTEMPTS overrides
ELBV2_TAGS_BATCH = 20


class CleanupError(RuntimeError):
    """Cleanup could not start (no region, no credentials, endpoint down), as one line."""


def resolve_region(region: str | None) -> str | None:
    """``--region``, else ``AWS_REGION`` (what the AWS CLI v2 and the other SDKs read first), else None: boto3
    then reads ``AWS_DEFAULT_REGION`` and the profile."""
    return region or os.environ.get("AWS_REGION") or None


def cluster_tag(cluster: str) -> str:
    """The tag the in-tree cloud provider and Karpenter put on what they create for a cluster, value ``owned``;
    ``shared`` marks a resource the cluster uses but must not destroy with it (kubernetes/cloud-provider-aws v1.36.1,
    pkg/providers/v1/tags.go: TagNameKubernetesClusterPrefix, ResourceLifecycleOwned, ResourceLifecycleShared)."""
    return f"kubernetes.io/cluster/{cluster}"


def karpenter_profile_path(region: str, cluster: str) -> str:
    return f"/karpenter/{region}/{cluster}/"


def not_ours(tags: Tags, cluster: str) -> bool:
    """Created by the Pulumi stack or by EKS itself (their own destroy removes it), or shared with the cluster by
    someone else: never deleted here."""
    return TAG_STACK in tags or EKS_MANAGED_TAG in tags or tags.get(cluster_tag(cluster)) == "shared"


def karpenter_instance(tags: Tags, cluster: str) -> bool:
    for_cluster = cluster_tag(cluster) in tags or tags.get(EKS_CLUSTER_NAME_TAG) == cluster
    return LABEL_NODEPOOL in tags and for_cluster and not not_ours(tags, cluster)


def load_balancer_controller_resource(tags: Tags, cluster: str) -> bool:
    return tags.get(LBC_CLUSTER_TAG) == cluster and not not_ours(tags, cluster)


def service_load_balancer_resource(tags: Tags, cluster: str) -> bool:
    """A load balancer or target group of the AWS Load Balancer Controller or of the in-tree Service controller."""
    return load_balancer_controller_resource(tags, cluster) or cluster_owned(tags, cluster)


def vpc_cni_interface(tags: Tags, cluster: str) -> bool:
    return tags.get(VPC_CNI_CLUSTER_TAG) == cluster and not not_ours(tags, cluster)


def karpenter_launch_template(name: str, tags: Tags, cluster: str) -> bool:
    for_cluster = tags.get(EKS_CLUSTER_NAME_TAG) == cluster or cluster_owned(tags, cluster)
    return name.startswith(KARPENTER_LAUNCH_TEMPLATE_PREFIX) and for_cluster and not not_ours(tags, cluster)


def karpenter_instance_profile(path: str, tags: Tags, cluster: str, region: str) -> bool:
    return (path.startswith(karpenter_profile_path(region, cluster)) and cluster_owned(tags, cluster)
            and tags.get(REGION_TAG) == region)  # cluster_owned excludes what the stack owns


def cluster_owned(tags: Tags, cluster: str) -> bool:
    return tags.get(cluster_tag(cluster)) == "owned" and not not_ours(tags, cluster)


def cluster_security_group(tags: Tags, cluster: str) -> bool:
    """A group the in-tree Service controller (``k8s-elb-*``, owned) or the load balancer controller made."""
    return cluster_owned(tags, cluster) or load_balancer_controller_resource(tags, cluster)


def references_revocable(tags: Tags, cluster: str) -> bool:
    """A group of this cluster whose rules pointing at a doomed group may be revoked: EKS's cluster security group,
    or one of the cluster's own (owned or the load balancer controller's); never a shared or another cluster's."""
    return tags.get(cluster_tag(cluster)) != "shared" and (
        tags.get(EKS_MANAGED_TAG) == cluster or cluster_security_group(tags, cluster))


@dataclass(frozen=True, order=True)
class Orphan:
    """One resource to delete; ``id`` is what the delete call takes (an ID or an ARN)."""

    kind: str
    id: str
    name: str = ""
    detail: str = ""


@dataclass
class Report:
    deleted: list[Orphan] = field(default_factory=list)
    failed: dict[Orphan, str] = field(default_factory=dict)
    left: list[Orphan] = field(default_factory=list)
    aborted: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.failed or self.left or self.aborted)


def _tags(items: Iterable[Mapping[str, str]] | None) -> dict[str, str]:
    return {item["Key"]: item["Value"] for item in items or ()}


def _error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def _permissions_referencing(permissions: list[dict], group_id: str) -> list[dict]:
    """The parts of ``permissions`` that reference ``group_id``, as revoke calls take them."""
    found = []
    for permission in permissions:
        pairs = [{"GroupId": pair["GroupId"]} for pair in permission.get("UserIdGroupPairs", [])
                 if pair.get("GroupId") == group_id]
        if pairs:
            found.append({key: permission[key] for key in ("IpProtocol", "FromPort", "ToPort") if key in permission}
                         | {"UserIdGroupPairs": pairs})
    return found


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _retry_config() -> botocore.config.Config:
    retries = {"mode": "standard"}
    if "AWS_MAX_ATTEMPTS" not in os.environ:  # botocore reads it itself when set
        retries["max_attempts"] = DEFAULT_MAX_ATTEMPTS
    return botocore.config.Config(retries=retries)


@dataclass(frozen=True)
class Kind:
    """How to list, re-read and delete one kind of resource."""

    name: str
    find: Callable[[], list[Orphan]]
    describe: Callable[[list[str]], Described]  # only what still exists (terminated instances do not)
    deletable: Callable[[dict[str, str], str], bool]  # tags and state, checked right before each delete
    delete: Callable[[str], object]
    retry_codes: frozenset[str] = frozenset()


class Cleaner:
    """Finds and deletes one cluster's leftovers through boto3 (``AWS_ENDPOINT_URL`` is honoured)."""

    def __init__(self, cluster: str, region: str | None = None, *, wait_timeout: float = 600.0,
                 poll_interval: float = 2.0, on_progress: Callable[[str], None] = lambda message: None):
        if not cluster.strip():
            raise CleanupError("empty cluster name: pass --cluster NAME")
        self.cluster = cluster
        self.wait_timeout = wait_timeout
        self.poll_interval = poll_interval
        self.on_progress = on_progress
        try:
            session = boto3.session.Session(region_name=resolve_region(region))
            self.ec2 = session.client("ec2", config=_retry_config())
            self.elbv2 = session.client("elbv2", config=_retry_config())
            self.elb = session.client("elb", config=_retry_config())
            self.iam = session.client("iam", config=_retry_config())
            self.eks = session.client("eks", config=_retry_config())
        except botocore.exceptions.NoRegionError:
            raise CleanupError("no AWS region: pass --region or set AWS_REGION") from None
        except ValueError as error:  # botocore's "Invalid endpoint: ..." for a malformed AWS_ENDPOINT_URL
            raise CleanupError(f"the AWS endpoint (AWS_ENDPOINT_URL {os.environ.get('AWS_ENDPOINT_URL', '')!r}) is "
                               f"not a URL: {_one_line(error)}") from None
        self.region = session.region_name
        self.kinds = (
            Kind("instance", self._find_instances, self._describe_instances,
                 lambda tags, state: karpenter_instance(tags, cluster),
                 lambda instance: self.ec2.terminate_instances(InstanceIds=[instance])),
            Kind("launch-template", self._find_launch_templates, self._describe_launch_templates,
                 lambda tags, name: karpenter_launch_template(name, tags, cluster),
                 lambda template: self.ec2.delete_launch_template(LaunchTemplateId=template)),
            Kind("instance-profile", self._find_instance_profiles, self._describe_instance_profiles,
                 lambda tags, path: karpenter_instance_profile(path, tags, cluster, self.region),
                 self._delete_instance_profile),
            Kind("classic-load-balancer", self._find_classic_load_balancers, self._describe_classic_load_balancers,
                 lambda tags, state: cluster_owned(tags, cluster),
                 lambda name: self.elb.delete_load_balancer(LoadBalancerName=name)),
            Kind("load-balancer", self._find_load_balancers, self._describe_load_balancers,
                 lambda tags, state: service_load_balancer_resource(tags, cluster),
                 lambda arn: self.elbv2.delete_load_balancer(LoadBalancerArn=arn)),
            Kind("target-group", self._find_target_groups, self._describe_target_groups,
                 lambda tags, state: service_load_balancer_resource(tags, cluster),
                 lambda arn: self.elbv2.delete_target_group(TargetGroupArn=arn), frozenset({"ResourceInUse"})),
            Kind("network-interface", self._find_network_interfaces, self._describe_network_interfaces,
                 lambda tags, state: (cluster_owned(tags, cluster) or vpc_cni_interface(tags, cluster))
                 and state == "available",
                 lambda eni: self.ec2.delete_network_interface(NetworkInterfaceId=eni)),
            Kind("security-group", self._find_security_groups, self._describe_security_groups,
                 lambda tags, state: cluster_security_group(tags, cluster) and state != "default",
                 self._delete_security_group, frozenset({"DependencyViolation"})),
            Kind("volume", self._find_volumes, self._describe_volumes,
                 lambda tags, state: cluster_owned(tags, cluster) and state == "available",
                 lambda volume: self.ec2.delete_volume(VolumeId=volume)),
        )

    # -- the entry points -----------------------------------------------------

    def cluster_status(self) -> str | None:
        """The EKS cluster's status (ACTIVE, DELETING, ...), or None when it does not exist."""
        try:
            return self.eks.describe_cluster(name=self.cluster)["cluster"].get("status", "")
        except ClientError as error:
            if _error_code(error) == "ResourceNotFoundException":
                return None
            raise CleanupError(f"cannot tell whether cluster {self.cluster!r} exists: {_one_line(error)}") from None
        except ENDPOINT_ERRORS as error:
            raise CleanupError(f"AWS endpoint unreachable: {_one_line(error)}") from None
        except botocore.exceptions.BotoCoreError as error:  # no credentials, a bad profile
            raise CleanupError(f"cannot tell whether cluster {self.cluster!r} exists: {_one_line(error)}") from None

    def refusal(self, ephemeral_prefix: str) -> str | None:
        """Why this cluster must not be cleaned up (it still exists, or is no ephemeral environment's), or None."""
        status = self.cluster_status()
        if status is not None:
            return (f"cluster {self.cluster} still exists ({status}) in {self.region}: its controllers own these "
                    "resources; destroy its stack first (`gpuyard env destroy`), or pass --force")
        if not self.cluster.startswith(ephemeral_prefix):
            return (f"cluster {self.cluster} is not an ephemeral environment's (their names start with "
                    f"{ephemeral_prefix}): pass --force to clean it up anyway")
        return None

    def find(self) -> list[Orphan]:
        """Everything that would be deleted now, in deletion order."""
        try:
            return self._find_all()
        except ENDPOINT_ERRORS as error:
            raise CleanupError(f"AWS endpoint unreachable: {_one_line(error)}") from None
        except (ClientError, botocore.exceptions.BotoCoreError) as error:
            raise CleanupError(f"cannot list resources of cluster {self.cluster!r}: {_one_line(error)}") from None

    def run(self, plan: list[Orphan]) -> Report:
        """Delete ``plan`` and whatever each step finds anew; report what is left."""
        report = Report()
        seen = list(plan)
        try:
            for kind in self.kinds:
                found = kind.find()
                seen += [orphan for orphan in found if orphan not in seen]
                targets = sorted({*found, *(orphan for orphan in plan if orphan.kind == kind.name)})
                if targets:
                    self._delete_kind(kind, targets, report)
            report.left = self._find_all()
        except ENDPOINT_ERRORS as error:
            report.aborted = f"AWS endpoint lost: {_one_line(error)}"
            report.left = [orphan for orphan in seen if orphan not in report.deleted]
        return report

    def _find_all(self) -> list[Orphan]:
        return [orphan for kind in self.kinds for orphan in kind.find()]

    # -- deleting ---------------------------------------------------------------

    def _delete_kind(self, kind: Kind, targets: list[Orphan], report: Report) -> None:
        """Re-check tags, delete, retry dependency errors in rounds, then wait until gone."""
        requested: list[Orphan] = []
        pending = targets
        deadline = time.monotonic() + self.wait_timeout
        delay = self.poll_interval
        while pending:
            current = kind.describe([orphan.id for orphan in pending])
            retry = []
            for orphan in pending:
                if orphan.id not in current:
                    report.deleted.append(orphan)  # already gone: a rerun or someone else
                    continue
                tags, state = current[orphan.id]
                if not kind.deletable(tags, state):
                    report.failed[orphan] = f"left alone: tags or state changed ({state})"
                    continue
                try:
                    kind.delete(orphan.id)
                except ClientError as error:
                    code = _error_code(error)
                    if code in NOT_FOUND_CODES:
                        report.deleted.append(orphan)
                    elif code in kind.retry_codes and time.monotonic() < deadline:
                        retry.append(orphan)
                    else:
                        report.failed[orphan] = _one_line(error)
                    continue
                requested.append(orphan)
                self.on_progress(f"deleting {orphan.kind} {orphan.id} {orphan.name}".rstrip())
            if retry:
                self.on_progress(f"{len(retry)} {kind.name}(s) still in use, retrying in {delay:.0f}s")
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
            pending = retry
        self._wait_gone(kind, requested, report)

    def _wait_gone(self, kind: Kind, orphans: list[Orphan], report: Report) -> None:
        deadline = time.monotonic() + self.wait_timeout
        remaining = {orphan.id: orphan for orphan in orphans}
        while remaining:
            still = kind.describe(list(remaining))
            gone = [remaining.pop(orphan_id) for orphan_id in list(remaining) if orphan_id not in still]
            report.deleted += gone
            if gone:
                self.on_progress(f"{len(gone)} {kind.name}(s) gone")
            if not remaining:
                return
            if time.monotonic() >= deadline:
                for orphan_id, orphan in remaining.items():
                    report.failed[orphan] = f"still {still[orphan_id][1]} after {self.wait_timeout:.0f}s"
                return
            time.sleep(self.poll_interval)

    # -- EC2 instances ------------------------------------------------------------

    def _instances(self, filters: list[dict]) -> Iterable[dict]:
        pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
        for page in pages:
            for reservation in page["Reservations"]:
                yield from reservation["Instances"]

    def _find_instances(self) -> list[Orphan]:
        filters = [{"Name": "tag-key", "Values": [LABEL_NODEPOOL]},
                   {"Name": "instance-state-name", "Values": list(LIVE_INSTANCE_STATES)}]
        return [Orphan("instance", i["InstanceId"], _tags(i.get("Tags")).get("Name", ""),
                       f"{_tags(i.get('Tags'))[LABEL_NODEPOOL]} {i.get('InstanceType', '')}".strip())
                for i in self._instances(filters) if karpenter_instance(_tags(i.get("Tags")), self.cluster)]

    def _describe_instances(self, ids: list[str]) -> Described:
        filters = [{"Name": "instance-id", "Values": ids},
                   {"Name": "instance-state-name", "Values": list(LIVE_INSTANCE_STATES)}]
        return {i["InstanceId"]: (_tags(i.get("Tags")), i["State"]["Name"]) for i in self._instances(filters)}

    # -- Karpenter's launch templates and instance profiles ---------------------------

    def _launch_templates(self) -> list[dict]:
        filters = [{"Name": f"tag:{EKS_CLUSTER_NAME_TAG}", "Values": [self.cluster]}]
        pages = self.ec2.get_paginator("describe_launch_templates").paginate(Filters=filters)
        return [template for page in pages for template in page["LaunchTemplates"]]

    def _find_launch_templates(self) -> list[Orphan]:
        return [Orphan("launch-template", t["LaunchTemplateId"], t["LaunchTemplateName"])
                for t in self._launch_templates()
                if karpenter_launch_template(t["LaunchTemplateName"], _tags(t.get("Tags")), self.cluster)]

    def _describe_launch_templates(self, ids: list[str]) -> Described:
        return {t["LaunchTemplateId"]: (_tags(t.get("Tags")), t["LaunchTemplateName"])
                for t in self._launch_templates() if t["LaunchTemplateId"] in ids}

    def _instance_profiles(self) -> list[tuple[dict, dict[str, str]]]:
        """This cluster's profiles under Karpenter's path, with their tags (GetInstanceProfile carries them)."""
        prefix = karpenter_profile_path(self.region, self.cluster)
        pages = self.iam.get_paginator("list_instance_profiles").paginate(PathPrefix=prefix)
        names = [profile["InstanceProfileName"] for page in pages for profile in page["InstanceProfiles"]]
        profiles = [self.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"] for name in names]
        return [(profile, _tags(profile.get("Tags"))) for profile in profiles]

    def _find_instance_profiles(self) -> list[Orphan]:
        return [Orphan("instance-profile", p["InstanceProfileName"], "",
                       ", ".join(role["RoleName"] for role in p.get("Roles", [])))
                for p, tags in self._instance_profiles()
                if karpenter_instance_profile(p["Path"], tags, self.cluster, self.region)]

    def _describe_instance_profiles(self, names: list[str]) -> Described:
        return {p["InstanceProfileName"]: (tags, p["Path"])
                for p, tags in self._instance_profiles() if p["InstanceProfileName"] in names}

    def _delete_instance_profile(self, name: str) -> None:
        """Detach its role (a profile holds at most one), then delete it, as Karpenter does."""
        for role in self.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"].get("Roles", []):
            self.iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=role["RoleName"])
        self.iam.delete_instance_profile(InstanceProfileName=name)

    # -- classic ELB (in-tree Service controller) -------------------------------------

    def _classic_load_balancers(self) -> list[tuple[dict, dict[str, str]]]:
        pages = self.elb.get_paginator("describe_load_balancers").paginate()
        balancers = [lb for page in pages for lb in page["LoadBalancerDescriptions"]]
        tags: dict[str, dict[str, str]] = {}
        for batch in _chunks([lb["LoadBalancerName"] for lb in balancers], ELBV2_TAGS_BATCH):
            for description in self.elb.describe_tags(LoadBalancerNames=batch)["TagDescriptions"]:
                tags[description["LoadBalancerName"]] = _tags(description.get("Tags"))
        return [(lb, tags.get(lb["LoadBalancerName"], {})) for lb in balancers]

    def _find_classic_load_balancers(self) -> list[Orphan]:
        return [Orphan("classic-load-balancer", lb["LoadBalancerName"], lb.get("DNSName", ""), "classic")
                for lb, tags in self._classic_load_balancers() if cluster_owned(tags, self.cluster)]

    def _describe_classic_load_balancers(self, names: list[str]) -> Described:
        return {lb["LoadBalancerName"]: (tags, "") for lb, tags in self._classic_load_balancers()
                if lb["LoadBalancerName"] in names}

    # -- ELBv2 ----------------------------------------------------------------------

    def _elbv2_tags(self, arns: list[str]) -> dict[str, dict[str, str]]:
        tags: dict[str, dict[str, str]] = {}
        for batch in _chunks(arns, ELBV2_TAGS_BATCH):
            for description in self.elbv2.describe_tags(ResourceArns=batch)["TagDescriptions"]:
                tags[description["ResourceArn"]] = _tags(description.get("Tags"))
        return tags

    def _load_balancers(self) -> list[tuple[dict, dict[str, str]]]:
        """Every load balancer of the region, with its tags."""
        pages = self.elbv2.get_paginator("describe_load_balancers").paginate()
        balancers = [lb for page in pages for lb in page["LoadBalancers"]]
        tags = self._elbv2_tags([lb["LoadBalancerArn"] for lb in balancers])
        return [(lb, tags.get(lb["LoadBalancerArn"], {})) for lb in balancers]

    def _find_load_balancers(self) -> list[Orphan]:
        return [Orphan("load-balancer", lb["LoadBalancerArn"], lb["LoadBalancerName"], lb.get("Type", ""))
                for lb, tags in self._load_balancers() if service_load_balancer_resource(tags, self.cluster)]

    def _describe_load_balancers(self, arns: list[str]) -> Described:
        return {lb["LoadBalancerArn"]: (tags, lb.get("State", {}).get("Code", ""))
                for lb, tags in self._load_balancers() if lb["LoadBalancerArn"] in arns}

    def _target_groups(self) -> list[tuple[dict, dict[str, str]]]:
        """Every target group of the region, with its tags."""
        pages = self.elbv2.get_paginator("describe_target_groups").paginate()
        groups = [tg for page in pages for tg in page["TargetGroups"]]
        tags = self._elbv2_tags([tg["TargetGroupArn"] for tg in groups])
        return [(tg, tags.get(tg["TargetGroupArn"], {})) for tg in groups]

    def _find_target_groups(self) -> list[Orphan]:
        return [Orphan("target-group", tg["TargetGroupArn"], tg["TargetGroupName"], tg.get("TargetType", ""))
                for tg, tags in self._target_groups() if service_load_balancer_resource(tags, self.cluster)]

    def _describe_target_groups(self, arns: list[str]) -> Described:
        return {tg["TargetGroupArn"]: (tags, "") for tg, tags in self._target_groups() if tg["TargetGroupArn"] in arns}

    # -- ENIs, security groups, volumes -----------------------------------------------

    def _network_interfaces(self, filters: list[dict]) -> list[dict]:
        pages = self.ec2.get_paginator("describe_network_interfaces").paginate(Filters=filters)
        return [eni for page in pages for eni in page["NetworkInterfaces"]]

    def _find_network_interfaces(self) -> list[Orphan]:
        """Available ENIs tagged for the cluster by Kubernetes controllers or by the VPC CNI."""
        available = {"Name": "status", "Values": ["available"]}
        found = {eni["NetworkInterfaceId"]: eni for filters in (
            [{"Name": "tag-key", "Values": [cluster_tag(self.cluster)]}, available],
            [{"Name": f"tag:{VPC_CNI_CLUSTER_TAG}", "Values": [self.cluster]}, available],
        ) for eni in self._network_interfaces(filters)}
        return [Orphan("network-interface", eni["NetworkInterfaceId"], eni.get("Description", ""), eni["Status"])
                for eni in found.values() if eni["Status"] == "available" and (
                    cluster_owned(_tags(eni.get("TagSet")), self.cluster)
                    or vpc_cni_interface(_tags(eni.get("TagSet")), self.cluster))]

    def _describe_network_interfaces(self, ids: list[str]) -> Described:
        found = self._network_interfaces([{"Name": "network-interface-id", "Values": ids}])
        return {eni["NetworkInterfaceId"]: (_tags(eni.get("TagSet")), eni["Status"]) for eni in found}

    def _security_groups(self, filters: list[dict]) -> list[dict]:
        pages = self.ec2.get_paginator("describe_security_groups").paginate(Filters=filters)
        return [group for page in pages for group in page["SecurityGroups"]]

    def _find_security_groups(self) -> list[Orphan]:
        """The in-tree controller's groups (owned) and the load balancer controller's (its own tag only)."""
        found = {g["GroupId"]: g for filters in (
            [{"Name": f"tag:{cluster_tag(self.cluster)}", "Values": ["owned"]}],
            [{"Name": f"tag:{LBC_CLUSTER_TAG}", "Values": [self.cluster]}],
        ) for g in self._security_groups(filters)}
        return [Orphan("security-group", g["GroupId"], g["GroupName"], g.get("VpcId", ""))
                for g in found.values()
                if cluster_security_group(_tags(g.get("Tags")), self.cluster) and g["GroupName"] != "default"]

    def _delete_security_group(self, group_id: str) -> None:
        """Revoke the rules of this cluster's groups that reference ``group_id`` (kubernetes/cloud-provider-aws
        v1.36.1 pkg/providers/v1/aws.go: updateInstanceSecurityGroupsForLoadBalancer opens the instances' tagged
        group to the ``k8s-elb-*`` group), then delete it; any other reference makes EC2 refuse (DependencyViolation)."""
        for direction, filter_name, revoke in (
            ("IpPermissions", "ip-permission.group-id", self.ec2.revoke_security_group_ingress),
            ("IpPermissionsEgress", "egress.ip-permission.group-id", self.ec2.revoke_security_group_egress),
        ):
            for holder in self._security_groups([{"Name": filter_name, "Values": [group_id]}]):
                if holder["GroupId"] == group_id or not references_revocable(_tags(holder.get("Tags")), self.cluster):
                    continue
                permissions = _permissions_referencing(holder[direction], group_id)
                if permissions:
                    revoke(GroupId=holder["GroupId"], IpPermissions=permissions)
                    self.on_progress(f"revoked {holder['GroupId']}'s rule(s) referencing {group_id}")
        self.ec2.delete_security_group(GroupId=group_id)

    def _describe_security_groups(self, ids: list[str]) -> Described:
        found = self._security_groups([{"Name": "group-id", "Values": ids}])
        return {g["GroupId"]: (_tags(g.get("Tags")), "default" if g["GroupName"] == "default" else "") for g in found}

    def _volumes(self, filters: list[dict]) -> list[dict]:
        pages = self.ec2.get_paginator("describe_volumes").paginate(Filters=filters)
        return [volume for page in pages for volume in page["Volumes"]]

    def _find_volumes(self) -> list[Orphan]:
        filters = [{"Name": f"tag:{cluster_tag(self.cluster)}", "Values": ["owned"]},
                   {"Name": "status", "Values": ["available"]}]
        return [Orphan("volume", v["VolumeId"], _tags(v.get("Tags")).get("Name", ""), f"{v['Size']} GiB {v['State']}")
                for v in self._volumes(filters)
                if cluster_owned(_tags(v.get("Tags")), self.cluster) and v["State"] == "available"]

    def _describe_volumes(self, ids: list[str]) -> Described:
        return {v["VolumeId"]: (_tags(v.get("Tags")), v["State"])
                for v in self._volumes([{"Name": "volume-id", "Values": ids}])}
