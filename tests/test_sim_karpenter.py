"""`gpuyard sim up --karpenter`: no GPU node exists until Karpenter (v1.14.1, kwok provider) launches one for a
gang Volcano could not place, and the GPU pools return to zero once the gang is done.

The NodePools consolidate after CONSOLIDATE_AFTER here instead of the stack's 10m (GPU) / 1m (CPU), so a pool's
return to zero is seen in seconds; Karpenter acts on it at its next disruption pass, so the tests allow SETTLE.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable

import pytest
import yaml

from gpuyard.infra.cluster import LABEL_GPU_NODE
from conftest import with_registry
from gpuyard.infra.config import load_stack
from gpuyard.infra.conventions import GPU_RESOURCE, GRACE_PERIOD_SECONDS, LABEL_NODEPOOL, LABEL_PART_OF, NODEPOOL_GPU_ON_DEMAND
from gpuyard.infra.plan import plan
from gpuyard.jobs.ephemeral.stacks import drain_node_pools
from gpuyard.jobs.render import render_specs, write_manifests
from gpuyard.jobs.spec import build_spec, stack_kinds
from gpuyard.sim import karpenter
from gpuyard.sim.cluster import Sim
from gpuyard.sim.kube import Kubectl
from gpuyard.sim.report import cluster_report
from gpuyard.sim.submit import KWOK_COMPLETED, SubmitFailed, job_phase, submit

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim"),  # -n 2 --dist loadgroup: one cluster at a time (the MPI Operator holds port 8080)
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
]
STACK = "dev"
CONFIG = with_registry(load_stack(STACK))  # images from the stack's ECR registry
CONSOLIDATE_AFTER = "5s"
SETTLE = 90  # seconds: consolidateAfter, Karpenter's disruption pass (every 10 s) and the node's termination
RUN = 240  # seconds for a gang to run, launching nodes included
GRANTED = re.compile(r"granted (\d+) seconds of grace-period")
CONTEST = 150  # seconds for two gangs, one after the other, to have run


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    cluster = Sim(STACK, tmp_path_factory.mktemp("sim") / "state", karpenter=True, consolidate_after=CONSOLIDATE_AFTER)
    cluster.up(print)
    yield cluster
    cluster.down()
    assert not cluster.state.exists()


def _rendered(tmp_path: Path, team: str, kind: str, **overrides) -> Path:
    spec = build_spec(CONFIG, CONFIG.team(team), kind, **overrides)
    [path] = write_manifests(render_specs(CONFIG, [spec]), tmp_path)
    return path


def _gpu_nodes(kubectl: Kubectl) -> list[dict]:
    return kubectl.items("nodes", selector=f"{LABEL_GPU_NODE}=true")


def _until(check: Callable[[], bool], seconds: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"not within {seconds:.0f}s: {what}")
        time.sleep(1)
    return time.monotonic() - started


def _job_pods(kubectl: Kubectl, team: str, name: str) -> list[dict]:
    return kubectl.items("pods", namespace=CONFIG.team(team).namespace, selector=f"gpuyard.io/job={name}")


def test_starts_without_gpu_nodes_and_with_the_plans_nodepools(sim):
    kubectl = sim.kubectl()
    assert _gpu_nodes(kubectl) == []
    assert {n["metadata"]["labels"].get("eks.amazonaws.com/nodegroup") for n in kubectl.items("nodes")} == {"system"}
    live = {p["metadata"]["name"]: p for p in kubectl.items("nodepools.karpenter.sh")}
    for declared in karpenter.nodepools(plan(STACK).resources):
        pool = live[declared["metadata"]["name"]]
        spec, template = pool["spec"], pool["spec"]["template"]
        assert template["spec"]["nodeClassRef"] == karpenter.NODE_CLASS_REF
        assert template["spec"]["requirements"] == declared["spec"]["template"]["spec"]["requirements"]
        assert template["spec"].get("taints") == declared["spec"]["template"]["spec"].get("taints")
        assert template["metadata"]["labels"] == declared["spec"]["template"]["metadata"]["labels"]
        assert spec["limits"] == declared["spec"]["limits"] and spec["weight"] == declared["spec"]["weight"]
        assert spec["disruption"]["consolidateAfter"] == CONSOLIDATE_AFTER

    def ready() -> bool:
        pools = kubectl.items("nodepools.karpenter.sh")
        return all(any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
                   for p in pools)

    _until(ready, 30, "every NodePool Ready (its KWOKNodeClass resolved)")


@pytest.mark.parametrize("kind", stack_kinds(CONFIG))
def test_gang_scales_its_pool_from_zero_and_back(sim, tmp_path, kind):
    """The gang runs on nodes Karpenter launched for it; once the job is gone (deleted: a RayJob cannot succeed
    here, its driver needs the Ray dashboard) the pool returns to zero."""
    kubectl = sim.kubectl()
    _until(lambda: not _gpu_nodes(kubectl), SETTLE, "no GPU node left by an earlier test")
    path = _rendered(tmp_path, "vision", kind, name=f"vision-{kind}-scale")
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    said: list[str] = []
    try:
        [job] = submit(sim, [path], RUN, said.append, until=("running", KWOK_COMPLETED))
        assert job.pods and job.bound == job.pods, said  # pods may be gone (a finished Volcano Job's workers)
        nodes = {n["metadata"]["name"]: n for n in kubectl.items("nodes")}
        gpu_nodes = {job.nodes[pod] for pod in job.pods} & {
            name for name, node in nodes.items() if node["metadata"]["labels"].get(LABEL_NODEPOOL) == NODEPOOL_GPU_ON_DEMAND}
        assert gpu_nodes, said
        for node in gpu_nodes:
            labels = nodes[node]["metadata"]["labels"]
            assert labels["karpenter.sh/registered"] == "true"
            assert labels["karpenter.k8s.aws/instance-family"] in CONFIG.karpenter.gpu_families
        claims = kubectl.items("nodeclaims.karpenter.sh")
        assert {c["status"]["nodeName"] for c in claims} >= gpu_nodes
    finally:
        kubectl.run("delete", "-f", str(path), "--wait=false")
    took = _until(lambda: not _gpu_nodes(kubectl), SETTLE, f"GPU pool back to zero after {name}")
    print(f"{kind}: GPU nodes gone {took:.0f}s after the job was deleted (consolidateAfter {CONSOLIDATE_AFTER})")


def test_gang_that_fits_no_instance_type_launches_nothing_and_submit_says_why(sim, tmp_path):
    kubectl = sim.kubectl()
    path = _rendered(tmp_path, "vision", "volcanojob", name="vision-too-wide", gpus_per_node=16)
    with pytest.raises(SubmitFailed, match=r"not applied: Job vision-too-wide: no instance type of NodePool "
                                           r"gpu-on-demand \(families g5, g6\) fits a pod requesting .*nvidia.com/gpu=16"):
        submit(sim, [path], 30, print)
    assert not _job_pods(kubectl, "vision", "vision-too-wide")
    # Applied anyway (no pre-flight): Karpenter itself finds no instance type for the GPU workers (and launches a
    # CPU node for the master, which the pre-flight spares).
    kubectl.apply_files([path])
    namespace = CONFIG.team("vision").namespace
    try:
        def karpenter_refused() -> bool:
            events = kubectl.items("events", namespace=namespace)
            return any(e["involvedObject"].get("name", "").startswith("vision-too-wide-mpiworker")
                       and "no instance type" in e.get("message", "") for e in events)
        _until(karpenter_refused, 60, "Karpenter's FailedScheduling event on a worker")
        assert not _gpu_nodes(kubectl)
    finally:
        kubectl.run("delete", "-f", str(path), "--wait=false")


def test_gang_beyond_the_pool_limit_is_refused_before_karpenter_sees_it(sim, tmp_path):
    kubectl = sim.kubectl()
    claims = len(kubectl.items("nodeclaims.karpenter.sh"))
    path = _rendered(tmp_path, "vision", "pytorchjob", name="vision-too-many", nodes=3, gpus_per_node=4)
    with pytest.raises(SubmitFailed, match=r"its gang needs 12 nvidia.com/gpu from NodePool gpu-on-demand, "
                                           r"whose limit is 8"):
        submit(sim, [path], 30, print)
    assert not _job_pods(kubectl, "vision", "vision-too-many")
    assert len(kubectl.items("nodeclaims.karpenter.sh")) == claims


def _without_completion(path: Path) -> Path:
    """The job's pods lose the part-of label kwok completes training pods by (sim/kwok.py): they run until deleted."""
    text = path.read_text()
    manifest = yaml.safe_load(text)

    def strip(tree):
        if isinstance(tree, dict):
            if "template" in tree and isinstance(tree["template"], dict):
                tree["template"].get("metadata", {}).get("labels", {}).pop(LABEL_PART_OF, None)
            for value in tree.values():
                strip(value)
        elif isinstance(tree, list):
            for value in tree:
                strip(value)

    strip(manifest["spec"])
    path.write_text(yaml.dump(manifest, Dumper=yaml.CSafeDumper, sort_keys=False))
    return path


