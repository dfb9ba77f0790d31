"""Contract: each controller flag and scheduler setting the job templates rely on is in what the stacks install.

Read from the real plans: the Helm values the releases get, the kustomizations the operators are installed
from, and the objects (Queues, PriorityClasses, TrainingRuntimes) the stacks create.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuyard.infra.charts import KUBERAY_OPERATOR, MPI_OPERATOR_MANIFEST, VOLCANO
from gpuyard.infra.config import load_stack
from gpuyard.infra.operators import (
    KUBERAY_OPERATOR_ARGS,
    MPI_OPERATOR_ARGS,
    PYTORCH_INIT_TEMPLATE,
    PYTORCH_INIT_TEMPLATE_FLAG,
    PYTORCH_INIT_TEMPLATE_PATH,
    TRAINING_OPERATOR_ARGS,
    VOLCANO_SCHEDULER_CONF,
)
from conftest import with_registry
from infra_plans import kubernetes_manifests, of_type, planned
from gpuyard.jobs.render import default_specs, render
from pod_security import restricted_violations

STACKS = ("dev", "prod", "ephemeral")
RELEASE = "kubernetes:helm.sh/v3:Release"
DIRECTORY = "kubernetes:kustomize/v2:Directory"


def release_values(stack: str, chart: str) -> dict:
    (release,) = [r for r in of_type(planned(stack), RELEASE) if r.inputs["chart"] == chart]
    return release.inputs["values"]


def deployment_args(stack: str, operator: str, deployment: str) -> list[str]:
    """The args the kustomization the stack installs ``operator`` from sets on ``deployment``."""
    return deployment_patch(stack, operator, deployment)["/spec/template/spec/containers/0/args"]


def deployment_patch(stack: str, operator: str, deployment: str) -> dict[str, object]:
    """The JSON patch the stack's kustomization of ``operator`` applies to ``deployment``, as path -> value."""
    kustomization = yaml.safe_load((operator_directory(stack, operator) / "kustomization.yaml").read_text())
    (patch,) = [p for p in kustomization["patches"] if p.get("target", {}).get("name") == deployment]
    operations = yaml.safe_load(patch["patch"])
    assert {operation["op"] for operation in operations} <= {"add", "replace"}
    return {operation["path"]: operation["value"] for operation in operations}


def operator_directory(stack: str, operator: str) -> Path:
    (directory,) = [d for d in of_type(planned(stack), DIRECTORY) if Path(d.inputs["directory"]).name == operator]
    return Path(directory.inputs["directory"])


def kuberay_chart_args(values: dict) -> list[str]:
    """The operator args ray-project/kuberay v1.7.0 helm-chart/kuberay-operator/templates/deployment.yaml writes
    from batchScheduler (without ``configuration.enabled``, which replaces every flag by a config file)."""
    assert not values.get("configuration", {}).get("enabled")
    scheduler = values.get("batchScheduler", {})
    args = ["--enable-batch-scheduler"] if scheduler.get("enabled") else []
    if scheduler.get("name"):
        args.append(f"--batch-scheduler={scheduler['name']}")
    return args


def scheduler_conf(stack: str) -> dict:
    text = release_values(stack, VOLCANO.name)["custom"]["scheduler_config_override"]
    assert text == VOLCANO_SCHEDULER_CONF
    return yaml.safe_load(text)


@pytest.mark.parametrize("stack", STACKS)
def test_volcano_admits_gangs_karpenter_must_scale_for(stack):
    conf = scheduler_conf(stack)
    actions = [a.strip() for a in conf["actions"].split(",")]
    assert "enqueue" not in actions and actions[0] == "allocate"
    plugins = {p["name"] for tier in conf["tiers"] for p in tier["plugins"]}
    assert {"gang", "priority", "capacity", "predicates"} <= plugins


@pytest.mark.parametrize("stack", STACKS)
def test_a_queue_may_run_a_gang_as_large_as_its_capability(stack):
    """``proportion`` caps a queue at its weighted share of the nodes present (volcano v1.14.1
    plugins/proportion/proportion.go queueAllocatable): two teams each wanting the capped pool would never run.
    ``capacity`` caps it at its capability bounded by the cluster (plugins/capacity/capacity.go queueAllocatable)."""
    plugins = [p["name"] for tier in scheduler_conf(stack)["tiers"] for p in tier["plugins"]]
    assert "capacity" in plugins and "proportion" not in plugins


@pytest.mark.parametrize("stack", STACKS)
def test_queues_deserve_their_weighted_gpu_share_within_capability(stack):
    """What Volcano's capacity plugin and queue webhook read (volcano v1.14.1): ``deserved`` <= ``capability``
    (webhooks/admission/queues/validate/validate_queue.go, "deserved should less equal than capability"); every
    dimension a team's pods ask for is in ``deserved``, or each such pod is a victim of any reclaim
    (capacity.go isImmediateVictim); the GPUs deserved add up to the pool and follow the weights."""
    config = load_stack(stack)
    queues = {m["metadata"]["name"]: m["spec"] for m in kubernetes_manifests(planned(stack)) if m["kind"] == "Queue"}
    deserved = {}
    for team in config.teams:
        spec = queues[team.queue]
        assert set(spec["deserved"]) == set(spec["capability"]) == {"cpu", "memory", "nvidia.com/gpu"}
        assert spec["deserved"]["cpu"] == spec["capability"]["cpu"]
        assert spec["deserved"]["memory"] == spec["capability"]["memory"]
        deserved[team.name] = int(spec["deserved"]["nvidia.com/gpu"])
        assert 0 <= deserved[team.name] <= int(spec["capability"]["nvidia.com/gpu"])
    assert sum(deserved.values()) <= config.karpenter.gpu_limit
    if all(t.gpu_quota >= config.karpenter.gpu_limit for t in config.teams):
        assert sum(deserved.values()) == config.karpenter.gpu_limit
    by_weight = sorted(config.teams, key=lambda t: t.queue_weight)
    uncapped = [t for t in by_weight if deserved[t.name] < t.gpu_quota]
    assert all(deserved[a.name] <= deserved[b.name] for a, b in zip(uncapped, uncapped[1:]))


