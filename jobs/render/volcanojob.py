"""Volcano Job (``batch.volcano.sh/v1alpha1``): mpimaster runs mpirun over mpiworker tasks.

The ``ssh`` plugin shares a per-job key (mounted where the ``mpi`` image's sshd reads
it), ``svc`` gives the workers stable hostnames ``<job>-mpiworker-<i>.<job>``. The gang is
every pod; the master waits (bounded) for the workers' sshd, a failed or evicted pod restarts
the whole job up to ``maxRetry`` times, and the master finishing completes it.

Final exits end it instead: Volcano v1.15.1 (volcano-sh/volcano, pkg/controllers/job/
job_controller_util.go ``applyPolicies``) takes the first job policy whose event or ``exitCode`` matches
a pod failure, with the exit code of the pod's first container (job_controller_handler.go
``updatePod``). So ``exitCode`` 1 and 2 (the master's mpirun passes on the trainer's status) come first
with ``TerminateJob`` (the job cannot be resumed), then ``PodFailed``/``PodEvicted`` with ``RestartJob``.
The master's mpirun runs under ``gpuyard.jobs.workload.launch``, so a SIGTERM ends it with 143, not mpirun's 1.
"""

from gpuyard.infra.config import Team
from gpuyard.infra.conventions import FINAL_EXIT_CODES, SCHEDULER_NAME
from gpuyard.jobs.render.mpi import SSH_DIR, launcher_container, worker_container
from gpuyard.jobs.render.pod import helper_pod, metadata, trainer_pod
from gpuyard.jobs.spec import JobSpec

API_VERSION = "batch.volcano.sh/v1alpha1"
MASTER_TASK = "mpimaster"
WORKER_TASK = "mpiworker"
# Volcano counts job restarts, not container restarts, toward maxRetry: pods never restart in place
# (restartPolicy Never) and a failed or evicted pod restarts the whole job, at most max_restarts times.
RESTART_EVENTS = ("PodEvicted", "PodFailed")
FINAL_ACTION = "TerminateJob"


def policies() -> list[dict]:
    """Final exit codes terminate the job; any other pod failure restarts it. Order matters: first match wins."""
    return [*({"exitCode": code, "action": FINAL_ACTION} for code in FINAL_EXIT_CODES),
            *({"event": event, "action": "RestartJob"} for event in RESTART_EVENTS)]


def worker_hosts(spec: JobSpec) -> list[str]:
    return [f"{spec.name}-{WORKER_TASK}-{index}.{spec.name}" for index in range(spec.nodes)]


def render(spec: JobSpec, team: Team) -> dict:
    hosts = worker_hosts(spec)
    master = launcher_container(MASTER_TASK, spec, hosts[0], hosts, wait=True)
    worker = worker_container(WORKER_TASK, spec)
    return {
        "apiVersion": API_VERSION,
        "kind": "Job",
        "metadata": metadata(spec, team),
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "queue": team.queue,
            "priorityClassName": team.priority_class,
            "minAvailable": spec.nodes + 1,
            "maxRetry": spec.max_restarts,
            "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
            "plugins": {"ssh": [f"--ssh-key-file-path={SSH_DIR}"], "svc": []},
            "policies": policies(),
            "tasks": [
                {
                    "name": MASTER_TASK,
                    "replicas": 1,
                    "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                    "template": helper_pod(spec, team, MASTER_TASK, master, restart_policy="Never"),
                },
                {
                    "name": WORKER_TASK,
                    "replicas": spec.nodes,
                    "template": trainer_pod(spec, team, WORKER_TASK, worker, restart_policy="Never"),
                },
            ],
        },
    }
