"""Team lanes: ValidatingAdmissionPolicies (CEL) tying everything that runs in a team namespace to the team's
Volcano queue, its PriorityClasses and the Volcano scheduler, and keeping its Services inside the cluster.

The policies read the team from its namespace (``namespaceObject``), which only the stack writes: the queue from
Volcano's own namespace annotation ``scheduling.volcano.sh/queue-name``, the allowed PriorityClasses from one label
each (``priority-class.gpuyard.io/<class>``). They check the objects themselves, whoever sends them: a team
member's job, and the pods and PodGroups the operators create from it under their own identities. How each
operator carries the three settings to its pods and PodGroups (upstream, at the pinned tags):

- Volcano (v1.15.1): the scheduler takes a pod's queue from its PodGroup (annotation ``scheduling.k8s.io/
  group-name``, same namespace); a pod without one gets a PodGroup from ``scheduling.volcano.sh/queue-name`` and its
  ``priorityClassName`` (pkg/controllers/podgroup/pg_controller_handler.go, buildPodGroupFromPod). The Job
  controller copies ``spec.queue`` and ``spec.priorityClassName`` to the PodGroup, and a task template's
  ``schedulerName``/``priorityClassName`` win over the job's (pkg/controllers/job/job_controller_util.go).
- Training Operator v1.9.4: PodGroup queue and priority from ``runPolicy.schedulingPolicy`` (``default`` and none
  without it; pkg/controller.v1/common/job.go); a template's own ``schedulerName`` is kept
  (pkg/controller.v1/control/podgroup_control.go, DecoratePodTemplateSpec); pods get the template's priority.
- MPI Operator v0.8.0: queue from ``schedulingPolicy.queue``, else the MPIJob's ``scheduling.volcano.sh/queue-name``;
  priority from ``schedulingPolicy.priorityClass``, else the launcher's or workers' template; ``schedulerName``
  overwritten with volcano (pkg/controller/podgroup.go).
- KubeRay v1.7.0: PodGroup queue and priority from the RayCluster's (or RayJob's) labels ``volcano.sh/queue-name``
  and ``ray.io/priority-class-name``; ``schedulerName`` overwritten; pods keep their template's priority
  (ray-operator/controllers/ray/batchscheduler/volcano/volcano_scheduler.go). A RayJob's labels are copied to
  its RayCluster (rayjob_controller.go, constructRayClusterForRayJob).
- Kubeflow Trainer v2.3.0: queue from the runtime template's (or a runtime patch's) ``scheduling.volcano.sh/
  queue-name``, priority from the runtime's pod template; no ``schedulerName`` is set
  (pkg/runtime/framework/plugins/volcano/volcano.go). A TrainJob's ``runtimeRef`` defaults to a
  ClusterTrainingRuntime, which carries none of the team's settings, so teams use their namespace's runtime.

Every message starts with the rule's name (``team-queue``, ``team-priority``, ``volcano-scheduler``,
``gpu-by-request``, ``team-runtime``, ``cluster-ip-services``), so a refusal names what it enforces.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuyard.infra.conventions import (
    ANNOTATION_QUEUE_NAME,
    LABEL_PRIORITY_CLASS_PREFIX,
    LABEL_QUEUE_NAME,
    LABEL_TEAM,
    SCHEDULER_NAME,
)

# KubeRay's priority label (ray-operator/controllers/ray/utils/constant.go, RayPriorityClassName).
LABEL_RAY_PRIORITY_CLASS = "ray.io/priority-class-name"
# Set by NVIDIA's device plugin for the GPUs a container was allocated; a pod that sets it itself asks the node's
# container toolkit for GPUs outside the scheduler (NVIDIA/k8s-device-plugin v0.17.4, internal/plugin/server.go).
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
TEAM_QUEUE = "variables.queue"
VARIABLES = [{
    "name": "queue",
    "expression": f"has(namespaceObject.metadata.annotations) && '{ANNOTATION_QUEUE_NAME}' in "
                  f"namespaceObject.metadata.annotations ? "
                  f"namespaceObject.metadata.annotations['{ANNOTATION_QUEUE_NAME}'] : ''",
}]


@dataclass(frozen=True)
class Lane:
    """One admission policy: the resource it checks and its CEL validations (expression, messageExpression)."""

    name: str
    group: str
    resource: str
    validations: tuple[tuple[str, str], ...]


def _allowed_priority(expression: str) -> str:
    return f"(('{LABEL_PRIORITY_CLASS_PREFIX}' + {expression}) in namespaceObject.metadata.labels)"


def _quoted(text: str) -> str:
    return f'"{text}"'


def _message(rule: str, text: str, *expressions: str) -> str:
    """A CEL messageExpression: ``rule: text`` followed by the values of ``expressions``."""
    return " + ".join([_quoted(f"{rule}: {text}"), *expressions])


def _absent_or(path: str, condition: str) -> str:
    """``condition`` holds wherever ``path`` (a CEL field selection) is set."""
    return f"(!has({path}) || {condition})"


def _present(path: str) -> str:
    """Every field of ``path`` below ``object`` is set (CEL's ``has`` needs each parent)."""
    parts = path.split(".")
    return " && ".join(f"has({'.'.join(parts[:i])})" for i in range(3, len(parts) + 1))


def _names_team_queue(metadata: str, kind: str, key: str) -> str:
    """``key`` of ``metadata``'s ``kind`` (labels, annotations), where set, is the team's queue."""
    field = f"{metadata}.{kind}"
    return f"(!has({field}) || !('{key}' in {field}) || {field}['{key}'] == {TEAM_QUEUE})"


QUEUE_KEYS = (("annotations", ANNOTATION_QUEUE_NAME), ("annotations", LABEL_QUEUE_NAME), ("labels", LABEL_QUEUE_NAME))


def _template_queue(template: str) -> str:
    """A pod template's (or pod's) queue annotations and labels, where set, name the team's queue."""
    metadata = f"{template}.metadata"
    checks = " && ".join(_names_team_queue(metadata, kind, key) for kind, key in QUEUE_KEYS)
    return f"(!has({metadata}) || ({checks}))"


# Values of NVIDIA_VISIBLE_DEVICES that expose no GPU (NVIDIA container toolkit: empty or "void" behaves as runc,
# "none" only the driver). MPI Operator v0.8.0 sets it empty on every launcher that requests no GPU
# (kubeflow/mpi-operator v0.8.0 pkg/controller/mpi_job_controller.go, nvidiaDisableEnvVars).
NO_DEVICES = ("", "void", "none")


def _no_visible_devices(spec: str) -> str:
    """No container of the pod spec sets NVIDIA_VISIBLE_DEVICES to devices (nor from a reference, unseen here)."""
    values = ", ".join(f"'{value}'" for value in NO_DEVICES)
    grants_none = f"!has(e.valueFrom) && (!has(e.value) || e.value in [{values}])"
    return " && ".join(
        f"(!has({spec}.{field}) || {spec}.{field}.all(c, !has(c.env) || "
        f"c.env.all(e, e.name != '{VISIBLE_DEVICES}' || ({grants_none}))))"
        for field in CONTAINER_LISTS
    )


def _scheduler(spec: str) -> str:
    return _absent_or(f"{spec}.schedulerName", f"{spec}.schedulerName == '{SCHEDULER_NAME}'")


def _priority(spec: str, required: bool) -> str:
    field = f"{spec}.priorityClassName"
    check = _allowed_priority(field)
    return f"(has({field}) && {check})" if required else _absent_or(field, check)


@dataclass(frozen=True)
class Templates:
    """Where a kind keeps pod templates: ``each`` turns a check of one template (over ``t``) into CEL over all."""

    each: str  # CEL with ``{check}`` standing for the check of ``t``
    where: str  # the field path, for messages
    priority_required: bool  # the pods' priority comes only from here

    def all(self, check) -> str:
        return self.each.format(check=check("t"))


def _map_templates(path: str, where: str) -> Templates:
    return Templates(f"(!has({path}) || {path}.all(k, [{path}[k].template].all(t, {{check}})))", where, True)


def _list_templates(path: str, where: str, field: str = "template", required: bool = True) -> Templates:
    return Templates(f"(!has({path}) || {path}.all(g, [g.{field}].all(t, {{check}})))", where, required)


def _one_template(path: str, where: str, guard: str = "") -> Templates:
    guarded = f"!({guard}) || " if guard else ""
    return Templates(f"({guarded}!has({path}) || [{path}].all(t, {{check}}))", where, True)


def _template_checks(templates: Templates) -> list[tuple[str, str]]:
    where = templates.where
    return [
        (templates.all(lambda t: _scheduler(f"{t}.spec")),
         _message("volcano-scheduler", f"schedulerName in {where} must be {SCHEDULER_NAME} or unset")),
        (templates.all(lambda t: _priority(f"{t}.spec", templates.priority_required)),
         _message("team-priority", f"priorityClassName in {where} must be one of this team's classes "
                                   f"(namespace labels {LABEL_PRIORITY_CLASS_PREFIX}<class>)")),
        (templates.all(_template_queue),
         _message("team-queue", f"queue annotations and labels in {where} must name this team's queue ", TEAM_QUEUE)),
        (templates.all(lambda t: _no_visible_devices(f"{t}.spec")),
         _message("gpu-by-request", f"{VISIBLE_DEVICES} in {where}: GPUs come from requesting nvidia.com/gpu")),
    ]


def _equals_queue(path: str, where: str) -> tuple[str, str]:
    return (f"({_present(path)}) && {path} == {TEAM_QUEUE}",
            _message("team-queue", f"{where} must be this team's queue ", TEAM_QUEUE))


def _allowed_class(path: str, where: str) -> tuple[str, str]:
    return (f"({_present(path)}) && {_allowed_priority(path)}",
            _message("team-priority", f"{where} must be one of this team's PriorityClasses "
                                      f"(namespace labels {LABEL_PRIORITY_CLASS_PREFIX}<class>)"))


def _label_equals_queue(key: str) -> tuple[str, str]:
    labels = "object.metadata.labels"
    return (f"has({labels}) && '{key}' in {labels} && {labels}['{key}'] == {TEAM_QUEUE}",
            _message("team-queue", f"label {key} must be this team's queue ", TEAM_QUEUE))


def _label_allowed_class(key: str) -> tuple[str, str]:
    labels = "object.metadata.labels"
    return (f"has({labels}) && '{key}' in {labels} && {_allowed_priority(f'{labels}[{_quoted(key)}]')}",
            _message("team-priority", f"label {key} must be one of this team's PriorityClasses"))


def _ray_cluster_spec(spec: str, where: str, guard: str = "") -> list[tuple[str, str]]:
    """A RayCluster spec: its head and worker templates, and a head Service that stays inside the cluster."""
    head = f"{spec}.headGroupSpec"
    cluster_ip = _absent_or(f"{head}.serviceType", f"{head}.serviceType == 'ClusterIP'")
    no_ingress = _absent_or(f"{head}.enableIngress", f"{head}.enableIngress == false")
    inside = f"({cluster_ip} && {no_ingress})"
    guarded = (lambda check: f"(!({guard}) || {check})") if guard else (lambda check: check)
    return [
        *_template_checks(_one_template(f"{head}.template", f"{where}.headGroupSpec.template", guard)),
        *_template_checks(Templates(guarded(_list_templates(f"{spec}.workerGroupSpecs", "").each),
                                    f"{where}.workerGroupSpecs[].template", True)),
        (guarded(inside), _message("cluster-ip-services", f"{where}.headGroupSpec: serviceType ClusterIP and no "
                                                          "ingress (a LoadBalancer would expose the Ray dashboard)")),
    ]


SCHEDULING_POLICY = "object.spec.runPolicy.schedulingPolicy"


def _kubeflow_job(replicas: str) -> list[tuple[str, str]]:
    return [
        _equals_queue(f"{SCHEDULING_POLICY}.queue", "spec.runPolicy.schedulingPolicy.queue"),
        _allowed_class(f"{SCHEDULING_POLICY}.priorityClass", "spec.runPolicy.schedulingPolicy.priorityClass"),
        *_template_checks(_map_templates(f"object.spec.{replicas}", f"spec.{replicas}[].template")),
    ]


def _pod() -> list[tuple[str, str]]:
    return [
        (f"object.spec.schedulerName == '{SCHEDULER_NAME}'",
         _message("volcano-scheduler", f"pods in team namespaces are scheduled by {SCHEDULER_NAME}, not ",
                  "object.spec.schedulerName")),
        (_priority("object.spec", required=True),
         _message("team-priority", "a pod's priorityClassName must be one of this team's PriorityClasses "
                                   f"(namespace labels {LABEL_PRIORITY_CLASS_PREFIX}<class>)")),
        (_template_queue("object"),
         _message("team-queue", "a pod's queue annotations and labels must name this team's queue ", TEAM_QUEUE)),
        (_no_visible_devices("object.spec"),
         _message("gpu-by-request", f"a pod may not set {VISIBLE_DEVICES}: GPUs come from requesting nvidia.com/gpu")),
    ]


def _volcano_job() -> list[tuple[str, str]]:
    return [
        _equals_queue("object.spec.queue", "spec.queue"),
        _allowed_class("object.spec.priorityClassName", "spec.priorityClassName"),
        (_absent_or("object.spec.schedulerName", f"object.spec.schedulerName == '{SCHEDULER_NAME}'"),
         _message("volcano-scheduler", f"spec.schedulerName must be {SCHEDULER_NAME}")),
        *_template_checks(_list_templates("object.spec.tasks", "spec.tasks[].template", required=False)),
    ]


def _ray_job() -> list[tuple[str, str]]:
    return [
        _label_equals_queue(LABEL_QUEUE_NAME),
        _label_allowed_class(LABEL_RAY_PRIORITY_CLASS),
        *_ray_cluster_spec("object.spec.rayClusterSpec", "spec.rayClusterSpec", guard="has(object.spec.rayClusterSpec)"),
        *_template_checks(_one_template("object.spec.submitterPodTemplate", "spec.submitterPodTemplate")),
    ]


def _train_job() -> list[tuple[str, str]]:
    runtime = "object.spec.runtimeRef"
    jobset_patch = "p.trainingRuntimeSpec.template.metadata"
    patches = "object.spec.runtimePatches"
    queue_patch = _names_team_queue(jobset_patch, "annotations", ANNOTATION_QUEUE_NAME)
    return [
        (f"has({runtime}.kind) && {runtime}.kind == 'TrainingRuntime'",
         _message("team-runtime", "spec.runtimeRef must name this namespace's TrainingRuntime (kind "
                                  "TrainingRuntime): a ClusterTrainingRuntime carries no team queue or priority")),
        (f"!has({patches}) || {patches}.all(p, !has(p.trainingRuntimeSpec) || "
         f"!has(p.trainingRuntimeSpec.template) || !has({jobset_patch}) || {queue_patch})",
         _message("team-queue", "spec.runtimePatches may not name a queue other than this team's ", TEAM_QUEUE)),
    ]


def _training_runtime() -> list[tuple[str, str]]:
    template = "object.spec.template"
    jobs = f"{template}.spec.replicatedJobs"
    pods = Templates(f"(!has({jobs}) || {jobs}.all(j, [j.template.spec.template].all(t, {{check}})))",
                     "spec.template.spec.replicatedJobs[].template.spec.template", True)
    required_scheduler = pods.all(lambda t: f"(has({t}.spec.schedulerName) && {t}.spec.schedulerName == "
                                            f"'{SCHEDULER_NAME}')")
    return [
        (f"has({template}.metadata) && has({template}.metadata.annotations) && '{ANNOTATION_QUEUE_NAME}' in "
         f"{template}.metadata.annotations && {template}.metadata.annotations['{ANNOTATION_QUEUE_NAME}'] == {TEAM_QUEUE}",
         _message("team-queue", f"spec.template.metadata.annotations[{ANNOTATION_QUEUE_NAME}] must be this team's "
                                "queue ", TEAM_QUEUE)),
        (required_scheduler, _message("volcano-scheduler", f"Trainer sets no schedulerName: {pods.where} must say "
                                                           f"{SCHEDULER_NAME}")),
        *_template_checks(pods),
    ]


def _service() -> list[tuple[str, str]]:
    return [
        ("object.spec.type == 'ClusterIP'",
         _message("cluster-ip-services", "Services in team namespaces are ClusterIP, not ", "object.spec.type")),
        ("!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0",
         _message("cluster-ip-services", "Services in team namespaces have no externalIPs")),
    ]


LANES = (
    Lane("pods", "", "pods", tuple(_pod())),
    Lane("podgroups", "scheduling.volcano.sh", "podgroups", (
        _equals_queue("object.spec.queue", "PodGroup spec.queue"),
        _allowed_class("object.spec.priorityClassName", "PodGroup spec.priorityClassName"),
    )),
    Lane("pytorchjobs", "kubeflow.org", "pytorchjobs", tuple(_kubeflow_job("pytorchReplicaSpecs"))),
    Lane("mpijobs", "kubeflow.org", "mpijobs", tuple(_kubeflow_job("mpiReplicaSpecs"))),
    Lane("volcanojobs", "batch.volcano.sh", "jobs", tuple(_volcano_job())),
    Lane("rayclusters", "ray.io", "rayclusters", (
        _label_equals_queue(LABEL_QUEUE_NAME),
        _label_allowed_class(LABEL_RAY_PRIORITY_CLASS),
        *_ray_cluster_spec("object.spec", "spec"),
    )),
    Lane("rayjobs", "ray.io", "rayjobs", tuple(_ray_job())),
    Lane("trainjobs", "trainer.kubeflow.org", "trainjobs", tuple(_train_job())),
    Lane("trainingruntimes", "trainer.kubeflow.org", "trainingruntimes", tuple(_training_runtime())),
    Lane("services", "", "services", tuple(_service())),
)


def lane_policy_name(lane: Lane) -> str:
    return f"gpuyard-lanes-{lane.name}"


def lane_policy_spec(lane: Lane) -> dict:
    """ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1): ``lane``'s objects created or updated, by anyone
    (status subresources excluded: controllers report status, they do not choose a queue there)."""
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [{
                "apiGroups": [lane.group],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": [lane.resource],
            }]
        },
        "variables": VARIABLES,
        "validations": [
            {"expression": expression, "messageExpression": message, "reason": "Forbidden"}
            for expression, message in lane.validations
        ],
    }


def lane_binding_spec(lane: Lane) -> dict:
    """Binds ``lane``'s policy to every namespace carrying a team label, denying (not just warning)."""
    return {
        "policyName": lane_policy_name(lane),
        "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchExpressions": [{"key": LABEL_TEAM, "operator": "Exists"}]}},
    }
