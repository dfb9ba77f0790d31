"""`gpuyard sim replay` without a cluster: traces (read, generated, from a cluster's jobs), gangs rendered for the
replay, and the report computed from what the watches saw (sim/trace.py, sim/replay.py). The replay itself runs in
tests/test_sim_replay.py."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error, gpuyard
from gpuyard.infra.config import load_stack
from gpuyard.sim.kwok import ANNOTATION_RUNS_FOR, ANNOTATION_SERVES
from gpuyard.sim.nodes import SHAPES
from gpuyard.sim.replay import explain_failed, prepare
from gpuyard.sim.replay_report import ReplayJob, lives, percentile, summarize
from gpuyard.sim.watch import Holding, NodeLife, Seen, on_job
from gpuyard.sim.trace import Gang, TraceError, cluster_history, read_trace, synthetic_trace, write_trace

DEV = load_stack("dev")


def _trace(tmp_path, *lines: str):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("line, message", [
    ("{not json", "trace.jsonl:1: not JSON"),
    ('{"team": "vision", "kind": "rayjob", "duration_s": 60, "arrival_s": 0}', "trace.jsonl:1: kind"),
    ('{"team": "ops", "kind": "pytorchjob", "duration_s": 60, "arrival_s": 0}', "team 'ops' is not in stack 'dev'"),
    ('{"team": "vision", "kind": "pytorchjob", "duration_s": 0, "arrival_s": 0}', "duration_s"),
    ('{"team": "vision", "kind": "pytorchjob", "duration_s": 9, "arrival_s": 0, "colour": "red"}', "colour"),
])
def test_bad_trace_lines_are_named(tmp_path, line, message):
    with pytest.raises(TraceError, match=message):
        read_trace(_trace(tmp_path, '{"team": "nlp", "kind": "mpijob", "duration_s": 60, "arrival_s": 5}', line)
                   if message.startswith("team") else _trace(tmp_path, line), DEV)


def test_trace_round_trips_in_arrival_order(tmp_path):
    gangs = [Gang(team="nlp", kind="mpijob", duration_s=60, arrival_s=30),
             Gang(team="vision", kind="pytorchjob", nodes=2, gpus_per_node=4, duration_s=90, arrival_s=0)]
    read = read_trace(_trace(tmp_path, *write_trace(gangs).splitlines()), DEV)
    assert [g.arrival_s for g in read] == [0, 30] and read[0].gpus == 8


def test_synthetic_trace_is_reproducible_and_weighted():
    gangs = synthetic_trace(DEV, 600, hours=24, seed=7)
    assert gangs == synthetic_trace(DEV, 600, hours=24, seed=7) != synthetic_trace(DEV, 600, hours=24, seed=8)
    assert all(0 <= g.arrival_s <= 86400 for g in gangs)
    share = sum(g.team == "vision" for g in gangs) / len(gangs)  # vision weighs 2 of 3
    assert 0.6 < share < 0.73


def _kubeflow(kind: str, namespace: str, created: str, start: str, end: str, replicas: dict[str, int]) -> dict:
    def template(gpus: int) -> dict:
        return {"spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}}
    return {"kind": kind, "metadata": {"namespace": namespace, "creationTimestamp": created},
            "spec": {"pytorchReplicaSpecs": {name: {"replicas": n, "template": template(4)}
                                             for name, n in replicas.items()}},
            "status": {"startTime": start, "completionTime": end}}


def test_cluster_history_from_jobs():
    jobs = [
        _kubeflow("PyTorchJob", "team-vision", "2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z",
                  "2026-01-01T00:01:20Z", {"Master": 1, "Worker": 1}),
        {"kind": "Job", "metadata": {"namespace": "team-nlp", "creationTimestamp": "2026-01-01T00:00:00Z"},
         "spec": {"tasks": [{"replicas": 1, "template": {"spec": {"containers": [{"name": "m"}]}}},
                            {"replicas": 2, "template": {"spec": {"containers": [
                                {"name": "w", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}}]},
         "status": {"runningDuration": "1m30.5s"}},
        _kubeflow("PyTorchJob", "kube-system", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z",
                  "2026-01-01T00:01:00Z", {"Master": 1}),  # not a team's
        {"kind": "Job", "metadata": {"namespace": "team-nlp", "creationTimestamp": "2026-01-01T00:00:05Z"},
         "spec": {"tasks": []}, "status": {}},  # never ran
    ]
    [nlp, vision] = cluster_history(jobs, DEV, speed=2)
    assert (nlp.team, nlp.kind, nlp.nodes, nlp.gpus_per_node, nlp.duration_s, nlp.arrival_s) == (
        "nlp", "volcanojob", 2, 1, 181.0, 0)
    assert (vision.team, vision.kind, vision.nodes, vision.gpus_per_node, vision.duration_s, vision.arrival_s) == (
        "vision", "pytorchjob", 2, 4, 120.0, 20.0)


def test_prepare_renders_annotates_and_refuses_what_never_fits():
    gangs = [Gang(team="vision", kind="pytorchjob", nodes=2, gpus_per_node=1, duration_s=600, arrival_s=0),
             Gang(team="nlp", kind="volcanojob", nodes=4, gpus_per_node=4, duration_s=60, arrival_s=0)]
    ok, refused = prepare(DEV, gangs, speed=100, nodepools={})
    assert ok.manifest and ok.pods == 2 and not ok.refused
    annotations = ok.manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["annotations"]
    assert annotations[ANNOTATION_RUNS_FOR] == "6.000s"
    assert refused.manifest is None and "never fits" in refused.refused


@pytest.mark.parametrize(("kind", "ends", "serves"), [
    ("mpijob", ["Launcher"], ["Worker"]),
    ("volcanojob", ["mpimaster"], ["mpiworker"]),
    ("pytorchjob", ["Master", "Worker"], []),
])
def test_only_the_pods_that_end_by_themselves_carry_the_duration(kind, ends, serves):
    """An MPI launcher (mpirun) ends after the gang's duration; the workers' sshd serves until the operator ends the
    job and deletes them (sim/kwok.py serving_templates cites upstream). torchrun's pods all end by themselves."""
    [job] = prepare(DEV, [Gang(team="nlp", kind=kind, nodes=3, gpus_per_node=1, duration_s=600, arrival_s=0)],
                    speed=100, nodepools={})
    spec = job.manifest["spec"]
    replicas = spec.get("mpiReplicaSpecs") or spec.get("pytorchReplicaSpecs") or {
        task["name"]: task for task in spec["tasks"]}
    annotations = {name: replica["template"]["metadata"]["annotations"] for name, replica in replicas.items()}
    assert sorted(annotations) == sorted(ends + serves)
    for name in ends:
        assert annotations[name][ANNOTATION_RUNS_FOR] == "6.000s" and ANNOTATION_SERVES not in annotations[name]
    for name in serves:
        assert ANNOTATION_SERVES in annotations[name] and ANNOTATION_RUNS_FOR not in annotations[name]


