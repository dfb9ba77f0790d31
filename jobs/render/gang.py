"""Gang scheduling on Volcano: the Kubeflow ``runPolicy`` both Training and MPI operators read."""

from gpuyard.infra.config import Team
from gpuyard.jobs.spec import JobSpec


def run_policy(spec: JobSpec, team: Team, min_available: int, backoff_limit: int) -> dict:
    """Retries, cleanup and the PodGroup (team queue, ``min_available`` pods, team priority)."""
    return {
        "backoffLimit": backoff_limit,
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
        "schedulingPolicy": {
            "queue": team.queue,
            "minAvailable": min_available,
            "priorityClass": team.priority_class,
        },
    }
