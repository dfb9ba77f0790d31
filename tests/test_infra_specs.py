"""Pure builders of the infrastructure: subnets, policies, launch templates, NodePools, tenancy and add-on specs.

The Kubernetes objects built for the dev stack also have goldens in tests/golden/infra/ (rewrite with
GPUYARD_UPDATE_GOLDEN=1 and review the diff like code).
"""

from __future__ import annotations

import fnmatch

import ipaddress
import json
import os
from pathlib import Path

import pytest
import yaml

from gpuyard.infra.addons import kuberay_values
from gpuyard.infra.charts import TRAINING_OPERATOR_KUSTOMIZATION
from gpuyard.infra.cluster import gpu_node_taints, kubeconfig, launch_template_spec
from gpuyard.infra.config import KarpenterConfig, Team, load_stack
from gpuyard.infra.dashboard import training_dashboard
from gpuyard.infra.karpenter import ec2_node_class_spec, node_pool_spec, node_pools
from gpuyard.infra.monitoring import training_pod_monitor_spec
from gpuyard.infra.network import subnet_cidrs, subnet_tags
from gpuyard.infra.policies import (
    bucket_tls_only_policy,
    irsa_assume_role_policy,
    karpenter_controller_policy,
    team_checkpoint_policy,
)
from gpuyard.infra.storage import checkpoint_lifecycle_rules
from gpuyard.infra.tenancy import deserved_gpus, team_network_policies, team_queue_spec, team_quota
from gpuyard.infra.trainer_runtime import RuntimePool, training_runtime_spec
from infra_plans import kubernetes_manifests, planned

GOLDEN = Path(__file__).parent / "golden" / "infra"
UPDATE = os.environ.get("GPUYARD_UPDATE_GOLDEN") == "1"
KUSTOMIZATION = Path(TRAINING_OPERATOR_KUSTOMIZATION) / "kustomization.yaml"


@pytest.mark.parametrize(("cidr", "azs"), [("10.0.0.0/16", 2), ("10.20.0.0/16", 3), ("10.0.0.0/20", 6), ("172.16.0.0/12", 4)])
def test_subnets_are_disjoint_and_inside_the_vpc(cidr, azs):
    public, private = subnet_cidrs(cidr, azs)
    assert len(public) == len(private) == azs
    networks = [ipaddress.ip_network(n) for n in public + private]
    vpc = ipaddress.ip_network(cidr)
    assert all(n.subnet_of(vpc) for n in networks)
    assert not any(a.overlaps(b) for i, a in enumerate(networks) for b in networks[i + 1 :])
    assert all(ipaddress.ip_network(p).num_addresses * 8 == ipaddress.ip_network(q).num_addresses for p, q in zip(public, private))


@pytest.mark.parametrize(("public", "key"), [(True, "kubernetes.io/role/elb"), (False, "kubernetes.io/role/internal-elb")])
def test_subnet_tags(public, key):
    tags = subnet_tags("c1", public)
    assert tags[key] == "1"
    assert ("karpenter.sh/discovery" in tags) is (not public)


@pytest.mark.parametrize(("namespace", "account"), [("team-a", "a-trainer"), ("kube-system", "karpenter")])
def test_irsa_trust_names_exactly_one_service_account(namespace, account):
    policy = irsa_assume_role_policy("arn:aws:iam::1:oidc-provider/oidc.example/id/X", "https://oidc.example/id/X", namespace, account)
    (statement,) = policy["Statement"]
    assert statement["Principal"] == {"Federated": "arn:aws:iam::1:oidc-provider/oidc.example/id/X"}
    assert statement["Condition"] == {
        "StringEquals": {
            "oidc.example/id/X:sub": f"system:serviceaccount:{namespace}:{account}",
            "oidc.example/id/X:aud": "sts.amazonaws.com",
        }
    }


