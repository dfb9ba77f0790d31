"""``gpuyard env cleanup`` against a real moto_server: exactly the cluster's leftovers go, in order.

Seeds, for an ephemeral cluster, what Karpenter (instances, launch templates, instance profiles),
the VPC CNI (ENIs), the AWS Load Balancer Controller and the in-tree Service controller (classic and
network load balancers, the ``k8s-elb-*`` group EKS's cluster security group is opened to; the load balancer
controller's own security groups, tagged ``elbv2.k8s.aws/cluster`` only) leave behind, each with the tags those
controllers really use, plus look-alikes that must survive: the same kinds for another cluster, untagged ones,
and ones tagged for the cluster but owned by the stack or EKS, not Karpenter-launched, attached or shared
(``kubernetes.io/cluster/<c>=shared``). Faults go through a real HTTP proxy in front of moto that throttles,
goes down mid-way, or refuses to delete a security group another group still references, as EC2 does
(moto deletes it anyway). A cluster that still exists, or is no ephemeral environment's, is refused unless
``--force``.
"""

from __future__ import annotations

import http.client
import http.server
import os
import subprocess
import sys
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest

from gpuyard.infra.conventions import TAG_STACK
from gpuyard.jobs.ephemeral.cleanup import Cleaner, CleanupError, Orphan

pytestmark = pytest.mark.slow

CLUSTER, OTHER = "gpuyard-ephemeral-alpha", "gpuyard-ephemeral-beta"  # the template's cluster name + env name
REGION = "us-east-1"
GPUYARD = str(Path(sys.executable).with_name("gpuyard"))


def _tag_spec(kind: str, tags: dict[str, str]) -> list[dict]:
    return [{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}] if tags else []


def _elb_tags(tags: dict[str, str]) -> dict:
    return {"Tags": [{"Key": k, "Value": v} for k, v in tags.items()]} if tags else {}


@dataclass
class World:
    """IDs of everything seeded, by kind, split into what cleanup must delete and what must stay."""

    doomed: set[tuple[str, str]] = field(default_factory=set)
    kept: set[tuple[str, str]] = field(default_factory=set)


