"""`gpuyard sim replay` on the simulated cluster with Karpenter: a weight change moves two teams' waits the way the
weights say (one command, two stacks); a replay's jobs read back as the cluster's own history; MPI workers serve
until their operator ends the job; `render --explain` reads a team's queue from the cluster.

Time runs at the wall clock's pace here (``--speed 1``, durations of seconds): the scheduling, not the compression,
is under test."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
import yaml

from cli_helpers import gpuyard
from conftest import with_registry
from gpuyard.infra.config import STACKS_DIR_ENV, load_stack, stacks_dir
from gpuyard.sim.cluster import Sim
from gpuyard.sim.replay import consolidation, prepare, run
from gpuyard.sim.submit import submit
from gpuyard.sim.trace import Gang, cluster_history, write_trace

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim"),  # -n 2 --dist loadgroup: one cluster at a time (the MPI Operator holds port 8080)
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
]
BURST = 12  # one-GPU gangs per team, all at once, against the dev pool's 8 GPUs
RUNS_S = 20


def _weighted_stacks(folder, weights: dict[str, dict[str, int]]) -> None:
    """Copies of the dev stack named after ``weights``' keys, each with its teams' queue weights."""
    for name, by_team in weights.items():
        document = yaml.safe_load((stacks_dir() / "Pulumi.dev.yaml").read_text())
        for team in document["config"]["gpuyard:teams"]:
            team["queue_weight"] = by_team[team["name"]]
        (folder / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(document))


def test_a_weight_change_moves_the_waits_the_way_the_weights_say(tmp_path):
    """vision 2 : nlp 1, then 1 : 2. Each queue deserves its weighted share of the 8 GPUs (5 and 3, then 3 and 5);
    Volcano's capacity plugin gives a freed GPU to the queue furthest below its share, so the heavier team's burst
    drains first and waits less."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    _weighted_stacks(stacks, {"before": {"vision": 2, "nlp": 1}, "after": {"vision": 1, "nlp": 2}})
    trace = tmp_path / "burst.jsonl"
    trace.write_text(write_trace([
        Gang(team=team, kind="pytorchjob", nodes=1, gpus_per_node=1, duration_s=RUNS_S, arrival_s=i * 0.5)
        for i in range(BURST) for team in ("vision", "nlp")]))
    result = gpuyard("sim", "replay", str(trace), "--stack", "before", "--stack", "after", "--speed", "1", "--json",
                     env={STACKS_DIR_ENV: str(stacks)}, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = json.loads(result.stdout)
    print(json.dumps({s: {t: {k: v for k, v in r["teams"][t].items() if k.startswith("wait")} for t in r["teams"]}
                      for s, r in reports.items()}, indent=1))
    for report in reports.values():
        assert report["admitted"] == 2 * BURST, report
    before, after = reports["before"]["teams"], reports["after"]["teams"]
    # Within one stack's run, against arrival order (vision's gang arrives first each half second) in the second.
    # Not across runs: each stack gets a fresh cluster whose Karpenter nodes come up at the load's pace; one CI run
    # measured both teams' mean waits summing to 42 s on one cluster and 20 s on the other, vision's 12 s on both.
    assert before["vision"]["wait_mean_s"] < before["nlp"]["wait_mean_s"]
    assert after["nlp"]["wait_mean_s"] < after["vision"]["wait_mean_s"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    cluster = Sim("dev", tmp_path_factory.mktemp("sim") / "state", karpenter=True, consolidate_after=consolidation(120))
    cluster.up(print)
    yield cluster
    cluster.down()
    assert not cluster.state.exists()


def test_a_replays_jobs_read_back_as_the_clusters_history(sim):
    config = load_stack("dev")
    gangs = [Gang(team="vision", kind="pytorchjob", nodes=2, gpus_per_node=2, duration_s=15, arrival_s=0),
             Gang(team="nlp", kind="volcanojob", nodes=1, gpus_per_node=1, duration_s=25, arrival_s=5),
             Gang(team="nlp", kind="mpijob", nodes=2, gpus_per_node=1, duration_s=15, arrival_s=10),
             Gang(team="vision", kind="mpijob", nodes=4, gpus_per_node=4, duration_s=15, arrival_s=10)]
    report = run(sim, config, gangs, 1.0, print)
    assert (report["admitted"], report["explained"], report["unexplained"]) == (3, 1, 0), report
    [refused] = report["explanations"]
    assert refused["gang"] == "vision-0003" and "never fits" in refused["reason"]
    assert 0 < report["gpu_utilization"] <= 1 and report["cost_usd"] > 0
    result = gpuyard("sim", "trace", "history", "--stack", "dev", "--kubeconfig", str(sim.kubeconfig))
    assert result.returncode == 0, result.stderr
    read = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(g["team"], g["kind"], g["nodes"], g["gpus_per_node"]) for g in read] == [
        (g.team, g.kind, g.nodes, g.gpus_per_node) for g in gangs[:3]]
    for replayed, original in zip(read, gangs):
        assert original.duration_s - 2 <= replayed["duration_s"] <= original.duration_s + 15, read
    assert read[0]["arrival_s"] == 0 and read[1]["arrival_s"] < read[2]["arrival_s"]
    assert cluster_history([], config) == []


def test_mpi_workers_serve_until_their_operator_ends_the_job(sim):
    """Gangs of a second: the launcher (MPIJob) or master (Volcano Job) alone ends after it, and only once it runs;
    the workers' sshd serves until then, so the gang runs whole, and the operator then deletes the workers (MPI
    Operator: cleanPodPolicy Running; Volcano: CompleteJob). Were workers to end on their own, they would be gone
    before the MPIJob's launcher (created once they are ready) runs: a gang never whole, unexplained."""
    config = load_stack("dev")
    gangs = [Gang(team="nlp", kind="mpijob", nodes=2, gpus_per_node=1, duration_s=1, arrival_s=0),
             Gang(team="vision", kind="volcanojob", nodes=2, gpus_per_node=1, duration_s=1, arrival_s=0)]
    report = run(sim, config, gangs, 1.0, print, max_wall_s=300)
    assert (report["admitted"], report["unexplained"], report["failed"]) == (2, 0, 0), report
    for team, name in (("nlp", "nlp-0000"), ("vision", "vision-0001")):
        pods = sim.kubectl().items("pods", namespace=config.team(team).namespace, selector=f"gpuyard.io/job={name}")
        assert [pod["status"]["phase"] for pod in pods] == ["Succeeded"], [
            (pod["metadata"]["name"], pod["status"]["phase"]) for pod in pods]


def test_render_explain_reads_the_teams_queue(sim, tmp_path):
    """vision holds the whole pool (8 GPUs) with one gang; a second waits; the pre-flight of a third says so."""
    config = with_registry(load_stack("dev"))
    held, waiting = prepare(config, [Gang(team="vision", kind="volcanojob", nodes=2, gpus_per_node=4,
                                          duration_s=120, arrival_s=0)] * 2, 1.0, {})
    paths = []
    for job, name in ((held, "vision-holds"), (waiting, "vision-waits")):
        job.manifest["metadata"]["name"] = name
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(job.manifest))
        paths.append(path)
    kubectl = sim.kubectl()
    try:
        submit(sim, paths[:1], 240, print, until=("running",))
        kubectl.apply_files(paths[1:])
        time.sleep(5)
        result = gpuyard("render", "--stack", "dev", "--team", "vision", "--kind", "pytorchjob", "--nodes", "1",
                         "--gpus-per-node", "1", "--explain", "-o", "json", "--kubeconfig", str(sim.kubeconfig),
                         env={STACKS_DIR_ENV: str(stacks_dir())})
        assert result.returncode == 0, result.stderr
        state = json.loads(result.stdout)["queue_state"]
        assert (state["queue"], state["deserved_gpus"], state["allocated_gpus"]) == ("vision", 5, 8), state
        assert [w["podgroup"].split("/")[0] for w in state["waiting"]] == ["team-vision"], state
        assert state["waiting"][0]["gpus"] == 8 and "vision-waits" in state["waiting"][0]["podgroup"]
        text = gpuyard("render", "--stack", "dev", "--team", "vision", "--kind", "pytorchjob", "--nodes", "1",
                       "--gpus-per-node", "1", "--explain", "--kubeconfig", str(sim.kubeconfig)).stdout
        assert "queue vision: deserved 5 GPUs, allocated 8" in text and "waiting ahead: 1 gang(s), 8 GPUs" in text
    finally:
        kubectl.run("delete", "-f", str(paths[0]), "-f", str(paths[1]), "--wait=false")


