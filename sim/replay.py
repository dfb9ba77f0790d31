"""`gpuyard sim replay`: a trace of gangs through the simulated cluster with Karpenter, time compressed.

Each gang is rendered as gpuyard renders it (``gpuyard.jobs.render``), placed (``gpuyard.jobs.placement``: a gang
the stack can never run is explained, not applied) and applied at its arrival divided by ``speed``; the pods that
end by themselves (torchrun's, an MPI launcher) carry their run time (duration / ``speed``) in the annotation kwok
completes them by, MPI workers serve until their operator ends the job, as on a real cluster (sim/kwok.py
serving_templates); an MPI launcher's time runs only while all its workers do, and it fails when they are lost more
often than it reruns mpirun (sim/mpi_launcher.py). A gang its operator failed before it ever ran whole is explained
by that failure. The stack's NodePools consolidate after their ``consolidateAfter`` / ``speed``. What happens is
read from kubectl watches of pods, nodes and Volcano's eviction events (sim/watch.py) and summed up per team
(sim/replay_report.py): waits, reclaim evictions, GPU-hours held and held idle, and cost, each node priced by its
instance type's offering (sim/nodes.py SHAPES, what the simulated Karpenter prices it at).
Times in the report are the cluster's (wall x speed).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from gpuyard.infra.config import StackConfig
from gpuyard.infra.karpenter import gpu_disruption
from gpuyard.jobs.duration import parse_duration
from gpuyard.jobs.placement import place, stack_pools
from gpuyard.jobs.render import render
from gpuyard.jobs.spec import SpecError, build_spec
from gpuyard.sim import preflight
from gpuyard.sim.kube import Kubectl, KubectlError
from gpuyard.sim.kwok import runs_for
from gpuyard.sim.mpi_launcher import Launchers
from gpuyard.sim.replay_report import ReplayJob, gang_whole, summarize
from gpuyard.sim.trace import Gang
from gpuyard.sim.watch import Seen, Watch, on_event, on_job, on_node, on_pod

POLL_SECONDS = 0.2
PLACEHOLDER_REGISTRY = "placeholder.invalid"  # nothing is pulled in the simulated cluster


def prepare(config: StackConfig, gangs: list[Gang], speed: float, nodepools: dict[str, dict]) -> list[ReplayJob]:
    """Every gang rendered and annotated, or refused with the reason the stack (or its NodePools) gives."""
    if not config.image_registry:
        config = config.model_copy(update={"image_registry": f"{PLACEHOLDER_REGISTRY}/{config.cluster_name}"})
    pools = stack_pools(config)
    jobs = []
    for index, gang in enumerate(gangs):
        job = ReplayJob(f"{gang.team}-{index:04d}", gang)
        jobs.append(job)
        try:
            spec = place(config, build_spec(
                config, config.team(gang.team), gang.kind, name=job.name, nodes=gang.nodes,
                gpus_per_node=gang.gpus_per_node, capacity_type=gang.capacity_type, node_pool=gang.node_pool,
                efa_devices=gang.efa), pools)
            manifest = runs_for(render(spec, config.team(gang.team)), f"{gang.duration_s / speed:.3f}s")
            preflight.check([manifest], nodepools)
        except (SpecError, preflight.WontFit) as error:
            job.refused = str(error)
            continue
        job.manifest = manifest
        job.pods = sum(count for count, _, _ in preflight.pod_sets(manifest))
    return jobs


def consolidation(speed: float) -> str:
    """The GPU NodePools' consolidateAfter, compressed like the trace (at least a second)."""
    stack_value = parse_duration(gpu_disruption()["consolidateAfter"]).total_seconds()
    return f"{max(stack_value / speed, 1):.0f}s"


JOB_RESOURCES = ("pytorchjobs.kubeflow.org", "mpijobs.kubeflow.org", "jobs.batch.volcano.sh")  # trace.REPLAYED_KINDS


def _finished(seen: Seen, job: ReplayJob) -> bool:
    """Every pod ended, and some succeeded or the operator failed the job (it starts no more)."""
    with seen.lock:
        return bool(seen.succeeded.get(job.name) or job.name in seen.failed) and not seen.live.get(job.name)