class Seeder:
    def __init__(self, endpoint: str):
        session = boto3.session.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
        self.ec2 = session.client("ec2", endpoint_url=endpoint)
        self.elbv2 = session.client("elbv2", endpoint_url=endpoint)
        self.elb = session.client("elb", endpoint_url=endpoint)
        self.iam = session.client("iam", endpoint_url=endpoint)
        self.eks = session.client("eks", endpoint_url=endpoint)
        self.node_role = self.iam.create_role(RoleName="karpenter-node", AssumeRolePolicyDocument="{}")["Role"]["RoleName"]
        self.vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnets = [self.ec2.create_subnet(VpcId=self.vpc, CidrBlock=f"10.0.{i}.0/24",
                                               AvailabilityZone=f"{REGION}{az}")["Subnet"]["SubnetId"]
                        for i, az in enumerate("ab", start=1)]
        self.world = World()
        self.count = 0
        self.groups: dict[str, tuple[str, str]] = {}  # cluster -> (EKS's cluster group, the k8s-elb group it opens to)

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}-{self.count}"

    def _record(self, doomed: bool, kind: str, resource_id: str) -> str:
        (self.world.doomed if doomed else self.world.kept).add((kind, resource_id))
        return resource_id

    def instance(self, tags: dict[str, str], doomed: bool) -> str:
        reply = self.ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
                                       SubnetId=self.subnets[0], TagSpecifications=_tag_spec("instance", tags))
        return self._record(doomed, "instance", reply["Instances"][0]["InstanceId"])

    def load_balancer(self, tags: dict[str, str], doomed: bool, kind: str = "application") -> str:
        lb = self.elbv2.create_load_balancer(Name=self._name("lb"), Subnets=self.subnets, Type=kind,
                                             **_elb_tags(tags))["LoadBalancers"][0]
        group = self.target_group(tags, doomed, protocol="HTTP" if kind == "application" else "TCP")
        self.elbv2.create_listener(LoadBalancerArn=lb["LoadBalancerArn"], Port=80,
                                   Protocol="HTTP" if kind == "application" else "TCP",
                                   DefaultActions=[{"Type": "forward", "TargetGroupArn": group}])
        return self._record(doomed, "load-balancer", lb["LoadBalancerArn"])

    def target_group(self, tags: dict[str, str], doomed: bool, protocol: str = "HTTP") -> str:
        group = self.elbv2.create_target_group(Name=self._name("tg"), Protocol=protocol, Port=80, VpcId=self.vpc,
                                               TargetType="ip", **_elb_tags(tags))["TargetGroups"][0]
        return self._record(doomed, "target-group", group["TargetGroupArn"])

    def security_group(self, tags: dict[str, str], doomed: bool, name: str = "sg") -> str:
        group = self.ec2.create_security_group(GroupName=self._name(name), Description="test", VpcId=self.vpc,
                                               TagSpecifications=_tag_spec("security-group", tags))["GroupId"]
        return self._record(doomed, "security-group", group)

    def open_to(self, group: str, source: str) -> None:
        """An ingress rule of ``group`` from ``source``, as the in-tree Service controller adds to the node group
        (kubernetes/cloud-provider-aws v1.36.1 pkg/providers/v1/aws.go updateInstanceSecurityGroupsForLoadBalancer)."""
        self.ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 30000, "ToPort": 32767, "UserIdGroupPairs": [{"GroupId": source}]}])

    def cluster_security_group(self, cluster: str) -> str:
        """EKS's cluster security group (kept: EKS deletes it with the cluster), HTTPS from the VPC."""
        group = self.security_group({f"kubernetes.io/cluster/{cluster}": "owned", "aws:eks:cluster-name": cluster},
                                    doomed=False, name=f"eks-cluster-sg-{cluster}")
        self.ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "IpRanges": [{"CidrIp": "10.0.0.0/16"}]}])
        return group

    def references(self, group: str) -> set[str]:
        """The groups ``group``'s ingress rules reference."""
        (found,) = self.ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"]
        return {pair["GroupId"] for rule in found["IpPermissions"] for pair in rule.get("UserIdGroupPairs", [])}

    def network_interface(self, tags: dict[str, str], doomed: bool, attach: bool = False) -> str:
        eni = self.ec2.create_network_interface(SubnetId=self.subnets[0], TagSpecifications=_tag_spec(
            "network-interface", tags))["NetworkInterface"]["NetworkInterfaceId"]
        if attach:
            host = self.instance({}, doomed=False)
            self.ec2.attach_network_interface(NetworkInterfaceId=eni, InstanceId=host, DeviceIndex=1)
        return self._record(doomed, "network-interface", eni)

    def classic_load_balancer(self, tags: dict[str, str], doomed: bool) -> str:
        name = self._name("elb")
        self.elb.create_load_balancer(LoadBalancerName=name, AvailabilityZones=[f"{REGION}a"], **_elb_tags(tags),
                                      Listeners=[{"Protocol": "TCP", "LoadBalancerPort": 80, "InstancePort": 30080}])
        return self._record(doomed, "classic-load-balancer", name)

    def launch_template(self, name: str, tags: dict[str, str], doomed: bool) -> str:
        template = self.ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={"ImageId": "ami-1"},
                                                   TagSpecifications=_tag_spec("launch-template", tags))
        return self._record(doomed, "launch-template", template["LaunchTemplate"]["LaunchTemplateId"])

    def instance_profile(self, path: str, tags: dict[str, str], doomed: bool) -> str:
        name = self._name("profile")
        self.iam.create_instance_profile(InstanceProfileName=name, Path=path, **_elb_tags(tags))
        self.iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=self.node_role)
        return self._record(doomed, "instance-profile", name)

    def volume(self, tags: dict[str, str], doomed: bool) -> str:
        volume = self.ec2.create_volume(Size=8, AvailabilityZone=f"{REGION}a",
                                        TagSpecifications=_tag_spec("volume", tags))["VolumeId"]
        return self._record(doomed, "volume", volume)

    def cluster_leftovers(self, cluster: str, doomed: bool) -> None:
        """What one cluster's controllers leave: Karpenter nodes, launch templates and instance profiles,
        ALB/NLB + TGs of the load balancer controller, classic and network LBs of the in-tree Service controller,
        SG, ENIs (the VPC CNI's too), PVC volume."""
        owned = {f"kubernetes.io/cluster/{cluster}": "owned"}
        karpenter = {**owned, "eks:eks-cluster-name": cluster, "karpenter.sh/nodepool": "gpu-on-demand",
                     "karpenter.k8s.aws/ec2nodeclass": "default"}
        self.instance({"karpenter.sh/nodepool": "gpu-on-demand", **owned}, doomed)
        self.instance({"karpenter.sh/nodepool": "gpu-spot", "eks:eks-cluster-name": cluster}, doomed)
        self.launch_template(f"karpenter.k8s.aws/{self._name('')}", karpenter, doomed)
        self.instance_profile(f"/karpenter/{REGION}/{cluster}/4f1c2e9a-uid/", {
            **owned, "eks:eks-cluster-name": cluster, "topology.kubernetes.io/region": REGION,
            "karpenter.k8s.aws/ec2nodeclass": "default"}, doomed)
        lbc = {"elbv2.k8s.aws/cluster": cluster, "ingress.k8s.aws/stack": "team-vision/train"}
        self.load_balancer(lbc, doomed, "application")
        self.load_balancer(lbc, doomed, "network")
        self.target_group(lbc, doomed)
        in_tree = {**owned, "kubernetes.io/service-name": "team-vision/tensorboard"}
        self.classic_load_balancer(in_tree, doomed)
        self.load_balancer(in_tree, doomed, "network")
        self.security_group({f"kubernetes.io/cluster/{cluster}": "owned", "elbv2.k8s.aws/cluster": cluster}, doomed)
        # the load balancer controller's groups carry its tag only (aws-load-balancer-controller v3.5.0,
        # pkg/networking/backend_sg_provider.go; pkg/deploy/tracking/provider.go)
        self.security_group({"elbv2.k8s.aws/cluster": cluster, "elbv2.k8s.aws/resource": "backend-sg"}, doomed,
                            name="k8s-traffic")
        self.security_group({"elbv2.k8s.aws/cluster": cluster, "elbv2.k8s.aws/resource": "ManagedLBSecurityGroup",
                             "ingress.k8s.aws/stack": "team-vision/train"}, doomed, name="k8s-team-visi")
        # an in-tree Service's group, which EKS's cluster security group is opened to
        elb_group = self.security_group({**owned, "kubernetes.io/service-name": "team-vision/tensorboard"}, doomed,
                                        name="k8s-elb-a1b2c3")
        eks_group = self.cluster_security_group(cluster)
        self.open_to(eks_group, elb_group)
        self.groups[cluster] = (eks_group, elb_group)
        self.network_interface(owned, doomed)
        self.network_interface({"cluster.k8s.amazonaws.com/name": cluster, "node.k8s.amazonaws.com/instance_id":
                                "i-0123456789abcdef0"}, doomed)
        self.volume({f"kubernetes.io/cluster/{cluster}": "owned", "kubernetes.io/created-for/pvc/name": "ckpt"}, doomed)

    def look_alikes(self, cluster: str) -> None:
        """Tagged for ``cluster`` but not ours to delete."""
        owned = {f"kubernetes.io/cluster/{cluster}": "owned"}
        self.instance({**owned, "eks:nodegroup-name": "system"}, doomed=False)  # managed node group, no Karpenter tag
        self.instance({"karpenter.sh/nodepool": "cpu", TAG_STACK: "eph", **owned}, doomed=False)
        self.security_group({**owned, TAG_STACK: "eph"}, doomed=False)  # the stack's node security group
        self.security_group({**owned, "aws:eks:cluster-name": cluster}, doomed=False)  # EKS's cluster SG
        self.load_balancer({"elbv2.k8s.aws/cluster": cluster, TAG_STACK: "eph"}, doomed=False)
        self.network_interface(owned, doomed=False, attach=True)  # in use
        self.network_interface({"cluster.k8s.amazonaws.com/name": cluster}, doomed=False, attach=True)  # in use
        shared = {f"kubernetes.io/cluster/{cluster}": "shared"}  # someone else's, used by the cluster
        self.volume(shared, doomed=False)
        self.classic_load_balancer(shared, doomed=False)
        self.security_group(shared, doomed=False)
        self.security_group({**shared, "elbv2.k8s.aws/cluster": cluster}, doomed=False)
        self.network_interface(shared, doomed=False)
        self.instance({**shared, "karpenter.sh/nodepool": "gpu-spot", "eks:eks-cluster-name": cluster}, doomed=False)
        self.load_balancer({**shared, "elbv2.k8s.aws/cluster": cluster}, doomed=False)
        self.launch_template("team-vision-workstation", {"eks:eks-cluster-name": cluster}, doomed=False)  # not Karpenter's
        profile_tags = {**owned, "topology.kubernetes.io/region": REGION}
        self.instance_profile(f"/karpenter/{REGION}/{cluster}2/uid/", {  # a cluster whose name extends this one's
            f"kubernetes.io/cluster/{cluster}2": "owned", "topology.kubernetes.io/region": REGION}, doomed=False)
        self.instance_profile(f"/karpenter/{REGION}/{cluster}/uid/", {**profile_tags, TAG_STACK: "eph"}, doomed=False)

    def untagged(self) -> None:
        self.instance({"karpenter.sh/nodepool": "gpu-on-demand"}, doomed=False)  # no cluster tag
        self.launch_template("karpenter.k8s.aws/1", {}, doomed=False)
        self.instance_profile(f"/karpenter/{REGION}/{CLUSTER}/uid/", {}, doomed=False)
        self.classic_load_balancer({}, doomed=False)
        self.load_balancer({}, doomed=False)
        self.target_group({}, doomed=False)
        self.security_group({}, doomed=False)
        self.network_interface({}, doomed=False)
        self.volume({}, doomed=False)

    def existing(self) -> set[tuple[str, str]]:
        """Which seeded resources still exist (terminated instances do not)."""
        seeded = self.world.doomed | self.world.kept
        ids = {kind: {i for k, i in seeded if k == kind} for kind, _ in seeded}
        live = {("instance", i["InstanceId"]) for r in self.ec2.describe_instances()["Reservations"]
                for i in r["Instances"] if i["State"]["Name"] != "terminated"}
        live |= {("load-balancer", lb["LoadBalancerArn"]) for lb in self.elbv2.describe_load_balancers()["LoadBalancers"]}
        live |= {("target-group", tg["TargetGroupArn"]) for tg in self.elbv2.describe_target_groups()["TargetGroups"]}
        live |= {("security-group", g["GroupId"]) for g in self.ec2.describe_security_groups()["SecurityGroups"]}
        live |= {("network-interface", e["NetworkInterfaceId"])
                 for e in self.ec2.describe_network_interfaces()["NetworkInterfaces"]}
        live |= {("volume", v["VolumeId"]) for v in self.ec2.describe_volumes()["Volumes"]}
        live |= {("launch-template", t["LaunchTemplateId"])
                 for t in self.ec2.describe_launch_templates()["LaunchTemplates"]}
        live |= {("instance-profile", p["InstanceProfileName"])
                 for p in self.iam.list_instance_profiles()["InstanceProfiles"]}
        live |= {("classic-load-balancer", lb["LoadBalancerName"])
                 for lb in self.elb.describe_load_balancers()["LoadBalancerDescriptions"]}
        return {(kind, i) for kind, i in live if i in ids.get(kind, ())}