def test_consolidation_never_evicts_a_running_gang(sim, tmp_path):
    kubectl = sim.kubectl()
    _until(lambda: not _gpu_nodes(kubectl), SETTLE, "no GPU node left by an earlier test")
    path = _without_completion(_rendered(tmp_path, "vision", "pytorchjob", name="vision-long"))

    def gang_claims(nodes: set[str]) -> set[str]:
        return {c["metadata"]["name"] for c in kubectl.items("nodeclaims.karpenter.sh")
                if c.get("status", {}).get("nodeName") in nodes}

    try:
        submit(sim, [path], RUN, print, until=("running",))
        before = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in _job_pods(kubectl, "vision", "vision-long")}
        assert before and all(before.values())
        claims = gang_claims(set(before.values()))
        assert claims
        time.sleep(SETTLE / 2)  # several disruption passes, each long past consolidateAfter
        pods = _job_pods(kubectl, "vision", "vision-long")
        assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods} == before
        assert all(not p["metadata"].get("deletionTimestamp") for p in pods)
        assert gang_claims(set(before.values())) == claims
        tainted = [n["metadata"]["name"] for n in _gpu_nodes(kubectl)
                   if any(t["key"] == "karpenter.sh/disrupted" for t in n["spec"].get("taints", []))]
        assert not tainted
    finally:
        kubectl.run("delete", "-f", str(path), "--wait=false")
    took = _until(lambda: not _gpu_nodes(kubectl), SETTLE, "GPU pool back to zero after the job was deleted")
    print(f"GPU nodes gone {took:.0f}s after the job was deleted")


