"""`gpuyard sim`: the dev stack's Kubernetes layer and every job template on the real control plane, Volcano and
operators, with kwok nodes shaped like the stack's pools. Builds the components once (cached, needs Go)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import yaml

from conftest import with_registry
from gpuyard.infra.config import load_stack
from gpuyard.infra.conventions import GPU_RESOURCE
from gpuyard.infra.plan import plan
from gpuyard.infra.prices import on_demand_price
from gpuyard.jobs.render import render_specs, write_manifests
from gpuyard.jobs.spec import build_spec, stack_kinds
from gpuyard.sim import monitoring, nodes, stack
from render_helpers import pod_templates
from sim_running import running_sim
from gpuyard.sim.images import build_images
from gpuyard.sim.kwok import runs_for
from gpuyard.sim.submit import KWOK_COMPLETED, SubmitFailed, submit

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim"),  # -n 2 --dist loadgroup: one cluster at a time (the MPI Operator holds port 8080)
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
]
STACK = "dev"
CONFIG = with_registry(load_stack(STACK))  # images from the stack's ECR registry


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """The dev stack's simulated cluster with its monitoring, started once for this module (the Karpenter tests start
    their own)."""
    with running_sim(STACK, tmp_path_factory.mktemp("sim") / "state", monitoring=True) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def resources():
    return plan(STACK).resources


def test_every_stack_object_is_admitted(sim, resources):
    kubectl = sim.kubectl()
    objects = stack.kubernetes_objects(resources)
    simulated = [o for o in objects if stack.simulated(o)]
    assert {o["kind"] for o in simulated} >= {"Namespace", "ResourceQuota", "LimitRange", "Role", "RoleBinding",
                                              "ServiceAccount", "PriorityClass", "NetworkPolicy", "Queue"}
    for manifest in simulated:
        meta = manifest["metadata"]
        resource = f"{manifest['kind'].lower()}.{manifest['apiVersion'].split('/')[0]}" if "/" in manifest["apiVersion"] \
            else manifest["kind"].lower()
        live = kubectl.get(resource, meta["name"], meta.get("namespace"))
        assert meta.get("labels", {}).items() <= live["metadata"].get("labels", {}).items()
    queue = kubectl.get("queues.scheduling.volcano.sh", "vision")
    assert queue["spec"]["capability"]["nvidia.com/gpu"] == "16"


def test_the_registry_answers_at_the_prefix_status_names(sim):
    """The image registry runs with the cluster (sim/registry.py); `gpuyard sim registry` prints this prefix."""
    registry = sim.registry()
    assert registry.ready() and registry.address.startswith("127.0.0.1:")
    assert sim.status()["registry"] == f"{registry.address}/{CONFIG.cluster_name}"
    assert "registry" in sim.supervisor.running()


def test_the_images_are_pushed_to_the_registry_under_the_stacks_prefix(sim):
    """What `gpuyard sim images` does: the three images (built once by `python -m gpuyard.sim.images`, found by the digest
    of their inputs) under the prefix `gpuyard render --registry` takes."""
    registry = sim.registry()
    refs = build_images(registry, STACK)
    assert refs == {image: f"{registry.address}/{CONFIG.cluster_name}/{image}:{CONFIG.image_tag}" for image in refs}
    for image in refs:
        assert registry.manifest(f"{CONFIG.cluster_name}/{image}", CONFIG.image_tag) is not None


def test_nodes_follow_the_stack_pools(sim, resources):
    live = {n["metadata"]["name"]: n for n in sim.kubectl().items("nodes")}
    pools = nodes.pools(resources)
    assert len(live) == sum(pool.count for pool in pools)
    g5 = live["gpu-small-g5-xlarge-0"]
    assert g5["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert g5["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "g5.xlarge"
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in g5["spec"]["taints"]
    assert all(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
               for n in live.values())


def _rendered(tmp_path: Path, team: str, kind: str, **overrides) -> Path:
    spec = build_spec(CONFIG, CONFIG.team(team), kind, **overrides)
    [path] = write_manifests(render_specs(CONFIG, [spec]), tmp_path)
    return path


def _gang_size(manifest: dict, pods: int) -> int:
    """The gang the template declares (Volcano Job minAvailable, runPolicy.schedulingPolicy.minAvailable), else every pod."""
    spec = manifest["spec"]
    declared = spec.get("minAvailable") or spec.get("runPolicy", {}).get("schedulingPolicy", {}).get("minAvailable")
    return declared or pods


JOBS = [pytest.param(team.name, kind, id=f"{team.name}-{kind}")
        for team in CONFIG.teams for kind in stack_kinds(CONFIG)]


@pytest.mark.parametrize(("team", "kind"), JOBS)
def test_job_runs_as_a_gang_then_its_operator_completes_it_once_kwok_ends_its_pods_no_container_runs(sim, tmp_path,
                                                                                                   team, kind):
    """The gang is real (Volcano, the operator); the end is kwok's: the pods exit 0 without running anything, so this
    checks the operator's bookkeeping, not the training (tests/test_images_containers.py runs the images)."""
    path = _rendered(tmp_path, team, kind)
    manifest = yaml.safe_load(path.read_text())
    said: list[str] = []
    [job] = submit(sim, [path], 180, said.append, until=("running", KWOK_COMPLETED))
    assert job.podgroups, said
    assert {queue for queue, _ in job.podgroups.values()} == {CONFIG.team(team).queue}, said
    gang = [pod for pod in job.pods if job.components.get(pod) != "submitter"]  # a RayJob's submitter: not the gang
    assert sum(size for group, (_, size) in job.podgroups.items() if not group.startswith("podgroup-")) == \
        _gang_size(manifest, len(gang)), said
    assert job.pods and job.bound == job.pods, said  # every pod bound: never part of a gang
    graces = {pod["metadata"]["name"]: pod["spec"]["terminationGracePeriodSeconds"]
              for pod in sim.kubectl().items("pods", namespace=job.namespace) if pod["metadata"]["name"] in gang}
    rendered_graces = {pod["spec"]["terminationGracePeriodSeconds"] for _, _, pod in pod_templates(manifest)}
    assert graces and set(graces.values()) == rendered_graces, graces  # what the operator made: the trainer's grace
    [job] = submit(sim, [path], 180, said.append, until=(KWOK_COMPLETED,), apply=False)
    assert job.outcome == KWOK_COMPLETED, said
    assert any("no container ran" in line for line in said), said