def seed(endpoint: str) -> Seeder:
    seeder = Seeder(endpoint)
    seeder.cluster_leftovers(CLUSTER, doomed=True)
    seeder.cluster_leftovers(OTHER, doomed=False)
    seeder.look_alikes(CLUSTER)
    seeder.untagged()
    return seeder


class FaultyProxy:
    """An HTTP proxy on 127.0.0.1 in front of moto that can throttle or go down mid-way.

    ``throttle_every=n`` answers every n-th request with the service's throttling error;
    ``down_on=b"Action=X"`` forwards nothing from the first request containing it on, until
    ``up()``: the listener is closed (connection refused) and open connections are cut. Always, as EC2 does and
    moto does not, DeleteSecurityGroup of a group another group's rules reference fails with DependencyViolation.
    """

    def __init__(self, upstream_port: int, throttle_every: int = 0, down_on: bytes | None = None):
        self.upstream_port = upstream_port
        self.throttle_every = throttle_every
        self.down_on = down_on
        self.refused: list[str] = []
        self.ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=f"http://127.0.0.1:{upstream_port}",
                                aws_access_key_id="testing", aws_secret_access_key="testing")
        self.requests = self.throttled = 0
        self.down = threading.Event()
        self.lock = threading.Lock()
        self.server: http.server.ThreadingHTTPServer | None = None
        self.port = 0
        self._start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if proxy._goes_down(body):
                    self.close_connection = True
                    self.connection.close()
                    return
                if proxy._throttles():
                    self._reply(400, _throttling_body(self.headers.get("Authorization", "")), {})
                    return
                if referenced := proxy._still_referenced(body):
                    self._reply(400, _dependency_violation_body(referenced), {})
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                upstream.request(self.command, self.path, body, dict(self.headers))
                response = upstream.getresponse()
                self._reply(response.status, response.read(), dict(response.getheaders()))
                upstream.close()

            do_GET = do_POST

            def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _goes_down(self, body: bytes) -> bool:
        if self.down.is_set():
            return True
        if self.down_on and self.down_on in body:
            self.down.set()
            threading.Thread(target=self._close_listener, daemon=True).start()
            return True
        return False

    def _still_referenced(self, body: bytes) -> str:
        """The group a DeleteSecurityGroup names when another group's rules still reference it, else ""."""
        form = urllib.parse.parse_qs(body.decode(errors="ignore"))
        if form.get("Action") != ["DeleteSecurityGroup"]:
            return ""
        (group,) = form["GroupId"]
        holders = {g["GroupId"] for name in ("ip-permission.group-id", "egress.ip-permission.group-id")
                   for g in self.ec2.describe_security_groups(Filters=[{"Name": name, "Values": [group]}])[
                       "SecurityGroups"]} - {group}
        if holders:
            self.refused.append(group)
        return group if holders else ""

    def _throttles(self) -> bool:
        with self.lock:
            self.requests += 1
            throttle = bool(self.throttle_every) and self.requests % self.throttle_every == 0
            self.throttled += throttle
        return throttle

    def _close_listener(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def up(self) -> None:
        self.down_on = None
        self.down.clear()
        self._start()

    def close(self) -> None:
        if not self.down.is_set():
            self._close_listener()


def _throttling_body(authorization: str) -> bytes:
    if "/elasticloadbalancing/" in authorization:
        return (b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>"
                b"<Message>Rate exceeded</Message></Error><RequestId>1</RequestId></ErrorResponse>")
    return (b"<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded."
            b"</Message></Error></Errors><RequestID>1</RequestID></Response>")


def _dependency_violation_body(group: str) -> bytes:
    return (f"<Response><Errors><Error><Code>DependencyViolation</Code><Message>resource {group} has a dependent "
            "object</Message></Error></Errors><RequestID>1</RequestID></Response>").encode()


def gpuyard(*args: str, endpoint: str, stdin: str | None = None, extra_env: dict[str, str] | None = None):
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION, "COLUMNS": "200", **(extra_env or {})}
    stdin_source = {"stdin": subprocess.DEVNULL} if stdin is None else {"input": stdin}
    return subprocess.run([GPUYARD, *args], env=env, text=True, capture_output=True, timeout=300, **stdin_source)