def _gpu_pods(kubectl: Kubectl, team: str, name: str) -> list[dict]:
    return [p for p in _job_pods(kubectl, team, name)
            if any(GPU_RESOURCE in c["resources"].get("requests", {}) for c in p["spec"]["containers"])]


def _gpus_held(kubectl: Kubectl, team: str, name: str) -> int:
    """The job's GPU pods holding their GPUs: bound and not finished."""
    return sum(1 for p in _gpu_pods(kubectl, team, name)
               if p["spec"].get("nodeName") and p["status"].get("phase") not in ("Succeeded", "Failed"))


def _reclaimed_pods(kubectl: Kubectl, team: str, name: str) -> set[str]:
    """The job's pods Volcano evicted for another queue (volcano v1.14.1 pkg/scheduler/cache/cache.go Evict:
    "Pod is evicted, because of reclaim")."""
    return {e["involvedObject"]["name"] for e in kubectl.items("events", namespace=CONFIG.team(team).namespace)
            if e.get("reason") == "Evict" and e["involvedObject"].get("kind") == "Pod"
            and e["involvedObject"]["name"].startswith(f"{name}-") and "reclaim" in e.get("message", "")}


def test_two_teams_compete_for_the_capped_pool_and_the_loser_stays_whole(sim, tmp_path):
    """Each gang wants the whole GPU pool (2 x 4 GPUs, the dev pool's limit 8): one holds all its GPUs, the other
    none until the first is done or has been reclaimed from (Volcano's capacity plugin: nlp deserves 3 of the 8 GPUs,
    vision 5; infra/operators.py). A gang's CPU launcher may bind before its workers: Volcano pipelines the workers
    onto GPUs being released (pkg/scheduler/actions/allocate), and Karpenter replaces nodes it consolidated."""
    kubectl = sim.kubectl()
    _until(lambda: not _gpu_nodes(kubectl), SETTLE, "no GPU node left by an earlier test")
    jobs = {team: f"{team}-contest" for team in ("vision", "nlp")}
    paths = [_rendered(tmp_path, team, "volcanojob", name=name, nodes=2, gpus_per_node=4) for team, name in jobs.items()]
    run_order = []
    kubectl.apply_files(paths)
    try:
        _until(lambda: all(_gpu_pods(kubectl, t, n) for t, n in jobs.items()), 60, "both jobs' pods created")
        gang = {team: len(_gpu_pods(kubectl, team, name)) for team, name in jobs.items()}
        report = None
        deadline = time.monotonic() + CONTEST
        while len(run_order) < len(jobs):
            assert time.monotonic() < deadline, f"not both gangs ran: {run_order}"
            held = {team: _gpus_held(kubectl, team, name) for team, name in jobs.items()}
            # a gang that ran winds down pod by pod; one that has not run yet must never hold part of its GPUs
            partial = [team for team in jobs if team not in run_order and 0 < held[team] < gang[team]]
            if partial:  # binding a gang takes a few API calls: a partial gang must not last
                time.sleep(3)
                still = [t for t in partial if 0 < _gpus_held(kubectl, t, jobs[t]) < gang[t]]
                assert not still, f"a partial gang holds GPUs: {still}: " + "; ".join(
                    f"{p['metadata']['name']} {p['status'].get('phase')} on {p['spec'].get('nodeName')}"
                    for t in still for p in _job_pods(kubectl, t, jobs[t]))
            for team in jobs:
                if held[team] == gang[team] and team not in run_order:
                    run_order.append(team)
                    if len(run_order) == 1:
                        other = next(t for t in jobs if t != team)
                        assert _gpus_held(kubectl, other, jobs[other]) == 0
                        report = cluster_report(kubectl)
            time.sleep(1)
        print(f"ran in order {run_order}")
        reclaimed = {team: _reclaimed_pods(kubectl, team, name) for team, name in jobs.items()}
        assert not reclaimed["vision"], reclaimed  # nlp may not take back what is within vision's share
        if run_order[0] == "nlp":  # nlp held 8 GPUs, 5 above its share: vision, under its own, reclaims them all
            assert len(reclaimed["nlp"]) == gang["nlp"], reclaimed
        capacity = report["nodes"][NODEPOOL_GPU_ON_DEMAND]
        assert set(capacity) == {"on-demand"} and sum(capacity["on-demand"].values()) >= 1
        loser = run_order[1]
        waiting = [g for g in report["podgroups"][CONFIG.team(loser).queue] if jobs[loser] in g["podgroup"]]
        assert waiting and waiting[0]["pending_reasons"], report["podgroups"]
    finally:
        kubectl.run("delete", "-f", str(paths[0]), "-f", str(paths[1]), "--wait=false")