@pytest.mark.parametrize("prefix", ["teams/a/", "x/"])
def test_team_checkpoint_policy_is_limited_to_its_prefix(prefix):
    objects, listing, data, data_listing = team_checkpoint_policy("arn:aws:s3:::b", prefix, "data/a/")["Statement"]
    assert objects["Resource"] == f"arn:aws:s3:::b/{prefix}*"
    assert "s3:*" not in objects["Action"]
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [f"{prefix}*", prefix]
    # the team's data: read, never written or deleted
    assert (data["Action"], data["Resource"]) == ("s3:GetObject", "arn:aws:s3:::b/data/a/*")
    assert data_listing["Condition"]["StringLike"]["s3:prefix"] == ["data/a/*", "data/a/"]


def test_a_prefix_ending_at_slash_leaves_the_neighbours_keys_alone():
    """IAM StringLike and object ARNs compare characters (``*`` any run of them): teams/a without the slash also
    matched teams/a-2/... (issue 21)."""
    objects, listing, _, _ = team_checkpoint_policy("arn:aws:s3:::b", "teams/a/", "data/a/")["Statement"]
    for pattern in (objects["Resource"].removeprefix("arn:aws:s3:::b/"), *listing["Condition"]["StringLike"]["s3:prefix"]):
        assert not fnmatch.fnmatchcase("teams/a-2/ckpt-1.pt", pattern)
        assert not fnmatch.fnmatchcase("teams/a-2/", pattern)
    assert fnmatch.fnmatchcase("teams/a/run/ckpt-1.pt", objects["Resource"].removeprefix("arn:aws:s3:::b/"))


def test_bucket_policy_denies_plain_http():
    (statement,) = bucket_tls_only_policy("arn:aws:s3:::b")["Statement"]
    assert statement["Effect"] == "Deny" and statement["Resource"] == ["arn:aws:s3:::b", "arn:aws:s3:::b/*"]
    assert statement["Condition"]["Bool"]["aws:SecureTransport"] == "false"


@pytest.mark.parametrize(("security_group", "cards"), [(None, 0), ("sg-1", 1), ("sg-1", 4), ("sg-1", 32)])
def test_launch_template_requires_imdsv2_encrypts_root_and_has_one_efa_interface_per_card(security_group, cards):
    spec = launch_template_spec(200, security_group, cards)
    assert spec["metadata_options"]["http_tokens"] == "required"
    assert spec["block_device_mappings"][0]["ebs"]["encrypted"] == "true"
    if cards:
        interfaces = spec["network_interfaces"]
        assert [i["network_card_index"] for i in interfaces] == list(range(cards))
        assert [i["device_index"] for i in interfaces] == [0] + [1] * (cards - 1)
        assert {(i["interface_type"], tuple(i["security_groups"])) for i in interfaces} == {("efa", ("sg-1",))}
    else:
        assert "network_interfaces" not in spec


def test_gpu_node_taint_matches_the_conventions():
    assert gpu_node_taints() == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]


def test_kubeconfig_uses_aws_token():
    config = kubeconfig("c1", "https://x", "CA", "eu-west-1")
    assert config["users"][0]["user"]["exec"]["args"] == ["eks", "get-token", "--cluster-name", "c1", "--region", "eu-west-1"]


@pytest.mark.parametrize(("gpu", "policy"), [(True, "WhenEmpty"), (False, "WhenEmptyOrUnderutilized")])
def test_node_pool_spec(gpu, policy):
    spec = node_pool_spec("p", capacity_types=["spot"], families=("g5",), gpu=gpu, limit=8, weight=5)
    assert spec["disruption"]["consolidationPolicy"] == policy
    assert ("taints" in spec["template"]["spec"]) is gpu
    assert spec["template"]["spec"]["expireAfter"] == ("Never" if gpu else "720h")
    assert spec["limits"] == ({"nvidia.com/gpu": "8"} if gpu else {"cpu": "8"})