def test_summarize_waits_costs_idle_and_utilization():
    """Two gangs of 2 one-GPU pods on two g6.xlarge (speed 10): vision's waits 1 s (10 s simulated) and runs 100 s;
    nlp's gang holds one GPU for 10 s before the second pod binds, then runs 50 s; one node lives 50 s longer,
    idle. nlp's third gang never runs and is explained."""
    price = SHAPES["g6.xlarge"].price
    node = {"nvidia.com/gpu": 1.0, "cpu": 3.9, "memory": 15e9}
    jobs = [ReplayJob("vision-0000", Gang(team="vision", kind="pytorchjob", duration_s=1000, arrival_s=0), pods=2,
                      applied_at=0.0),
            ReplayJob("nlp-0001", Gang(team="nlp", kind="pytorchjob", duration_s=500, arrival_s=0), pods=2,
                      applied_at=0.0),
            ReplayJob("nlp-0002", Gang(team="nlp", kind="pytorchjob", duration_s=500, arrival_s=0), pods=2,
                      applied_at=0.0, reason="queue nlp unschedulable")]
    seen = Seen(
        pods={"a": Holding("vision-0000", "n1", {"nvidia.com/gpu": 1.0}, 1, 101, True),
              "b": Holding("vision-0000", "n2", {"nvidia.com/gpu": 1.0}, 1, 101, True),
              "c": Holding("nlp-0001", "n1", {"nvidia.com/gpu": 1.0}, 101, 161, True),
              "d": Holding("nlp-0001", "n2", {"nvidia.com/gpu": 1.0}, 111, 161, True)},
        nodes={"n1": NodeLife("n1", "g6.xlarge", "on-demand", price, node, 0, 161),
               "n2": NodeLife("n2", "g6.xlarge", "on-demand", price, node, 0, None)},
        evicted={"nlp-0001": {"c"}},
        failed={"nlp-0001": "Failed"},
    )
    report = summarize(DEV, jobs, seen, end=211, speed=10)
    hours = 10 / 3600
    vision, nlp = report["teams"]["vision"], report["teams"]["nlp"]
    assert (vision["wait_p50_s"], nlp["wait_p50_s"]) == (10, 1110)
    assert (vision["admitted"], nlp["admitted"], nlp["explained"], report["unexplained"]) == (1, 1, 1, 0)
    assert vision["gpu_hours"] == round(200 * hours, 2) and nlp["idle_gpu_hours"] == round(10 * hours, 2)
    assert nlp["reclaim_evictions"] == 1 and nlp["gpu_utilization"] == round(1 - 10 / 110, 4)
    assert (vision["failed"], nlp["failed"], report["failed"]) == (0, 1, 1)
    assert vision["cost_usd"] == round(200 * price * hours, 2)
    assert report["gpu_utilization"] == round(310 / (161 + 211), 4)
    assert report["idle_gpu_hours"] == round((161 + 211 - 310) * hours, 2)
    assert report["cost_usd"] == round((161 + 211) * price * hours, 2)
    assert [{k: v for k, v in e.items() if k != "seen"} for e in report["explanations"]] == [
        {"gang": "nlp-0002", "team": "nlp", "gpus": 1, "reason": "queue nlp unschedulable"}]


