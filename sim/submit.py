"""`gpuyard sim submit`: server-side apply job manifests, then follow each job through Volcano to a running gang, or,
on a cluster with real nodes (``--real-nodes``), to its end.

What is followed is what the real components report: the job's PodGroup (phase, queue, conditions), its pods
(bound to a node, phase, what the kubelet says of their containers) and the job's own status, plus Warning events;
a failure is reported with the message the component wrote (a webhook's denial, Volcano's unschedulable reason, the
quota admission's refusal, an image pull, a container's exit code, OOM kill and last lines).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from gpuyard.sim import preflight
from gpuyard.sim.kube import Kubectl, KubectlError

POLL_SECONDS = 0.5
LABEL_JOB = "gpuyard.io/job"
LABEL_COMPONENT = "app.kubernetes.io/component"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"  # Volcano names each pod's PodGroup here
# kind -> kubectl resource name of the job kinds gpuyard renders
JOB_RESOURCES = {
    "PyTorchJob": "pytorchjobs.kubeflow.org", "MPIJob": "mpijobs.kubeflow.org", "RayJob": "rayjobs.ray.io",
    "Job": "jobs.batch.volcano.sh", "TrainJob": "trainjobs.trainer.kubeflow.org",
}
# The operators' "done" phases. On this cluster they follow kwok's stand-in containers, which exit 0 after a delay
# (sim/kwok.py) and run nothing, or the stand-in Ray heads' STOPPED (sim/ray_head.py): a job reaching one says its
# operator completed it, never that it trained, so it is reported as KWOK_COMPLETED, not as a success.
ENDED = ("Succeeded", "Completed", "Complete", "SUCCEEDED", "STOPPED")
FAILED = ("Failed", "Aborted", "Terminated", "FAILED")
KWOK_COMPLETED = "kwok-completed"
# A job that ended on real nodes (gpuyard sim up --real-nodes): its operator saw its containers exit 0 there.
SUCCEEDED = "succeeded"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"  # on every kwok node (sim/nodes.py), never on a real one
LOG_LINES = 8  # a failed container's last lines in a failure's report


class SubmitFailed(RuntimeError):
    """The job was refused or did not reach a running gang; the message is the components' reason."""


def job_phase(job: dict[str, Any]) -> str:
    """The phase a job's operator reports, whatever its kind."""
    status = job.get("status") or {}
    if "state" in status:  # Volcano Job
        return status["state"].get("phase", "")
    if "jobDeploymentStatus" in status:  # RayJob
        return status.get("jobStatus") or status["jobDeploymentStatus"]
    true = [c["type"] for c in status.get("conditions", []) if c.get("status") == "True"]
    return true[-1] if true else ""


@dataclass
class Watch:
    """One submitted job and what was last said about it."""

    kind: str
    name: str
    namespace: str
    said: set[str] = field(default_factory=set)
    reason: str = ""
    phases: list[str] = field(default_factory=list)  # the job's phases, in the order seen
    podgroups: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (queue, minMember)
    pods: set[str] = field(default_factory=set)  # every pod seen
    nodes: dict[str, str] = field(default_factory=dict)  # every pod seen bound -> the node it was bound to
    components: dict[str, str] = field(default_factory=dict)  # every pod seen -> its app.kubernetes.io/component
    outcome: str = ""
    real_nodes: frozenset[str] = frozenset()  # the cluster's nodes that run containers (none: kwok's only)
    tails: dict[str, str] = field(default_factory=dict)  # an ended container (pod uid/container/end) -> its last lines

    @property
    def bound(self) -> set[str]:
        """Every pod seen bound to a node."""
        return set(self.nodes)

    def say_once(self, line: str, say: Callable[[str], None]) -> None:
        if line not in self.said:
            self.said.add(line)
            say(line)


def _jobs(files: list[Path]) -> list[Watch]:
    watches = []
    for path in files:
        for manifest in yaml.safe_load_all(path.read_text()):
            if manifest and manifest.get("kind") in JOB_RESOURCES and "/" in manifest.get("apiVersion", ""):
                if manifest["kind"] == "Job" and not manifest["apiVersion"].startswith("batch.volcano.sh/"):
                    continue
                meta = manifest["metadata"]
                watches.append(Watch(manifest["kind"], meta["name"], meta.get("namespace", "default")))
    return watches


