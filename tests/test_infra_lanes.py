"""Team lanes (infra/admission.py), their CEL run by cel-python against the planned team namespaces: every rendered
job, the pods, PodGroups and Services the operators make from it are admitted; each escape of issue 21 is refused
by the rule that names it. `tests/test_sim_tenancy.py` tries the same escapes on the real API server."""

from __future__ import annotations

import copy

import celpy
import pytest
from celpy import celtypes

from conftest import with_registry
from gpuyard.infra.admission import LANES, lane_binding_spec, lane_policy_name
from gpuyard.infra.admission import lane_policy_spec
from gpuyard.infra.config import load_stack
from infra_plans import of_type, planned
from gpuyard.jobs.render import default_specs, render
from pod_security import pod_specs

STACK = "dev"
CONFIG = with_registry(load_stack(STACK))
ENVIRONMENT = celpy.Environment()
KIND_LANES = {"PyTorchJob": "pytorchjobs", "MPIJob": "mpijobs", "Job": "volcanojobs", "RayJob": "rayjobs",
              "RayCluster": "rayclusters", "TrainJob": "trainjobs", "TrainingRuntime": "trainingruntimes",
              "Pod": "pods", "PodGroup": "podgroups", "Service": "services"}


def _programs(lane_name: str):
    (lane,) = [lane for lane in LANES if lane.name == lane_name]
    spec = lane_policy_spec(lane)
    compiled = lambda expression: ENVIRONMENT.program(ENVIRONMENT.compile(expression))  # noqa: E731
    variables = [(v["name"], compiled(v["expression"])) for v in spec["variables"]]
    return variables, [(compiled(v["expression"]), compiled(v["messageExpression"])) for v in spec["validations"]]


PROGRAMS = {lane.name: _programs(lane.name) for lane in LANES}


def namespace_object(team: str) -> dict:
    (namespace,) = [n.inputs for n in of_type(planned(STACK), "kubernetes:core/v1:Namespace")
                    if n.inputs["metadata"]["name"] == CONFIG.team(team).namespace]
    return namespace


def refusals(obj: dict, team: str) -> list[str]:
    """The messages the lane of ``obj``'s kind refuses it with in ``team``'s namespace (an error refuses too, as
    with the policies' failurePolicy Fail)."""
    variables, validations = PROGRAMS[KIND_LANES[obj["kind"]]]
    activation = {"object": celpy.json_to_cel(obj), "namespaceObject": celpy.json_to_cel(namespace_object(team))}
    activation["variables"] = celtypes.MapType(
        {celtypes.StringType(name): program.evaluate(activation) for name, program in variables})
    found = []
    for expression, message in validations:
        verdict = expression.evaluate(activation)
        if verdict is not True and verdict != celtypes.BoolType(True):
            found.append(str(message.evaluate(activation)) if not isinstance(verdict, Exception) else f"error {verdict}")
    return found


def rendered(team: str, kind: str) -> dict:
    (spec,) = [s for s in default_specs(CONFIG) if s.team == team and s.kind == kind]
    return render(spec, CONFIG.team(team))


def training_runtimes(team: str) -> dict[str, dict]:
    """The team's TrainingRuntimes by name (one per pool)."""
    return {r.inputs["metadata"]["name"]: r.inputs for r in planned(STACK) if r.inputs.get("kind") == "TrainingRuntime"
            and r.inputs["metadata"]["namespace"] == CONFIG.team(team).namespace}


def pods_of(manifest: dict) -> list[dict]:
    """The pods an operator makes from ``manifest``'s templates: Volcano's scheduler where none is named, a
    Volcano Job's priority where its template has none (the operators' defaults, infra/admission.py)."""
    pods = []
    for spec in pod_specs(manifest):
        spec = {"schedulerName": "volcano", **spec}
        spec.setdefault("priorityClassName", manifest["spec"].get("priorityClassName"))
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"annotations": {
            "scheduling.k8s.io/group-name": manifest["metadata"]["name"]}}, "spec": spec})
    return pods


KINDS = ("pytorchjob", "mpijob", "rayjob", "volcanojob", "trainjob")
JOBS = [pytest.param(team.name, kind, id=f"{team.name}-{kind}") for team in CONFIG.teams for kind in KINDS]


@pytest.mark.parametrize(("team", "kind"), JOBS)
def test_rendered_jobs_and_what_operators_make_of_them_are_admitted(team, kind):
    manifest = rendered(team, kind)
    assert refusals(manifest, team) == []
    # a TrainJob's pods come from the runtime it names
    pod_source = training_runtimes(team)[manifest["spec"]["runtimeRef"]["name"]] if kind == "trainjob" else manifest
    pods = pods_of(pod_source)
    assert pods and [refusals(pod, team) for pod in pods] == [[]] * len(pods)
    podgroup = {"kind": "PodGroup", "spec": {"queue": CONFIG.team(team).queue,
                                             "priorityClassName": CONFIG.team(team).priority_class}}
    assert refusals(podgroup, team) == []
    if kind == "rayjob":
        cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": manifest["metadata"],
                   "spec": manifest["spec"]["rayClusterSpec"]}
        assert refusals(cluster, team) == []


