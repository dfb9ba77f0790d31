"""What a replay sees of the simulated cluster: kubectl watches of pods, nodes and Volcano's evictions, folded into
who held what where and when (``Seen``), in seconds since the replay started (wall clock)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuyard.infra.conventions import LABEL_CAPACITY_TYPE, LABEL_JOB
from gpuyard.jobs.processes import stop_tree
from gpuyard.sim.kube import Kubectl
from gpuyard.sim.nodes import SHAPES
from gpuyard.sim.preflight import pod_requests, quantity
from gpuyard.sim.report import node_pool

RESTART_SECONDS = 0.2
TERMINAL = ("Succeeded", "Failed")


@dataclass
class Holding:
    """One pod (by uid) holding resources on a node from ``start`` until ``end`` (None: still holding)."""

    job: str
    node: str
    requests: dict[str, float]
    start: float
    end: float | None = None
    succeeded: bool = False


@dataclass
class NodeLife:
    name: str
    instance_type: str
    capacity_type: str
    price: float
    allocatable: dict[str, float]
    start: float
    end: float | None = None


@dataclass
class Seen:
    """Everything the watches saw, in seconds since the replay started (wall clock)."""

    pods: dict[str, Holding] = field(default_factory=dict)  # uid -> holding
    job_of_pod: dict[str, str] = field(default_factory=dict)  # pod name -> job
    live: dict[str, set[str]] = field(default_factory=dict)  # job -> uids of pods not yet ended
    succeeded: dict[str, int] = field(default_factory=dict)  # job -> pods that succeeded
    nodes: dict[str, NodeLife] = field(default_factory=dict)
    evicted: dict[str, set[str]] = field(default_factory=dict)  # job -> pods evicted by reclaim
    failed: dict[str, str] = field(default_factory=dict)  # job -> how its operator ended it: it runs no more pods
    lock: threading.Lock = field(default_factory=threading.Lock)


def on_pod(seen: Seen, now: float, kind: str, pod: dict[str, Any]) -> None:
    """A pod event: holding starts when it is bound and not finished, ends when it finishes or is deleted."""
    meta = pod["metadata"]
    job = meta.get("labels", {}).get(LABEL_JOB)
    if not job:
        return
    uid, phase, node = meta["uid"], (pod.get("status") or {}).get("phase", ""), pod["spec"].get("nodeName", "")
    with seen.lock:
        seen.job_of_pod[meta["name"]] = job
        live = seen.live.setdefault(job, set())
        holding = seen.pods.get(uid)
        ended = kind == "DELETED" or phase in TERMINAL
        if not ended:
            live.add(uid)
        if holding is None and node and not ended:
            seen.pods[uid] = Holding(job, node, pod_requests(pod["spec"]), now)
        elif holding is not None and ended and holding.end is None:
            holding.end, holding.succeeded = now, phase == "Succeeded"
            seen.succeeded[job] = seen.succeeded.get(job, 0) + int(holding.succeeded)
        if ended:
            live.discard(uid)


def on_node(seen: Seen, now: float, kind: str, node: dict[str, Any]) -> None:
    meta = node["metadata"]
    with seen.lock:
        life = seen.nodes.get(meta["name"])
        if kind == "DELETED":
            if life is not None and life.end is None:
                life.end = now
            return
        if life is not None:
            return
        labels = meta.get("labels", {})
        instance_type = labels.get("node.kubernetes.io/instance-type", "")
        shape = SHAPES.get(instance_type)
        allocatable = {k: quantity(v) for k, v in (node.get("status") or {}).get("allocatable", {}).items()}
        seen.nodes[meta["name"]] = NodeLife(meta["name"], instance_type, node_pool(node)[1] or
                                            labels.get(LABEL_CAPACITY_TYPE, ""), shape.price if shape else 0.0,
                                            allocatable, now)


# A job its operator gave up on: a Volcano Job's terminal phases but Completed (volcano.sh/apis v1.14 pkg/apis/batch/
# v1alpha1/job.go JobPhase; a gang restarted maxRetry times after reclaim evictions ends Failed), a Kubeflow job's
# Failed condition (kubeflow/training-operator v1.9.4 pkg/apis/kubeflow.org/v1/common_types.go JobFailed; MPI Operator
# v0.8.0 pkg/apis/kubeflow/v2beta1/types.go JobFailed).
VOLCANO_FAILED = ("Failed", "Aborted", "Terminated")


def on_job(seen: Seen, now: float, kind: str, job: dict[str, Any]) -> None:
    status = job.get("status") or {}
    phase = (status.get("state") or {}).get("phase")
    failed = phase if phase in VOLCANO_FAILED else next(
        ("Failed" for c in status.get("conditions") or [] if c.get("type") == "Failed" and c.get("status") == "True"),
        None)
    if failed and kind != "DELETED":
        with seen.lock:
            seen.failed[job["metadata"]["name"]] = failed


def on_event(seen: Seen, now: float, kind: str, event: dict[str, Any]) -> None:
    """Volcano's eviction of a pod for another queue (volcano v1.14.1 pkg/scheduler/cache/cache.go Evict:
    reason Evict, "Pod is evicted, because of reclaim")."""
    involved = event.get("involvedObject", {})
    if event.get("reason") != "Evict" or "reclaim" not in event.get("message", "") or involved.get("kind") != "Pod":
        return
    with seen.lock:
        job = seen.job_of_pod.get(involved.get("name", ""))
        if job:
            seen.evicted.setdefault(job, set()).add(involved["name"])


class Watch(threading.Thread):
    """``kubectl get RESOURCE -A --watch --output-watch-events -o json``, each event handed to ``handle``; started
    again (listing every object anew) when the API server ends the watch (its --min-request-timeout)."""

    def __init__(self, kubectl: Kubectl, resource: str, handle: Callable[[float, str, dict], None], t0: float,
                 *selectors: str):
        super().__init__(daemon=True)
        self.command = [str(kubectl.binary), f"--kubeconfig={kubectl.kubeconfig}", "get", resource,
                        "--all-namespaces", "--watch", "--output-watch-events", "-o", "json", *selectors]
        self.handle, self.t0 = handle, t0
        self.stopped, self.lock = threading.Event(), threading.Lock()
        self.process = self._start()

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)

    def run(self) -> None:
        while not self.stopped.is_set():
            self._read(self.process)
            time.sleep(RESTART_SECONDS)
            with self.lock:
                if self.stopped.is_set():
                    return
                self.process = self._start()

    def _read(self, process: subprocess.Popen) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        for chunk in iter(process.stdout.readline, ""):
            buffer += chunk
            while True:
                stripped = buffer.lstrip()
                try:
                    event, end = decoder.raw_decode(stripped)
                except json.JSONDecodeError:
                    break
                buffer = stripped[end:]
                self.handle(time.monotonic() - self.t0, event.get("type", ""), event.get("object") or {})

    def stop(self) -> None:
        with self.lock:
            self.stopped.set()
            stop_tree(self.process, grace=2)
        self.join(timeout=5)
