"""A team that submits more gangs than its limit holds: every gang runs whole, one after another, and the team never
holds more GPUs than its limit (its Volcano queue's capability, infra/tenancy.py), on the simulated cluster with
Karpenter.

With the GPUs also in the namespace's ResourceQuota this deadlocked: Volcano (no ``enqueue`` action) moves every
PodGroup to Inqueue at once, the operators then create every gang's pods, Pending pods count against the quota, and
the quota refused the rest of gangs already half-created, so none of them could become whole."""

from __future__ import annotations

import shutil
import time

import pytest
import yaml

from gpuyard.infra.config import STACKS_DIR_ENV, load_stack, stacks_dir
from gpuyard.infra.conventions import GPU_RESOURCE
from gpuyard.sim.replay import consolidation, run
from gpuyard.sim.trace import Gang
from gpuyard.sim.watch import Seen, Watch, on_pod
from sim_running import running_sim

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim"),  # -n 2 --dist loadgroup: one cluster at a time (the MPI Operator holds port 8080)
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
]
TEAM = "nlp"
LIMIT = 4  # the team's GPUs, half the dev pool's 8: the team's limit binds, not the pool's
KINDS = ("pytorchjob", "mpijob", "volcanojob", "pytorchjob")  # three operators creating pods at once
GANG = 3  # pods of one GPU each: two gangs never fit the limit together
RUNS_S = 8


def _stack(folder) -> None:
    """The dev stack with ``TEAM``'s GPUs limited to ``LIMIT``."""
    document = yaml.safe_load((stacks_dir() / "Pulumi.dev.yaml").read_text())
    for team in document["config"]["gpuyard:teams"]:
        if team["name"] == TEAM:
            team["gpu_quota"] = LIMIT
    (folder / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document))


def peak_gpus(seen: Seen) -> float:
    """The most GPUs the watched pods held at one moment."""
    changes = sorted([(h.start, h.requests.get(GPU_RESOURCE, 0.0)) for h in seen.pods.values()]
                     + [(h.end if h.end is not None else float("inf"), -h.requests.get(GPU_RESOURCE, 0.0))
                        for h in seen.pods.values()])
    held, peak = 0.0, 0.0
    for _, step in changes:  # at one moment an end (negative) sorts before a start
        held += step
        peak = max(peak, held)
    return peak


def test_gangs_beyond_the_teams_limit_wait_whole_and_all_run(tmp_path, monkeypatch):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    _stack(stacks)
    monkeypatch.setenv(STACKS_DIR_ENV, str(stacks))
    config = load_stack("dev")
    gangs = [Gang(team=TEAM, kind=kind, nodes=GANG, gpus_per_node=1, duration_s=RUNS_S, arrival_s=0) for kind in KINDS]
    namespace = config.team(TEAM).namespace
    with running_sim("dev", tmp_path / "state", karpenter=True, consolidate_after=consolidation(120)) as sim:
        kubectl = sim.kubectl()
        seen = Seen()
        watch = Watch(kubectl, "pods", lambda t, k, o: o["metadata"].get("namespace") == namespace and on_pod(
            seen, t, k, o), time.monotonic())
        watch.start()
        try:
            report = run(sim, config, gangs, 1.0, print, max_wall_s=300)
        finally:
            watch.stop()
        refusals = [e["message"] for e in kubectl.items("events", namespace=namespace)
                    if "exceeded quota" in e.get("message", "")]
    print({k: report[k] for k in ("admitted", "explained", "unexplained", "failed")}, report["explanations"])
    assert not refusals, refusals[:3]
    assert (report["admitted"], report["unexplained"], report["failed"]) == (len(KINDS), 0, 0), report["explanations"]
    assert GANG <= peak_gpus(seen) <= LIMIT
