"""Each team's Kubeflow Trainer v2 TrainingRuntimes: torchrun jobs gang-scheduled by Volcano in the team's queue.

One runtime per pool (``torch-distributed`` for the on-demand GPU NodePool, ``torch-distributed-<pool>`` for every
other NodePool and managed GPU node group), each carrying what ``gpuyard render --kind trainjob`` gives the pods of a
job on that pool and that does not depend on the job: the pool's node selector and capacity type's grace period,
Karpenter's do-not-disrupt, /dev/shm in memory, NCCL (and EFA) settings, the launchers' shutdown timeouts and the
job's contract variables (``CONTRACT_VARIABLES``; the job's name from the JobSet label). So a TrainJob written by
hand or by the Kubeflow SDK (``TrainerClient().train(runtime=...)``) gets gpuyard's pods, and ``gpuyard render``
names the runtime of the job's pool and patches only what is the job's own (labels, /dev/shm's size, the instance
family, the contract's values). Trainer v2.3.0 merges a TrainJob's runtime patch into the runtime strategically
(pkg/runtime/core/trainingruntime.go ``mergeRuntimePatches``: maps merge key by key), so a patch could not take a
NodePool's selector away for a node group: hence one runtime per pool, not one patched to every pool.

Trainer v2.3.0's Volcano plugin (kubeflow/trainer, pkg/runtime/framework/plugins/volcano/volcano.go) creates
the PodGroup for runtimes with ``podGroupPolicy.volcano`` but sets no ``schedulerName``, takes the queue only
from the runtime template's ``scheduling.volcano.sh/queue-name`` annotation (pkg/runtime/core/
trainingruntime.go, ``newRuntimeInfo``), and the priority from the pod template's ``priorityClassName``; a
TrainJob cannot carry a priority class. So the runtime, one per team in its namespace, carries all three.

It also carries the retry rule, which a TrainJob cannot patch (its JobSpecPatch has only the pod template,
kubeflow/trainer v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go) and which Trainer passes on whole to the
JobSet (pkg/runtime/core/trainingruntime.go): the node Job's pods never restart in place (``restartPolicy:
Never``, which a podFailurePolicy requires), its ``backoffLimit`` is 0 and its podFailurePolicy fails the Job
when the trainer exits 1 or 2 (batch/v1 reason ``PodFailurePolicy``); the JobSet's failurePolicy (JobSet v0.12.0,
api/jobset/v1alpha2/jobset_types.go: the first matching rule wins, no match means RestartJobSet) fails the
JobSet for that reason and restarts it for any other failure, at most DEFAULT_MAX_RESTARTS times.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuyard.infra.config import StackConfig, Team
from gpuyard.infra.conventions import (
    ANNOTATION_DO_NOT_DISRUPT,
    ANNOTATION_QUEUE_NAME,
    DEFAULT_MAX_RESTARTS,
    ENV_JOB_NAME,
    FINAL_EXIT_CODES,
    GPU_RESOURCE,
    GRACE_PERIOD_SECONDS,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    LABEL_CAPACITY_TYPE,
    LABEL_EFA_PRESENT,
    LABEL_PART_OF,
    LABEL_TEAM,
    METRICS_PORT,
    METRICS_PORT_NAME,
    PART_OF,
    SCHEDULER_NAME,
    SHM_PATH,
    SHM_VOLUME,
    runtime_name,
    container_security,
    contract_env,
    network_env,
    node_selector,
    pod_security,
)
from gpuyard.infra.karpenter import node_pools
from gpuyard.infra.operators import TRAINER_PODGROUP_POLICY

# The container Trainer v2 fills from the TrainJob (image, command, resourcesPerNode) is named "node"
# (pkg/constants: Node), in the replicated job whose ancestor label is "trainer".
NODE = "node"
API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainingRuntime"
LABEL_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
FINAL_RULE = "finalExitCodes"
# JobSet v0.12.0 labels every pod with its JobSet's name (api/jobset/v1alpha2/jobset_types.go JobSetNameKey), and
# Trainer v2.3.0 names the JobSet after the TrainJob (pkg/runtime/framework/plugins/jobset/jobset.go).
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


@dataclass(frozen=True)
class RuntimePool:
    """Where one of a team's runtimes puts its pods, as ``gpuyard render`` places a job on that pool by default."""

    name: str
    capacity_type: str
    gpus: bool
    efa: bool = False
    node_group: bool = False

    @property
    def runtime(self) -> str:
        return runtime_name(self.name)