@pytest.mark.parametrize(("spot", "pools"), [(True, {"gpu-on-demand", "gpu-spot", "cpu"}), (False, {"gpu-on-demand", "cpu"})])
def test_spot_pool_follows_config(spot, pools):
    specs = node_pools(KarpenterConfig(spot=spot, gpu_families=("g5", "g6")))
    assert set(specs) == pools
    assert specs["cpu"]["template"]["spec"]["requirements"][0]["values"] == (["spot", "on-demand"] if spot else ["on-demand"])


@pytest.mark.parametrize(("families", "efa_types"), [
    (("g5", "g6"), None),
    (("g6e", "p4d", "p5"), ["p4d.24xlarge", "p5.48xlarge"]),
    (("p5", "p5en"), ["p5.48xlarge", "p5en.48xlarge"]),
])
def test_efa_pool_launches_only_efa_types_and_labels_them_for_the_plugin(families, efa_types):
    specs = node_pools(KarpenterConfig(gpu_families=families))
    if efa_types is None:
        assert "gpu-efa" not in specs
        return
    template = specs["gpu-efa"]["template"]
    (types,) = [r["values"] for r in template["spec"]["requirements"] if r["key"] == "node.kubernetes.io/instance-type"]
    assert types == efa_types
    assert template["metadata"]["labels"]["vpc.amazonaws.com/efa.present"] == "true"
    assert {r["values"][0] for r in template["spec"]["requirements"] if r["key"] == "karpenter.sh/capacity-type"} == {"on-demand"}
    assert all("vpc.amazonaws.com/efa.present" not in specs[p]["template"]["metadata"]["labels"] for p in specs if p != "gpu-efa")


def test_node_class_selects_discovery_subnets_and_cluster_security_group():
    spec = ec2_node_class_spec("c1", "node-role", "sg-1")
    assert spec["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "c1"}}]
    assert spec["securityGroupSelectorTerms"] == [{"id": "sg-1"}]


@pytest.mark.parametrize("team", [Team(name="a"), Team(name="b", gpu_quota=0, cpu_quota=2, memory_quota_gib=4, queue_weight=7)])
def test_the_queue_alone_limits_a_teams_compute(team):
    queue = team_queue_spec(team, deserved_gpus=5)
    assert queue["capability"] == {"nvidia.com/gpu": str(team.gpu_quota), "cpu": str(team.cpu_quota),
                                   "memory": f"{team.memory_quota_gib}Gi"}
    assert not [key for key in team_quota() if key.startswith(("requests.", "limits.", "nvidia.com/", "cpu", "memory"))]
    assert queue["weight"] == team.queue_weight
    assert queue["deserved"]["nvidia.com/gpu"] == str(min(5, team.gpu_quota))
    assert {k: v for k, v in queue["deserved"].items() if k != "nvidia.com/gpu"} == {
        k: v for k, v in queue["capability"].items() if k != "nvidia.com/gpu"}


@pytest.mark.parametrize(("weights", "supply", "expected"), [
    ((2, 1), 8, (5, 3)),  # 5.33 and 2.67: the larger remainder gets the spare GPU
    ((1, 1, 1), 10, (4, 3, 3)),
    ((1,), 8, (8,)),
    ((3, 1), 0, (0, 0)),
])
def test_deserved_gpus_split_the_pool_by_weight_in_whole_gpus(weights, supply, expected):
    teams = tuple(Team(name=f"t{i}", queue_weight=w, gpu_quota=64) for i, w in enumerate(weights))
    shares = deserved_gpus(teams, supply)
    assert tuple(shares[t.name] for t in teams) == expected and sum(expected) == supply


def test_deserved_gpus_never_exceed_the_quota():
    teams = (Team(name="big", queue_weight=9, gpu_quota=2), Team(name="small", queue_weight=1, gpu_quota=8))
    assert deserved_gpus(teams, 10) == {"big": 2, "small": 1}


def test_network_policies_admit_only_own_namespace_prometheus_and_kuberay():
    sources = [peer for spec in team_network_policies().values() for rule in spec.get("ingress", []) for peer in rule["from"]]
    assert sources == [
        {"podSelector": {}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}},
    ]