def _instance_gone(kubectl: Kubectl, node: str) -> None:
    """What the node lifecycle controller records once the kubelet of a terminated instance stops reporting."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "instance terminated",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
    if node in {n["metadata"]["name"] for n in kubectl.items("nodes")}:  # else Karpenter already removed it
        kubectl.run("patch", "node", node, "--subresource=status", "--type=strategic",
                    "-p", json.dumps({"status": {"conditions": [condition]}}))


def _spot_job(sim, tmp_path: Path, name: str) -> tuple[Kubectl, Path, dict[str, str]]:
    kubectl = sim.kubectl()
    _until(lambda: not _gpu_nodes(kubectl), SETTLE, "no GPU node left by an earlier test")
    path = _without_completion(_rendered(tmp_path, "vision", "pytorchjob", name=name, capacity_type="spot"))
    submit(sim, [path], RUN, print, until=("running",))
    pods = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in _job_pods(kubectl, "vision", name)}
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kubectl.items("nodes")}
    assert {nodes[node]["karpenter.sh/capacity-type"] for node in pods.values()} == {"spot"}
    return kubectl, path, pods


def test_spot_interruption_the_operator_restarts_the_job_on_new_capacity(sim, tmp_path):
    """The node of a running spot gang is deleted (the interruption), then its instance is gone. Karpenter does not
    evict the gang's karpenter.sh/do-not-disrupt pods at once; they go (at the latest at the spot pool's
    terminationGracePeriod), the Training Operator recreates them and Karpenter launches spot capacity again."""
    kubectl, path, before = _spot_job(sim, tmp_path, "vision-spot")
    node = next(iter(before.values()))
    try:
        kubectl.run("delete", "node", node, "--wait=false")
        _until(lambda: any(e["involvedObject"].get("name") == node and e.get("reason") == "FailedDraining"
                           for e in kubectl.items("events", namespace="default")), 60, "Karpenter waits to drain")
        assert set(p["metadata"]["uid"] for p in _job_pods(kubectl, "vision", "vision-spot")) == set(before)
        _instance_gone(kubectl, node)

        def restarted() -> bool:
            pods = _job_pods(kubectl, "vision", "vision-spot")
            return (len(pods) == len(before) and not set(p["metadata"]["uid"] for p in pods) & set(before)
                    and all(p["spec"].get("nodeName") and p["status"].get("phase") == "Running" for p in pods))

        took = _until(restarted, RUN, "the gang running again on new nodes")
        print(f"gang running again {took:.0f}s after the instance was gone")
        nodes = {n["metadata"]["name"] for n in kubectl.items("nodes")}
        assert node not in nodes
        job = kubectl.get("pytorchjobs.kubeflow.org", "vision-spot", CONFIG.team("vision").namespace)
        assert job_phase(job) not in ("Failed",), job["status"]
    finally:
        kubectl.run("delete", "-f", str(path), "--wait=false")


def test_spot_interruption_gives_the_gang_its_grace_period(sim, tmp_path):
    kubectl, path, before = _spot_job(sim, tmp_path, "vision-spot-grace")
    node = next(iter(before.values()))
    namespace = CONFIG.team("vision").namespace
    names = {p["metadata"]["name"] for p in _job_pods(kubectl, "vision", "vision-spot-grace")
             if p["metadata"]["uid"] in before and p["spec"].get("nodeName") == node}
    try:
        kubectl.run("delete", "node", node, "--wait=false")

        granted: list[int] = []

        def deleted_gracefully() -> bool:
            # kwok removes a deleted pod at once, so what stays is Karpenter's event on it (kubernetes-sigs/karpenter
            # v1.14.1 pkg/controllers/node/termination/terminator/events DisruptPodDelete)
            granted[:] = [int(GRANTED.search(e["message"])[1]) for e in kubectl.items("events", namespace=namespace)
                          if e["involvedObject"].get("name") in names and e.get("reason") == "Disrupted"
                          and GRANTED.search(e.get("message", ""))]
            return len(granted) >= len(names)

        # the spot pool's terminationGracePeriod (120s) less the pods' (90s): Karpenter deletes them 30s in, with
        # what is left of the node's deadline as their grace (whole seconds, so 89 or 90)
        _until(deleted_gracefully, 90, "the gang's pods deleted with their grace period")
        assert min(granted) >= GRACE_PERIOD_SECONDS["spot"] - 2, granted
    finally:
        _instance_gone(kubectl, node)
        kubectl.run("delete", "-f", str(path), "--wait=false")


def test_teardown_drain_returns_only_once_karpenters_nodes_are_gone(sim, tmp_path, monkeypatch):
    """`env destroy`'s first step against a live Karpenter: with a gang's GPU nodes still up, drain_node_pools deletes
    the NodePools with a foreground cascade and returns only once no NodeClaim or Karpenter node is left, so
    `pulumi destroy` never races a node Karpenter relaunches. Runs last: it deletes the module cluster's NodePools."""
    kubectl = sim.kubectl()
    _until(lambda: not _gpu_nodes(kubectl), SETTLE, "no GPU node left by an earlier test")
    path = _rendered(tmp_path, "vision", "pytorchjob", name="vision-teardown")
    submit(sim, [path], RUN, print, until=("running",))
    assert _gpu_nodes(kubectl)
    kubectl.run("delete", "-f", str(path), "--wait=false")
    monkeypatch.setenv("PATH", f"{sim.kubectl_binary().parent}:{os.environ['PATH']}")
    said: list[str] = []
    drain_node_pools(sim.kubeconfig.read_text(), "sim", said.append, timeout=SETTLE + RUN)
    assert said == ["NodePools drained: no NodeClaim or Karpenter node left in cluster sim"]
    assert kubectl.items("nodepools.karpenter.sh") == []
    assert kubectl.items("nodeclaims.karpenter.sh") == []
    assert [n["metadata"]["name"] for n in kubectl.items("nodes", selector=LABEL_NODEPOOL)] == []
