"""Least privilege in the planned stacks: Karpenter's IAM as v1.14.1 ships it, the spot service-linked role,
IMDS hop limit 1 on every node, an API endpoint never open to the internet, EKS versions in support."""

from __future__ import annotations

import json
import logging
from datetime import date

import pytest

from gpuyard.infra.config import ConfigError, load_stack, parse_stack
from gpuyard.infra.eks_versions import Support, support
from gpuyard.infra.karpenter import SPOT_ROLE_NAME
from gpuyard.infra.plan import plan_values, stack_values
from gpuyard.infra.policies import karpenter_controller_policy
from infra_plans import named, of_type, planned

CLUSTER, REGION = "c1", "eu-west-1"
CLUSTER_ARN = f"arn:aws:eks:{REGION}:111122223333:cluster/{CLUSTER}"
MUTATING = ("ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate", "ec2:CreateTags",
            "ec2:TerminateInstances", "ec2:DeleteLaunchTemplate", "iam:CreateInstanceProfile",
            "iam:TagInstanceProfile", "iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile",
            "iam:DeleteInstanceProfile", "iam:PassRole")


def _statements() -> dict[str, dict]:
    policy = karpenter_controller_policy(CLUSTER, CLUSTER_ARN, "arn:aws:sqs:q", "arn:aws:iam::1:role/node", REGION)
    return {s["Sid"]: s for s in policy["Statement"]}


def _actions(statement: dict) -> list[str]:
    return [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]


def test_no_mutating_action_on_any_resource_without_a_condition():
    """Unconditioned launches only name what an instance is launched *from* (images, subnets, security groups...)."""
    inputs = ("image/*", "snapshot/*", "security-group/*", "subnet/*", "capacity-reservation/*", "placement-group/*")
    for sid, statement in _statements().items():
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        if set(_actions(statement)) & set(MUTATING):
            assert "Condition" in statement or all(r.endswith(inputs) for r in resources), sid
            assert "*" not in resources, sid


def test_creation_needs_the_cluster_and_nodepool_request_tags():
    statements = _statements()
    for sid in ("AllowScopedEC2InstanceActionsWithTags", "AllowScopedResourceCreationTagging"):
        condition = statements[sid]["Condition"]
        assert condition["StringEquals"]["aws:RequestTag/kubernetes.io/cluster/c1"] == "owned"
        assert condition["StringEquals"]["aws:RequestTag/eks:eks-cluster-name"] == CLUSTER
        assert condition["StringLike"] == {"aws:RequestTag/karpenter.sh/nodepool": "*"}
    create_tags = statements["AllowScopedResourceCreationTagging"]
    assert create_tags["Condition"]["StringEquals"]["ec2:CreateAction"] == [
        "RunInstances", "CreateFleet", "CreateLaunchTemplate"]


