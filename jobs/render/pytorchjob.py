"""PyTorchJob (Kubeflow Training Operator ``kubeflow.org/v1``) running torchrun.

Fixed size: a Master (rendezvous host) plus ``nodes - 1`` Workers. Elastic
(``min_nodes < nodes``): Workers only, as upstream runs elastic jobs, because the
operator's HPA and ``PET_NNODES`` count Worker replicas. Either way torchrun uses the
c10d rendezvous with an id unique to the job (the default id collides between jobs).

Retries: every replica has ``restartPolicy: ExitCode``. Training Operator v1.9.0
(kubeflow/training-operator, pkg/controller.v1/common/pod.go ``ReconcilePods`` with
pkg/util/train/train_util.go ``IsRetryableExitCode``) deletes and recreates a pod whose container
``pytorch`` failed with 128-255 and fails the job for 1-127; pods get ``restartPolicy: Never``
(pkg/core/pod.go ``SetRestartPolicy``). torchrun runs as ``gpuyard.jobs.workload.torchrun``, whose status is its
workers' (torchrun's own is 1 for any failure), with ``--max-restarts=0``: torchrun restarts after any
failure whatever its status, so the operator alone retries, reading the status. The operator's
``runPolicy.backoffLimit`` sums the container restarts of running pods (pkg/core/job.go
``PastBackoffLimit``): it never counts these re-creations, so a retryable status is retried without bound.
"""

from gpuyard.infra.config import Team
from gpuyard.infra.conventions import SCHEDULER_NAME
from gpuyard.jobs.render.gang import run_policy
from gpuyard.jobs.render.pod import container, metadata, metrics_port, trainer_env, trainer_pod, trainer_resources
from gpuyard.jobs.spec import JobSpec
from gpuyard.jobs.workload.args import TORCHRUN_MODULE

API_VERSION = "kubeflow.org/v1"
CONTAINER = "pytorch"  # the operator injects its env only into the container with this name
RDZV_PORT = 29400
RDZV_PORT_NAME = "pytorchjob-port"  # the operator's Service port and MASTER_PORT
RESTART_POLICY = "ExitCode"


def rdzv_id(spec: JobSpec, team: Team) -> str:
    return f"{team.namespace}-{spec.name}"


def rdzv_host(spec: JobSpec) -> str:
    return f"{spec.name}-worker-0" if spec.elastic else f"{spec.name}-master-0"


def torchrun_command(spec: JobSpec, team: Team) -> list[str]:
    """torchrun (its status the workers') up to the program; its arguments follow as container args."""
    nnodes = f"{spec.min_nodes}:{spec.nodes}" if spec.elastic else str(spec.nodes)
    return [
        "python3",
        "-m",
        TORCHRUN_MODULE,
        f"--nnodes={nnodes}",
        f"--nproc-per-node={spec.procs_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_host(spec)}:{RDZV_PORT}",
        f"--rdzv-id={rdzv_id(spec, team)}",
        "--max-restarts=0",
        *spec.program,
    ]


def _replica(spec: JobSpec, team: Team, component: str, replicas: int) -> dict:
    ports = [{"name": RDZV_PORT_NAME, "containerPort": RDZV_PORT, "protocol": "TCP"}, metrics_port()]
    trainer = container(
        CONTAINER, spec.image, trainer_resources(spec),
        command=torchrun_command(spec, team), args=list(spec.args), env=trainer_env(spec), ports=ports,
    )
    return {
        "replicas": replicas,
        "restartPolicy": RESTART_POLICY,
        "template": trainer_pod(spec, team, component, trainer, scheduler_name=SCHEDULER_NAME),
    }


def elastic_policy(spec: JobSpec, team: Team) -> dict:
    return {
        "rdzvBackend": "c10d",
        "rdzvPort": RDZV_PORT,
        "rdzvId": rdzv_id(spec, team),
        "minReplicas": spec.min_nodes,
        "maxReplicas": spec.nodes,
        "maxRestarts": 0,  # the operator's PET_MAX_RESTARTS, torchrun's restarts: none (see above)
    }


def render(spec: JobSpec, team: Team) -> dict:
    if spec.elastic:
        replica_specs = {"Worker": _replica(spec, team, "worker", spec.nodes)}
    else:
        replica_specs = {"Master": _replica(spec, team, "master", 1)}
        if spec.nodes > 1:
            replica_specs["Worker"] = _replica(spec, team, "worker", spec.nodes - 1)
    body: dict = {"nprocPerNode": str(spec.procs_per_node)}
    if spec.elastic:
        body["elasticPolicy"] = elastic_policy(spec, team)
    body["runPolicy"] = run_policy(spec, team, min_available=spec.min_nodes, backoff_limit=spec.max_restarts)
    body["pytorchReplicaSpecs"] = replica_specs
    return {"apiVersion": API_VERSION, "kind": "PyTorchJob", "metadata": metadata(spec, team), "spec": body}
