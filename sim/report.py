"""What `gpuyard sim status` shows of a running cluster: nodes by pool and capacity type, PodGroups by queue, and
why what waits is waiting (Volcano's PodGroup condition, the scheduler's pod condition, Karpenter's pod events)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from gpuyard.infra.conventions import LABEL_CAPACITY_TYPE, LABEL_NODEPOOL
from gpuyard.sim.kube import Kubectl

NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
NODEGROUP_CAPACITY_LABEL = "eks.amazonaws.com/capacityType"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"  # Volcano names each pod's PodGroup here


def everywhere(kubectl: Kubectl, resource: str) -> list[dict[str, Any]]:
    """Every object of ``resource`` in all namespaces."""
    return json.loads(kubectl.run("get", resource, "--all-namespaces", "-o", "json")).get("items", [])


def node_pool(node: dict[str, Any]) -> tuple[str, str]:
    """(pool, capacity type): the Karpenter NodePool or managed node group a node belongs to."""
    labels = node["metadata"].get("labels", {})
    if LABEL_NODEPOOL in labels:
        return labels[LABEL_NODEPOOL], labels.get(LABEL_CAPACITY_TYPE, "")
    return labels.get(NODEGROUP_LABEL, "-"), labels.get(NODEGROUP_CAPACITY_LABEL, "").lower().replace("_", "-")


def nodes_by_pool(nodes: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    """pool -> capacity type -> instance type -> node count."""
    counts: Counter[tuple[str, str, str]] = Counter(
        (*node_pool(node), node["metadata"].get("labels", {}).get("node.kubernetes.io/instance-type", "-"))
        for node in nodes
    )
    report: dict[str, dict[str, dict[str, int]]] = {}
    for (pool, capacity_type, instance_type), count in sorted(counts.items()):
        report.setdefault(pool, {}).setdefault(capacity_type, {})[instance_type] = count
    return report


def _pending_reasons(group: dict[str, Any], pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[str]:
    reasons = [
        f"volcano: {c.get('message') or c.get('reason')}" for c in (group.get("status") or {}).get("conditions", [])
        if c.get("type") == "Unschedulable" and c.get("status") == "True"
    ]
    pending = {p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")}
    latest: dict[str, dict[str, Any]] = {}
    for event in events:
        involved = event["involvedObject"]
        if event.get("type") == "Warning" and involved.get("kind") == "Pod" and involved.get("name") in pending:
            source = event.get("reportingComponent") or (event.get("source") or {}).get("component") or "?"
            latest[source] = event
    reasons += [f"{source}: {event.get('message', '').strip()}" for source, event in sorted(latest.items())]
    return list(dict.fromkeys(reasons))


def podgroups_by_queue(kubectl: Kubectl) -> dict[str, list[dict[str, Any]]]:
    """queue -> its PodGroups: namespace/name, phase, gang size, pods bound, and the reasons a pending one waits."""
    pods_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in everywhere(kubectl, "pods"):
        group = pod["metadata"].get("annotations", {}).get(GROUP_ANNOTATION)
        if group:
            pods_of.setdefault((pod["metadata"]["namespace"], group), []).append(pod)
    events = everywhere(kubectl, "events")
    report: dict[str, list[dict[str, Any]]] = {}
    for group in everywhere(kubectl, "podgroups.scheduling.volcano.sh"):
        meta, spec, status = group["metadata"], group["spec"], group.get("status") or {}
        pods = pods_of.get((meta["namespace"], meta["name"]), [])
        phase = status.get("phase", "Pending")
        entry = {
            "podgroup": f"{meta['namespace']}/{meta['name']}", "phase": phase, "min_member": spec.get("minMember", 1),
            "pods": len(pods), "bound": sum(1 for p in pods if p["spec"].get("nodeName")),
        }
        if phase not in ("Running", "Completed"):
            entry["pending_reasons"] = _pending_reasons(
                group, pods, [e for e in events if e["metadata"].get("namespace") == meta["namespace"]])
        report.setdefault(spec.get("queue", "default"), []).append(entry)
    return report


def cluster_report(kubectl: Kubectl) -> dict[str, Any]:
    return {"nodes": nodes_by_pool(everywhere(kubectl, "nodes")), "podgroups": podgroups_by_queue(kubectl)}
