"""What only real AWS would show, checked against the offline plans of every stack and the rendered templates
(issue 22, items 1-5 and 8): each contract cites the upstream file it follows, read at the pinned version.
Teardown order (items 6 and 8) lives in test_infra_teardown.py, cleanup (item 7) in test_ephemeral_cleanup.py."""

from __future__ import annotations

import base64
import email
import fnmatch
import json
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dockerfile_parse import Dockerfile
from gpuyard.infra.charts import EFA_DEVICE_PLUGIN, KARPENTER
from gpuyard.infra.cluster import ADDON_CONFLICTS, EKS_ADDONS
from gpuyard.infra.config import load_stack
from gpuyard.infra.conventions import (EFA_RESOURCE, HUGEPAGES_EFA, HUGEPAGES_EFA_NODE_PAGES, HUGEPAGES_RESOURCE,
                               NODEPOOL_GPU_EFA)
from gpuyard.infra.images import kept_tags
from gpuyard.infra.karpenter import (CHART_REPLICAS, EFA_NODE_CLASS, LABEL_ZONE, MAINTENANCE_WINDOW_HOURS,
                             MAINTENANCE_WINDOW_START)
from gpuyard.infra.storage import ecr_lifecycle_policy
from infra_plans import named, of_type, planned
from gpuyard.jobs.placement import place
from gpuyard.jobs.render import render_specs
from gpuyard.jobs.spec import build_spec
from conftest import with_registry

STACKS = ("dev", "prod", "ephemeral")
REPO = Path(__file__).resolve().parent.parent
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SUBNET = "aws:ec2/subnet:Subnet"
CRDS = REPO.parent / "shared" / "crds"


def _pools(stack: str) -> dict[str, dict]:
    return {p.inputs["metadata"]["name"]: p.inputs["spec"] for p in of_type(planned(stack), NODE_POOL)}


def _zone_of_subnet(stack: str, subnet_id: str) -> str:
    """The zone of a planned subnet from the id the plan's mocks gave it (``<resource name>-id``)."""
    (subnet,) = [s for s in of_type(planned(stack), SUBNET) if f"{s.name}-id" == subnet_id]
    return subnet.inputs["availabilityZone"]


# -- 1. RayJob with --efa -----------------------------------------------------------------------------------------


def test_a_rayjob_with_efa_runs_an_image_that_has_libfabric_and_aws_ofi_nccl():
    """The RayJob's workers are told to use only EFA (NCCL_NET, FI_PROVIDER); the ray image therefore carries the EFA
    installer's libfabric and aws-ofi-nccl on the library path, built and pinned as images/ddp does."""
    config = with_registry(load_stack("prod"))
    spec = place(config, build_spec(config, config.team("vision"), "rayjob", nodes=2, gpus_per_node=8, efa_devices=4,
                                    node_pool="gpu-a100"))
    [manifest] = render_specs(config, [spec]).values()
    worker = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["NCCL_NET"] == "AWS Libfabric" and env["FI_PROVIDER"] == "efa"
    assert worker["image"].rsplit(":", 1)[0].endswith("/ray")
    ray, ddp = Dockerfile.of("ray"), Dockerfile.of("ddp")
    runs = " ".join(ray.all("RUN"))
    assert 'install-efa.sh plugin "${EFA_INSTALLER_VERSION}" "${AWS_OFI_NCCL_VERSION}"' in runs
    assert 'install-efa.sh runtime "${EFA_INSTALLER_VERSION}"' in runs
    assert "--from=efa /opt/aws-ofi-nccl /opt/aws-ofi-nccl" in ray.all("COPY")
    assert ray.env()["LD_LIBRARY_PATH"].startswith("/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib")
    pins = ("EFA_INSTALLER_VERSION", "AWS_OFI_NCCL_VERSION", "PYTORCH_VERSION", "CUDA_VERSION")
    assert {k: ray.arg_defaults()[k] for k in pins} == {k: ddp.arg_defaults()[k] for k in pins}
    assert ray.all("USER")[-1] == "1000:100"  # back to the base's non-root user after the root install


