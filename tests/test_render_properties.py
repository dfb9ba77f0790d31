"""Invariants over job sizes (1..64 nodes x 0..8 GPUs), every kind, random valid names."""

import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.infra.conventions import ANNOTATION_DO_NOT_DISRUPT, GPU_RESOURCE, GPU_TAINT_KEY
from gpuyard.jobs.render import render, to_yaml
from gpuyard.jobs.spec import ELASTIC_KINDS, KINDS, SpecError
from render_helpers import STACK, make_spec, pod_templates, trainer_resources, trainer_templates

NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,61}[a-z0-9]", fullmatch=True)


def gang_size(manifest: dict) -> int:
    """The pods the gang scheduler waits for, as each operator computes it."""
    spec = manifest["spec"]
    kind = manifest["kind"]
    if kind in ("PyTorchJob", "MPIJob"):
        return spec["runPolicy"]["schedulingPolicy"]["minAvailable"]
    if kind == "Job":
        return spec["minAvailable"]
    if kind == "RayJob":  # KubeRay: head + every group's minReplicas
        return 1 + sum(group["minReplicas"] for group in spec["rayClusterSpec"]["workerGroupSpecs"])
    return spec["trainer"]["numNodes"]  # TrainJob: the runtime's PodGroup covers every node


def pods_at_start(manifest: dict) -> int:
    """Pods that exist while the gang is scheduled (the MPIJob launcher comes after the workers)."""
    return sum(count for role, count, _ in pod_templates(manifest) if role != "launcher")


def derived_names(manifest: dict, name: str) -> list[str]:
    """Names the operators derive from the job's: pod hostnames and Services."""
    kind = manifest["kind"]
    if kind == "RayJob":
        return [f"{name}-xxxxx-head-svc"]
    prefix = {"TrainJob": "node-0"}.get(kind)
    return [f"{name}-{prefix or role}-{index}" for role, count, _ in pod_templates(manifest) for index in range(count)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), nodes=st.integers(1, 64), gpus=st.integers(0, 8), data=st.data())
def test_gang_covers_every_pod_and_gpu_pods_tolerate_the_taint(kind, nodes, gpus, data):
    elastic = kind in ELASTIC_KINDS and data.draw(st.booleans())
    min_nodes = data.draw(st.integers(1, nodes)) if elastic else nodes
    manifest = render(make_spec(kind, nodes=nodes, min_nodes=min_nodes, gpus_per_node=gpus), STACK.team("vision"))
    if min_nodes == nodes:
        assert gang_size(manifest) == pods_at_start(manifest)
    else:
        assert gang_size(manifest) == min_nodes and pods_at_start(manifest) == nodes
    assert sum(count for count, _ in trainer_templates(manifest)) == nodes
    resources = trainer_resources(manifest)
    assert resources["requests"] == resources["limits"]
    assert resources["limits"].get(GPU_RESOURCE) == (str(gpus) if gpus else None)
    for _, pod in trainer_templates(manifest):
        tolerations = [t["key"] for t in pod["spec"].get("tolerations", [])]
        assert tolerations == ([GPU_TAINT_KEY] if gpus else [])
    for _, _, pod in pod_templates(manifest):
        assert pod["metadata"]["annotations"][ANNOTATION_DO_NOT_DISRUPT] == "true"


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(KINDS), nodes=st.integers(1, 64), name=NAMES)
def test_names_fit_a_label_or_are_refused(kind, nodes, name):
    try:
        spec = make_spec(kind, name=name, nodes=nodes)
    except SpecError as error:
        assert "too long" in str(error)
        return
    manifest = render(spec, STACK.team("vision"))
    assert manifest["metadata"]["name"] == name
    assert all(len(derived) <= 63 for derived in derived_names(manifest, name))
    for _, _, pod in pod_templates(manifest):
        assert all(len(value) <= 63 for value in pod["metadata"]["labels"].values())


@settings(max_examples=50, deadline=None)
@given(kind=st.sampled_from(KINDS), nodes=st.integers(1, 64), gpus=st.integers(0, 8))
def test_rendering_is_pure_and_reads_back(kind, nodes, gpus):
    spec = make_spec(kind, nodes=nodes, gpus_per_node=gpus)
    manifest = render(spec, STACK.team("vision"))
    assert to_yaml(manifest) == to_yaml(render(spec, STACK.team("vision")))
    assert yaml.safe_load(to_yaml(manifest)) == manifest


def test_size_grid_passes_the_official_schemas(tmp_path, validate_manifests):
    count = 0
    for kind in KINDS:
        for nodes in (1, 2, 64):
            for gpus in (0, 1, 8):
                efa = 4 if gpus == 8 else 0
                spec = make_spec(kind, "nlp", name=f"g-{nodes}-{gpus}", nodes=nodes, gpus_per_node=gpus,
                                 efa_devices=efa)
                (tmp_path / f"{kind}-{nodes}-{gpus}.yaml").write_text(to_yaml(render(spec, STACK.team("nlp"))))
                count += 1
    elastic = make_spec("pytorchjob", "nlp", nodes=8, min_nodes=2, name="elastic")
    (tmp_path / "elastic.yaml").write_text(to_yaml(render(elastic, STACK.team("nlp"))))
    result = subprocess.run([sys.executable, str(validate_manifests), "--strict", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{count + 1} passed, 0 failed" in result.stdout


@pytest.mark.parametrize("kind", KINDS)
def test_sixty_four_nodes_of_eight_gpus(kind):
    manifest = render(make_spec(kind, nodes=64, gpus_per_node=8), STACK.team("vision"))
    assert sum(count for count, _ in trainer_templates(manifest)) == 64
