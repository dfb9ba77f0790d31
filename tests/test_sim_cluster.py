"""`gpuyard sim`: the dev stack's Kubernetes layer and every job template on the real control plane, Volcano and
operators, with kwok nodes shaped like the stack's pools. Builds the components once (cached, needs Go)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from infra.config import load_stack
from infra.plan import plan
from jobs.render import render_specs, write_manifests
from jobs.spec import build_spec, stack_kinds
from sim import nodes, stack
from sim.cluster import Sim
from sim.submit import SubmitFailed, submit

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
]
STACK = "dev"
CONFIG = load_stack(STACK)


@pytest.fixture(scope="session")
def sim(tmp_path_factory):
    """The dev stack's simulated cluster, started once for the session (state in a temporary folder)."""
    cluster = Sim(STACK, tmp_path_factory.mktemp("sim") / "state")
    cluster.up(print)
    yield cluster
    cluster.down()
    assert not cluster.state.exists()


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
        assert live["metadata"]["labels"] == meta.get("labels", live["metadata"].get("labels"))
    queue = kubectl.get("queues.scheduling.volcano.sh", "vision")
    assert queue["spec"]["capability"]["nvidia.com/gpu"] == "16"


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


JOBS = [(team.name, kind) for team in CONFIG.teams for kind in stack_kinds(CONFIG)]


@pytest.mark.parametrize(("team", "kind"), JOBS, ids=[f"{t}-{k}" for t, k in JOBS])
def test_job_runs_as_a_gang_then_succeeds(sim, tmp_path, team, kind):
    path = _rendered(tmp_path, team, kind)
    manifest = yaml.safe_load(path.read_text())
    said: list[str] = []
    submit(sim, [path], 180, said.append, until=("running", "succeeded"))
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    kubectl = sim.kubectl()
    pods = kubectl.items("pods", namespace=namespace, selector=f"gpuyard.io/job={name}")
    groups = [g for g in kubectl.items("podgroups.scheduling.volcano.sh", namespace=namespace)
              if g["metadata"]["name"] in {p["metadata"]["annotations"].get("scheduling.k8s.io/group-name") for p in pods}]
    assert groups, said
    assert {g["spec"]["queue"] for g in groups} == {CONFIG.team(team).queue}
    assert sum(g["spec"]["minMember"] for g in groups) == len(pods)
    assert all(p["spec"].get("nodeName") for p in pods)
    submit(sim, [path], 180, said.append, until=("succeeded",))
    assert any("gang running" in line for line in said) or any("gang succeeded" in line for line in said), said
