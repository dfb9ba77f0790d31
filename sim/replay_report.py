"""A replay's report, from what its watches saw (pure): per team and for the cluster, in the cluster's seconds
(wall x speed), GPU-hours and USD.

A gang waits from its arrival until all its pods hold their resources at once; GPU-hours held while fewer do
(a gang filling up or winding down) are idle. A node costs its offering's price for as long as it lives, shared by
the pods on it by their dominant resource (GPUs, CPU or memory, whichever share of the node is largest); what no pod
holds of a GPU node is idle cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpuyard.infra.config import StackConfig
from gpuyard.infra.conventions import GPU_RESOURCE
from gpuyard.sim.trace import Gang
from gpuyard.sim.watch import Holding, NodeLife, Seen


@dataclass
class ReplayJob:
    """A gang of the trace as applied: its manifest and what was seen of it."""

    name: str
    gang: Gang
    manifest: dict[str, Any] | None = None
    pods: int = 0  # pods of the whole gang
    refused: str = ""  # why it was never applied
    applied_at: float | None = None
    reason: str = ""  # why it was waiting when the replay ended


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


def _changes(holdings: list[Holding], end: float) -> list[tuple[float, int, Holding]]:
    """(moment, +1 or -1, holding) for each start and end (``end`` for one still held), in time order, an end before
    a start at the same moment."""
    return sorted([(h.start, 1, h) for h in holdings] + [(h.end if h.end is not None else end, -1, h)
                                                          for h in holdings], key=lambda c: (c[0], c[1]))


def gang_whole(holdings: list[Holding], gang: int, end: float) -> tuple[float | None, float]:
    """(first time all ``gang`` pods held at once, GPU-seconds held while fewer did)."""
    count, gpus, last, first, idle = 0, 0.0, 0.0, None, 0.0
    for moment, step, holding in _changes(holdings, end):
        if count < gang:
            idle += gpus * (moment - last)
        count += step
        gpus += step * holding.requests.get(GPU_RESOURCE, 0.0)
        last = moment
        if count >= gang and first is None:
            first = moment
    return first, idle


def most_at_once(holdings: list[Holding], end: float) -> int:
    """The most of ``holdings`` held at one moment."""
    count = most = 0
    for _, step, _ in _changes(holdings, end):
        count += step
        most = max(most, count)
    return most


def lives(holdings: list[Holding], since: float, speed: float) -> list[list]:
    """Each pod's [node, start, end (None: still held), succeeded], in the cluster's seconds from ``since``, in the
    order they started."""
    return [[h.node, round((h.start - since) * speed),
             None if h.end is None else round((h.end - since) * speed), h.succeeded]
            for h in sorted(holdings, key=lambda h: h.start)]


def _dominant_share(holding: Holding, node: NodeLife | None) -> float:
    if node is None:
        return 0.0
    shares = [value / node.allocatable[name] for name, value in holding.requests.items()
              if node.allocatable.get(name)]
    return min(max(shares, default=0.0), 1.0)


def summarize(config: StackConfig, jobs: list[ReplayJob], seen: Seen, end: float, speed: float) -> dict[str, Any]:
    """The replay's report: per team and for the cluster, in the cluster's seconds, GPU-hours and USD."""
    hours = speed / 3600  # wall seconds -> cluster hours
    by_job: dict[str, list[Holding]] = {}
    for holding in seen.pods.values():
        by_job.setdefault(holding.job, []).append(holding)
    teams = {team.name: {"gangs": 0, "admitted": 0, "explained": 0, "failed": 0, "waits": [],
                         "reclaim_evictions": 0,
                         "gpu_hours": 0.0, "idle_gpu_hours": 0.0, "cost_usd": 0.0} for team in config.teams}
    explanations = []
    for job in jobs:
        team = teams[job.gang.team]
        team["gangs"] += 1
        holdings = by_job.get(job.name, [])
        admitted, idle = gang_whole(holdings, job.pods, end) if job.pods else (None, 0.0)
        team["idle_gpu_hours"] += idle * hours
        evictions = len(seen.evicted.get(job.name, ()))
        team["reclaim_evictions"] += evictions
        team["failed"] += job.name in seen.failed
        for holding in holdings:
            held = (holding.end if holding.end is not None else end) - holding.start
            team["gpu_hours"] += holding.requests.get(GPU_RESOURCE, 0.0) * held * hours
            node = seen.nodes.get(holding.node)
            team["cost_usd"] += (node.price if node else 0.0) * _dominant_share(holding, node) * held * hours
        if admitted is not None and job.applied_at is not None:
            team["admitted"] += 1
            team["waits"].append(max(admitted - job.applied_at, 0.0) * speed)
        else:
            team["explained"] += bool(job.refused or job.reason)
            explanations.append({"gang": job.name, "team": job.gang.team, "gpus": job.gang.gpus,
                                 "reason": job.refused or job.reason or None,
                                 # what the watches saw of it, so that a gang left unexplained can be looked into
                                 "seen": {"pods": job.pods, "held": len(holdings),
                                          "most_at_once": most_at_once(holdings, end),
                                          "succeeded": sum(h.succeeded for h in holdings),
                                          "reclaim_evictions": evictions,
                                          "lives": lives(holdings, job.applied_at or 0.0, speed)}})
    gpu_node_seconds = node_cost = idle_cost = 0.0
    held_on: dict[str, float] = {}
    for holding in seen.pods.values():
        held_on[holding.node] = held_on.get(holding.node, 0.0) + holding.requests.get(GPU_RESOURCE, 0.0) * (
            (holding.end if holding.end is not None else end) - holding.start)
    for node in seen.nodes.values():
        alive = (node.end if node.end is not None else end) - node.start
        gpus = node.allocatable.get(GPU_RESOURCE, 0.0)
        node_cost += node.price * alive * hours
        if gpus:
            gpu_node_seconds += gpus * alive
            idle_cost += node.price * max(gpus * alive - held_on.get(node.name, 0.0), 0.0) / gpus * hours
    held = sum(held_on.values())
    report = {
        "stack": config.stack, "speed": speed, "gangs": len(jobs),
        "admitted": sum(t["admitted"] for t in teams.values()),
        "explained": sum(t["explained"] for t in teams.values()),
        "unexplained": sum(1 for e in explanations if not e["reason"]),
        "simulated_s": round(end * speed), "wall_s": round(end, 1),
        "gpu_utilization": round(held / gpu_node_seconds, 4) if gpu_node_seconds else None,
        "gpu_hours": round(held * hours, 2), "idle_gpu_hours": round((gpu_node_seconds - held) * hours, 2),
        "cost_usd": round(node_cost, 2), "idle_gpu_cost_usd": round(idle_cost, 2),
        "reclaim_evictions": sum(t["reclaim_evictions"] for t in teams.values()),
        "failed": sum(t["failed"] for t in teams.values()),
        "teams": {},
        "explanations": explanations,
    }
    for name, team in teams.items():
        waits = team.pop("waits")
        report["teams"][name] = {
            **{k: round(v, 2) if isinstance(v, float) else v for k, v in team.items()},
            "wait_p50_s": _rounded(percentile(waits, 0.5)), "wait_p95_s": _rounded(percentile(waits, 0.95)),
            "wait_mean_s": _rounded(sum(waits) / len(waits) if waits else None),
            "gpu_utilization": round(1 - team["idle_gpu_hours"] / team["gpu_hours"], 4) if team["gpu_hours"] else None,
        }
    return report


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value)