def runtime_pools(config: StackConfig) -> tuple[RuntimePool, ...]:
    """The stack's NodePools (on-demand where a pool offers it, as jobs default to) and managed GPU node groups."""
    pools = []
    for name, spec in node_pools(config.karpenter).items():
        capacity = next(r["values"] for r in spec["template"]["spec"]["requirements"]
                        if r["key"] == LABEL_CAPACITY_TYPE)
        pools.append(RuntimePool(name, "on-demand" if "on-demand" in capacity else capacity[0],
                                 gpus=GPU_RESOURCE in spec["limits"],
                                 efa=LABEL_EFA_PRESENT in spec["template"]["metadata"]["labels"]))
    pools += [RuntimePool(group.name, "on-demand", gpus=True, efa=group.efa, node_group=True)
              for group in config.cluster.gpu_node_groups]
    return tuple(pools)


def node_failure_policy() -> dict:
    """The node Job fails at once (reason PodFailurePolicy) when the trainer exits with a final status."""
    exit_codes = {"containerName": NODE, "operator": "In", "values": list(FINAL_EXIT_CODES)}
    return {"rules": [{"action": "FailJob", "onExitCodes": exit_codes}]}


def jobset_failure_policy() -> dict:
    """A node Job failed by the final statuses fails the JobSet; any other failure restarts the whole JobSet."""
    return {"maxRestarts": DEFAULT_MAX_RESTARTS,
            "rules": [{"name": FINAL_RULE, "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]}


def runtime_labels(team: Team) -> dict[str, str]:
    return {"trainer.kubeflow.org/framework": "torch", LABEL_PART_OF: PART_OF, LABEL_TEAM: team.name}


def node_env(team: Team, pool: RuntimePool, checkpoint_bucket: str) -> list[dict]:
    """What ``gpuyard render`` gives a TrainJob's trainer on ``pool`` that does not depend on the job; the job's name
    comes from its pods' JobSet label, and the checkpoint folder is the team's prefix plus that name (Kubernetes
    expands ``$(VAR)`` from variables listed before it: the contract lists the name first)."""
    grace = GRACE_PERIOD_SECONDS[pool.capacity_type]
    env = network_env(pool.gpus, pool.efa, pool.node_group)
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(grace)
    env.update(contract_env(f"$({ENV_JOB_NAME})", team.name, team.checkpoint_uri(checkpoint_bucket, f"$({ENV_JOB_NAME})"),
                            grace, team.data_uri(checkpoint_bucket)))
    job_name = {"fieldRef": {"fieldPath": f"metadata.labels['{LABEL_JOBSET_NAME}']"}}
    return [{"name": name, "valueFrom": job_name} if name == ENV_JOB_NAME else {"name": name, "value": value}
            for name, value in env.items()]


def training_runtime_spec(team: Team, pool: RuntimePool, image: str, checkpoint_bucket: str) -> dict:
    """The TrainingRuntime spec for ``team`` on ``pool``: Volcano scheduler, the team's queue and priority, the pool's
    placement, grace period and pod settings (``node_env``), and the restricted security context its namespace
    enforces (a TrainJob written by hand is admitted too)."""
    container = {"name": NODE, "image": image, "env": node_env(team, pool, checkpoint_bucket),
                 "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT}],
                 "securityContext": container_security(),
                 "volumeMounts": [{"name": SHM_VOLUME, "mountPath": SHM_PATH}]}
    pod_spec = {
        "schedulerName": SCHEDULER_NAME,
        "priorityClassName": team.priority_class,
        "serviceAccountName": team.service_account,
        "nodeSelector": node_selector(pool.name, pool.capacity_type, node_group=pool.node_group),
        "securityContext": pod_security(),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_PERIOD_SECONDS[pool.capacity_type],
        "containers": [container],
        # /dev/shm's size is bounded by the pod's memory limit (memory-backed emptyDir); gpuyard render sets half.
        "volumes": [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}],
    }
    if pool.gpus:
        pod_spec["tolerations"] = [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}]
    job = {
        "metadata": {"labels": {LABEL_PART_OF: PART_OF, LABEL_ANCESTOR: "trainer"}},
        "spec": {"backoffLimit": 0, "podFailurePolicy": node_failure_policy(),
                 "template": {"metadata": {"labels": {LABEL_PART_OF: PART_OF},
                                           "annotations": {ANNOTATION_DO_NOT_DISRUPT: "true"}},
                              "spec": pod_spec}},
    }
    return {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "podGroupPolicy": TRAINER_PODGROUP_POLICY,
        "template": {
            "metadata": {"annotations": {ANNOTATION_QUEUE_NAME: team.queue}},
            "spec": {"failurePolicy": jobset_failure_policy(),
                     "replicatedJobs": [{"name": NODE, "replicas": 1, "template": job}]},
        },
    }


def training_runtime_metadata(team: Team, pool: RuntimePool) -> dict:
    """The pool's runtime in the team's namespace."""
    return {"name": pool.runtime, "namespace": team.namespace, "labels": runtime_labels(team)}
