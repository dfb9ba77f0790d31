"""Tenants stay in their lane (issue 21) on `gpuyard sim`: each escape tried as a team member (`kubectl --as
--as-group=gpuyard:<team>`, the group infra/tenancy.py binds) is refused by the real API server (RBAC), Volcano's
webhooks or the admission policies (infra/admission.py), with a message naming the rule; what the operators would
create under their own identities (pods, PodGroups, Services) is refused likewise when sent by the cluster admin;
and the team's ordinary jobs of every kind, sent by a team member, are admitted and run as gangs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from conftest import with_registry
from gpuyard.infra.config import load_stack
from gpuyard.infra.tenancy import team_group
from gpuyard.jobs.render import render_specs, write_manifests
from gpuyard.jobs.spec import build_spec, stack_kinds
from pod_security import pod_specs
from sim_running import running_sim
from gpuyard.sim.kube import KubectlError
from gpuyard.sim.submit import KWOK_COMPLETED, submit

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim"),  # -n 2 --dist loadgroup: one cluster at a time (the MPI Operator holds port 8080)
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
]
STACK = "dev"
CONFIG = with_registry(load_stack(STACK))
TEAM = CONFIG.team("nlp")  # priority class gpuyard-low: the lowest, so any other class is above the team's
MEMBER = ("--as=alice", f"--as-group={team_group(TEAM)}")


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with running_sim(STACK, tmp_path_factory.mktemp("sim") / "state") as cluster:
        yield cluster


def _rendered(tmp_path: Path, kind: str, edit=None, **overrides) -> Path:
    spec = build_spec(CONFIG, TEAM, kind, **overrides)
    [path] = write_manifests(render_specs(CONFIG, [spec]), tmp_path)
    if edit:
        manifest = yaml.safe_load(path.read_text())
        edit(manifest)
        path.write_text(yaml.dump(manifest, Dumper=yaml.CSafeDumper, sort_keys=False))
    return path


def _apply(sim, path: Path, *identity: str, dry_run: bool = True) -> str:
    args = [*identity, "apply", "--server-side", "--field-manager=gpuyard-test", "-f", str(path)]
    return sim.kubectl().run(*args, *(["--dry-run=server"] if dry_run else []))


def _refused(sim, path: Path, *identity: str) -> str:
    with pytest.raises(KubectlError) as refused:
        _apply(sim, path, *identity)
    return str(refused.value)


def _every_template(change):
    return lambda manifest: [change(spec) for spec in pod_specs(manifest)]


def _policy(**values):
    return lambda m: m["spec"]["runPolicy"]["schedulingPolicy"].update(values)


NVIDIA_ALL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
ESCAPES = [
    pytest.param("pytorchjob", _policy(queue="vision"), "pytorchjobs", "team-queue", id="another-teams-queue"),
    pytest.param("mpijob", _policy(queue="default"), "mpijobs", "team-queue", id="volcanos-default-queue"),
    pytest.param("volcanojob", lambda m: m["spec"].update(queue="default"), "volcanojobs", "team-queue",
                 id="volcano-job-default-queue"),
    pytest.param("rayjob", lambda m: m["metadata"]["labels"].update({"volcano.sh/queue-name": "vision"}), "rayjobs",
                 "team-queue", id="rayjob-another-queue"),
    pytest.param("pytorchjob", _policy(priorityClass="gpuyard-high"), "pytorchjobs", "team-priority",
                 id="higher-priority"),
    pytest.param("volcanojob", _every_template(lambda s: s.update(priorityClassName="gpuyard-high")), "volcanojobs",
                 "team-priority", id="higher-priority-in-a-task"),
    pytest.param("rayjob", lambda m: m["metadata"]["labels"].update({"ray.io/priority-class-name": "gpuyard-normal"}),
                 "rayjobs", "team-priority", id="rayjob-higher-priority"),
    pytest.param("pytorchjob", _every_template(lambda s: s.update(schedulerName="default-scheduler")), "pytorchjobs",
                 "volcano-scheduler", id="leaving-volcano"),
    pytest.param("volcanojob", _every_template(lambda s: s.update(schedulerName="default-scheduler")), "volcanojobs",
                 "volcano-scheduler", id="volcano-task-leaving-volcano"),
    pytest.param("mpijob", _every_template(lambda s: s["containers"][0].setdefault("env", []).append(NVIDIA_ALL)),
                 "mpijobs", "gpu-by-request", id="every-gpu-without-asking"),
    pytest.param("rayjob", lambda m: m["spec"]["rayClusterSpec"]["headGroupSpec"].update(serviceType="LoadBalancer"),
                 "rayjobs", "cluster-ip-services", id="load-balancer-in-front-of-ray"),
    pytest.param("trainjob", lambda m: m["spec"]["runtimeRef"].update(kind="ClusterTrainingRuntime"), "trainjobs",
                 "team-runtime", id="cluster-training-runtime"),
]


@pytest.mark.parametrize(("kind", "edit", "lane", "rule"), ESCAPES)
def test_each_escape_is_refused_for_a_team_member_naming_the_rule(sim, tmp_path, kind, edit, lane, rule):
    message = _refused(sim, _rendered(tmp_path, kind, edit), *MEMBER)
    assert f"ValidatingAdmissionPolicy 'gpuyard-lanes-{lane}'" in message, message
    assert f"denied request: {rule}: " in message, message


def _object(tmp_path: Path, manifest: dict) -> Path:
    path = tmp_path / "object.yaml"
    path.write_text(yaml.dump(manifest, Dumper=yaml.CSafeDumper, sort_keys=False))
    return path


def _team_object(kind: str, api: str, spec: dict, **metadata) -> dict:
    return {"apiVersion": api, "kind": kind, "spec": spec,
            "metadata": {"name": "escape", "namespace": TEAM.namespace, **metadata}}


POD_SPEC = {"priorityClassName": "gpuyard-low", "schedulerName": "volcano", "serviceAccountName": TEAM.service_account,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "busybox", "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}


@pytest.mark.parametrize(("manifest", "lane", "rule"), [
    pytest.param(_team_object("PodGroup", "scheduling.volcano.sh/v1beta1", {"queue": "vision", "minMember": 1,
                                                                             "priorityClassName": "gpuyard-low"}),
                 "podgroups", "team-queue", id="podgroup-in-another-queue"),
    pytest.param(_team_object("PodGroup", "scheduling.volcano.sh/v1beta1", {"queue": "nlp", "minMember": 1,
                                                                             "priorityClassName": "gpuyard-high"}),
                 "podgroups", "team-priority", id="podgroup-above-the-team"),
    pytest.param(_team_object("Pod", "v1", {**POD_SPEC, "schedulerName": "default-scheduler"}), "pods",
                 "volcano-scheduler", id="pod-leaving-volcano"),
    pytest.param(_team_object("Pod", "v1", POD_SPEC, annotations={"scheduling.volcano.sh/queue-name": "default"}),
                 "pods", "team-queue", id="pod-in-default-queue"),
    pytest.param(_team_object("Pod", "v1", {**POD_SPEC, "containers": [
        {**POD_SPEC["containers"][0], "env": [NVIDIA_ALL]}]}), "pods", "gpu-by-request", id="pod-asking-every-gpu"),
    pytest.param(_team_object("Service", "v1", {"type": "LoadBalancer", "ports": [{"port": 8265}]}), "services",
                 "cluster-ip-services", id="load-balancer-service"),
])
def test_what_operators_create_is_checked_whoever_sends_it(sim, tmp_path, manifest, lane, rule):
    """Sent by the cluster admin (as a controller would be: not a team member), still refused."""
    message = _refused(sim, _object(tmp_path, manifest))
    assert f"ValidatingAdmissionPolicy 'gpuyard-lanes-{lane}'" in message and f"denied request: {rule}: " in message, \
        message


@pytest.mark.parametrize(("manifest", "resource"), [
    pytest.param(_team_object("Pod", "v1", POD_SPEC), "pods", id="bare-pod"),
    pytest.param(_team_object("TrainingRuntime", "trainer.kubeflow.org/v1alpha1", {"template": {"spec": {}}}),
                 "trainingruntimes", id="own-training-runtime"),
    pytest.param(_team_object("RayService", "ray.io/v1", {}), "rayservices", id="ray-service"),
])
def test_team_members_cannot_create_what_they_do_not_need(sim, tmp_path, manifest, resource):
    message = _refused(sim, _object(tmp_path, manifest), *MEMBER)
    assert f'cannot patch resource "{resource}"' in message and "is forbidden" in message, message


@pytest.mark.parametrize("kind", stack_kinds(CONFIG))
def test_a_team_members_ordinary_jobs_run_as_gangs_in_the_team_queue(sim, tmp_path, kind):
    path = _rendered(tmp_path, kind, name=f"nlp-member-{kind}")
    _apply(sim, path, *MEMBER, dry_run=False)
    said: list[str] = []
    [job] = submit(sim, [path], 180, said.append, until=("running", KWOK_COMPLETED), apply=False)
    assert {queue for queue, _ in job.podgroups.values()} == {TEAM.queue}, said
    assert job.pods and job.bound == job.pods, said