def test_termination_and_later_tagging_need_the_resource_tags_not_just_a_taggable_one():
    statements = _statements()
    deletion = statements["AllowScopedDeletion"]["Condition"]
    assert deletion == {"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/c1": "owned"},
                        "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}}
    retag = statements["AllowScopedResourceTagging"]
    assert retag["Resource"] == f"arn:aws:ec2:{REGION}:*:instance/*"
    assert retag["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"] == [
        "eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]  # cannot add the cluster or nodepool tag


def test_instance_profiles_by_request_and_resource_tags_in_this_account():
    statements = _statements()
    create = statements["AllowScopedInstanceProfileCreationActions"]
    assert create["Resource"] == "arn:aws:iam::111122223333:instance-profile/*"
    assert create["Condition"]["StringEquals"]["aws:RequestTag/topology.kubernetes.io/region"] == REGION
    assert create["Condition"]["StringLike"] == {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"}
    manage = statements["AllowScopedInstanceProfileActions"]
    assert manage["Condition"]["StringEquals"] == {"aws:ResourceTag/kubernetes.io/cluster/c1": "owned",
                                                   "aws:ResourceTag/topology.kubernetes.io/region": REGION}
    assert statements["AllowInstanceProfileReadActions"]["Resource"] == create["Resource"]


def test_reads_what_v1_14_reads_in_its_region():
    reads = _statements()["AllowRegionalReadActions"]
    assert "ec2:DescribeInstanceStatus" in reads["Action"]
    assert reads["Condition"] == {"StringEquals": {"aws:RequestedRegion": REGION}}
    assert _statements()["AllowAPIServerEndpointDiscovery"]["Resource"] == CLUSTER_ARN


def test_partition_follows_the_cluster_arn():
    policy = karpenter_controller_policy(CLUSTER, "arn:aws-cn:eks:cn-north-1:1:cluster/c1", "q", "r", "cn-north-1")
    deletion = next(s for s in policy["Statement"] if s["Sid"] == "AllowScopedDeletion")
    assert deletion["Resource"][0] == "arn:aws-cn:ec2:cn-north-1:*:instance/*"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_planned_controller_policy_is_the_scoped_one(stack):
    policy = json.loads(named(planned(stack), "karpenter-controller", "aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    sids = {s["Sid"] for s in policy["Statement"]}
    assert {"AllowScopedEC2InstanceActionsWithTags", "AllowScopedDeletion", "AllowRegionalReadActions"} <= sids
    assert not [s for s in policy["Statement"] if s["Resource"] == "*" and set(_actions(s)) & set(MUTATING)]


def test_capacity_reservation_interruptions_reach_the_queue():
    resources = planned("dev")
    patterns = [json.loads(r.inputs["eventPattern"]) for r in of_type(resources, "aws:cloudwatch/eventRule:EventRule")]
    assert {"source": ["aws.ec2"], "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"]} in patterns


SLR = "aws:iam/serviceLinkedRole:ServiceLinkedRole"


def test_spot_stack_creates_the_spot_service_linked_role_and_never_deletes_it():
    (role,) = of_type(planned("dev"), SLR)
    assert role.inputs["awsServiceName"] == "spot.amazonaws.com"
    assert role.retain_on_delete


def test_an_account_that_has_the_spot_role_gets_none_created():
    resources = plan_values("dev", stack_values("dev"), account_roles=(SPOT_ROLE_NAME, "other")).resources
    assert not of_type(resources, SLR)
    assert of_type(resources, "kubernetes:karpenter.sh/v1:NodePool")  # the rest of the stack is planned


def test_no_spot_no_spot_role():
    assert not load_stack("prod").karpenter.spot
    assert not of_type(planned("prod"), SLR)


@pytest.mark.parametrize("stack", ["dev", "prod", "ephemeral"])
def test_every_node_has_imds_hop_limit_one(stack):
    resources = planned(stack)
    templates = of_type(resources, "aws:ec2/launchTemplate:LaunchTemplate")
    assert templates
    for template in templates:
        assert template.inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1, template.name
    node_classes = of_type(resources, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    assert node_classes
    for node_class in node_classes:
        assert node_class.inputs["spec"]["metadataOptions"]["httpPutResponseHopLimit"] == 1, node_class.name


EKS = "aws:eks/cluster:Cluster"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"


@pytest.mark.parametrize("stack", ["dev", "prod", "ephemeral"])
def test_api_endpoint_is_never_open_to_anywhere(stack):
    (cluster,) = of_type(planned(stack), EKS)
    vpc = cluster.inputs["vpcConfig"]
    if vpc["endpointPublicAccess"]:
        assert vpc["publicAccessCidrs"] == list(load_stack(stack).cluster.public_access_cidrs)
        assert not {"0.0.0.0/0", "::/0"} & set(vpc["publicAccessCidrs"])
    else:
        assert "publicAccessCidrs" not in vpc


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"endpoint_public": True}, "cluster.endpoint_public needs cluster.public_access_cidrs"),
        ({"endpoint_public": True, "public_access_cidrs": ["0.0.0.0/0"]}, "opens the Kubernetes API to the whole internet"),
        ({"private_access_cidrs": ["::/0"]}, "cluster.private_access_cidrs: '::/0' opens"),
        ({"endpoint_public": True, "public_access_cidrs": ["10.0.0.300/8"]}, "'10.0.0.300/8' is not a CIDR network"),
        ({"endpoint_public": True, "endpoint_private": False, "public_access_cidrs": ["198.51.100.0/24"],
          "private_access_cidrs": ["10.9.0.0/16"]}, "private_access_cidrs needs cluster.endpoint_private"),
        ({"public_access_cidrs": ["198.51.100.0/24"]}, "public_access_cidrs needs cluster.endpoint_public: true"),
    ],
)
def test_endpoint_access_mistakes_are_refused_at_config_time(cluster, message):
    with pytest.raises(ConfigError, match=message):
        parse_stack("t", {"gpuyard:cluster_name": "t", "gpuyard:cluster": cluster})


