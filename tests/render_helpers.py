"""Builders shared by the render tests: a fixed stack, specs, and walking rendered manifests."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from gpuyard.infra.config import StackConfig, parse_stack
from gpuyard.jobs.render import render
from gpuyard.jobs.spec import JobSpec, build_spec

STACK = parse_stack("test", {
    "gpuyard:cluster_name": "yard",
    "gpuyard:image_registry": "123456789012.dkr.ecr.us-west-2.amazonaws.com/yard",
    "gpuyard:teams": [{"name": "vision", "queue_weight": 2}, {"name": "nlp", "priority_class": "gpuyard-low"}],
    "gpuyard:addons": {"trainer_v2": True},
})


def make_spec(kind: str = "pytorchjob", team: str = "vision", config: StackConfig = STACK, **fields) -> JobSpec:
    return build_spec(config, config.team(team), kind, **fields)


def rendered(kind: str = "pytorchjob", team: str = "vision", **fields) -> dict:
    spec = make_spec(kind, team, **fields)
    return render(spec, STACK.team(team))


def pod_templates(manifest: dict) -> Iterator[tuple[str, int, dict]]:
    """(role, replicas, pod template) for every pod template of a manifest."""
    spec = manifest["spec"]
    kind = manifest["kind"]
    if kind in ("PyTorchJob", "MPIJob"):
        replica_specs = spec["pytorchReplicaSpecs"] if kind == "PyTorchJob" else spec["mpiReplicaSpecs"]
        for role, replica in replica_specs.items():
            yield role.lower(), replica["replicas"], replica["template"]
    elif kind == "Job":
        for task in spec["tasks"]:
            yield task["name"], task["replicas"], task["template"]
    elif kind == "RayJob":
        cluster = spec["rayClusterSpec"]
        yield "head", 1, cluster["headGroupSpec"]["template"]
        for group in cluster["workerGroupSpecs"]:
            yield "worker", group["replicas"], group["template"]
    elif kind == "TrainJob":
        patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        yield "node", spec["trainer"]["numNodes"], patch["template"]["spec"]["template"]


TRAINER_ROLES = {"master", "worker", "mpiworker", "node"}


def trainer_templates(manifest: dict) -> list[tuple[int, dict]]:
    return [(replicas, pod) for role, replicas, pod in pod_templates(manifest) if role in TRAINER_ROLES]


def trainer_resources(manifest: dict) -> dict:
    """The resources of a training node (TrainJob keeps them in trainer.resourcesPerNode)."""
    if manifest["kind"] == "TrainJob":
        return manifest["spec"]["trainer"]["resourcesPerNode"]
    _, pod = trainer_templates(manifest)[0]
    return pod["spec"]["containers"][0]["resources"]


def trainer_argv(manifest: dict) -> list[str]:
    """The trainer's own arguments, wherever the kind puts them."""
    spec = manifest["spec"]
    kind = manifest["kind"]
    if kind == "TrainJob":
        return spec["trainer"]["args"]
    if kind == "RayJob":
        return shlex.split(spec["entrypoint"])[3:]
    role = {"PyTorchJob": None, "MPIJob": "launcher", "Job": "mpimaster"}[kind]
    pod = next(pod for name, _, pod in pod_templates(manifest) if role in (None, name))
    return pod["spec"]["containers"][0]["args"]
