"""A team's gpuyard jobs on any cluster (EKS or ``gpuyard sim``) through kubectl: find, describe, cancel, logs.

Every failure a user can act on is a ``ClusterError`` of one line: no kubeconfig, a cluster that cannot be
reached or lacks gpuyard's job CRDs, a team namespace that is not there or not the user's, no such job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuyard.infra.config import StackConfig, Team
from gpuyard.infra.conventions import LABEL_COMPONENT, LABEL_JOB, LABEL_MANAGED_BY, LABEL_TEAM, LAUNCH_RERUN, PART_OF
from gpuyard.sim.kube import Kubectl, KubectlError
from gpuyard.sim.queues import queue_state
from gpuyard.sim.submit import GROUP_ANNOTATION, JOB_RESOURCES, job_phase

DEFAULT_KUBECONFIG = Path("~/.kube/config")
HINT = "EKS: pulumi stack output kubeconfig; simulated: gpuyard sim kubeconfig"
# The pod whose log holds every rank's output where one pod does (the launcher runs mpirun, the Ray submitter
# follows the driver); torchrun kinds print each node's ranks in that node's pod.
OUTPUT_COMPONENT = {"MPIJob": "launcher", "Job": "mpimaster", "RayJob": "submitter"}
NODE_COMPONENTS = ("master", "worker", "node")  # torchrun pods, master first (PyTorchJob, TrainJob)


UNREACHABLE = ("refused", "no such host", "Unable to connect", "i/o timeout", "certificate")


class ClusterError(RuntimeError):
    """What went wrong on the cluster, as one line a user can act on."""


def kubeconfig_path(given: Path | None) -> Path:
    """``--kubeconfig`` (or ``$KUBECONFIG``, one file), else kubectl's default file; none is a ClusterError."""
    if given is not None and os.pathsep in str(given):
        raise ClusterError(f"KUBECONFIG {given} lists several files: pass one with --kubeconfig FILE")
    path = given if given is not None else DEFAULT_KUBECONFIG.expanduser()
    if not path.is_file():
        where = f"--kubeconfig {given}: no such file" if given else "no kubeconfig: pass --kubeconfig FILE or set KUBECONFIG"
        raise ClusterError(f"{where} ({HINT})")
    return path


def kubectl_for(config: StackConfig, kubeconfig: Path) -> Kubectl:
    """kubectl from PATH, else the one ``gpuyard sim`` built for the stack."""
    from gpuyard.sim.cluster import Sim

    found = shutil.which("kubectl")
    binary = Path(found) if found else Sim(config.stack).kubectl_binary()
    if not binary.is_file():
        raise ClusterError("no kubectl on PATH (nor a gpuyard sim build): install kubectl")
    return Kubectl(binary, kubeconfig)