def run(sim, config: StackConfig, gangs: list[Gang], speed: float, say: Callable[[str], None],
        max_wall_s: float | None = None) -> dict[str, Any]:
    """Replay ``gangs`` on the running simulated cluster ``sim`` (with Karpenter); returns ``summarize``'s report."""
    kubectl = sim.kubectl()
    jobs = prepare(config, gangs, speed, preflight.live_nodepools(kubectl))
    pending = sorted((j for j in jobs if j.manifest), key=lambda j: j.gang.arrival_s)
    say(f"replay {config.stack}: {len(pending)} gangs to apply, {len(jobs) - len(pending)} refused; "
        f"speed {speed:g}x")
    span = max((g.arrival_s + g.duration_s for g in gangs), default=0) / speed
    deadline = max_wall_s if max_wall_s is not None else 3 * span + 300
    seen, t0 = Seen(), time.monotonic()
    launchers = Launchers(kubectl, {j.name: j.gang.nodes for j in pending if j.manifest["kind"] == "MPIJob"})

    def pod_event(now: float, kind: str, pod: dict) -> None:
        on_pod(seen, now, kind, pod)
        launchers.on_pod(now, kind, pod)

    watches = [Watch(kubectl, "pods", pod_event, t0),
               Watch(kubectl, "nodes", lambda t, k, o: on_node(seen, t, k, o), t0),
               Watch(kubectl, "events", lambda t, k, o: on_event(seen, t, k, o), t0, "--field-selector=reason=Evict"),
               *(Watch(kubectl, resource, lambda t, k, o: on_job(seen, t, k, o), t0) for resource in JOB_RESOURCES)]
    for watch in watches:
        watch.start()
    try:
        applied: list[ReplayJob] = []
        while True:
            now = time.monotonic() - t0
            due = [j for j in pending if j.gang.arrival_s / speed <= now]
            if due:
                for job in due:
                    pending.remove(job)
                applied += _apply(kubectl, due, now)
            launchers.tick(now)
            open_jobs = [j for j in applied if not _finished(seen, j)]
            if not pending and not open_jobs or now > deadline:
                break
            time.sleep(POLL_SECONDS)
        end = time.monotonic() - t0
        _explain_waiting(kubectl, open_jobs, seen, end)
        explain_failed(applied, seen, end)
    finally:
        for watch in watches:
            watch.stop()
    say(f"replay {config.stack}: done in {end:.0f}s, {len(open_jobs)} gangs unfinished")
    return summarize(config, jobs, seen, end, speed)


def _apply(kubectl: Kubectl, jobs: list[ReplayJob], now: float) -> list[ReplayJob]:
    """Apply ``jobs`` in one call, or one by one when the API server refuses one (a quota, a webhook), which is then
    explained by the refusal; returns the jobs applied."""
    try:
        kubectl.apply(job.manifest for job in jobs)
    except KubectlError:
        for job in jobs:
            try:
                kubectl.apply([job.manifest])
            except KubectlError as error:
                job.refused = f"admission denied: {error}"
    for job in jobs:
        job.applied_at = None if job.refused else now
    return [job for job in jobs if not job.refused]


def _explain_waiting(kubectl: Kubectl, jobs: list[ReplayJob], seen: Seen, end: float) -> None:
    """Why each gang that never ran whole is waiting: what Volcano, the scheduler, Karpenter and the operator said
    (gpuyard.sim.submit.check)."""
    from gpuyard.sim.submit import SubmitFailed, Watch as Followed, check

    for job in jobs:
        with seen.lock:
            holdings = [h for h in seen.pods.values() if h.job == job.name]
        if gang_whole(holdings, job.pods, end)[0] is not None:
            job.reason = "still running when the replay ended"
            continue
        followed = Followed(job.manifest["kind"], job.name, job.manifest["metadata"]["namespace"])
        try:
            check(kubectl, followed, lambda _line: None)
        except SubmitFailed as error:
            job.reason = str(error)
            continue
        job.reason = followed.reason


def explain_failed(jobs: list[ReplayJob], seen: Seen, end: float) -> None:
    """A gang its operator failed before all its pods ever ran at once is explained by that failure."""
    for job in jobs:
        with seen.lock:
            failed = seen.failed.get(job.name)
            holdings = [h for h in seen.pods.values() if h.job == job.name]
            evicted = len(seen.evicted.get(job.name, ()))
        if failed and not job.reason and gang_whole(holdings, job.pods, end)[0] is None:
            job.reason = f"its operator ended it {failed} before its {job.pods} pods ran at once " \
                         f"({evicted} reclaim evictions)"
