"""Each team's Kubeflow Trainer v2 TrainingRuntime: torchrun jobs gang-scheduled by Volcano in the team's queue.

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

from infra.config import Team
from infra.conventions import (
    ANNOTATION_QUEUE_NAME,
    DEFAULT_MAX_RESTARTS,
    FINAL_EXIT_CODES,
    GRACE_PERIOD_SECONDS,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    LABEL_PART_OF,
    LABEL_TEAM,
    METRICS_PORT,
    METRICS_PORT_NAME,
    PART_OF,
    SCHEDULER_NAME,
    TRAINING_RUNTIME,
    container_security,
    pod_security,
)
from infra.operators import TRAINER_PODGROUP_POLICY

# The container Trainer v2 fills from the TrainJob (image, command, resourcesPerNode) is named "node"
# (pkg/constants: Node), in the replicated job whose ancestor label is "trainer".
NODE = "node"
API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainingRuntime"
LABEL_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
FINAL_RULE = "finalExitCodes"


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


def training_runtime_spec(team: Team, image: str) -> dict:
    """The TrainingRuntime spec for ``team``: Volcano scheduler, the team's queue and priority, GPU toleration, the
    grace period, and the restricted security context its namespace enforces (a TrainJob written by hand is admitted
    too)."""
    container = {"name": NODE, "image": image, "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT}],
                 "securityContext": container_security()}
    pod_spec = {
        "schedulerName": SCHEDULER_NAME,
        "priorityClassName": team.priority_class,
        "serviceAccountName": team.service_account,
        "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}],
        "securityContext": pod_security(),
        "restartPolicy": "Never",
        # A TrainJob written by hand (the Kubeflow SDK's) gets the on-demand grace; gpuyard's patch its capacity's.
        "terminationGracePeriodSeconds": GRACE_PERIOD_SECONDS["on-demand"],
        "containers": [container],
    }
    job = {
        "metadata": {"labels": {LABEL_PART_OF: PART_OF, LABEL_ANCESTOR: "trainer"}},
        "spec": {"backoffLimit": 0, "podFailurePolicy": node_failure_policy(),
                 "template": {"metadata": {"labels": {LABEL_PART_OF: PART_OF}}, "spec": pod_spec}},
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


def training_runtime_metadata(team: Team) -> dict:
    """``TRAINING_RUNTIME`` in the team's namespace."""
    return {"name": TRAINING_RUNTIME, "namespace": team.namespace, "labels": runtime_labels(team)}
