"""The whole Pulumi program for the dev and prod stacks, run under mocks: the inputs that matter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuyard.infra.charts import KARPENTER, KUBEFLOW_TRAINER, KUBERAY_OPERATOR, MPI_OPERATOR_MANIFEST, VOLCANO
from gpuyard.infra.config import load_stack
from gpuyard.infra.conventions import GPU_RESOURCE, IMAGE_NAMES, METRICS_PORT_NAME, PRIORITY_CLASSES
from gpuyard.infra.plan import plan_values, stack_values
from gpuyard.infra.trainer_runtime import runtime_pools
from infra_plans import named, of_type, planned

EKS = "aws:eks/cluster:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
RELEASE = "kubernetes:helm.sh/v3:Release"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
GPU_TAINT_EKS = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}


@pytest.fixture(scope="module", params=["dev", "prod"])
def stack(request):
    return request.param, planned(request.param)


def test_every_component_is_created_once(stack):
    _, resources = stack
    components = sorted(r.type for r in resources if r.type.startswith("gpuyard:") and r.type != "gpuyard:tenancy:Team")
    assert components == sorted(
        f"gpuyard:{t}"
        for t in ("network:Network", "eks:Cluster", "karpenter:Karpenter", "addons:Addons", "monitoring:Monitoring",
                  "tenancy:PriorityClasses", "tenancy:PodAdmission", "storage:Storage")
    )


def test_every_aws_resource_is_tagged_with_the_stack(stack):
    name, resources = stack
    (provider,) = of_type(resources, "pulumi:providers:aws")
    assert json.loads(provider.inputs["defaultTags"]) == {"tags": {"gpuyard.io/stack": name}}


def test_children_have_parents_and_explicit_providers(stack):
    _, resources = stack
    components = {r.name for r in resources if r.type.startswith("gpuyard:")}
    providers = {r.type.removeprefix("pulumi:providers:"): r.urn for r in resources if r.type.startswith("pulumi:providers:")}
    for resource in resources:
        if resource.type.startswith(("gpuyard:", "pulumi:providers:")):
            continue
        assert resource.parent in components, f"{resource.name} is not parented to a component"
        package = resource.type.split(":")[0]
        assert resource.provider.startswith(providers[package] + "::"), f"{resource.name} has no explicit provider"


def test_vpc_spans_azs_with_tagged_subnets(stack):
    name, resources = stack
    config = load_stack(name)
    subnets = of_type(resources, "aws:ec2/subnet:Subnet")
    private = [s for s in subnets if "karpenter.sh/discovery" in s.inputs["tags"]]
    public = [s for s in subnets if "kubernetes.io/role/elb" in s.inputs["tags"]]
    assert len(private) == len(public) == config.network.az_count >= 2
    assert len({s.inputs["availabilityZone"] for s in private}) == config.network.az_count
    assert all(s.inputs["tags"]["karpenter.sh/discovery"] == config.cluster_name for s in private)
    nats = of_type(resources, "aws:ec2/natGateway:NatGateway")
    assert len(nats) == (config.network.az_count if config.network.nat == "per_az" else 1)


def test_cluster_encryption_logging_endpoint_and_version(stack):
    name, resources = stack
    config = load_stack(name)
    (cluster,) = of_type(resources, EKS)
    inputs = cluster.inputs
    assert inputs["version"] == config.cluster.kubernetes_version
    assert inputs["encryptionConfig"]["resources"] == ["secrets"]
    assert inputs["encryptionConfig"]["provider"]["keyArn"].startswith("arn:aws:kms:")
    assert set(inputs["enabledClusterLogTypes"]) == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
    assert inputs["vpcConfig"]["endpointPublicAccess"] is config.cluster.endpoint_public
    assert inputs["vpcConfig"]["endpointPrivateAccess"] is config.cluster.endpoint_private
    assert inputs["accessConfig"]["authenticationMode"] == "API"
    (oidc,) = of_type(resources, "aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    assert oidc.inputs["clientIdLists"] == ["sts.amazonaws.com"]


def test_gpu_node_groups_are_tainted_nvidia_al2023(stack):
    name, resources = stack
    config = load_stack(name)
    groups = {g.inputs["nodeGroupName"]: g.inputs for g in of_type(resources, NODE_GROUP)}
    assert groups["system"]["amiType"] == "AL2023_x86_64_STANDARD"
    assert "taints" not in groups["system"]
    assert groups["system"]["labels"]["gpuyard.io/system-node"] == "true"
    assert named(resources, "karpenter-chart").inputs["values"]["nodeSelector"] == {"gpuyard.io/system-node": "true"}
    for group in config.cluster.gpu_node_groups:
        inputs = groups[group.name]
        assert inputs["amiType"] == "AL2023_x86_64_NVIDIA"
        assert inputs["taints"] == [GPU_TAINT_EKS]
        assert inputs["instanceTypes"] == list(group.instance_types)
        assert inputs["scalingConfig"] == {"minSize": group.min_size, "desiredSize": group.desired_size, "maxSize": group.max_size}
        assert inputs["labels"]["gpuyard.io/gpu-node"] == "true"


def test_every_launch_template_requires_imdsv2(stack):
    _, resources = stack
    templates = of_type(resources, "aws:ec2/launchTemplate:LaunchTemplate")
    assert templates
    for template in templates:
        assert template.inputs["metadataOptions"]["httpTokens"] == "required"
    node_classes = of_type(resources, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    assert node_classes
    for node_class in node_classes:
        assert node_class.inputs["spec"]["metadataOptions"]["httpTokens"] == "required"


def test_prod_efa_groups_get_placement_group_and_one_subnet():
    resources = planned("prod")
    placements = {p.name: p for p in of_type(resources, "aws:ec2/placementGroup:PlacementGroup")}
    assert set(placements) == {"cluster-gpu-a100", "cluster-gpu-h100", "karpenter-gpu-efa"}  # + the EFA NodePool's
    assert all(p.inputs["strategy"] == "cluster" for p in placements.values())
    template = named(resources, "cluster-gpu-a100", "aws:ec2/launchTemplate:LaunchTemplate")
    assert template.inputs["networkInterfaces"][0]["interfaceType"] == "efa"
    assert template.inputs["placement"]["groupName"] == "cluster-gpu-a100"
    assert len(named(resources, "cluster-gpu-a100", NODE_GROUP).inputs["subnetIds"]) == 1
    dev_template = named(planned("dev"), "cluster-gpu-small", "aws:ec2/launchTemplate:LaunchTemplate")
    assert "networkInterfaces" not in dev_template.inputs and "placement" not in dev_template.inputs


def test_node_pools_taints_limits_and_budgets(stack):
    name, resources = stack
    config = load_stack(name)
    pools = {p.inputs["metadata"]["name"]: p.inputs["spec"] for p in of_type(resources, NODEPOOL)}
    expected = {"gpu-on-demand", "cpu"} | ({"gpu-spot"} if config.karpenter.spot else set())
    expected |= {"gpu-efa"} if name == "prod" else set()  # prod's families have EFA types (p4d, p5)
    assert set(pools) == expected
    for pool in expected - {"cpu"}:
        spec = pools[pool]
        assert spec["template"]["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
        assert spec["limits"] == {GPU_RESOURCE: str(config.karpenter.gpu_limit)}
        assert spec["disruption"]["consolidationPolicy"] == "WhenEmpty"
        assert {"nodes": "0", "reasons": ["Underutilized"]} in spec["disruption"]["budgets"]
    assert "taints" not in pools["cpu"]["template"]["spec"]


def test_karpenter_chart_irsa_and_interruption_queue(stack):
    name, resources = stack
    release = named(resources, "karpenter-chart")
    assert (release.inputs["chart"], release.inputs["version"]) == (KARPENTER.name, KARPENTER.version)
    values = release.inputs["values"]
    assert values["settings"]["interruptionQueue"] == f"{load_stack(name).cluster_name}-karpenter"
    role = named(resources, "karpenter-controller", "aws:iam/role:Role")
    assert values["serviceAccount"]["annotations"]["eks.amazonaws.com/role-arn"].endswith("/karpenter-controller")
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Condition"]["StringEquals"]
    assert [v for k, v in trust.items() if k.endswith(":sub")] == ["system:serviceaccount:kube-system:karpenter"]
    rules = of_type(resources, "aws:cloudwatch/eventRule:EventRule")
    targets = of_type(resources, "aws:cloudwatch/eventTarget:EventTarget")
    assert len(rules) == len(targets) == 5
    entry = named(resources, "karpenter-node", "aws:eks/accessEntry:AccessEntry")
    assert entry.inputs["type"] == "EC2_LINUX"
    assert entry.inputs["principalArn"] == "arn:aws:iam::123456789012:role/karpenter-node"


def test_addon_charts_are_pinned_with_their_values(stack):
    name, resources = stack
    releases = {r.inputs["chart"]: r.inputs for r in of_type(resources, RELEASE)}
    for chart in releases.values():
        assert chart["version"].removeprefix("v")[0].isdigit(), chart
    assert releases[VOLCANO.name]["version"] == VOLCANO.version
    assert releases[VOLCANO.name]["repositoryOpts"]["repo"] == VOLCANO.repo
    assert releases[KUBERAY_OPERATOR.name]["values"]["batchScheduler"]["name"] == "volcano"
    plugin = releases["nvidia-device-plugin"]["values"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in plugin["tolerations"]
    prometheus = releases["kube-prometheus-stack"]["values"]
    assert prometheus["prometheus"]["prometheusSpec"]["podMonitorSelectorNilUsesHelmValues"] is False
    assert "dcgm-exporter" in releases
    assert releases["aws-efa-k8s-device-plugin"]["values"]["nodeSelector"] == {"vpc.amazonaws.com/efa.present": "true"}
    directories = {Path(d.inputs["directory"]).name: d for d in of_type(resources, "kubernetes:kustomize/v2:Directory")}
    assert set(directories) == {"training-operator", "mpi-operator"}
    mpi = yaml.safe_load((Path(directories["mpi-operator"].inputs["directory"]) / "kustomization.yaml").read_text())
    assert mpi["resources"] == [MPI_OPERATOR_MANIFEST]
    assert (Path(directories["training-operator"].inputs["directory"]) / "kustomization.yaml").is_file()


def test_trainer_v2_follows_the_flag():
    dev, prod = planned("dev"), planned("prod")
    assert load_stack("dev").addons.trainer_v2 and not load_stack("prod").addons.trainer_v2
    assert KUBEFLOW_TRAINER.name in {r.inputs["chart"] for r in of_type(dev, RELEASE)}
    assert KUBEFLOW_TRAINER.name not in {r.inputs["chart"] for r in of_type(prod, RELEASE)}
    runtimes = of_type(dev, "kubernetes:trainer.kubeflow.org/v1alpha1:TrainingRuntime")
    pools = runtime_pools(load_stack("dev"))
    assert {(r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]) for r in runtimes} == {
        (team.namespace, pool.runtime) for team in load_stack("dev").teams for pool in pools
    }
    assert {"torch-distributed", "torch-distributed-cpu"} <= {pool.runtime for pool in pools}
    assert all(r.inputs["spec"]["podGroupPolicy"] == {"volcano": {}} for r in runtimes)
    assert not of_type(prod, "kubernetes:trainer.kubeflow.org/v1alpha1:TrainingRuntime")


def test_pod_monitor_and_dashboard(stack):
    _, resources = stack
    (monitor,) = of_type(resources, "kubernetes:monitoring.coreos.com/v1:PodMonitor")
    spec = monitor.inputs["spec"]
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/part-of": "gpuyard"}
    assert spec["podMetricsEndpoints"][0]["port"] == METRICS_PORT_NAME
    dashboard = named(resources, "monitoring-dashboard").inputs
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dashboard["data"]["gpuyard-training.json"])
    queries = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    for metric in ("gpuyard_train_samples_per_second", "gpuyard_train_loss", "gpuyard_train_step_seconds",
                   "gpuyard_checkpoint_save_seconds", "DCGM_FI_DEV_GPU_UTIL"):
        assert metric in queries


def test_checkpoint_bucket_is_private_encrypted_versioned_tls_only(stack):
    name, resources = stack
    config = load_stack(name)
    (bucket,) = of_type(resources, "aws:s3/bucket:Bucket")
    assert bucket.inputs["bucket"] == config.checkpoint_bucket
    (block,) = of_type(resources, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(block.inputs[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    (sse,) = of_type(resources, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    assert sse.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    (versioning,) = of_type(resources, "aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.inputs["versioningConfiguration"]["status"] == "Enabled"
    (policy,) = of_type(resources, "aws:s3/bucketPolicy:BucketPolicy")
    (statement,) = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    (lifecycle,) = of_type(resources, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    assert lifecycle.inputs["rules"][0]["noncurrentVersionExpiration"]["noncurrentDays"] == config.storage.noncurrent_days


def test_ecr_repository_per_image(stack):
    name, resources = stack
    repositories = sorted(r.inputs["name"] for r in of_type(resources, "aws:ecr/repository:Repository"))
    assert repositories == sorted(f"{load_stack(name).cluster_name}/{image}" for image in IMAGE_NAMES)


def test_team_tenancy_and_irsa_scoped_to_one_service_account(stack):
    name, resources = stack
    config = load_stack(name)
    assert {q.inputs["metadata"]["name"] for q in of_type(resources, "kubernetes:scheduling.volcano.sh/v1beta1:Queue")} == {
        t.queue for t in config.teams
    }
    for team in config.teams:
        trust = json.loads(named(resources, f"team-{team.name}-irsa", "aws:iam/role:Role").inputs["assumeRolePolicy"])
        (statement,) = trust["Statement"]
        assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
        conditions = statement["Condition"]["StringEquals"]
        assert sorted(conditions.values()) == sorted(
            [f"system:serviceaccount:{team.namespace}:{team.service_account}", "sts.amazonaws.com"]
        )
        access = json.loads(named(resources, f"team-{team.name}-checkpoints").inputs["policy"])
        objects = access["Statement"][0]
        assert objects["Resource"] == f"arn:aws:s3:::{config.checkpoint_bucket}/{team.checkpoint_prefix}*"
        account = named(resources, f"team-{team.name}-sa").inputs
        assert account["metadata"]["namespace"] == team.namespace
        assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(f"/team-{team.name}-irsa")
        quota = named(resources, f"team-{team.name}-quota").inputs["spec"]["hard"]
        assert quota["services.loadbalancers"] == "0" and f"requests.{GPU_RESOURCE}" not in quota
        queue = named(resources, f"team-{team.name}-queue").inputs["spec"]
        assert queue["capability"][GPU_RESOURCE] == str(team.gpu_quota)
        isolation = named(resources, f"team-{team.name}-default-deny").inputs["spec"]
        assert isolation == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_priority_classes(stack):
    _, resources = stack
    classes = {p.inputs["metadata"]["name"]: p.inputs["value"] for p in of_type(resources, "kubernetes:scheduling.k8s.io/v1:PriorityClass")}
    assert classes == PRIORITY_CLASSES


def test_team_members_get_access_entries_in_their_group():
    arn = "arn:aws:iam::111122223333:role/vision-ml"
    values = {**stack_values("dev"), "gpuyard:teams": [{"name": "vision", "member_role_arns": [arn]}, {"name": "nlp"}]}
    resources = plan_values("dev", values).resources
    entries = [e for e in of_type(resources, "aws:eks/accessEntry:AccessEntry") if e.parent.startswith("team-")]
    assert [(e.parent, e.inputs["principalArn"], e.inputs["kubernetesGroups"]) for e in entries] == [
        ("team-vision", arn, ["gpuyard:vision"])
    ]
    binding = named(resources, "team-vision-role", "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert binding.inputs["subjects"][0]["name"] == "gpuyard:vision"
