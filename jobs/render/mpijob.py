"""MPIJob (MPI Operator ``kubeflow.org/v2beta1``): a CPU Launcher runs mpirun over GPU Workers.

``launcherCreationPolicy: WaitForWorkersReady`` keeps the launcher from crash-looping
while workers pull images; the launcher is then created only after the workers are
ready, so the gang (``minAvailable``) is the workers alone, else Volcano and the operator
wait on each other forever (kubeflow/mpi-operator#608).

Retries: MPI Operator v0.8.0 runs the launcher in a batch/v1 Job with the MPIJob's
``runPolicy.backoffLimit`` and no podFailurePolicy (kubeflow/mpi-operator, pkg/controller/
mpi_job_controller.go ``newLauncherJob``; the v2beta1 API has none), so the Job would rerun any failed
launcher pod whatever its exit status: a diverged run (exit 1) as much as a stopped one (143). So the
launcher Job gets ``backoffLimit: 0`` and ``restartPolicy: Never``, and its mpirun runs under
``gpuyard.jobs.workload.launch``, which reruns it only after a retryable status (128 or more: a stopped or lost
rank, or 205, mpirun's status for a lost worker node) up to ``max_restarts`` times, once every
worker's sshd answers again (the operator recreates a deleted worker pod). Exit 1 or 2 fails the MPIJob
at once. What the operator itself does about an evicted worker (it marks the MPIJob Failed,
``updateMPIJobStatus``) needs real nodes to observe.
"""

from gpuyard.infra.config import Team
from gpuyard.infra.conventions import SCHEDULER_NAME
from gpuyard.jobs.render.gang import run_policy
from gpuyard.jobs.render.mpi import SSH_DIR, launcher_container, worker_container
from gpuyard.jobs.render.pod import helper_pod, metadata, trainer_pod
from gpuyard.jobs.spec import JobSpec

API_VERSION = "kubeflow.org/v2beta1"


def worker_hosts(spec: JobSpec, team: Team) -> list[str]:
    """The operator's hostfile: each worker behind the job's headless Service."""
    return [f"{spec.name}-worker-{index}.{spec.name}.{team.namespace}.svc" for index in range(spec.nodes)]


def master_addr(spec: JobSpec, team: Team) -> str:
    """The first host of the operator's hostfile: worker 0."""
    return worker_hosts(spec, team)[0]


def render(spec: JobSpec, team: Team) -> dict:
    launcher = launcher_container("launcher", spec, master_addr(spec, team), restarts=spec.max_restarts,
                                  restart_hosts=worker_hosts(spec, team))
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
            "runPolicy": run_policy(spec, team, min_available=spec.nodes, backoff_limit=0),
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "Never",
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