@pytest.fixture
def seeded(local_aws):
    return seed(local_aws.endpoint_url)


def test_finds_exactly_the_clusters_leftovers_in_dependency_order(local_aws, seeded):
    plan = Cleaner(CLUSTER).find()
    assert {(o.kind, o.id) for o in plan} == seeded.world.doomed
    order = ["instance", "launch-template", "instance-profile", "classic-load-balancer", "load-balancer", "target-group",
             "network-interface", "security-group", "volume"]
    assert set(order) == {kind for kind, _ in seeded.world.doomed}
    assert [o.kind for o in plan] == sorted((o.kind for o in plan), key=order.index)


def test_cleanup_deletes_exactly_the_first_cluster_then_finds_nothing(local_aws, seeded):
    before = seeded.existing()
    first = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=local_aws.endpoint_url)
    assert first.returncode == 0, first.stdout + first.stderr
    assert seeded.existing() == before - seeded.world.doomed
    assert f"deleted {len(seeded.world.doomed)} resource(s)" in first.stdout

    second = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=local_aws.endpoint_url)
    assert second.returncode == 0 and f"nothing to clean up for cluster {CLUSTER}" in second.stdout
    assert seeded.existing() == before - seeded.world.doomed


def test_load_balancer_groups_go_after_their_references_are_revoked_and_shared_or_foreign_ones_stay(local_aws, seeded):
    """Through a proxy that refuses, as EC2 does, to delete a group still referenced: the load balancer controller's
    groups and the in-tree k8s-elb group go, EKS's cluster group loses only the rule that referenced it, and another
    cluster's groups and rules, and every shared-tagged resource, stay."""
    before = seeded.existing()
    proxy = FaultyProxy(local_aws.port)
    try:
        result = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=proxy.endpoint_url)
    finally:
        proxy.close()
    assert result.returncode == 0, result.stdout + result.stderr
    assert seeded.existing() == before - seeded.world.doomed
    eks_group, elb_group = seeded.groups[CLUSTER]
    assert f"revoked {eks_group}'s rule(s) referencing {elb_group}" in result.stdout
    (cluster_group,) = seeded.ec2.describe_security_groups(GroupIds=[eks_group])["SecurityGroups"]
    assert [(r["FromPort"], r["IpRanges"]) for r in cluster_group["IpPermissions"]] == [
        (443, [{"CidrIp": "10.0.0.0/16"}])]
    other_eks_group, other_elb_group = seeded.groups[OTHER]
    assert seeded.references(other_eks_group) == {other_elb_group}
    lbc = {g["GroupId"] for g in seeded.ec2.describe_security_groups(
        Filters=[{"Name": "tag:elbv2.k8s.aws/cluster", "Values": [CLUSTER]}])["SecurityGroups"]}
    assert all(("security-group", g) in seeded.world.kept for g in lbc)  # what is left is shared or the stack's