def test_prod_private_endpoint_admits_the_vpc_and_the_deploying_network_on_443():
    resources = planned("prod")
    (cluster,) = of_type(resources, EKS)
    assert cluster.inputs["vpcConfig"]["endpointPublicAccess"] is False
    rules = of_type(resources, INGRESS)
    assert sorted(r.inputs["cidrIpv4"] for r in rules) == ["10.100.0.0/16", "10.30.0.0/16"]
    for rule in rules:
        assert (rule.inputs["fromPort"], rule.inputs["toPort"], rule.inputs["ipProtocol"]) == (443, 443, "tcp")
        assert rule.inputs["securityGroupId"] == "sg-gpuyard-prod"  # the cluster security group


def test_endpoint_notice_says_where_pulumi_up_must_run():
    private = load_stack("prod").cluster.endpoint_notice("10.30.0.0/16")
    assert private.startswith("private EKS endpoint: run `pulumi up` and kubectl from 10.30.0.0/16, 10.100.0.0/16")
    assert "\n" not in private and "VPN" in private
    public = load_stack("dev").cluster.endpoint_notice("10.20.0.0/16")
    assert public == ("public EKS endpoint open to 198.51.100.0/24, 203.0.113.0/24; private endpoint from 10.20.0.0/16")


@pytest.mark.parametrize(
    ("version", "today", "expected"),
    [
        ("1.35", date(2026, 12, 2), Support.STANDARD),
        ("1.34", date(2026, 12, 1), Support.STANDARD),
        ("1.34", date(2026, 12, 2), Support.EXTENDED),  # extended support bills from the start of its first day
        ("1.33", date(2026, 7, 29), Support.EXTENDED),
        ("1.31", date(2026, 11, 26), Support.ENDED),
        ("1.35", date(2028, 3, 27), Support.ENDED),
    ],
)
def test_eks_support_windows(version, today, expected):
    assert support(version, today) is expected


TODAY = date(2026, 12, 2)


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"kubernetes_version": "1.30"}, "kubernetes_version '1.30' left EKS extended support on 2026-07-23"),
        ({"kubernetes_version": "1.33"}, "left EKS standard support on 2026-07-29 .* set cluster.allow_extended_support"),
        ({"kubernetes_version": "1.36"}, "'1.36' is not an EKS version"),
        ({"kubernetes_version": "1.30", "allow_extended_support": True}, "left EKS extended support"),
    ],
)
def test_unsupported_versions_are_refused(cluster, message):
    with pytest.raises(ConfigError, match=message):
        parse_stack("t", {"gpuyard:cluster_name": "t", "gpuyard:cluster": cluster}, today=TODAY)


def test_extended_support_is_a_written_choice_and_sets_the_upgrade_policy():
    values = {**stack_values("dev"), "gpuyard:cluster": {**stack_values("dev")["gpuyard:cluster"],
                                                       "kubernetes_version": "1.34", "allow_extended_support": True}}
    assert parse_stack("dev", values, today=TODAY).cluster.kubernetes_version == "1.34"
    (cluster,) = of_type(plan_values("dev", values).resources, EKS)
    assert cluster.inputs["upgradePolicy"] == {"supportType": "EXTENDED"}


@pytest.mark.parametrize("stack", ["dev", "prod", "ephemeral"])
def test_stacks_run_1_35_in_standard_support(stack):
    (cluster,) = of_type(planned(stack), EKS)
    assert cluster.inputs["version"] == "1.35"
    assert support("1.35", TODAY) is Support.STANDARD
    assert cluster.inputs["upgradePolicy"] == {"supportType": "STANDARD"}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_karpenter_is_told_its_region_since_its_pods_cannot_ask_imds(stack):
    values = named(planned(stack), "karpenter-chart").inputs["values"]
    assert values["controller"]["env"] == [{"name": "AWS_REGION", "value": load_stack(stack).region}]


def test_deployments_start_by_saying_where_the_api_is_reachable_from(caplog):
    caplog.set_level(logging.INFO)
    plan_values("prod", stack_values("prod"))
    assert load_stack("prod").cluster.endpoint_notice("10.30.0.0/16") in caplog.messages
    assert any(m.startswith("checkpoint bucket gpuyard-prod-checkpoints and the image registries are protected")
               for m in caplog.messages)
