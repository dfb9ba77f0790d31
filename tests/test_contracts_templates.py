"""Contract: what the rendered templates rely on exists in what the same stack's plan installs.

Every kind, every team, every stack (as it is once gpuyard:image_registry names its ECR registry): the queue,
priority class, runtime and controller flag a manifest relies on are in the plan, and its training pods select a
node shape of the plan whose taints they tolerate.
"""

from __future__ import annotations

import pytest

from conftest import with_registry
from gpuyard.infra.config import load_stack
from gpuyard.jobs.render import default_specs, render
from render_helpers import trainer_templates
from infra_plans import kubernetes_manifests, planned
from test_contracts_nodes import managed_nodes, pool_nodes
from test_contracts_operators import deployment_args, kuberay_chart_args, release_values

STACKS = ("dev", "prod", "ephemeral")


def cases(stack: str):
    config = with_registry(load_stack(stack))
    return [(stack, spec) for spec in default_specs(config)]


CASES = [case for stack in STACKS for case in cases(stack)]


def plan_objects(stack: str, kind: str) -> list[dict]:
    return [m for m in kubernetes_manifests(planned(stack)) if m["kind"] == kind]


def relied_on_flag(stack: str, kind: str) -> tuple[str, list[str]]:
    """The controller flag a kind's gang scheduling needs, and the args the stack runs that controller with."""
    if kind == "PyTorchJob":
        return "--gang-scheduler-name=volcano", deployment_args(stack, "training-operator", "training-operator")
    if kind == "MPIJob":
        return "--gang-scheduling=volcano", deployment_args(stack, "mpi-operator", "mpi-operator")
    return "--batch-scheduler=volcano", kuberay_chart_args(release_values(stack, "kuberay-operator"))


def queue_and_priority(manifest: dict) -> tuple[str, str | None]:
    spec, kind = manifest["spec"], manifest["kind"]
    if kind in ("PyTorchJob", "MPIJob"):
        policy = spec["runPolicy"]["schedulingPolicy"]
        return policy["queue"], policy["priorityClass"]
    if kind == "RayJob":
        labels = manifest["metadata"]["labels"]
        return labels["volcano.sh/queue-name"], labels["ray.io/priority-class-name"]
    if kind == "Job":
        return spec["queue"], spec["priorityClassName"]
    return None, None


@pytest.mark.parametrize(("stack", "spec"), CASES, ids=[f"{s}-{spec.team}-{spec.kind}" for s, spec in CASES])
def test_queues_priorities_runtimes_and_flags_the_template_relies_on_are_installed(stack, spec):
    config = with_registry(load_stack(stack))
    manifest = render(spec, config.team(spec.team))
    queue, priority = queue_and_priority(manifest)
    if manifest["kind"] == "TrainJob":
        ref = manifest["spec"]["runtimeRef"]
        runtimes = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in plan_objects(stack, ref["kind"])}
        assert (manifest["metadata"]["namespace"], ref["name"]) in runtimes
        return
    assert queue in {q["metadata"]["name"] for q in plan_objects(stack, "Queue")}
    assert priority in {p["metadata"]["name"] for p in plan_objects(stack, "PriorityClass")}
    if manifest["kind"] != "Job":
        flag, args = relied_on_flag(stack, manifest["kind"])
        assert flag in args


def _tolerates(tolerations: list[dict], taints: list[dict]) -> bool:
    return all(any(t.get("key") == taint["key"] and t.get("effect") in (None, taint["effect"]) for t in tolerations)
               for taint in taints if taint["effect"] == "NoSchedule")


@pytest.mark.parametrize(("stack", "spec"), CASES, ids=[f"{s}-{spec.team}-{spec.kind}" for s, spec in CASES])
def test_training_pods_select_a_node_shape_of_the_plan_and_tolerate_its_taints(stack, spec):
    config = with_registry(load_stack(stack))
    manifest = render(spec, config.team(spec.team))
    resources = planned(stack)
    nodes = managed_nodes(resources) + pool_nodes(resources)
    for _, pod in trainer_templates(manifest):
        if not spec.gpus_per_node:
            continue
        selector = pod["spec"]["nodeSelector"]
        matching = [n for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())]
        assert matching, f"no node shape of {stack} has {selector}"
        assert all(_tolerates(pod["spec"].get("tolerations", []), n.taints) for n in matching)


def test_every_stack_renders_every_kind_it_installs():
    """The cases above cover each stack's kinds (Trainer v2 only where installed)."""
    kinds = {stack: {spec.kind for s, spec in CASES if s == stack} for stack in STACKS}
    assert kinds["dev"] == {"pytorchjob", "mpijob", "rayjob", "volcanojob", "trainjob"}
    assert kinds["prod"] == kinds["ephemeral"] == {"pytorchjob", "mpijob", "rayjob", "volcanojob"}