def test_a_group_another_clusters_group_references_is_left_reported_and_its_rule_kept(local_aws):
    seeder = Seeder(local_aws.endpoint_url)
    ours = seeder.security_group({"elbv2.k8s.aws/cluster": CLUSTER, "elbv2.k8s.aws/resource": "backend-sg"}, doomed=False)
    theirs = seeder.cluster_security_group(OTHER)
    seeder.open_to(theirs, ours)
    proxy = FaultyProxy(local_aws.port)
    try:
        cleaner = Cleaner(CLUSTER, wait_timeout=1.0, poll_interval=0.2)
        cleaner.ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=proxy.endpoint_url)
        report = cleaner.run(cleaner.find())
    finally:
        proxy.close()
    assert not report.ok and ours in proxy.refused
    assert [(o.id, "DependencyViolation" in why) for o, why in report.failed.items()] == [(ours, True)]
    assert seeder.references(theirs) == {ours}
    assert seeder.existing() == seeder.world.kept


def test_dry_run_lists_a_table_and_changes_nothing(local_aws, seeded):
    before = seeded.existing()
    result = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--dry-run", endpoint=local_aws.endpoint_url)
    assert result.returncode == 0, result.stderr
    assert "dry run: nothing deleted" in result.stdout
    for kind, resource_id in seeded.world.doomed:
        assert resource_id.rsplit("/", 1)[-1] in result.stdout, (kind, resource_id)
    assert seeded.existing() == before


