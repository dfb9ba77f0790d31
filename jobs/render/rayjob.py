"""RayJob (KubeRay ``ray.io/v1``): a CPU head and one GPU worker group run the Ray Train entry.

KubeRay, run with --batch-scheduler=volcano (infra.operators), gang-schedules the cluster on Volcano
with the queue from the job's ``volcano.sh/queue-name`` label and the priority class from
``ray.io/priority-class-name``; the worker group is fixed-size so the gang is head + ``nodes`` workers.
Ray's own metrics stay on 8080 so the trainer's ``metrics`` port (9464) is the trainer's.
"""

import shlex

from infra.config import Team
from jobs.render.pod import (
    container,
    helper_pod,
    helper_resources,
    metadata,
    metrics_port,
    trainer_env,
    trainer_pod,
    trainer_resources,
)
from jobs.spec import JobSpec

API_VERSION = "ray.io/v1"
LABEL_QUEUE = "volcano.sh/queue-name"
LABEL_PRIORITY_CLASS = "ray.io/priority-class-name"
WORKER_GROUP = "workers"
RAY_METRICS_PORT = "8080"


def entrypoint(spec: JobSpec) -> str:
    return shlex.join(["python", "-m", spec.module, *spec.args])


def volcano_labels(team: Team) -> dict[str, str]:
    return {LABEL_QUEUE: team.queue, LABEL_PRIORITY_CLASS: team.priority_class}


def head_group(spec: JobSpec, team: Team) -> dict:
    head = container("ray-head", spec.image, helper_resources())
    return {
        # no training on the head: every Ray Train worker lands on a worker pod
        "rayStartParams": {"num-cpus": "0", "metrics-export-port": RAY_METRICS_PORT},
        "template": helper_pod(spec, team, "head", head),
    }


def worker_group(spec: JobSpec, team: Team) -> dict:
    worker = container("ray-worker", spec.image, trainer_resources(spec), env=trainer_env(spec), ports=[metrics_port()])
    return {
        "groupName": WORKER_GROUP,
        "replicas": spec.nodes,
        "minReplicas": spec.nodes,
        "maxReplicas": spec.nodes,
        "rayStartParams": {"metrics-export-port": RAY_METRICS_PORT},
        "template": trainer_pod(spec, team, "worker", worker),
    }


def render(spec: JobSpec, team: Team) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "RayJob",
        "metadata": metadata(spec, team, volcano_labels(team)),
        "spec": {
            "entrypoint": entrypoint(spec),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
            "backoffLimit": spec.max_restarts,
            "rayClusterSpec": {
                "enableInTreeAutoscaling": False,
                "headGroupSpec": head_group(spec, team),
                "workerGroupSpecs": [worker_group(spec, team)],
            },
        },
    }