@pytest.mark.parametrize("stack", STACKS)
def test_reclaimable_queues_and_priority_classes_have_their_actions(stack):
    actions = {a.strip() for a in scheduler_conf(stack)["actions"].split(",")}
    manifests = kubernetes_manifests(planned(stack))
    queues = [m for m in manifests if m["kind"] == "Queue"]
    assert queues and all(q["spec"]["reclaimable"] for q in queues)
    assert "reclaim" in actions
    classes = [m for m in manifests if m["kind"] == "PriorityClass"]
    assert any(c["preemptionPolicy"] == "PreemptLowerPriority" for c in classes)
    assert "preempt" in actions


@pytest.mark.parametrize("stack", STACKS)
def test_mpi_operator_gang_schedules_with_volcano(stack):
    args = deployment_args(stack, "mpi-operator", "mpi-operator")
    assert args == list(MPI_OPERATOR_ARGS) and "--gang-scheduling=volcano" in args
    (directory,) = [d for d in of_type(planned(stack), DIRECTORY) if d.inputs["directory"].endswith("mpi-operator")]
    resources = yaml.safe_load((Path(directory.inputs["directory"]) / "kustomization.yaml").read_text())["resources"]
    assert resources == [MPI_OPERATOR_MANIFEST] and "/v0.8.0/" in MPI_OPERATOR_MANIFEST


@pytest.mark.parametrize("stack", STACKS)
def test_training_operator_gang_schedules_with_volcano(stack):
    args = deployment_args(stack, "training-operator", "training-operator")
    assert args == list(TRAINING_OPERATOR_ARGS) and "--gang-scheduler-name=volcano" in args


@pytest.mark.parametrize("stack", STACKS)
def test_pytorch_workers_init_container_meets_restricted(stack):
    """The operator reads the template where the Deployment mounts the ConfigMap made of PYTORCH_INIT_TEMPLATE, and a
    worker pod of our PyTorchJob with that init container passes the Pod Security Standard its namespace enforces."""
    directory = operator_directory(stack, "training-operator")
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    (generated,) = kustomization["configMapGenerator"]
    key, source = generated["files"][0].split("=")
    assert (directory / source).resolve() == PYTORCH_INIT_TEMPLATE.resolve()
    patch = deployment_patch(stack, "training-operator", "training-operator")
    mount, volume = patch["/spec/template/spec/containers/0/volumeMounts/-"], patch["/spec/template/spec/volumes/-"]
    assert (volume["configMap"]["name"], mount["name"]) == (generated["name"], volume["name"])
    assert f"{mount['mountPath']}/{key}" == PYTORCH_INIT_TEMPLATE_PATH
    assert f"{PYTORCH_INIT_TEMPLATE_FLAG}={PYTORCH_INIT_TEMPLATE_PATH}" in TRAINING_OPERATOR_ARGS
    # the Go template's fields, filled as pkg/controller.v1/pytorch/initcontainer.go GetInitContainer does
    text = PYTORCH_INIT_TEMPLATE.read_text().replace("{{.InitContainerImage}}", "alpine:3.10")
    (init,) = yaml.safe_load(text.replace("{{.MaxTries}}", "100").replace("{{.MasterAddr}}", "job-master-0"))
    config = with_registry(load_stack(stack))
    spec = next(s for s in default_specs(config) if s.kind == "pytorchjob")
    worker = render(spec, config.team(spec.team))["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert restricted_violations({**worker, "initContainers": [init]}) == []
    assert restricted_violations({**worker, "initContainers": [{**init, "securityContext": {}}]})  # upstream's as is


@pytest.mark.parametrize("stack", STACKS)
def test_kuberay_runs_with_the_volcano_batch_scheduler(stack):
    args = kuberay_chart_args(release_values(stack, KUBERAY_OPERATOR.name))
    assert set(KUBERAY_OPERATOR_ARGS) <= set(args) and "--batch-scheduler=volcano" in args


@pytest.mark.parametrize("stack", ["dev"])
def test_each_team_has_a_training_runtime_on_volcano_in_its_queue_with_its_priority(stack):
    config = load_stack(stack)
    runtimes = {m["metadata"]["namespace"]: m for m in kubernetes_manifests(planned(stack)) if m["kind"] == "TrainingRuntime"}
    assert set(runtimes) == {t.namespace for t in config.teams}
    for team in config.teams:
        spec = runtimes[team.namespace]["spec"]
        assert spec["podGroupPolicy"] == {"volcano": {}}
        assert spec["template"]["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == team.queue
        for job in spec["template"]["spec"]["replicatedJobs"]:
            pod = job["template"]["spec"]["template"]["spec"]
            assert (pod["schedulerName"], pod["priorityClassName"]) == ("volcano", team.priority_class)