@pytest.mark.parametrize("answer", ["n\n", "", None], ids=["no", "closed-stdin", "dev-null"])
def test_without_yes_it_asks_and_no_or_end_of_input_deletes_nothing(local_aws, seeded, answer):
    before = seeded.existing()
    result = gpuyard("env", "cleanup", "--cluster", CLUSTER, endpoint=local_aws.endpoint_url, stdin=answer)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "gpuyard: error: not confirmed, nothing deleted (pass --yes to skip the question)"]
    assert seeded.existing() == before


def test_answering_yes_deletes(local_aws, seeded):
    before = seeded.existing()
    result = gpuyard("env", "cleanup", "--cluster", CLUSTER, endpoint=local_aws.endpoint_url, stdin="y\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert seeded.existing() == before - seeded.world.doomed


def test_endpoint_lost_mid_way_reports_what_is_left_and_a_rerun_finishes(local_aws, seeded):
    before = seeded.existing()
    proxy = FaultyProxy(local_aws.port, down_on=b"Action=DeleteTargetGroup")
    try:
        broken = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=proxy.endpoint_url,
                         extra_env={"AWS_MAX_ATTEMPTS": "2"})
        assert broken.returncode == 1, broken.stdout + broken.stderr
        assert "stopped early: AWS endpoint lost" in broken.stdout
        left = seeded.existing()
        doomed_kinds_left = {kind for kind, _ in left & seeded.world.doomed}
        assert doomed_kinds_left == {"target-group", "network-interface", "security-group", "volume"}
        done = {"instance", "launch-template", "instance-profile", "classic-load-balancer", "load-balancer"}
        assert not {kind for kind, _ in before - left} - done  # done before the fault
        for _, resource_id in left & seeded.world.doomed:
            assert resource_id.rsplit("/", 1)[-1] in broken.stdout  # reported as left

        proxy.up()
        rerun = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=proxy.endpoint_url)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert seeded.existing() == before - seeded.world.doomed
    finally:
        proxy.close()