@dataclass(frozen=True)
class Jobs:
    """The jobs of one team on one cluster."""

    kubectl: Kubectl
    team: Team

    def _run(self, *args: str, timeout: float = 60) -> str:
        try:
            return self.kubectl.run(*args, timeout=timeout)
        except KubectlError as error:
            raise ClusterError(self._explain(str(error))) from None

    def _explain(self, message: str) -> str:
        """kubectl's last line (client-go logs its retries first), with what the user can do about it."""
        lines = [line for line in message.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else "kubectl failed"
        if "forbidden" in message.lower():
            return (f"not allowed in namespace {self.team.namespace} (team {self.team.name}): your identity is not "
                    f"a member of team {self.team.name} on this cluster ({last})")
        if any(sign in message for sign in UNREACHABLE):
            return f"cannot reach the cluster of {self.kubectl.kubeconfig}: {last}"
        return last

    def resources(self) -> list[str]:
        """The job kinds this cluster serves (kubectl resource names); none means it is no gpuyard cluster."""
        served = set(self._run("api-resources", "-o", "name").split())
        found = [resource for resource in JOB_RESOURCES.values() if resource in served]
        if not found:
            raise ClusterError(f"the cluster of {self.kubectl.kubeconfig} has none of gpuyard's job kinds (PyTorchJob, "
                               "MPIJob, RayJob, Volcano Job, TrainJob CRDs): deploy gpuyard's stack there first")
        if not self._run("get", "namespace", self.team.namespace, "--ignore-not-found", "-o", "name").strip():
            raise ClusterError(f"namespace {self.team.namespace} of team {self.team.name} is not on this cluster: "
                               "is it the stack's cluster?")
        return found

    def create(self, manifest: Path) -> str:
        return self._run("create", "-f", str(manifest)).strip()

    def all(self, name: str = "") -> list[dict[str, Any]]:
        """The team's jobs (made by gpuyard), oldest first; with ``name`` that job only."""
        selector = f"{LABEL_TEAM}={self.team.name}" + (f",{LABEL_JOB}={name}" if name else "")
        text = self._run("get", ",".join(self.resources()), "-n", self.team.namespace, "-l", selector, "-o", "json")
        items = json.loads(text).get("items", [])
        return sorted(items, key=lambda job: (job["metadata"].get("creationTimestamp", ""), job["metadata"]["name"]))

    def one(self, name: str) -> dict[str, Any]:
        found = self.all(name)
        if not found:
            raise ClusterError(f"no job {name!r} of team {self.team.name} in namespace {self.team.namespace} "
                               "(gpuyard list shows the team's jobs)")
        return found[0]

    def pods(self, name: str) -> list[dict[str, Any]]:
        text = self._run("get", "pods", "-n", self.team.namespace, "-l", f"{LABEL_JOB}={name}", "-o", "json")
        return sorted(json.loads(text).get("items", []), key=lambda pod: pod["metadata"]["name"])

    def describe(self, job: dict[str, Any]) -> dict[str, Any]:
        """Phase, gang (PodGroup phase, pods bound of the gang), queue and what it waits for, restarts."""
        name = job["metadata"]["name"]
        pods = self.pods(name)
        groups = {pod["metadata"].get("annotations", {}).get(GROUP_ANNOTATION) for pod in pods} - {None}
        uid = job["metadata"]["uid"]
        podgroups = [group for group in self.kubectl.items("podgroups.scheduling.volcano.sh",
                                                             namespace=self.team.namespace)
                     if group["metadata"]["name"] in groups
                     or any(owner.get("uid") == uid for owner in group["metadata"].get("ownerReferences", []))]
        gang = max(podgroups, key=lambda group: group["spec"].get("minMember", 1), default=None)
        waiting = []
        for pod in pods:
            for condition in (pod.get("status") or {}).get("conditions", []):
                if condition["type"] == "PodScheduled" and condition["status"] == "False" and condition.get("message"):
                    waiting.append(condition["message"])
        for group in podgroups:
            for condition in (group.get("status") or {}).get("conditions", []):
                if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
                    waiting.append(condition.get("message") or condition.get("reason", ""))
        return {
            "name": name, "kind": job["kind"], "phase": job_phase(job) or "Created",
            "queue": gang["spec"].get("queue", "") if gang else self.team.queue,
            "gang": {"podgroup": gang["metadata"]["name"], "phase": (gang.get("status") or {}).get("phase", "Pending"),
                     "min_member": gang["spec"].get("minMember", 1)} if gang else None,
            "pods": len(pods), "bound": sum(1 for pod in pods if pod["spec"].get("nodeName")),
            "restarts": self.restarts(job, pods) + sum(
                status.get("restartCount", 0) for pod in pods
                for status in (pod.get("status") or {}).get("containerStatuses", [])),
            "waiting": list(dict.fromkeys(waiting)),
            "ahead": self._ahead(gang),
        }

    def restarts(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        """How often the job's operator started it, or a part of it, again after a failure, as each kind records it:
        - PyTorchJob: the operator deletes a failed pod it will retry and records a ``PyTorchJobRestarting`` event
          "job NAME is restarting because TYPE replica(s) failed." (kubeflow/training-operator v1.9.4
          pkg/controller.v1/common/pod.go ReconcilePods); those events' counts are summed (a gang whose two pods both
          failed counts 2; events expire after an hour). Its status update records the same reason for any failed
          replica unless the policy is Never, a final exit code's too ("PyTorchJob NAME is restarting because N TYPE
          replica(s) failed.", pkg/controller.v1/pytorch/pytorchjob_controller.go UpdateJobStatus): not counted;
        - MPIJob: the launcher Job's failed pods (kubeflow/mpi-operator v0.8.0 pkg/controller/mpi_job_controller.go
          updateMPIJobStatus: ``launcherStatus.Failed = launcher.Status.Failed``), plus the launcher's own reruns of
          mpirun after a lost or stopped rank (gpuyard.jobs.workload.launch), which only its pod's log records;
        - Volcano Job: ``status.retryCount`` (volcano.sh/apis v1.14.0 pkg/apis/batch/v1alpha1/job.go), one a
          ``RestartJob`` (volcano.sh/volcano v1.14.1 pkg/controllers/job/state/running.go);
        - TrainJob: its JobSet's ``status.restarts`` (sigs.k8s.io/jobset v0.12.0 api/jobset/v1alpha2/
          jobset_types.go), the JobSet named after the TrainJob (kubeflow/trainer v2.3.0
          pkg/runtime/framework/plugins/jobset/jobset.go);
        - RayJob: ``status.failed`` (ray-project/kuberay v1.6.0 ray-operator/apis/ray/v1/rayjob_types.go); the Ray
          entry's reruns of the command (gpuyard.jobs.command.ray_entry) are in the driver's log only.
        """
        status, name = job.get("status") or {}, job["metadata"]["name"]
        if job["kind"] == "PyTorchJob":
            uid = job["metadata"]["uid"]
            restarted = f"job {name} is restarting because "
            return sum(event.get("count") or 1 for event in self.kubectl.items("events", namespace=self.team.namespace)
                       if event["involvedObject"].get("uid") == uid and event.get("reason") == "PyTorchJobRestarting"
                       and event.get("message", "").startswith(restarted))
        if job["kind"] == "MPIJob":
            return (status.get("replicaStatuses") or {}).get("Launcher", {}).get("failed", 0) + self._reruns(pods)
        if job["kind"] == "Job":
            return status.get("retryCount", 0)
        if job["kind"] == "TrainJob":
            try:
                jobset = self.kubectl.get("jobsets.jobset.x-k8s.io", name, self.team.namespace)
            except KubectlError:  # none yet (or no longer)
                return 0
            return (jobset.get("status") or {}).get("restarts", 0)
        return status.get("failed", 0)  # RayJob

    def _reruns(self, pods: list[dict[str, Any]]) -> int:
        """The launcher pods' reruns of mpirun, from their logs (none where the log cannot be read: a kwok node's)."""
        reruns = 0
        for pod in pods:
            if pod["metadata"].get("labels", {}).get(LABEL_COMPONENT) != "launcher":
                continue
            try:
                log = self.kubectl.run("logs", pod["metadata"]["name"], "-n", self.team.namespace)
            except KubectlError:
                continue
            reruns += log.count(LAUNCH_RERUN)
        return reruns

    def _ahead(self, gang: dict[str, Any] | None) -> int | None:
        """Gangs waiting in the queue before this one (None unless it waits)."""
        if gang is None or (gang.get("status") or {}).get("phase", "Pending") not in ("Pending", "Inqueue"):
            return None
        try:
            waiting = queue_state(self.kubectl, gang["spec"].get("queue", self.team.queue))["waiting"]
        except KubectlError:
            return None
        names = [entry["podgroup"] for entry in waiting]
        key = f"{self.team.namespace}/{gang['metadata']['name']}"
        return names.index(key) if key in names else None

    def cancel(self, job: dict[str, Any], wait: float) -> int:
        """Delete a job gpuyard made and wait (at most ``wait`` s) until it and its pods are gone; pods left."""
        name, labels = job["metadata"]["name"], job["metadata"].get("labels", {})
        if labels.get(LABEL_MANAGED_BY) != PART_OF:
            raise ClusterError(f"job {name} was not made by gpuyard (no {LABEL_MANAGED_BY}={PART_OF}): "
                               "gpuyard deletes only what it made")
        resource = JOB_RESOURCES[job["kind"]]
        self._run("delete", resource, name, "-n", self.team.namespace, "--wait=false")
        deadline = time.monotonic() + wait
        while True:
            left = len(self.pods(name)) + (1 if self.all(name) else 0)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(1)

    def logs(self, pod: str, follow: bool) -> Iterator[str]:
        """``kubectl logs`` of ``pod``, line by line as they come; kubectl is stopped if the reader stops."""
        command = [str(self.kubectl.binary), f"--kubeconfig={self.kubectl.kubeconfig}", "logs", pod,
                   "-n", self.team.namespace, *(["-f"] if follow else [])]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            yield from process.stdout
            error = process.stderr.read().strip()
            if process.wait():
                raise ClusterError(self._explain(error))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    def output_pods(self, job: dict[str, Any], rank: int | None) -> list[str]:
        """The pods whose logs hold the job's output (of ``rank``, where one pod holds it)."""
        pods = self.pods(job["metadata"]["name"])
        labels = {pod["metadata"]["name"]: pod["metadata"].get("labels", {}).get(LABEL_COMPONENT, "") for pod in pods}
        if job["kind"] in OUTPUT_COMPONENT:
            return [pod for pod, component in labels.items() if component == OUTPUT_COMPONENT[job["kind"]]]
        nodes = sorted((pod for pod, component in labels.items() if component in NODE_COMPONENTS),
                       key=lambda pod: (NODE_COMPONENTS.index(labels[pod]), _index(pod)))
        if rank is None:
            return nodes
        per_node = int(job["spec"].get("nprocPerNode") or job["spec"].get("trainer", {}).get("numProcPerNode") or 1)
        node = rank // per_node
        if node >= len(nodes):
            raise ClusterError(f"--rank {rank}: job {job['metadata']['name']} has {len(nodes)} node pod(s) of "
                               f"{per_node} rank(s) each")
        return [nodes[node]]


def _index(pod: str) -> tuple[int, ...]:
    """A pod's numbers in order (``job-node-0-10`` after ``job-node-0-9``)."""
    return tuple(int(number) for number in re.findall(r"[0-9]+", pod))
