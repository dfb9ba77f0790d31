"""RayJob (KubeRay ``ray.io/v1``): a CPU head and one GPU worker group run the Ray Train entry.

KubeRay, run with --batch-scheduler=volcano (gpuyard.infra.operators), gang-schedules the cluster on Volcano
with the queue from the job's ``volcano.sh/queue-name`` label and the priority class from
``ray.io/priority-class-name``; the worker group is fixed-size so the gang is head + ``nodes`` workers.
Ray's own metrics stay on 8080 so the trainer's ``metrics`` port (9464) is the trainer's.

Retries and stops: KubeRay v1.7.0 retries a RayJob whose Ray job FAILED while ``backoffLimit`` allows,
whatever the driver's exit status (ray-operator/controllers/ray/rayjob_controller.go
``checkBackoffLimitAndUpdateStatusIfNeeded``; only DeadlineExceeded and JobStatusCheckTimeoutExceeded
are never retried), and its K8sJobMode submitter ends with ``ray job logs --follow``, which exits 0
whatever the job did: its status says whether the submission worked, not how training ended. So the
RayJob gets ``backoffLimit: 0`` and the Ray entry retries itself (``--max-restarts``), only after a
retryable outcome: a stop a leaving worker asked for, or a lost worker. Exit 1 or 2 fails the RayJob for
good; so does the loss of the head (the driver runs there). Deleting the RayJob stops the Ray job
(rayjob_controller.go, the StopJob finalizer): Ray 2.60 sends the driver SIGTERM and SIGKILLs it
``RAY_JOB_STOP_WAIT_TIME_S`` later (dashboard/modules/job/job_supervisor.py, default 3 s), set here in
the job's runtime env to the pod's grace period. Every Ray pod's preStop hook (KubeRay leaves graceful
stops to one: rayjob_controller.go, the Suspending case) asks the trainer to stop at an agreed step and
waits until rank 0 has saved it.
"""

import shlex

import yaml

from gpuyard.infra.config import Team
from gpuyard.infra.conventions import ANNOTATION_QUEUE_NAME, GRACE_PERIOD_SECONDS, SCHEDULER_NAME
from gpuyard.jobs.command import RAY_ENTRY_MODULE
from gpuyard.jobs.render.pod import (
    container,
    helper_pod,
    helper_resources,
    job_contract,
    metadata,
    metrics_port,
    trainer_env,
    trainer_pod,
    trainer_resources,
)
from gpuyard.jobs.spec import JobSpec
from gpuyard.jobs.workload.args import RAY_STOP_MODULE
from gpuyard.jobs.workload.interrupt import GraceBudget

API_VERSION = "ray.io/v1"
LABEL_QUEUE = "volcano.sh/queue-name"
LABEL_PRIORITY_CLASS = "ray.io/priority-class-name"
WORKER_GROUP = "workers"
RAY_METRICS_PORT = "8080"
# The Ray in images/ray/Dockerfile (ARG RAY_VERSION). KubeRay v1.6.0 gives the Ray containers HTTP health probes
# only when rayVersion says 2.53.0 or later, and otherwise `wget` probes that an image without wget always fails
# (ray-operator/controllers/ray/common/pod.go, initLivenessAndReadinessProbe, supportsUnifiedHealthCheck).
RAY_VERSION = "2.60.0"
# The submitter only runs `ray job submit` and follows the logs; KubeRay's own default container asks this much
# (ray-operator/controllers/ray/common/job.go v1.6.0, GetDefaultSubmitterContainer), and Volcano's PodGroup reserves
# it beside the gang (controllers/ray/batchscheduler/volcano/volcano_scheduler.go, getSubmitterResource).
SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def entrypoint(spec: JobSpec) -> str:
    """The reference Ray entry with the trainer's arguments, or the command entry running the user's command."""
    if not spec.user_command:
        return shlex.join(["python", "-m", spec.module, *spec.args, "--max-restarts", str(spec.max_restarts)])
    workers = str(spec.nodes * spec.procs_per_node)
    return shlex.join([
        "python", "-m", RAY_ENTRY_MODULE,
        "--num-workers", workers, "--use-gpu" if spec.gpus_per_node else "--no-use-gpu",
        "--max-restarts", str(spec.max_restarts), "--grace-period", str(GRACE_PERIOD_SECONDS[spec.capacity_type]),
        "--", *spec.program, *spec.args,
    ])


