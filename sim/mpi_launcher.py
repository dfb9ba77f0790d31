"""A replayed MPIJob's launcher on a kwok node, doing what ``gpuyard.jobs.workload.launch`` does on a real one.

kwok ends a pod on a timer (sim/kwok.py ANNOTATION_RUNS_FOR) whatever its peers do, so a launcher whose workers
were evicted "succeeded" beside a partial gang: a stand-in deciding an outcome. On a real cluster mpirun exits
when it loses a worker's daemon (205), and ``launch`` reruns it once every worker's sshd answers again, at most
``--restarts`` times (the count in the launcher's own command), then exits with that status. So here the
launcher's timer runs only while every worker runs: when one stops, the launcher's run is paused (the training
time done so far is kept: the trainer resumes from its checkpoint) and, once the workers are back, resumed for
what remains; one loss more than ``--restarts`` fails the launcher pod with 205, and what follows (the launcher
Job's ``backoffLimit: 0``, the MPIJob's failure, its workers' cleanup) is the operators' doing, as on a real
cluster. ``launch``'s bound on the wait (jobs/render/mpi.py SSHD_WAIT_SECONDS) is not applied: compressed like
the trace it is shorter than the simulated control plane takes to bring a pod back (its reactions are not
compressed), so a gang whose worker never returns waits until the replay ends, and is explained as waiting.

The timer is moved through the launcher's annotation: kwok v0.8.0 cancels a pod's pending stage and plays the one
it matches anew, with a fresh delay, whenever the pod changes (sigs.k8s.io/kwok pkg/kwok/controllers/
pod_controller.go ``preprocess``, ``addStageJob``). The failure is kwok's own chaos stage
(kustomize/stage/pod/chaos/pod-container-running-failed.yaml), chosen by its label over any other by its weight.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from gpuyard.infra.conventions import LABEL_COMPONENT, LABEL_JOB
from gpuyard.sim.kube import Kubectl, KubectlError
from gpuyard.sim.kwok import ANNOTATION_RUNS_FOR

PAUSED = "8760h"  # a run that waits for its workers: kwok would end it in a year
LOST_NODE_EXIT = 205  # Open MPI 4's mpirun when it loses a node's daemon (gpuyard.jobs.workload.launch)
FAILS = "pod-container-running-failed.stage.kwok.x-k8s.io"  # the chaos stage's label and annotation prefix


@dataclass
class Run:
    """One launcher pod's mpirun: how long it trains in all, how much of it is done, how many reruns it had."""

    namespace: str
    name: str
    job: str
    duration_s: float
    restarts: int
    started: float
    done_s: float = 0.0
    paused: bool = False
    reruns: int = 0
    ended: bool = False


def restarts_of(pod: dict[str, Any]) -> int:
    """The ``--restarts`` of ``launch`` in the launcher's command (jobs/render/mpi.py ``supervised``), else 0."""
    container = pod["spec"]["containers"][0]
    words = [*container.get("command", []), *container.get("args", [])]
    return int(words[words.index("--restarts") + 1]) if "--restarts" in words else 0


def _running(pod: dict[str, Any], kind: str) -> bool:
    return kind != "DELETED" and not pod["metadata"].get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") == "Running"


class Launchers:
    """The launchers of the replayed MPIJobs ``workers`` (job name -> its number of workers): fed every pod event
    (``on_pod``), acting on the cluster at each ``tick``. A worker lost from a whole gang is counted when its event
    comes, so a worker deleted and back between two ticks still cost mpirun its run."""

    def __init__(self, kubectl: Kubectl, workers: dict[str, int]):
        self.kubectl, self.workers = kubectl, workers
        self.running_workers: dict[str, set[str]] = {}  # job -> uids of its workers running now
        self.losses: dict[str, tuple[int, float]] = {}  # job -> workers lost from its whole gang, the first one's time
        self.runs: dict[str, Run] = {}  # launcher pod uid -> its run
        self.lock = threading.Lock()

    def on_pod(self, now: float, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels", {})
        job = labels.get(LABEL_JOB)
        if job not in self.workers:
            return
        running = _running(pod, kind)
        with self.lock:
            if labels.get(LABEL_COMPONENT) == "worker":
                workers = self.running_workers.setdefault(job, set())
                was_whole = len(workers) >= self.workers[job]
                (workers.add if running else workers.discard)(meta["uid"])
                if was_whole and len(workers) < self.workers[job] and self._active(job):
                    count, first = self.losses.get(job, (0, now))
                    self.losses[job] = (count + 1, first)
                return
            run = self.runs.get(meta["uid"])
            if run is None and running:
                # as the replay writes it: seconds, "12.500s" (sim/replay.py prepare)
                duration = float(meta.get("annotations", {}).get(ANNOTATION_RUNS_FOR, "0s").removesuffix("s"))
                self.runs[meta["uid"]] = Run(meta["namespace"], meta["name"], job, duration, restarts_of(pod), now)
            elif run is not None and not running:
                run.ended = True

    def _active(self, job: str) -> bool:
        """A launcher of ``job`` runs mpirun now (not ended, not waiting for its workers)."""
        return any(r.job == job and not r.ended and not r.paused for r in self.runs.values())

    def tick(self, now: float) -> None:
        """Count the workers each running launcher lost (failing it past its reruns); pause the launchers whose gang
        is not whole, resume those whose workers are all back."""
        with self.lock:
            changes = []
            for run in self.runs.values():
                if run.ended:
                    continue
                lost, first = self.losses.pop(run.job, (0, now))
                whole = len(self.running_workers.get(run.job, ())) >= self.workers[run.job]
                if lost and not run.paused:
                    run.done_s += max(first - run.started, 0.0)
                    if run.reruns + lost > run.restarts:
                        run.ended = True
                        changes.append((run, self._failure(run, run.reruns + lost)))
                        continue
                    run.reruns += lost
                if (lost or not whole) and not run.paused:
                    if not lost:  # the gang is not whole: launch waits for every worker's sshd before mpirun
                        run.done_s += now - run.started
                    run.paused = True
                    if not whole:
                        changes.append((run, {"annotations": {ANNOTATION_RUNS_FOR: PAUSED}}))
                if whole and run.paused:  # mpirun (again) for what is left: kwok replays the stage with it
                    run.started, run.paused = now, False
                    left = max(run.duration_s - run.done_s, 0.001)
                    changes.append((run, {"annotations": {ANNOTATION_RUNS_FOR: f"{left:.3f}s"}}))
        for run, metadata in changes:
            try:
                self.kubectl.run("patch", "pod", run.name, "--namespace", run.namespace, "--type=merge",
                                 "--patch", json.dumps({"metadata": metadata}))
            except KubectlError:
                pass  # the pod is gone: its operator ended it meanwhile

    @staticmethod
    def _failure(run: Run, losses: int) -> dict[str, Any]:
        message = f"mpirun lost a worker {losses} times; launch gave up after {run.restarts} reruns"
        return {"labels": {FAILS: "true"},
                "annotations": {f"{FAILS}/exit-code": str(LOST_NODE_EXIT), f"{FAILS}/reason": "Error",
                                f"{FAILS}/message": message, f"{FAILS}/delay": "0s"}}
