"""Traces of gangs for `gpuyard sim replay`: read from a file, generated, or taken from a cluster's own history.

A trace is JSON Lines, one gang a line: ``{"team", "kind", "nodes", "gpus_per_node", "duration_s", "arrival_s"}``
and optionally ``"capacity_type"``, ``"node_pool"``, ``"efa"``; seconds are the cluster's (a replay compresses
them). A cluster's history comes from its jobs (PyTorchJob, MPIJob, Volcano Job): created at, size from their pod
templates, how long they ran from their status.
"""

from __future__ import annotations

import json
import random
import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuyard.infra.config import StackConfig
from gpuyard.infra.conventions import GPU_RESOURCE
from gpuyard.infra.validation import validation_message
from gpuyard.sim.preflight import pod_sets

# Kinds kwok ends after the gang's duration (sim/kwok.py runs_for: the pods that end by themselves carry it, MPI
# workers serve until their operator ends the job); Ray's pods are servers that never end by themselves there and
# TrainJob's pods come from its runtime, which carries no per-job annotation.
REPLAYED_KINDS = ("pytorchjob", "mpijob", "volcanojob")
KIND_OF = {"PyTorchJob": "pytorchjob", "MPIJob": "mpijob", "Job": "volcanojob"}
JOB_RESOURCES = {"pytorchjob": "pytorchjobs.kubeflow.org", "mpijob": "mpijobs.kubeflow.org",
                 "volcanojob": "jobs.batch.volcano.sh"}


GO_DURATION = re.compile(r"([0-9.]+)(h|ms|m|s|us|µs|ns)")
GO_UNITS = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the line and the field."""


class Gang(BaseModel):
    """One gang of a trace."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    team: str
    kind: Literal[REPLAYED_KINDS]
    nodes: Annotated[int, Field(ge=1, le=10_000)] = 1
    gpus_per_node: Annotated[int, Field(ge=0, le=16)] = 1
    duration_s: Annotated[float, Field(gt=0, le=30 * 86400)]
    arrival_s: Annotated[float, Field(ge=0, le=365 * 86400)]
    capacity_type: Literal["on-demand", "spot"] = "on-demand"
    node_pool: str | None = None
    efa: Annotated[int, Field(ge=0, le=32)] | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def read_trace(path: Path, config: StackConfig) -> list[Gang]:
    """The gangs of a JSON Lines file, in arrival order; TraceError names the first bad line."""
    teams = {team.name for team in config.teams}
    gangs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            gang = Gang.model_validate(json.loads(line))
        except json.JSONDecodeError as error:
            raise TraceError(f"{path}:{number}: not JSON ({error.msg})") from None
        except ValidationError as error:
            raise TraceError(f"{path}:{number}: {validation_message(error)}") from None
        if gang.team not in teams:
            raise TraceError(f"{path}:{number}: team {gang.team!r} is not in stack {config.stack!r} "
                             f"(teams: {', '.join(sorted(teams))})")
        gangs.append(gang)
    if not gangs:
        raise TraceError(f"{path}: no gang in the trace")
    return sorted(gangs, key=lambda g: g.arrival_s)


def write_trace(gangs: list[Gang]) -> str:
    return "".join(gang.model_dump_json(exclude_none=True) + "\n" for gang in gangs)


def synthetic_trace(config: StackConfig, gangs: int, hours: float = 24, seed: int = 0,
                    shapes: tuple[tuple[int, int], ...] = ((1, 1), (1, 8), (2, 8), (4, 8)),
                    mean_duration_s: float = 2 * 3600, kinds: tuple[str, ...] = REPLAYED_KINDS) -> list[Gang]:
    """``gangs`` gangs arriving at random over ``hours`` (Poisson, a fixed ``seed``), teams drawn in proportion to
    their queue weights, shapes ``(nodes, gpus_per_node)`` and kinds uniformly, durations exponential around
    ``mean_duration_s`` (at least a quarter of it or 5 minutes, whichever is less; at most 12 hours or twice the
    mean, whichever is more). Shapes beyond a team's quota are kept: the replay explains why they never run."""
    draw = random.Random(seed)
    teams = list(config.teams)
    arrivals = sorted(draw.uniform(0, hours * 3600) for _ in range(gangs))
    found = []
    for arrival in arrivals:
        team = draw.choices(teams, weights=[t.queue_weight for t in teams])[0]
        nodes, gpus = draw.choice(shapes)
        duration = min(max(draw.expovariate(1 / mean_duration_s), min(300, mean_duration_s / 4)),
                       max(12 * 3600, 2 * mean_duration_s))
        found.append(Gang(team=team.name, kind=draw.choice(kinds), nodes=nodes, gpus_per_node=gpus,
                          duration_s=round(duration), arrival_s=round(arrival)))
    return found


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _ran_for(job: dict[str, Any]) -> float | None:
    """Seconds the job ran: Kubeflow's startTime..completionTime, Volcano's runningDuration."""
    status = job.get("status") or {}
    if status.get("startTime") and status.get("completionTime"):
        return _seconds(status["completionTime"]) - _seconds(status["startTime"])
    running = status.get("runningDuration")  # metav1.Duration: Go's time.Duration.String(), e.g. "1m30.5s"
    if running:
        return sum(float(number) * GO_UNITS[unit] for number, unit in GO_DURATION.findall(running))
    return None


def cluster_history(jobs: list[dict[str, Any]], config: StackConfig, speed: float = 1.0) -> list[Gang]:
    """A trace from the jobs of a cluster (gpuyard's kinds, in the stack's team namespaces, that have run): arrival
    at creation relative to the first, size from the GPU pod sets, duration from their status; times are
    multiplied by ``speed`` (a replay's compression, to read a simulated cluster's history at its own scale)."""
    team_of = {team.namespace: team.name for team in config.teams}
    found = []
    for job in jobs:
        kind = KIND_OF.get(job.get("kind", ""))
        namespace = job["metadata"].get("namespace", "")
        ran = _ran_for(job)
        if kind is None or namespace not in team_of or not ran:
            continue
        gpu_sets = [(count, requests) for count, requests, _ in pod_sets(job) if requests.get(GPU_RESOURCE)]
        if not gpu_sets:
            continue
        found.append((_seconds(job["metadata"]["creationTimestamp"]), Gang(
            team=team_of[namespace], kind=kind, nodes=sum(count for count, _ in gpu_sets),
            gpus_per_node=int(max(requests[GPU_RESOURCE] for _, requests in gpu_sets)),
            duration_s=round(ran * speed, 1), arrival_s=0)))
    if not found:
        return []
    start = min(created for created, _ in found)
    return sorted((gang.model_copy(update={"arrival_s": round((created - start) * speed, 1)})
                   for created, gang in found), key=lambda g: g.arrival_s)
