"""TrainJob (Kubeflow Trainer v2 ``trainer.kubeflow.org/v1alpha1``) on its team's runtime for the job's pool.

The team's TrainingRuntime for the pool (created by the stack in the team's namespace, infra/trainer_runtime.py)
owns the JobSet, torchrun's rendezvous env, the Volcano PodGroup with the team's queue, the scheduler name, the
priority class, the metrics port and the pool's pod settings (placement, grace, do-not-disrupt, /dev/shm, NCCL);
the TrainJob sets the trainer (image, command, nodes, resources, the job's env) and patches the ``node`` pods with
what every gpuyard training pod carries, stated whole in the manifest (labels, service account, the grace period of
its capacity type, placement with its instance family, /dev/shm sized to the pod, non-root). The TrainJob API has no TTL, restart count or priority
class, and Trainer v2.3.0 reads the queue from the runtime only: the runtime owns them, and the retry rule too
(exit 1 and 2 fail the JobSet, anything else restarts it: infra/trainer_runtime.py). torchrun runs as
``gpuyard.jobs.workload.torchrun``, whose exit status is its workers', with ``--max-restarts=0``.
"""

from gpuyard.infra.config import Team
from gpuyard.infra.conventions import (
    ANNOTATION_DO_NOT_DISRUPT,
    GRACE_PERIOD_SECONDS,
    SHM_PATH,
    SHM_VOLUME,
    container_security,
    pod_security,
    runtime_name,
)
from gpuyard.jobs.render.pod import (
    env_list,
    gpu_tolerations,
    labels,
    metadata,
    shm_volume,
    trainer_env,
    trainer_node_selector,
    trainer_resources,
)
from gpuyard.jobs.spec import JobSpec
from gpuyard.jobs.workload.args import TORCHRUN_MODULE

API_VERSION = "trainer.kubeflow.org/v1alpha1"
NODE_JOB = "node"  # the runtime's replicated job and its trainer container
PATCH_MANAGER = "gpuyard.io/render"


def trainer(spec: JobSpec) -> dict:
    """torchrun gets nodes, ranks and the master from the runtime's ``PET_*`` env."""
    return {
        "image": spec.image,
        "command": ["python3", "-m", TORCHRUN_MODULE, "--max-restarts=0", *spec.program],
        "args": list(spec.args),
        "env": env_list(trainer_env(spec)),
        "numNodes": spec.nodes,
        "numProcPerNode": spec.procs_per_node,
        "resourcesPerNode": trainer_resources(spec),
    }


def node_pod_patch(spec: JobSpec, team: Team) -> dict:
    pod: dict = {
        "serviceAccountName": team.service_account,
        # The pod's grace is what the trainer is told (PodSpecPatch has the field and Trainer merges the patch
        # into the runtime's JobSet strategically: kubeflow/trainer v2.3.0 pkg/apis/trainer/v1alpha1/
        # trainjob_types.go, pkg/runtime/core/trainingruntime.go mergeRuntimePatches).
        "terminationGracePeriodSeconds": GRACE_PERIOD_SECONDS[spec.capacity_type],
        "nodeSelector": trainer_node_selector(spec),
    }
    if spec.gpus_per_node:
        pod["tolerations"] = gpu_tolerations(spec)
    pod["securityContext"] = pod_security()
    pod["volumes"] = [shm_volume(spec.memory_gib)]
    pod["containers"] = [{
        "name": NODE_JOB,
        "securityContext": container_security(),
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": SHM_PATH}],
    }]
    return {
        "metadata": {"labels": labels(spec, NODE_JOB), "annotations": {ANNOTATION_DO_NOT_DISRUPT: "true"}},
        "spec": pod,
    }


def render(spec: JobSpec, team: Team) -> dict:
    meta = metadata(spec, team)
    patch = {"name": NODE_JOB, "template": {"spec": {"template": node_pod_patch(spec, team)}}}
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": meta,
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                           "name": runtime_name(spec.node_pool)},
            "trainer": trainer(spec),
            "runtimePatches": [{
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [patch]}}},
            }],
        },
    }