def _warnings(events: list[dict], kind: str, name: str) -> list[str]:
    """The job's latest Warning event per reason (its operator's failures to create pods: quota, admission)."""
    latest: dict[str, str] = {}
    for event in events:
        involved = event["involvedObject"]
        if event.get("type") == "Warning" and involved.get("kind") == kind and involved.get("name") == name:
            latest[event.get("reason", "")] = f"{kind} {name}: {event.get('reason')}: {event.get('message', '').strip()}"
    return list(latest.values())


def real_nodes(kubectl: Kubectl) -> set[str]:
    """The cluster's nodes that run containers: every node kwok does not manage."""
    return {node["metadata"]["name"] for node in kubectl.items("nodes")
            if KWOK_NODE_ANNOTATION not in node["metadata"].get("annotations", {})}


def container_reasons(kubectl: Kubectl, pods: list[dict], namespace: str, tails: dict[str, str]) -> list[str]:
    """What the kubelet says of the pods' containers that do not run as they should: waiting for a reason other
    than starting (an image pull, a crash loop, a bad config), or ended with a non-zero code (with its reason, OOMKilled
    included, and the container's last lines, read once per ended container into ``tails``)."""
    reasons = []
    for pod in pods:
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        for container in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
            state = container.get("state") or {}
            waiting, ended = state.get("waiting") or {}, state.get("terminated") or {}
            if waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
                reasons.append(f"pod {name} container {container['name']}: {waiting['reason']}: "
                               f"{waiting.get('message', '').strip()}")
            if ended.get("exitCode", 0) != 0:
                key = f"{pod['metadata']['uid']}/{container['name']}/{ended.get('finishedAt')}"
                if key not in tails:
                    try:
                        tails[key] = kubectl.run("logs", name, "-n", namespace, "-c", container["name"],
                                                 f"--tail={LOG_LINES}")
                    except KubectlError:  # not kept: asked again at the next look
                        pass
                tail = tails.get(key, "")
                reasons.append(f"pod {name} container {container['name']}: exit {ended['exitCode']} "
                               f"({ended.get('reason', '')})" + "".join(f"\n    {line}" for line in tail.splitlines()))
    return reasons


