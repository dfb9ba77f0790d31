"""Contract: each controller flag and scheduler setting the job templates rely on is in what the stacks install.

Read from the real plans: the Helm values the releases get, the kustomizations the operators are installed
from, and the objects (Queues, PriorityClasses, TrainingRuntimes) the stacks create.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.charts import KUBERAY_OPERATOR, MPI_OPERATOR_MANIFEST, VOLCANO
from infra.config import load_stack
from infra.operators import (
    KUBERAY_OPERATOR_ARGS,
    MPI_OPERATOR_ARGS,
    TRAINING_OPERATOR_ARGS,
    VOLCANO_SCHEDULER_CONF,
)
from infra_plans import kubernetes_manifests, of_type, planned

STACKS = ("dev", "prod", "ephemeral")
RELEASE = "kubernetes:helm.sh/v3:Release"
DIRECTORY = "kubernetes:kustomize/v2:Directory"


def release_values(stack: str, chart: str) -> dict:
    (release,) = [r for r in of_type(planned(stack), RELEASE) if r.inputs["chart"] == chart]
    return release.inputs["values"]


def deployment_args(stack: str, operator: str, deployment: str) -> list[str]:
    """The args the kustomization the stack installs ``operator`` from sets on ``deployment``."""
    (directory,) = [d for d in of_type(planned(stack), DIRECTORY) if Path(d.inputs["directory"]).name == operator]
    kustomization = yaml.safe_load((Path(directory.inputs["directory"]) / "kustomization.yaml").read_text())
    (patch,) = [p for p in kustomization["patches"] if p.get("target", {}).get("name") == deployment]
    (operation,) = yaml.safe_load(patch["patch"])
    assert (operation["op"], operation["path"]) in {
        ("add", "/spec/template/spec/containers/0/args"), ("replace", "/spec/template/spec/containers/0/args")
    }
    return operation["value"]


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
    assert {"gang", "priority", "proportion", "predicates"} <= plugins


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
