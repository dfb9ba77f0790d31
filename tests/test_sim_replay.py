"""`gpuyard sim replay` on the simulated cluster with Karpenter: a weight change moves two teams' waits the way the
weights say (one command, two stacks); a replay's jobs read back as the cluster's own history; MPI workers serve
until their operator ends the job; `render --explain` reads a team's queue from the cluster.

Time runs at the wall clock's pace here (``--speed 1``, durations of seconds): the scheduling, not the compression,
is under test."""

from __future__ import annotations

import json
import shutil
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