@pytest.mark.parametrize("team", [team.name for team in CONFIG.teams])
def test_the_stacks_own_training_runtimes_and_headless_services_are_admitted(team):
    runtimes = training_runtimes(team)
    assert len(runtimes) > 1 and {name: refusals(runtime, team) for name, runtime in runtimes.items()} == {
        name: [] for name in runtimes}
    headless = {"kind": "Service", "spec": {"type": "ClusterIP", "clusterIP": "None"}}
    assert refusals(headless, team) == []


def _templates(manifest: dict) -> list[dict]:
    return [spec for spec in pod_specs(manifest)]


def _edit(team: str, kind: str, edit) -> dict:
    manifest = copy.deepcopy(rendered(team, kind))
    edit(manifest)
    return manifest


def _every_template(change):
    def edit(manifest):
        for spec in pod_specs(manifest):
            change(spec)
    return edit


def _scheduling_policy(**values):
    return lambda m: m["spec"]["runPolicy"]["schedulingPolicy"].update(values)


NVIDIA_ALL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
ESCAPES = [
    # 1. another team's queue, or Volcano's default
    ("nlp", "pytorchjob", _scheduling_policy(queue="vision"), "team-queue"),
    ("nlp", "mpijob", _scheduling_policy(queue="default"), "team-queue"),
    ("nlp", "volcanojob", lambda m: m["spec"].update(queue="vision"), "team-queue"),
    ("nlp", "rayjob", lambda m: m["metadata"]["labels"].update({"volcano.sh/queue-name": "vision"}), "team-queue"),
    ("nlp", "pytorchjob", lambda m: m["spec"]["runPolicy"]["schedulingPolicy"].pop("queue"), "team-queue"),
    ("nlp", "trainjob", lambda m: m["spec"].update(runtimePatches=[{"manager": "me", "trainingRuntimeSpec": {
        "template": {"metadata": {"annotations": {"scheduling.volcano.sh/queue-name": "vision"}}}}}]), "team-queue"),
    ("nlp", "trainjob", lambda m: m["spec"]["runtimeRef"].update(kind="ClusterTrainingRuntime"), "team-runtime"),
    # 2. a priority above the team's
    ("nlp", "pytorchjob", _scheduling_policy(priorityClass="gpuyard-high"), "team-priority"),
    ("nlp", "mpijob", _every_template(lambda s: s.update(priorityClassName="gpuyard-normal")), "team-priority"),
    ("vision", "volcanojob", lambda m: m["spec"].update(priorityClassName="gpuyard-high"), "team-priority"),
    ("nlp", "rayjob", lambda m: m["metadata"]["labels"].update({"ray.io/priority-class-name": "gpuyard-high"}),
     "team-priority"),
    ("vision", "rayjob", _every_template(lambda s: s.pop("priorityClassName")), "team-priority"),
    # 3. leaving Volcano
    ("vision", "pytorchjob", _every_template(lambda s: s.update(schedulerName="default-scheduler")), "volcano-scheduler"),
    ("vision", "volcanojob", _every_template(lambda s: s.update(schedulerName="default-scheduler")), "volcano-scheduler"),
    # 4. every GPU of a node without asking
    ("vision", "mpijob", _every_template(lambda s: s["containers"][0].setdefault("env", []).append(NVIDIA_ALL)),
     "gpu-by-request"),
    # 6. a load balancer in front of the Ray dashboard
    ("vision", "rayjob", lambda m: m["spec"]["rayClusterSpec"]["headGroupSpec"].update(serviceType="LoadBalancer"),
     "cluster-ip-services"),
    ("vision", "rayjob", lambda m: m["spec"]["rayClusterSpec"]["headGroupSpec"].update(enableIngress=True),
     "cluster-ip-services"),
]


@pytest.mark.parametrize(("team", "kind", "edit", "rule"), ESCAPES)
def test_each_escape_is_refused_by_the_rule_that_names_it(team, kind, edit, rule):
    found = refusals(_edit(team, kind, edit), team)
    assert found and all(message.startswith(f"{rule}: ") for message in found), found


POD = pods_of(rendered("vision", "pytorchjob"))[0]