# -- 2. the EFA pool: one zone, one cluster placement group --------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_the_efa_pool_keeps_every_node_in_one_zone_in_a_cluster_placement_group(stack):
    """karpenter-provider-aws v1.14.1: pkg/apis/v1/ec2nodeclass.go PlacementGroupSelector (name or id; one group per
    node class); pkg/providers/instancetype/offering/placement_group_resolver.go adds offerings only for partition
    groups and nothing pins a cluster group's zone, so the pool's zone requirement must."""
    pools, resources = _pools(stack), planned(stack)
    groups = {g.inputs.get("name"): g for g in of_type(resources, PLACEMENT_GROUP) if g.parent == "karpenter"}
    if NODEPOOL_GPU_EFA not in pools:
        assert not groups and EFA_NODE_CLASS not in {c.inputs["metadata"]["name"] for c in of_type(resources, NODE_CLASS)}
        return
    template = pools[NODEPOOL_GPU_EFA]["template"]["spec"]
    (zones,) = [r["values"] for r in template["requirements"] if r["key"] == LABEL_ZONE and r["operator"] == "In"]
    assert len(zones) == 1
    assert template["nodeClassRef"]["name"] == EFA_NODE_CLASS
    node_class = named(resources, f"karpenter-{EFA_NODE_CLASS}", NODE_CLASS)
    group_name = node_class.inputs["spec"]["placementGroupSelector"]["name"]
    assert groups[group_name].inputs["strategy"] == "cluster"
    assert named(resources, "karpenter-gpu-efa", PLACEMENT_GROUP).urn in node_class.dependencies
    others = [p for name, p in pools.items() if name != NODEPOOL_GPU_EFA]
    assert all(p["template"]["spec"]["nodeClassRef"]["name"] != EFA_NODE_CLASS for p in others)
    default = named(resources, "karpenter-default", NODE_CLASS)
    assert "placementGroupSelector" not in default.inputs["spec"]  # one cluster group would pin every pool's zone


def test_managed_efa_groups_and_the_efa_pool_share_one_zone():
    """Every EFA node of prod, managed or Karpenter's, in the same zone: EFA does not cross zones."""
    zones = set()
    for group in load_stack("prod").cluster.gpu_node_groups:
        if group.efa:
            (subnet,) = named(planned("prod"), f"cluster-{group.name}", NODE_GROUP).inputs["subnetIds"]
            zones.add(_zone_of_subnet("prod", subnet))
    (pool_zones,) = [r["values"] for r in _pools("prod")[NODEPOOL_GPU_EFA]["template"]["spec"]["requirements"]
                     if r["key"] == LABEL_ZONE]
    assert zones == set(pool_zones) and len(zones) == 1


def test_the_pinned_ec2nodeclass_crd_has_the_placement_group_selector():
    """The field exists at v1.14.1 in the CRD (pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml), which the
    manifest validation (test_infra_manifests.py) checks every planned EC2NodeClass against."""
    path = CRDS / "karpenter.k8s.aws_v1_EC2NodeClass.json"
    if not path.exists():
        pytest.skip(f"{path} missing: the CRD schemas live in ../shared beside the checkout")
    selector = json.loads(path.read_text())["properties"]["spec"]["properties"]["placementGroupSelector"]
    assert set(selector["properties"]) == {"id", "name"}
    assert KARPENTER.version == "1.14.1"


# -- 3. Karpenter's replicas and the chart's anti-affinity ---------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_each_karpenter_replica_has_a_system_node_of_its_own(stack):
    """charts/karpenter/values.yaml v1.14.1: replicas 2 with a required hostname anti-affinity; the controllers run
    on the system group only, so a stack with one system node runs one replica (ephemeral), never a Pending one."""
    values = named(planned(stack), "karpenter-chart").inputs["values"]
    system = load_stack(stack).cluster.system_node_group
    assert values["replicas"] == min(CHART_REPLICAS, system.min_size) >= 1
    assert "affinity" not in values  # the chart's required anti-affinity stays
    assert (stack, values["replicas"]) != ("ephemeral", 2)


# -- 4. huge pages on managed EFA groups ---------------------------------------------------------------------------


def _hugepages_script(template) -> str:
    archive = email.message_from_bytes(base64.b64decode(template.inputs["userData"]))
    (script,) = [part.get_payload() for part in archive.walk()
                 if part.get_content_type() == "text/x-shellscript" and "nr_hugepages" in part.get_payload()]
    return script


def _mebibytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()
    return int(number) * (1024 if unit == "Gi" else 1)


@pytest.mark.parametrize("stack", STACKS)
def test_managed_efa_nodes_reserve_the_huge_pages_their_pods_request(stack):
    """The AL2023 AMI's sources reserve none (amazon-eks-ami v20260724 templates/al2023/provisioners/install-efa.sh
    runs the installer with --minimal; nothing sets vm.nr_hugepages), so each EFA launch template's user data does,
    in a shell part that runs before nodeadm-run.service starts the kubelet (After=cloud-final.service)."""
    config = with_registry(load_stack(stack))
    for group in config.cluster.gpu_node_groups:
        template = named(planned(stack), f"cluster-{group.name}", LAUNCH_TEMPLATE)
        if not group.efa:
            assert "nr_hugepages" not in base64.b64decode(template.inputs["userData"]).decode()
            continue
        script = _hugepages_script(template)
        assert f"sysctl -w vm.nr_hugepages={HUGEPAGES_EFA_NODE_PAGES}" in script
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
        spec = place(config, build_spec(config, config.teams[0], "pytorchjob", gpus_per_node=8,
                                        efa_devices=group.efa_interfaces, node_pool=group.name))
        [manifest] = render_specs(config, [spec]).values()
        worker = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        request = worker["resources"]["requests"][HUGEPAGES_RESOURCE]
        assert request == HUGEPAGES_EFA and _mebibytes(request) <= 2 * HUGEPAGES_EFA_NODE_PAGES