def check(kubectl: Kubectl, watch: Watch, say: Callable[[str], None]) -> str | None:
    """One look at the job: returns "running", SUCCEEDED or KWOK_COMPLETED when done, raises SubmitFailed on
    failure."""
    job = kubectl.get(JOB_RESOURCES[watch.kind], watch.name, watch.namespace)
    phase = job_phase(job)
    if phase and phase not in watch.phases:
        watch.phases.append(phase)
    if phase:
        watch.say_once(f"{watch.kind} {watch.namespace}/{watch.name}: {phase}", say)
    pods = kubectl.items("pods", namespace=watch.namespace, selector=f"{LABEL_JOB}={watch.name}")
    groups = {p["metadata"].get("annotations", {}).get(GROUP_ANNOTATION) for p in pods} - {None}
    uid = job["metadata"]["uid"]
    podgroups = [g for g in kubectl.items("podgroups.scheduling.volcano.sh", namespace=watch.namespace)
                 if g["metadata"]["name"] in groups or any(o.get("uid") == uid for o in g["metadata"].get("ownerReferences", []))]
    reasons = []
    for group in podgroups:
        spec, status = group["spec"], group.get("status") or {}
        watch.podgroups[group["metadata"]["name"]] = (spec.get("queue", "default"), spec.get("minMember", 1))
        watch.say_once(f"PodGroup {group['metadata']['name']}: {status.get('phase', 'Pending')} in queue "
                       f"{spec.get('queue', 'default')} (gang of {spec.get('minMember', 1)})", say)
        for condition in status.get("conditions", []):
            if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
                reasons.append(f"PodGroup {group['metadata']['name']} in queue {spec.get('queue', 'default')} "
                               f"unschedulable: {condition.get('message') or condition.get('reason')}")
    bound = [p for p in pods if p["spec"].get("nodeName")]
    watch.pods |= {p["metadata"]["name"] for p in pods}
    watch.components |= {p["metadata"]["name"]: p["metadata"].get("labels", {}).get(LABEL_COMPONENT, "") for p in pods}
    events = kubectl.items("events", namespace=watch.namespace)
    # a pod may bind, run and be deleted between two looks (a Volcano Job ends its workers when the master
    # completes): the scheduler's Scheduled event stays (volcano v1.14.1 pkg/scheduler/cache/cache.go, Bind)
    watch.nodes |= {p["metadata"]["name"]: p["spec"]["nodeName"] for p in bound}
    watch.nodes |= {e["involvedObject"]["name"]: e["message"].rsplit(" to ", 1)[-1] for e in events
                    if e.get("reason") == "Scheduled" and e["involvedObject"].get("kind") == "Pod"
                    and e["involvedObject"].get("name") in watch.pods}  # "Successfully assigned ns/pod to node"
    if pods:
        watch.say_once(f"pods bound: {len(bound)}/{len(pods)}", say)
    unscheduled: dict[str, list[str]] = {}
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions", []):
            if condition["type"] == "PodScheduled" and condition["status"] == "False" and condition.get("message"):
                unscheduled.setdefault(condition["message"], []).append(pod["metadata"]["name"])
    reasons += [f"pods {', '.join(names)}: {message}" for message, names in unscheduled.items()]
    reasons += _warnings(events, watch.kind, watch.name)
    reasons += container_reasons(kubectl, [p for p in bound if p["spec"]["nodeName"] in watch.real_nodes],
                                 watch.namespace, watch.tails)
    watch.reason = "; ".join(dict.fromkeys(reasons))
    if phase in FAILED:
        raise SubmitFailed(f"{watch.kind} {watch.namespace}/{watch.name} {phase}: {watch.reason or job.get('status')}")
    if phase in ENDED:
        ran = sorted(set(watch.nodes.values()) & watch.real_nodes)
        if ran:
            watch.say_once(f"{watch.kind} {watch.namespace}/{watch.name}: {phase}: its containers ran on real nodes "
                           f"({', '.join(ran)}) and its operator saw them succeed", say)
            return SUCCEEDED
        watch.say_once(f"{watch.kind} {watch.namespace}/{watch.name}: its operator completed it once kwok ended its "
                       "pods; no container ran, so whether it trains is not tested here", say)
        return KWOK_COMPLETED
    # Volcano's PodGroup is Running once minMember of its pods run: the gang (TrainJob has no Running condition)
    gang_running = podgroups and all((g.get("status") or {}).get("phase") in ("Running", "Completed") for g in podgroups)
    return "running" if gang_running and len(bound) == len(pods) else None


def submit(sim, files: list[Path], wait: float, say: Callable[[str], None],
           until: tuple[str, ...] | None = None, apply: bool = True) -> list[Watch]:
    """Apply ``files`` on the simulated cluster ``sim`` (unless ``apply`` is false: follow only) and follow every job
    in them until each is in ``until``; returns what was seen of each job. By default a job is followed until its
    gang runs (or kwok completed it), and on a cluster with real nodes until it ends: a gang running there is not yet
    an outcome."""
    kubectl = sim.kubectl()
    real = frozenset(real_nodes(kubectl))
    if until is None:
        until = (SUCCEEDED, KWOK_COMPLETED) if real else ("running", KWOK_COMPLETED)
    if apply:
        try:
            preflight.check_files(kubectl, files)
        except preflight.WontFit as error:
            raise SubmitFailed(f"not applied: {error}") from None
        try:
            say(kubectl.apply_files(files).strip())
        except KubectlError as error:
            raise SubmitFailed(f"admission denied: {error}") from None
    watches = [replace(watch, real_nodes=real) for watch in _jobs(files)]
    pending = list(watches)
    deadline = time.monotonic() + wait
    while pending:
        for watch in list(pending):
            outcome = check(kubectl, watch, say)
            if outcome in until:
                watch.outcome = outcome
                said = {"running": "gang running", SUCCEEDED: "succeeded on real nodes"}
                say(f"{watch.kind} {watch.namespace}/{watch.name}: "
                    + said.get(outcome, "gang ran, then kwok ended its pods"))
                pending.remove(watch)
        if pending and time.monotonic() > deadline:
            watch = pending[0]
            raise SubmitFailed(f"{watch.kind} {watch.namespace}/{watch.name} not running after {wait:.0f}s: "
                               f"{watch.reason or 'no reason reported'}")
        time.sleep(POLL_SECONDS if pending else 0)
    return watches