def test_a_gang_its_operator_failed_before_it_ran_whole_is_explained_by_the_failure():
    """Volcano restarted nlp-0000 after reclaim evictions until maxRetry and failed it, never whole; vision-0001
    failed after it ran whole (admitted, needs no explanation); nlp-0002 ended never whole without a failure: what
    the replay cannot tell stays unexplained."""
    gangs = [ReplayJob(f"{team}-{i:04d}", Gang(team=team, kind="volcanojob", duration_s=60, arrival_s=0), pods=2,
                       applied_at=0.0) for i, team in enumerate(("nlp", "vision", "nlp"))]
    seen = Seen(pods={"a": Holding("nlp-0000", "n1", {}, 1, 5), "b": Holding("vision-0001", "n1", {}, 1, 9),
                      "c": Holding("vision-0001", "n1", {}, 2, 9), "d": Holding("nlp-0002", "n1", {}, 1, 5, True)},
                evicted={"nlp-0000": {"a", "x"}}, failed={"nlp-0000": "Failed", "vision-0001": "Failed"})
    explain_failed(gangs, seen, end=20)
    assert [job.reason for job in gangs] == [
        "its operator ended it Failed before its 2 pods ran at once (2 reclaim evictions)", "", ""]
    report = summarize(DEV, gangs, seen, end=20, speed=1)
    assert (report["admitted"], report["explained"], report["unexplained"]) == (1, 1, 1)
    assert [e["seen"] for e in report["explanations"]] == [
        {"pods": 2, "held": 1, "most_at_once": 1, "succeeded": 0, "reclaim_evictions": 2,
         "lives": [["n1", 1, 5, False]]},
        {"pods": 2, "held": 1, "most_at_once": 1, "succeeded": 1, "reclaim_evictions": 0,
         "lives": [["n1", 1, 5, True]]}]


