"""MPIJob (MPI Operator ``kubeflow.org/v2beta1``): a CPU Launcher runs mpirun over GPU Workers.

``launcherCreationPolicy: WaitForWorkersReady`` keeps the launcher from crash-looping
while workers pull images; the launcher is then created only after the workers are
ready, so the gang (``minAvailable``) is the workers alone, else Volcano and the operator
wait on each other forever (kubeflow/mpi-operator#608).
"""

from infra.config import Team
from infra.conventions import SCHEDULER_NAME
from jobs.render.gang import run_policy
from jobs.render.mpi import SSH_DIR, launcher_container, worker_container
from jobs.render.pod import helper_pod, metadata, trainer_pod
from jobs.spec import JobSpec

API_VERSION = "kubeflow.org/v2beta1"


def master_addr(spec: JobSpec, team: Team) -> str:
    """The first host of the operator's hostfile: worker 0 behind the job's headless Service."""
    return f"{spec.name}-worker-0.{spec.name}.{team.namespace}.svc"


def render(spec: JobSpec, team: Team) -> dict:
    launcher = launcher_container("launcher", spec, master_addr(spec, team))
    worker = worker_container("worker", spec)
    return {
        "apiVersion": API_VERSION,
        "kind": "MPIJob",
        "metadata": metadata(spec, team),
        "spec": {
            "slotsPerWorker": spec.procs_per_node,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": SSH_DIR,
            "runPolicy": run_policy(spec, team, min_available=spec.nodes),
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": helper_pod(spec, team, "launcher", launcher, scheduler_name=SCHEDULER_NAME),
                },
                "Worker": {
                    "replicas": spec.nodes,
                    "restartPolicy": "OnFailure",
                    "template": trainer_pod(spec, team, "worker", worker, scheduler_name=SCHEDULER_NAME),
                },
            },
        },
    }