def test_pods_on_the_karpenter_efa_pool_request_no_huge_pages_and_libfabric_uses_none():
    """Karpenter sizes nodes without huge pages (its instance types carry none), so a pod requesting them would never
    schedule there; libfabric is told not to use them instead."""
    config = with_registry(load_stack("prod"))
    spec = place(config, build_spec(config, config.team("vision"), "pytorchjob", gpus_per_node=8, efa_devices=4))
    [manifest] = render_specs(config, [spec]).values()
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["nodeSelector"]["karpenter.sh/nodepool"] == NODEPOOL_GPU_EFA
    assert container["resources"]["requests"][EFA_RESOURCE] == "4"
    assert HUGEPAGES_RESOURCE not in container["resources"]["requests"]
    assert {e["name"]: e.get("value") for e in container["env"]}["FI_EFA_USE_HUGE_PAGE"] == "0"


# -- 5. vpc-cni conflicts, the EFA chart pin, citations ------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_eks_addons_overwrite_the_self_managed_ones_they_replace(stack):
    """EKS installs vpc-cni, coredns and kube-proxy itself; creating the managed add-on with configuration values
    over them fails on a conflict unless OVERWRITE (amazon-eks-user-guide latest/ug/workloads/eks-add-ons.adoc)."""
    addons = {a.inputs["addonName"]: a.inputs for a in of_type(planned(stack), "aws:eks/addon:Addon")}
    assert set(addons) == set(EKS_ADDONS)
    assert ADDON_CONFLICTS == "OVERWRITE"
    for inputs in addons.values():
        assert (inputs["resolveConflictsOnCreate"], inputs["resolveConflictsOnUpdate"]) == ("OVERWRITE", "OVERWRITE")
    assert json.loads(addons["vpc-cni"]["configurationValues"]) == {"enableNetworkPolicy": "true"}


def test_the_efa_chart_pin_names_the_chart_and_the_plugin_it_deploys():
    """aws/eks-charts v0.0.194 (commit 8b25c60), stable/aws-efa-k8s-device-plugin/Chart.yaml: chart version v0.5.8,
    appVersion v0.5.5."""
    assert (EFA_DEVICE_PLUGIN.version, EFA_DEVICE_PLUGIN.deploys) == ("v0.5.8", "v0.5.5")
    release = named(planned("prod"), "addons-efa-device-plugin")
    assert release.inputs["version"] == EFA_DEVICE_PLUGIN.version


def test_no_citation_names_a_karpenter_docs_folder_missing_at_the_pinned_tag():
    """At aws/karpenter-provider-aws v1.14.1 the documentation of v1.14 lives in website/content/en/docs/; there is no
    website/content/en/v1.14/ (git ls-tree v1.14.1 website/content/en: docs, preview, v1.0, v1.11, v1.12, v1.13)."""
    cited = [f"{path.relative_to(REPO)}:{number}" for root in ("infra", "jobs", "sim", "tests", "images")
             for path in (REPO / root).rglob("*") if path.is_file() and path.suffix in (".py", ".sh", "")
             for number, line in enumerate(path.read_text(errors="ignore").splitlines(), 1)
             if "website/content/en/v1.14/" in line and path.name != Path(__file__).name]
    assert cited == []


# -- 8. ECR tags and the maintenance window ------------------------------------------------------------------------


def _expired(policy: dict, images: list[tuple[int, set[str]]]) -> set[int]:
    """ECR's lifecycle evaluation (AmazonECR userguide LifecyclePolicies.html, "Lifecycle policy evaluation rules"):
    rules in priority order; an image matched by a higher-priority rule is never expired by a lower one; count rules
    expire the oldest of the images they match beyond countNumber. ``images``: (pushed at, tags); returns indices."""
    expired: set[int] = set()
    claimed: set[int] = set()
    for rule in sorted(policy["rules"], key=lambda r: r["rulePriority"]):
        selection = rule["selection"]
        patterns = selection.get("tagPatternList", [])

        def selects(tags: set[str]) -> bool:
            if selection["tagStatus"] == "untagged":
                return not tags
            if selection["tagStatus"] == "tagged":
                return bool(tags) and all(any(fnmatch.fnmatchcase(t, p) for t in tags) for p in patterns)
            return True

        matched = sorted((i for i, (_, tags) in enumerate(images) if selects(tags)), key=lambda i: -images[i][0])
        assert selection["countType"] == "imageCountMoreThan"
        expired |= {i for i in matched[selection["countNumber"]:] if i not in claimed}
        claimed |= set(matched)
    return expired