def _pods(kubectl, namespace: str, job: str, component: str) -> list[dict]:
    selector = f"gpuyard.io/job={job},app.kubernetes.io/component={component}"
    return kubectl.items("pods", namespace=namespace, selector=selector)


def _running(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def _delete_workers(kubectl, namespace: str, job: str, times: int, away_s: float, seen: dict,
                    stop: threading.Event) -> None:
    """Once the launcher runs, delete worker 0 (as a reclaim or a drained node would), again each time the gang is whole
    again and the launcher still runs, ``times`` in all; with ``away_s`` the namespace admits no new pod for that long
    after a deletion (a ResourceQuota of 0 pods), so the operator cannot bring the worker back sooner. ``seen`` gets the
    launcher's first run and its end, each deletion's time and the time its gang was whole again."""
    whole_again, deleted = [], []
    seen.update(deleted=deleted, whole_again=whole_again)
    hold = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-new-pods", "namespace": namespace},
            "spec": {"hard": {"pods": "0"}}}
    while not stop.is_set():
        launchers = _pods(kubectl, namespace, job, "launcher")
        phases = {p["status"].get("phase") for p in launchers}
        now = time.monotonic()
        if "Running" in phases:
            seen.setdefault("launcher_running", now)
        if phases & {"Succeeded", "Failed"}:
            seen["launcher_ended"] = now
            return
        if away_s and deleted and now - deleted[-1] >= away_s:
            kubectl.run("delete", "resourcequota", "no-new-pods", "--namespace", namespace, "--ignore-not-found")
        workers = _running(_pods(kubectl, namespace, job, "worker"))
        if "Running" in phases and len(workers) == 2:
            if len(whole_again) < len(deleted):
                whole_again.append(now)
            if len(deleted) < times:
                if away_s:
                    kubectl.apply([hold])
                first = next(w for w in workers if w["metadata"]["name"].endswith("-worker-0"))
                kubectl.run("delete", "pod", first["metadata"]["name"], "--namespace", namespace, "--wait=false")
                deleted.append(time.monotonic())
        time.sleep(0.5)