def runtime_env(spec: JobSpec) -> str:
    """The job's runtime env: Ray's job stop waits the grace period between SIGTERM and SIGKILL."""
    grace = GRACE_PERIOD_SECONDS[spec.capacity_type]
    return yaml.safe_dump({"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(grace)}}, sort_keys=False)


def prestop(spec: JobSpec) -> dict:
    """Before the kubelet's SIGTERM: stop the trainer at an agreed step and wait (within the grace budget)."""
    budget = GraceBudget(GRACE_PERIOD_SECONDS[spec.capacity_type]).seconds
    command = ["python", "-m", RAY_STOP_MODULE, "--timeout", f"{budget:g}"]
    return {"preStop": {"exec": {"command": command}}}


def volcano_labels(team: Team) -> dict[str, str]:
    return {LABEL_QUEUE: team.queue, LABEL_PRIORITY_CLASS: team.priority_class}


def head_group(spec: JobSpec, team: Team) -> dict:
    """The head runs the job's driver (Ray 2.60 dashboard/modules/job/job_manager.py _get_label_selector: without entrypoint resources
    the driver is placed on the head node), which opens the job's storage before any worker does: it gets the
    contract and the spec's own env (credentials, endpoints) as the workers do."""
    head = container("ray-head", spec.image, helper_resources(), env={**job_contract(spec), **spec.env})
    head["lifecycle"] = prestop(spec)
    return {
        # no training on the head: every Ray Train worker lands on a worker pod
        "rayStartParams": {"num-cpus": "0", "metrics-export-port": RAY_METRICS_PORT},
        "template": helper_pod(spec, team, "head", head),
    }


def worker_group(spec: JobSpec, team: Team) -> dict:
    worker = container("ray-worker", spec.image, trainer_resources(spec), env=trainer_env(spec), ports=[metrics_port()])
    worker["lifecycle"] = prestop(spec)
    return {
        "groupName": WORKER_GROUP,
        "replicas": spec.nodes,
        "minReplicas": spec.nodes,
        "maxReplicas": spec.nodes,
        "rayStartParams": {"metrics-export-port": RAY_METRICS_PORT},
        "template": trainer_pod(spec, team, "worker", worker),
    }


def submitter_template(spec: JobSpec, team: Team) -> dict:
    """The K8sJobMode submitter's pod (``ray job submit``, then ``ray job logs --follow``), as a team pod must be.

    KubeRay's default submitter (ray-operator/controllers/ray/common/job.go, GetDefaultSubmitterTemplate) has no
    security context, scheduler or priority: the namespace's restricted Pod Security and the lanes' pod policy
    (infra/admission.py) refuse it, and the RayJob would never submit. KubeRay fills in the command and the
    dashboard address of a template whose container has none (rayjob_controller.go, getSubmitterTemplate).
    """
    submitter = container("ray-job-submitter", spec.image,
                          {key: dict(amounts) for key, amounts in SUBMITTER_RESOURCES.items()})
    template = helper_pod(spec, team, "submitter", submitter, scheduler_name=SCHEDULER_NAME, restart_policy="Never")
    template["metadata"]["annotations"][ANNOTATION_QUEUE_NAME] = team.queue
    return template


def render(spec: JobSpec, team: Team) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "RayJob",
        "metadata": metadata(spec, team, volcano_labels(team)),
        "spec": {
            "entrypoint": entrypoint(spec),
            "runtimeEnvYAML": runtime_env(spec),
            "shutdownAfterJobFinishes": True,
            # KubeRay deletes the finished job's RayCluster, its head and workers, this long after the end, the RayJob
            # never (ray-operator/apis/ray/v1/rayjob_types.go v1.6.0, TTLSecondsAfterFinished;
            # rayjob_controller.go handleShutdownAfterJobFinishes): at once, or the GPUs idle that long. Measured on
            # the sim's real nodes: a finished RayJob's cluster kept the node, and the next RayJob waited Pending.
            "ttlSecondsAfterFinished": 0,
            "backoffLimit": 0,  # the Ray entry retries itself, never a final exit (see above)
            "submitterPodTemplate": submitter_template(spec, team),
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                "enableInTreeAutoscaling": False,
                "headGroupSpec": head_group(spec, team),
                "workerGroupSpecs": [worker_group(spec, team)],
            },
        },
    }