def test_throttled_requests_are_retried_and_cleanup_finishes(local_aws, seeded):
    before = seeded.existing()
    proxy = FaultyProxy(local_aws.port, throttle_every=6)
    try:
        result = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=proxy.endpoint_url)
        assert result.returncode == 0, result.stdout + result.stderr
        assert proxy.throttled >= 5
        assert seeded.existing() == before - seeded.world.doomed
    finally:
        proxy.close()


def test_a_resource_whose_tags_change_before_delete_is_left_alone(local_aws):
    seeder = Seeder(local_aws.endpoint_url)
    volume = seeder.volume({f"kubernetes.io/cluster/{CLUSTER}": "owned"}, doomed=False)
    cleaner = Cleaner(CLUSTER)
    plan = cleaner.find()
    assert plan == [Orphan("volume", volume, "", "8 GiB available")]
    seeder.ec2.create_tags(Resources=[volume], Tags=[{"Key": TAG_STACK, "Value": "adopted"}])
    report = cleaner.run(plan)
    assert not report.ok and report.failed[plan[0]].startswith("left alone")
    assert seeder.existing() == {("volume", volume)}


def test_empty_cluster_name_is_a_usage_error(local_aws):
    result = gpuyard("env", "cleanup", "--cluster", " ", "--yes", endpoint=local_aws.endpoint_url)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gpuyard: error: --cluster ' ': not an EKS cluster name (letters, digits, '-' and '_', starting with a letter "
        "or digit, at most 100)"]
    with pytest.raises(CleanupError, match="empty cluster name"):
        Cleaner("")


