"""A team's Volcano queue as a cluster (or `gpuyard sim`) reports it: deserved, allocated, capability, and the
PodGroups waiting in it, oldest first (the order Volcano's gang and priority plugins break ties in).

Fields are Volcano's (volcano.sh/apis v1.14.0, pkg/apis/scheduling/v1beta1/types.go): ``Queue.spec.deserved`` and
``capability``, ``Queue.status.allocated`` (a ResourceList); ``PodGroup.spec.minResources`` (what the gang needs
to start), ``status.phase`` (Pending and Inqueue wait; Running and Completed do not).
"""

from __future__ import annotations

from typing import Any

from gpuyard.infra.conventions import GPU_RESOURCE
from gpuyard.sim.kube import Kubectl
from gpuyard.sim.preflight import quantity
from gpuyard.sim.report import everywhere

WAITING = ("Pending", "Inqueue")


def _gpus(resources: dict[str, Any] | None) -> float:
    return quantity((resources or {}).get(GPU_RESOURCE, 0))


def queue_summary(queue: dict[str, Any], podgroups: list[dict[str, Any]]) -> dict[str, Any]:
    """GPUs deserved, allocated and capped for ``queue``, and every PodGroup of it that waits, oldest first."""
    name = queue["metadata"]["name"]
    waiting = sorted(
        (g for g in podgroups
         if g["spec"].get("queue") == name and (g.get("status") or {}).get("phase", "Pending") in WAITING),
        key=lambda g: (g["metadata"].get("creationTimestamp", ""), g["metadata"]["name"]),
    )
    return {
        "queue": name,
        "state": (queue.get("status") or {}).get("state", ""),
        "deserved_gpus": _gpus(queue["spec"].get("deserved")),
        "capability_gpus": _gpus(queue["spec"].get("capability")),
        "allocated_gpus": _gpus((queue.get("status") or {}).get("allocated")),
        "waiting": [
            {"podgroup": f"{g['metadata']['namespace']}/{g['metadata']['name']}",
             "gpus": _gpus(g["spec"].get("minResources")), "since": g["metadata"].get("creationTimestamp", ""),
             "phase": (g.get("status") or {}).get("phase", "Pending")}
            for g in waiting
        ],
    }


def queue_state(kubectl: Kubectl, queue: str) -> dict[str, Any]:
    """``queue_summary`` of ``queue`` on the cluster ``kubectl`` talks to."""
    found = kubectl.get("queues.scheduling.volcano.sh", queue)
    return queue_summary(found, everywhere(kubectl, "podgroups.scheduling.volcano.sh"))


def describe_queue(state: dict[str, Any]) -> list[str]:
    lines = [f"  queue {state['queue']}: deserved {state['deserved_gpus']:g} GPUs, allocated "
             f"{state['allocated_gpus']:g}, capability {state['capability_gpus']:g}"]
    if not state["waiting"]:
        return lines + ["  waiting ahead: nothing"]
    lines.append(f"  waiting ahead: {len(state['waiting'])} gang(s), "
                 f"{sum(w['gpus'] for w in state['waiting']):g} GPUs")
    lines += [f"    {w['podgroup']} {w['gpus']:g} GPUs, {w['phase']} since {w['since']}" for w in state["waiting"]]
    return lines