def test_lives_are_each_pods_node_start_end_and_success_in_cluster_seconds_from_the_apply_in_start_order():
    holdings = [Holding("nlp-0000", "n1", {}, 3.0), Holding("nlp-0000", "n2", {}, 2.0, 4.0, True)]
    assert lives(holdings, since=1.0, speed=10) == [["n2", 10, 30, True], ["n1", 20, None, False]]


def test_percentile_is_nearest_rank():
    assert percentile([], 0.5) is None
    assert (percentile([3, 1, 2], 0.5), percentile(list(range(1, 101)), 0.95)) == (2, 95)


def test_replay_bad_input(tmp_path):
    assert_one_line_error(gpuyard("sim", "replay", str(tmp_path / "missing.jsonl")), "missing.jsonl: no such file")
    trace = _trace(tmp_path, '{"team": "vision", "kind": "trainjob", "duration_s": 60, "arrival_s": 0}')
    assert_one_line_error(gpuyard("sim", "replay", str(trace)), "trace.jsonl:1: kind")
    assert_one_line_error(gpuyard("sim", "trace", "synthetic", "--shapes", "2x"), "--shapes 2x")


def test_synthetic_trace_command_is_json_lines():
    result = gpuyard("sim", "trace", "synthetic", "--stack", "dev", "--gangs", "5", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["team"] in ("vision", "nlp") for line in result.stdout.splitlines()] == [True] * 5


def test_kwok_completes_a_pod_after_the_duration_it_is_annotated_with(tmp_path):
    """The stage that completes training pods reads its delay from the pod's annotation, else ten seconds."""
    import shutil

    import yaml

    from gpuyard.sim.kwok import TRAINING_RUNS_MILLISECONDS, write_config

    if shutil.which("go") is None:
        pytest.skip("kwok's stages are read from its Go module: no `go` on PATH")
    stages = {s["metadata"]["name"]: s for s in yaml.safe_load_all(write_config(tmp_path / "kwok.yaml").read_text())}
    delay = stages["gpuyard-training-complete"]["spec"]["delay"]
    assert delay["durationMilliseconds"] == TRAINING_RUNS_MILLISECONDS
    assert delay["durationFrom"] == {"jq": {"expression": f'.metadata.annotations["{ANNOTATION_RUNS_FOR}"]'}}
    assert {"key": f'.metadata.annotations["{ANNOTATION_SERVES}"]', "operator": "DoesNotExist"} in (
        stages["gpuyard-training-complete"]["spec"]["selector"]["matchExpressions"])


@pytest.mark.parametrize(("job", "failed"), [
    ({"kind": "Job", "status": {"state": {"phase": "Failed"}, "retryCount": 3}}, "Failed"),
    ({"kind": "Job", "status": {"state": {"phase": "Restarting"}}}, None),
    ({"kind": "Job", "status": {"state": {"phase": "Completed"}}}, None),
    ({"kind": "PyTorchJob", "status": {"conditions": [{"type": "Running", "status": "False"},
                                                      {"type": "Failed", "status": "True"}]}}, "Failed"),
    ({"kind": "MPIJob", "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}, None),
    ({"kind": "MPIJob"}, None),
])
def test_a_job_its_operator_failed_counts_as_finished(job, failed):
    """A gang Volcano restarted maxRetry times (reclaim) ends Failed with no pod left: the replay stops waiting."""
    seen = Seen()
    on_job(seen, 1.0, "MODIFIED", {**job, "metadata": {"name": "nlp-0001"}})
    assert seen.failed.get("nlp-0001") == failed