def test_unreachable_endpoint_before_any_change_is_one_line():
    from gpuyard.jobs.local_aws import free_port
    result = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=f"http://127.0.0.1:{free_port()}",
                     extra_env={"AWS_MAX_ATTEMPTS": "1"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuyard: error: AWS endpoint unreachable:")


def test_a_target_group_still_in_use_is_retried_then_reported_and_the_rest_is_deleted(local_aws):
    seeder = Seeder(local_aws.endpoint_url)
    seeder.cluster_leftovers(CLUSTER, doomed=True)
    stack_lb = seeder.load_balancer({TAG_STACK: "eph"}, doomed=False)  # the stack's LB, forwarding to a cluster TG
    busy = seeder.target_group({"elbv2.k8s.aws/cluster": CLUSTER}, doomed=False)
    seeder.elbv2.create_listener(LoadBalancerArn=stack_lb, Port=8080, Protocol="HTTP",
                                 DefaultActions=[{"Type": "forward", "TargetGroupArn": busy}])
    progress: list[str] = []
    cleaner = Cleaner(CLUSTER, wait_timeout=1.0, poll_interval=0.2, on_progress=progress.append)
    report = cleaner.run(cleaner.find())
    assert not report.ok and report.aborted is None
    assert [(o.id, "ResourceInUse" in why) for o, why in report.failed.items()] == [(busy, True)]
    assert [o.id for o in report.left] == [busy]
    assert any("still in use, retrying" in line for line in progress)
    assert seeder.existing() == seeder.world.kept


def test_refuses_a_cluster_that_still_exists_unless_forced(local_aws, seeded):
    seeded.eks.create_cluster(name=CLUSTER, roleArn="arn:aws:iam::123456789012:role/eks",
                              resourcesVpcConfig={"subnetIds": seeded.subnets})
    before = seeded.existing()
    refused = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=local_aws.endpoint_url)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"gpuyard: error: refusing to clean up: cluster {CLUSTER} still exists (ACTIVE) in us-east-1")
    assert "--force" in line
    assert seeded.existing() == before

    forced = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", "--force", endpoint=local_aws.endpoint_url)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert seeded.existing() == before - seeded.world.doomed


def test_refuses_a_cluster_that_is_not_an_ephemeral_environments_unless_forced(local_aws):
    seeder = Seeder(local_aws.endpoint_url)
    seeder.cluster_leftovers("gpuyard-prod", doomed=True)
    before = seeder.existing()
    refused = gpuyard("env", "cleanup", "--cluster", "gpuyard-prod", "--yes", endpoint=local_aws.endpoint_url)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "gpuyard: error: refusing to clean up: cluster gpuyard-prod is not an ephemeral environment's (their names "
        "start with gpuyard-ephemeral-): pass --force to clean it up anyway"]
    assert seeder.existing() == before

    forced = gpuyard("env", "cleanup", "--cluster", "gpuyard-prod", "--yes", "--force", endpoint=local_aws.endpoint_url)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert seeder.existing() == before - seeder.world.doomed


def test_aws_region_wins_over_aws_default_region(local_aws, seeded, monkeypatch):
    monkeypatch.delenv("AWS_REGION", raising=False)
    before = seeded.existing()
    elsewhere = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=local_aws.endpoint_url,
                        extra_env={"AWS_DEFAULT_REGION": "eu-west-1"})
    assert elsewhere.returncode == 0 and f"nothing to clean up for cluster {CLUSTER}" in elsewhere.stdout
    here = gpuyard("env", "cleanup", "--cluster", CLUSTER, "--yes", endpoint=local_aws.endpoint_url,
                   extra_env={"AWS_DEFAULT_REGION": "eu-west-1", "AWS_REGION": REGION})
    assert here.returncode == 0, here.stdout + here.stderr
    assert seeded.existing() == before - seeded.world.doomed