def sdk_train_function():
    """What a data scientist hands the Kubeflow SDK (its source goes into the TrainJob's command)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")


def test_the_kubeflow_sdks_trainjob_on_the_teams_runtime_gets_gpuyards_pods_and_one_naming_no_kind_is_refused(
        sim, tmp_path):
    """The Kubeflow SDK itself (kubeflow 0.5.0 from PyPI): ``TrainerClient().get_runtime("torch-distributed")`` finds
    the team's namespaced TrainingRuntime first and ``train()`` sends ``runtimeRef`` with its kind
    (kubeflow/trainer/backends/kubernetes/backend.py ``get_runtime``, ``_get_trainjob_spec``: ``kind=runtime.kind``),
    so Trainer v2.3.0 builds the job from that runtime alone: gang, queue, placement, grace, do-not-disrupt, /dev/shm
    and the contract come from there. A TrainJob naming no kind (what the SDK sent before 0.5: kubeflow/sdk at
    020e475) gets Trainer's default, ClusterTrainingRuntime (pkg/apis/trainer/v1alpha1/trainjob_types.go
    RuntimeRef.Kind), which carries no team queue or priority: the lanes refuse it, as on EKS. The env's values
    resolve in a kubelet (the JobSet label, ``$(VAR)``); kwok runs no container, so the pod spec and the label the
    value comes from are checked, not a process's environment."""
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import CustomTrainer, RuntimeKind, TrainerClient

    team = CONFIG.team("vision")
    client = TrainerClient(KubernetesBackendConfig(namespace=team.namespace, config_file=str(sim.kubeconfig)))
    runtime = client.get_runtime("torch-distributed")
    assert runtime.kind == RuntimeKind.TRAINING_RUNTIME
    name = client.train(runtime=runtime, trainer=CustomTrainer(func=sdk_train_function, num_nodes=1,
                                                               resources_per_node={"gpu": 1}))
    sent = sim.kubectl().get("trainjob", name, team.namespace)
    assert sent["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                          "name": "torch-distributed"}
    path = tmp_path / "sdk.yaml"
    path.write_text(yaml.safe_dump(sent))
    [job] = submit(sim, [path], 180, print, until=("running", KWOK_COMPLETED), apply=False)
    assert {queue for queue, _ in job.podgroups.values()} == {team.queue}
    [pod] = [pod for pod in sim.kubectl().items("pods", namespace=team.namespace)
             if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name]
    spec = pod["spec"]
    assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert spec["nodeSelector"] == {"karpenter.sh/nodepool": "gpu-on-demand", "karpenter.sh/capacity-type": "on-demand"}
    assert spec["terminationGracePeriodSeconds"] == 300 and spec.get("nodeName")
    assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in spec["containers"][0]["env"]}
    assert env["GPUYARD_JOB_NAME"] == {"fieldRef": {"apiVersion": "v1",
                                                    "fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}
    assert env["GPUYARD_CHECKPOINT_URI"] == f"s3://{CONFIG.checkpoint_bucket}/{team.checkpoint_prefix}$(GPUYARD_JOB_NAME)"
    assert (env["GPUYARD_TEAM"], env["NCCL_DEBUG"], env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) == ("vision", "WARN", "300")
    client.delete_job(name)
    no_kind = {"apiVersion": sent["apiVersion"], "kind": sent["kind"],
               "metadata": {"name": "vision-sdk-no-kind", "namespace": team.namespace},
               "spec": {**sent["spec"], "runtimeRef": {"name": "torch-distributed"}}}
    path.write_text(yaml.safe_dump(no_kind))
    with pytest.raises(SubmitFailed, match="team-runtime: spec.runtimeRef must name this namespace's TrainingRuntime"):
        submit(sim, [path], 180, print, until=("running", KWOK_COMPLETED))


def test_a_rayjobs_submitter_pod_is_admitted_and_scheduled_as_a_team_pod(sim, tmp_path):
    """KubeRay's default submitter has no security context, scheduler or priority, which restricted Pod Security and
    the lanes refuse (so no RayJob would submit): the rendered submitterPodTemplate is a team pod. What it runs
    (`ray job submit`) is not tested here: kwok runs no containers."""
    team = CONFIG.team("vision")
    path = _rendered(tmp_path, "vision", "rayjob", name="vision-submitter")
    submit(sim, [path], 180, print, until=("running", KWOK_COMPLETED))
    selector = "gpuyard.io/job=vision-submitter,app.kubernetes.io/component=submitter"
    [pod] = sim.kubectl().items("pods", namespace=team.namespace, selector=selector)
    assert pod["spec"]["schedulerName"] == "volcano" and pod["spec"].get("nodeName"), pod.get("status")
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_showback_rules_charge_a_running_gang_to_its_job_from_live_scrapes(sim, tmp_path):
    """kube-state-metrics watches the cluster and Prometheus evaluates the stack's own rules (once a minute, as on
    EKS): a running gang's GPUs and its cost per hour (each node's on-demand price per GPU) reach its job. GPU use
    is absent, not zero: kwok nodes have no GPU and no DCGM exporter."""
    path = _rendered(tmp_path, "nlp", "volcanojob", name="nlp-showback", nodes=2, gpus_per_node=1)
    path.write_text(yaml.safe_dump(runs_for(yaml.safe_load(path.read_text()), "600s")))
    kubectl, url = sim.kubectl(), monitoring.recorded(sim.state)
    try:
        submit(sim, [path], 180, print, until=("running",))
        nodes_by_name = {node["metadata"]["name"]: node for node in kubectl.items("nodes")}
        held: dict[str, int] = {}
        for pod in kubectl.items("pods", namespace=CONFIG.team("nlp").namespace, selector="gpuyard.io/job=nlp-showback"):
            gpus = sum(int(c["resources"].get("requests", {}).get(GPU_RESOURCE, 0)) for c in pod["spec"]["containers"])
            if gpus:
                held[pod["spec"]["nodeName"]] = held.get(pod["spec"]["nodeName"], 0) + gpus
        cost = sum(gpus * on_demand_price(nodes_by_name[node]["metadata"]["labels"]["node.kubernetes.io/instance-type"])
                   / int(nodes_by_name[node]["status"]["allocatable"][GPU_RESOURCE]) for node, gpus in held.items())
        job = '{gpuyard_job="nlp-showback", team="nlp"}'
        deadline = time.monotonic() + 240  # two rule groups, each evaluated once a minute
        while not (found := monitoring.query(url, f"gpuyard:job_cost_usd_per_hour{job}")) and time.monotonic() < deadline:
            time.sleep(2)
        assert found and float(found[0]["value"][1]) == pytest.approx(cost), (found, held)
        [allocated] = monitoring.query(url, f"gpuyard:job_gpus_allocated{job}")
        assert float(allocated["value"][1]) == sum(held.values()) == 2
        assert monitoring.query(url, f"gpuyard:job_gpus_used{job}") == []
    finally:
        kubectl.run("delete", "-f", str(path), "--wait=false")


def _with(path: Path, edit) -> Path:
    manifest = yaml.safe_load(path.read_text())
    edit(manifest)
    path.write_text(yaml.dump(manifest, Dumper=yaml.CSafeDumper, sort_keys=False))
    return path


def test_leading_digit_name_is_denied_by_the_training_operator_webhook(sim, tmp_path):
    # kubeflow/training-operator v1.9.4 pkg/webhooks/pytorch/pytorchjob_webhook.go: NameIsDNS1035Label
    path = _with(_rendered(tmp_path, "vision", "pytorchjob"), lambda m: m["metadata"].update(name="1-vision-job"))
    with pytest.raises(SubmitFailed) as denied:
        submit(sim, [path], 30, print)
    assert "admission denied" in str(denied.value)
    assert 'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied the request' in str(denied.value)
    assert "DNS-1035" in str(denied.value)


def test_gang_beyond_queue_capability_stays_unscheduled_and_names_the_queue(sim, tmp_path):
    team = CONFIG.team("nlp")  # queue capability nvidia.com/gpu = gpu_quota 8
    path = _rendered(tmp_path, "nlp", "volcanojob", name="nlp-too-big", nodes=team.gpu_quota + 1)
    with pytest.raises(SubmitFailed) as refused:
        submit(sim, [path], 30, print)
    message = str(refused.value)
    assert "not running after 30s" in message
    assert f"queue {team.queue}" in message
    pods = sim.kubectl().items("pods", namespace=team.namespace, selector="gpuyard.io/job=nlp-too-big")
    assert not any(p["spec"].get("nodeName") for p in pods)  # never part of a gang


def test_privileged_team_pod_is_denied(sim, tmp_path, resources):
    namespace = CONFIG.team("vision").namespace
    declared = next(o for o in stack.kubernetes_objects(resources)
                    if o["kind"] == "Namespace" and o["metadata"]["name"] == namespace)
    if "pod-security.kubernetes.io/enforce" not in declared["metadata"].get("labels", {}):
        pytest.skip(f"the stack declares no Pod Security level on {namespace} yet (issue 11)")

    def privileged(manifest):
        for spec in manifest["spec"]["pytorchReplicaSpecs"].values():
            spec["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}

    path = _with(_rendered(tmp_path, "vision", "pytorchjob", name="vision-privileged"), privileged)
    with pytest.raises(SubmitFailed) as denied:
        submit(sim, [path], 30, print)
    assert "privileged" in str(denied.value)