@pytest.mark.parametrize(("change", "rule"), [
    (lambda p: p["spec"].update(schedulerName="default-scheduler"), "volcano-scheduler"),
    (lambda p: p["spec"].pop("priorityClassName"), "team-priority"),
    (lambda p: p["spec"].update(priorityClassName="gpuyard-high"), "team-priority"),
    (lambda p: p["metadata"]["annotations"].update({"scheduling.volcano.sh/queue-name": "nlp"}), "team-queue"),
    (lambda p: p["metadata"].update(labels={"volcano.sh/queue-name": "default"}), "team-queue"),
    (lambda p: p["spec"]["containers"][0]["env"].append(NVIDIA_ALL), "gpu-by-request"),
    (lambda p: p["spec"].update(initContainers=[{"name": "i", "image": "i", "env": [NVIDIA_ALL]}]), "gpu-by-request"),
    (lambda p: p["spec"]["containers"][0]["env"].append(
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}),
     "gpu-by-request"),
])
def test_pods_the_operators_make_are_checked_themselves(change, rule):
    pod = copy.deepcopy(POD)
    change(pod)
    found = refusals(pod, "vision")
    assert found and all(message.startswith(f"{rule}: ") for message in found), found


@pytest.mark.parametrize(("obj", "rule"), [
    ({"kind": "PodGroup", "spec": {"queue": "default", "priorityClassName": "gpuyard-low"}}, "team-queue"),
    ({"kind": "PodGroup", "spec": {"queue": "nlp", "priorityClassName": "gpuyard-low"}}, "team-queue"),
    ({"kind": "PodGroup", "spec": {"queue": "vision", "priorityClassName": "gpuyard-high"}}, "team-priority"),
    ({"kind": "PodGroup", "spec": {"queue": "vision"}}, "team-priority"),
    ({"kind": "Service", "spec": {"type": "LoadBalancer"}}, "cluster-ip-services"),
    ({"kind": "Service", "spec": {"type": "NodePort"}}, "cluster-ip-services"),
    ({"kind": "Service", "spec": {"type": "ClusterIP", "externalIPs": ["203.0.113.9"]}}, "cluster-ip-services"),
])
def test_podgroups_and_services_stay_in_the_lane(obj, rule):
    found = refusals(obj, "vision")
    assert found and all(message.startswith(f"{rule}: ") for message in found), found


@pytest.mark.parametrize("value", [None, "", "void", "none"])
def test_a_pod_hiding_every_gpu_is_admitted(value):
    """MPI Operator v0.8.0 gives each launcher without GPUs NVIDIA_VISIBLE_DEVICES with no value
    (pkg/controller/mpi_job_controller.go, nvidiaDisableEnvVars): hiding GPUs is no escape."""
    pod = copy.deepcopy(POD)
    pod["spec"]["containers"][0]["env"].append({"name": "NVIDIA_VISIBLE_DEVICES"} | ({"value": value} if value is not None
                                                                                    else {}))
    assert refusals(pod, "vision") == []


def test_a_team_may_lower_its_priority_but_not_raise_it():
    low = _edit("vision", "volcanojob", lambda m: m["spec"].update(priorityClassName="gpuyard-low"))
    assert refusals(low, "vision") == []
    assert CONFIG.team("vision").priority_classes == ("gpuyard-normal", "gpuyard-low")
    assert CONFIG.team("nlp").priority_classes == ("gpuyard-low",)


@pytest.mark.parametrize("stack", ["dev", "prod", "ephemeral"])
def test_every_lane_is_bound_to_team_namespaces_and_denies(stack):
    resources = planned(stack)
    policies = {p.inputs["metadata"]["name"]: p for p in
                of_type(resources, "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy")}
    bindings = {b.inputs["spec"]["policyName"]: b for b in
                of_type(resources, "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding")}
    for lane in LANES:
        policy, binding = policies[lane_policy_name(lane)], bindings[lane_policy_name(lane)]
        assert binding.inputs["spec"] == lane_binding_spec(lane)
        assert policy.urn in binding.dependencies
        (rule,) = policy.inputs["spec"]["matchConstraints"]["resourceRules"]
        assert rule["resources"] == [lane.resource] and rule["apiGroups"] == [lane.group]
        assert "matchConditions" not in policy.inputs["spec"]  # no requester is exempt
    namespaces = of_type(resources, "kubernetes:core/v1:Namespace")
    for team in load_stack(stack).teams:
        (namespace,) = [n.inputs["metadata"] for n in namespaces if n.inputs["metadata"]["name"] == team.namespace]
        assert namespace["annotations"]["scheduling.volcano.sh/queue-name"] == team.queue
        allowed = {k.split("/", 1)[1] for k in namespace["labels"] if k.startswith("priority-class.gpuyard.io/")}
        assert allowed == set(team.priority_classes)