@pytest.mark.parametrize("stack", STACKS)
def test_ecr_tags_are_immutable_and_the_tags_the_stack_runs_never_expire(stack):
    config = load_stack(stack)
    resources = planned(stack)
    for repository in of_type(resources, "aws:ecr/repository:Repository"):
        assert repository.inputs["imageTagMutability"] == "IMMUTABLE", repository.name
    for policy_resource in of_type(resources, "aws:ecr/lifecyclePolicy:LifecyclePolicy"):
        image = policy_resource.name.removeprefix("storage-")
        policy = json.loads(policy_resource.inputs["policy"])
        assert policy == ecr_lifecycle_policy(kept_tags(config)[image])
        assert policy["rules"][-1]["selection"]["tagStatus"] == "any"  # ECR: an "any" rule comes last
        # The tag the stack runs was pushed first; 300 newer builds follow, some untagged.
        images = [(0, {config.image_tag})] + [(n, {f"build-{n}"} if n % 3 else set()) for n in range(1, 301)]
        expired = _expired(policy, images)
        assert 0 not in expired and len(expired) == 300 - 50  # the newest 50 others stay, the rest go


def test_a_team_image_in_the_stacks_registry_keeps_its_tag_too():
    config = load_stack("dev")
    registry = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/{config.cluster_name}"
    teams = [config.teams[0].model_copy(update={"image": f"{registry}/ddp:vision-7"}),
             config.teams[1].model_copy(update={"image": "docker.io/someone/ddp:1"})]
    tags = kept_tags(config.model_copy(update={"teams": tuple(teams)}))
    assert tags["ddp"] == tuple(sorted({config.image_tag, "vision-7"}))
    assert tags["mpi"] == tags["ray"] == (config.image_tag,)


def _weekly_hit_after(schedule: str, moment: datetime) -> datetime:
    """The first time after ``moment`` that a ``M H * * D`` cron schedule (UTC) fires."""
    minute, hour, day, month, weekday = schedule.split()
    assert (day, month) == ("*", "*")
    days_ahead = (int(weekday) - (moment.isoweekday() % 7)) % 7
    hit = (moment + timedelta(days=days_ahead)).replace(hour=int(hour), minute=int(minute), second=0, microsecond=0)
    return hit if hit > moment else hit + timedelta(days=7)


def _allowed(budgets: list[dict], reason: str, nodes: int, now: datetime) -> int:
    """kubernetes-sigs/karpenter v1.14.1 pkg/apis/v1/nodepool.go: the smallest active budget for ``reason``; a budget
    with a schedule is active when its first hit after now-duration is not after now; inactive ones allow any."""
    allowed = 10**9
    for budget in budgets:
        if budget.get("reasons") not in (None, []) and reason not in budget["reasons"]:
            continue
        if "schedule" in budget:
            hours = int(re.fullmatch(r"(\d+)h", budget["duration"])[1])
            if _weekly_hit_after(budget["schedule"], now - timedelta(hours=hours)) > now:
                continue
        value = budget["nodes"]
        allowed = min(allowed, -(-nodes * int(value[:-1]) // 100) if value.endswith("%") else int(value))
    return allowed


@pytest.mark.parametrize("stack", STACKS)
def test_busy_gpu_nodes_are_replaced_for_drift_in_the_maintenance_window_only(stack):
    """GPU nodes never expire (expireAfter Never) and never consolidate while busy; drifted ones (a new AMI) are
    replaced in the weekly window, busy ones too: drift is eventual disruption, bounded by the pool's
    terminationGracePeriod despite karpenter.sh/do-not-disrupt (pkg/controllers/disruption/types.go)."""
    start_hour = int(MAINTENANCE_WINDOW_START.split()[1])
    monday = datetime(2026, 12, 7, tzinfo=UTC)
    for name, pool in _pools(stack).items():
        template = pool["template"]["spec"]
        if "taints" not in template:
            continue
        assert template["expireAfter"] == "Never" and template["terminationGracePeriod"], name
        budgets = pool["disruption"]["budgets"]
        for step in range(7 * 24 * 6):
            now = monday + timedelta(minutes=10 * step)
            in_window = now.isoweekday() == 7 and start_hour <= now.hour < start_hour + MAINTENANCE_WINDOW_HOURS
            drift = _allowed(budgets, "Drifted", 20, now)
            assert drift == (2 if in_window else 0), (name, now)
            assert _allowed(budgets, "Underutilized", 20, now) == 0
            assert _allowed(budgets, "Empty", 20, now) == 2