def test_addon_specs():
    assert kuberay_values()["batchScheduler"] == {"name": "volcano"}
    team = Team(name="a", priority_class="gpuyard-high")
    runtime = training_runtime_spec(team, RuntimePool("gpu-on-demand", "on-demand", gpus=True), "reg/ddp:1", "bucket")
    pod = runtime["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "reg/ddp:1" and container["ports"][0]["name"] == "metrics"
    assert (pod["schedulerName"], pod["priorityClassName"]) == ("volcano", "gpuyard-high")
    assert runtime["template"]["metadata"]["annotations"] == {"scheduling.volcano.sh/queue-name": "a"}
    assert training_pod_monitor_spec()["podMetricsEndpoints"][0]["port"] == "metrics"
    assert checkpoint_lifecycle_rules(9)[0]["noncurrent_version_expiration"] == {"noncurrent_days": 9}


def test_dashboard_has_one_panel_per_training_signal():
    board = training_dashboard()
    titles = [panel["title"] for panel in board["panels"]]
    assert len(titles) == len(set(titles)) == 6
    assert json.loads(json.dumps(board)) == board


def test_training_operator_overlay_gang_schedules_with_volcano_and_leaves_mpijob_to_mpi_operator():
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert kustomization["resources"] == [
        "https://github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"
    ]
    args_patch, crd_patch = kustomization["patches"]
    operations = {operation["path"]: operation["value"] for operation in yaml.safe_load(args_patch["patch"])}
    args = operations["/spec/template/spec/containers/0/args"]
    assert "--gang-scheduler-name=volcano" in args
    schemes = {a.split("=", 1)[1] for a in args if a.startswith("--enable-scheme=")}
    assert schemes == {"tfjob", "pytorchjob", "xgboostjob", "paddlejob", "jaxjob"}
    deleted = yaml.safe_load(crd_patch["patch"])
    assert (deleted["$patch"], deleted["kind"], deleted["metadata"]["name"]) == (
        "delete", "CustomResourceDefinition", "mpijobs.kubeflow.org"
    )


@pytest.mark.parametrize("kind", ["NodePool", "EC2NodeClass", "Queue", "PodMonitor", "TrainingRuntime"])
def test_dev_custom_resources_match_their_golden(kind):
    manifests = [m for m in kubernetes_manifests(planned("dev")) if m["kind"] == kind]
    text = yaml.safe_dump_all(sorted(manifests, key=lambda m: (m["metadata"].get("namespace", ""), m["metadata"]["name"])), sort_keys=True)
    path = GOLDEN / f"dev-{kind.lower()}.yaml"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with GPUYARD_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs: review, then rewrite with GPUYARD_UPDATE_GOLDEN=1"


def test_stack_teams_reach_the_plan():
    assert {m["metadata"]["name"] for m in kubernetes_manifests(planned("dev")) if m["kind"] == "Namespace"} == {
        t.namespace for t in load_stack("dev").teams
    }


def test_karpenter_controller_policy_is_scoped():
    cluster = "arn:aws:eks:eu-west-1:111122223333:cluster/c1"
    policy = karpenter_controller_policy("c1", cluster, "arn:queue", "arn:node-role", "eu-west-1")
    statements = {s["Sid"]: s for s in policy["Statement"]}
    assert statements["AllowScopedDeletion"]["Condition"]["StringEquals"] == {
        "aws:ResourceTag/kubernetes.io/cluster/c1": "owned"}
    assert statements["AllowPassingInstanceRole"]["Resource"] == "arn:node-role"
    assert statements["AllowInterruptionQueueActions"]["Resource"] == "arn:queue"
    assert statements["AllowAPIServerEndpointDiscovery"]["Resource"] == cluster
    assert statements["AllowSSMReadActions"]["Resource"] == "arn:aws:ssm:eu-west-1::parameter/aws/service/*"
