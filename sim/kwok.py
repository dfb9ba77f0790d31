"""The kwok controller's configuration: which stages simulate the kubelet.

Nodes and pods follow kwok's own "fast" stages (sigs.k8s.io/kwok v0.8.0, kustomize/stage/node/fast,
node/heartbeat, pod/fast: the ones `kwokctl` uses by default), except that a training pod's containers complete
(exit 0) a few seconds after it runs, whatever owns it, so jobs reach Succeeded, unless it serves until its
operator ends the job (``runs_for``'s ANNOTATION_SERVES). kwok's own pod-complete only completes pods owned by a
batch/v1 Job (at once). Ray's head and worker pods are servers, not training processes: they keep
running until KubeRay deletes their RayCluster (the RayJob's submitter, a batch Job's pod, completes).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from gpuyard.infra.conventions import LABEL_PART_OF, PART_OF
from gpuyard.sim.upstream import documents, module_dir

KWOK_MODULE = "sigs.k8s.io/kwok"
# kwok's chaos stage fails a running pod labelled for it (with the exit code its annotations say), over any other
# stage by its weight: a replayed MPIJob launcher that gives up (sim/mpi_launcher.py)
STAGES = ("node/fast/node-initialize.yaml", "node/heartbeat/node-heartbeat.yaml", "pod/fast/pod-ready.yaml",
          "pod/fast/pod-delete.yaml", "pod/chaos/pod-container-running-failed.yaml")
TRAINING_RUNS_MILLISECONDS = 10000
# A pod annotated with a Go duration ("90s", "1.5h") runs that long instead (`gpuyard sim replay`): kwok v0.8.0 reads
# a stage delay's durationFrom (jq) and parses a string with time.ParseDuration, or falls back to durationMilliseconds
# when the annotation is absent (pkg/utils/lifecycle/value_duration_from.go)
ANNOTATION_RUNS_FOR = "gpuyard.io/sim-runs-for"


# A pod annotated with this serves (an MPI worker's sshd) until its operator deletes it: kwok never completes it.
ANNOTATION_SERVES = "gpuyard.io/sim-serves"
SERVES_UNTIL = "its-job-ends"


def serving_templates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of ``manifest`` whose pods never end by themselves: they serve until the operator ends the
    job. An MPIJob finishes with its launcher Job and the operator then deletes its workers (kubeflow/mpi-operator
    v0.8.0 pkg/controller/mpi_job_controller.go: updateMPIJobStatus sets Succeeded when the launcher Job is Complete,
    syncHandler then runs cleanUpWorkerPods under cleanPodPolicy Running, which jobs/render/gang.py sets). A Volcano
    Job whose task has the policy TaskCompleted -> CompleteJob finishes with that task, and Volcano then kills the
    other tasks' pods (volcano-sh/volcano v1.14.1 pkg/controllers/job/state/running.go: CompleteJobAction is
    KillJob with PodRetainPhaseSoft, which keeps only Succeeded and Failed pods). A PyTorchJob's pods all run
    torchrun and end together (kubeflow/training-operator v1.9.4 pkg/controller.v1/pytorch/pytorchjob_controller.go
    UpdateJobStatus: the Master's success, or every Worker's), so none of them serves."""
    spec = manifest["spec"]
    if manifest["kind"] == "MPIJob":
        return [spec["mpiReplicaSpecs"]["Worker"]["template"]]
    if manifest["kind"] == "Job" and manifest["apiVersion"].startswith("batch.volcano.sh/"):
        completing = {task["name"] for task in spec["tasks"] if {"event": "TaskCompleted", "action": "CompleteJob"}
                      in task.get("policies", [])}
        return [task["template"] for task in spec["tasks"] if completing and task["name"] not in completing]
    return []


def runs_for(manifest: dict[str, Any], duration: str) -> dict[str, Any]:
    """``manifest`` with every pod template annotated to run ``duration`` (a Go duration) under kwok, but those
    that serve until their operator ends the job (``serving_templates``), annotated so."""
    serving = [id(template) for template in serving_templates(manifest)]

    def visit(tree: Any) -> None:
        if isinstance(tree, dict):
            template = tree.get("template")
            if isinstance(template, dict) and "containers" in template.get("spec", {}):
                annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
                if id(template) in serving:
                    annotations[ANNOTATION_SERVES] = SERVES_UNTIL
                else:
                    annotations[ANNOTATION_RUNS_FOR] = duration
            for value in tree.values():
                visit(value)
        elif isinstance(tree, list):
            for value in tree:
                visit(value)

    visit(manifest["spec"])
    return manifest


def training_complete(pod_complete: dict[str, Any]) -> dict[str, Any]:
    """kwok's pod-complete stage for our training pods (``app.kubernetes.io/part-of: gpuyard``) but those annotated
    ANNOTATION_SERVES, after a delay: TRAINING_RUNS_MILLISECONDS, or the pod's ANNOTATION_RUNS_FOR."""
    stage = copy.deepcopy(pod_complete)
    stage["metadata"]["name"] = "gpuyard-training-complete"
    expressions = [e for e in stage["spec"]["selector"]["matchExpressions"] if "ownerReferences" not in e["key"]]
    expressions.append({"key": f'.metadata.labels["{LABEL_PART_OF}"]', "operator": "In", "values": [PART_OF]})
    # KubeRay labels every RayCluster pod with its node type (ray-operator/controllers/ray/utils/constant.go
    # RayNodeTypeLabelKey)
    expressions.append({"key": '.metadata.labels["ray.io/node-type"]', "operator": "DoesNotExist"})
    expressions.append({"key": f'.metadata.annotations["{ANNOTATION_SERVES}"]', "operator": "DoesNotExist"})
    stage["spec"]["selector"]["matchExpressions"] = expressions
    stage["spec"]["delay"] = {"durationMilliseconds": TRAINING_RUNS_MILLISECONDS,
                              "durationFrom": {"jq": {"expression": f'.metadata.annotations["{ANNOTATION_RUNS_FOR}"]'}}}
    return stage


def batch_jobs_complete(pod_complete: dict[str, Any]) -> dict[str, Any]:
    """kwok's pod-complete, for pods of a batch/v1 Job only: it selects owners of kind ``Job``, which a Volcano Job
    (batch.volcano.sh/v1alpha1) is too, so a Volcano Job's launcher would complete the moment it runs. Our training
    pods are left to ``training_complete``: an MPIJob's launcher and a RayJob's submitter are batch/v1 Job pods, and
    kwok v0.8.0 picks one stage at random among those that match (pkg/utils/lifecycle/lifecycle.go), so half of the
    launchers completed the moment they ran."""
    stage = copy.deepcopy(pod_complete)
    stage["spec"]["selector"]["matchExpressions"] += [
        {"key": ".metadata.ownerReferences.[].apiVersion", "operator": "In", "values": ["batch/v1"]},
        {"key": f'.metadata.labels["{LABEL_PART_OF}"]', "operator": "NotIn", "values": [PART_OF]}]
    return stage


def write_config(path: Path) -> Path:
    """Write the kwok configuration (stages only) to ``path``."""
    root = module_dir("kwok", KWOK_MODULE) / "kustomize" / "stage"
    stages = [next(documents(root / name)) for name in STAGES]
    pod_complete = next(documents(root / "pod/fast/pod-complete.yaml"))
    stages.append(batch_jobs_complete(pod_complete))
    stages.append(training_complete(pod_complete))
    path.write_text(yaml.dump_all(stages, Dumper=yaml.CSafeDumper, sort_keys=False))
    return path