def test_an_mpi_launcher_runs_only_while_its_whole_gang_does(sim):
    """A worker of a running MPIJob deleted through the API server: on a real cluster mpirun loses that node and
    ``launch`` reruns it once the operator's new worker answers, at most --restarts (3) times. Deleted once and kept
    away 10 s (no new pod admitted), the launcher runs its time out only after its gang is whole again, so it ends
    later by at least the time the gang was not whole; deleted four times, the launcher fails with mpirun's 205 and
    the MPI Operator fails the MPIJob. On kwok's timer alone both launchers had succeeded beside a partial gang."""
    config = load_stack("dev")
    gangs = [Gang(team="nlp", kind="mpijob", nodes=2, gpus_per_node=1, duration_s=30, arrival_s=0),
             Gang(team="vision", kind="mpijob", nodes=2, gpus_per_node=1, duration_s=60, arrival_s=0)]
    kubectl, stop = sim.kubectl(), threading.Event()
    for team in ("nlp", "vision"):  # the jobs of this module's other replays: the same names, and their pods with them
        kubectl.run("delete", "mpijobs,jobs.batch.volcano.sh,pytorchjobs", "--all", "--namespace",
                    config.team(team).namespace, "--cascade=foreground", "--wait=true", timeout=180)
    deadline, jobs = time.monotonic() + 120, (("nlp", "nlp-0000"), ("vision", "vision-0001"))
    while any(_pods(kubectl, config.team(team).namespace, name, component)
              for team, name in jobs for component in ("launcher", "worker")):
        assert time.monotonic() < deadline, "the module's earlier pods of the same jobs are still there"
        time.sleep(1)
    faults = {"nlp": {}, "vision": {}}
    threads = [threading.Thread(target=_delete_workers, args=(kubectl, config.team(team).namespace, name, times, away_s,
                                                              faults[team], stop), daemon=True)
               for team, name, times, away_s in (("nlp", "nlp-0000", 1, 10), ("vision", "vision-0001", 4, 0))]
    for thread in threads:
        thread.start()
    try:
        report = run(sim, config, gangs, 1.0, print, max_wall_s=400)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    print(json.dumps(faults, indent=1))
    assert (report["admitted"], report["unexplained"], report["failed"]) == (2, 0, 1), report
    nlp = faults["nlp"]
    assert len(nlp["deleted"]) == len(nlp["whole_again"]) == 1, nlp
    not_whole = nlp["whole_again"][0] - nlp["deleted"][0]
    assert not_whole >= 10, nlp
    assert nlp["launcher_ended"] - nlp["launcher_running"] >= 30 + not_whole - 2, nlp
    [launcher] = _pods(kubectl, config.team("nlp").namespace, "nlp-0000", "launcher")
    assert launcher["status"]["phase"] == "Succeeded"
    vision = faults["vision"]
    assert len(vision["deleted"]) == 4 and vision["launcher_ended"] - vision["launcher_running"] < 60, vision
    mpijob = kubectl.get("mpijobs", "vision-0001", namespace=config.team("vision").namespace)
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in mpijob["status"]["conditions"]), mpijob
    [launcher] = _pods(kubectl, config.team("vision").namespace, "vision-0001", "launcher")
    [state] = [c["state"]["terminated"] for c in launcher["status"]["containerStatuses"]]
    assert state["exitCode"] == 205 and "launch gave up after 3 reruns" in state["message"], state
