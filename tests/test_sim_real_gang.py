"""`gpuyard sim up --real-nodes 1` with cluster DNS: pods on the real nodes resolve Services (headless ones too) by
name through the sim's CoreDNS, and 2-rank jobs rendered by `gpuyard render` run on the real CPU node: Volcano
gang-schedules them, the operators start their pods, the ranks find each other through DNS, train over gloo and
checkpoint to the team's prefix of the bucket. A PyTorchJob trains to Succeeded, and so does team nlp's in its own
namespace, queue, role and prefix; the same job with its worker's pod
deleted mid-run stops on the kubelet's SIGTERM, is recreated by the Training Operator and ends bitwise identical to
the first; one that diverges exits 1 and is never retried, as a TrainJob, an MPIJob and a Volcano Job too; an
elastic PyTorchJob shrunk from 2 nodes to 1 resumes at world size 1 and finishes. A user's own script (the README's)
goes the user's way: `gpuyard images build --context` into the sim's registry, `gpuyard submit`, `status`, `logs
--rank`, a preemption it resumes from to the bits of an uninterrupted run, `gpuyard cancel`, as a PyTorchJob; and
as a TrainJob restarted by JobSet, an MPIJob rerun by its launcher and a Volcano Job restarted by Volcano, each with
a rank's pod deleted mid-run (one preemption test per kind: the reference trainer's own stop and resume under each
launcher is tested beside the cluster, tests/test_workload_interrupt.py). Each test's jobs are removed after it
(tests/sim_running.py jobs_removed), so one that fails cannot hold the node for the next.

The ranks are CPU-only (`--gpus-per-node 0`): all run on the one real node of the CPU NodePool, since the ddp image
unpacks to 5.1 GB per node and this disk holds one copy (README, "Real nodes"); `--cpu 0.9` (the workers of an
MPIJob or a Volcano Job 0.45, beside its launcher's 1) because that node has the machine's 2 cores, not an
m7i.2xlarge's 8. The trainer is the template's reference trainer with its arguments given after `--`, with the
`mlp` model and a larger dataset, so that a run trains long enough to be interrupted (the template's `linear` model
on 2048 samples trains in a second).
The stack's S3 bucket is on the sim's own endpoint (sim/s3.py), which the pods reach with their team's IRSA
credentials (sim/irsa.py): the tests give them no AWS setting.
Needs what tests/test_sim_real_node.py needs (Go, the images in the registry's storage, the pause package cached).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from gpuyard.infra.config import StackConfig, Team, load_stack
from gpuyard.infra.conventions import ANNOTATION_QUEUE_NAME, ENV_GRACE_PERIOD_SECONDS, GRACE_PERIOD_SECONDS
from gpuyard.jobs.local_aws import LocalAWS
from gpuyard.jobs.processes import die_with_parent
from gpuyard.jobs.spec import checkpoint_uri, trainer_args
from gpuyard.jobs.workload.args import TRAIN_MODULE, TrainArgs
from gpuyard.jobs.workload.checkpoint import MANIFEST, Checkpointer, manifest_name, step_of
from gpuyard.jobs.workload.storage import open_storage
from gpuyard.jobs.workload.train import identity
from gpuyard.sim import coredns, irsa, pause
from gpuyard.sim.kube import Kubectl
from gpuyard.sim.submit import ENDED, FAILED, JOB_RESOURCES, SUCCEEDED, SubmitFailed, job_phase, submit
from sim_running import CPU_NODE, jobs_removed, pod_ended, real_node_bucket, running_sim
from own_script import gpuyard, run_here, script_image, submit_script, user_lines

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim"),
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
    pytest.mark.timeout(1800),  # the cluster (about 4 min), the image's pull and unpack, the training
]
STACK = "dev"
TEAM, NAMESPACE = "vision", "team-vision"
OTHER_TEAM, OTHER_NAMESPACE = "nlp", "team-nlp"
JOB, PREEMPTED, DIVERGED, ELASTIC = "gang", "preempted", "diverged", "elastic"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # a TrainJob's node rank, on each pod of its Job
# 512 steps of 64 samples: the kind of run these ranks train for 10 s on an idle machine and 2 min on a busy one
# (measured 250 to 5000 samples/s: the node's containers share the 2 cores with everything else here)
EPOCHS, DATASET_SIZE, SAVE_EVERY_STEPS = 4, 8192, 64
STEPS = EPOCHS * DATASET_SIZE // (32 * 2)  # the template's --batch_size 32 a rank, 2 ranks
FINAL_WATCH_SECONDS = 30
JOB_TIMEOUT_SECONDS = 1200
POD_TIMEOUT_SECONDS = 300


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with running_sim(STACK, tmp_path_factory.mktemp("sim") / "state", real_nodes=1) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def _nothing_left_running(sim):
    """Each test's jobs removed after it, passed or failed: the next test's gang needs the real node's CPU."""
    yield
    for namespace in (NAMESPACE, OTHER_NAMESPACE):
        jobs_removed(sim.kubectl(), namespace)


def _busybox_pod(name: str, image: str, script: str, labels: dict[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": CPU_NODE},
                     "containers": [{"name": "main", "image": image, "command": ["sh", "-c", script]}]}}


def test_pods_on_a_real_node_resolve_services_and_headless_services_through_the_sims_coredns(sim):
    kubectl = sim.kubectl()
    busybox = pause.push(sim.registry())
    labels = {"app": "dns-target"}
    kubectl.apply([
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dns-target", "namespace": "default"},
         "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "x", "port": 29400}]}},
        _busybox_pod("dns-target", busybox, "sleep 600", labels),
    ])
    deadline = time.monotonic() + POD_TIMEOUT_SECONDS
    while (target := kubectl.get("pod", "dns-target", "default"))["status"].get("phase") != "Running":
        assert time.monotonic() < deadline, json.dumps(target["status"])[-2000:]
        time.sleep(1)
    # as the Training Operator's init container asks (sh, nslookup): the short name through the search path, the
    # full names, and a name no Service has, which must not resolve
    script = ("cat /etc/resolv.conf; nslookup kubernetes.default.svc.cluster.local; "
              "nslookup dns-target.default.svc.cluster.local; nslookup dns-target; "
              "if nslookup missing.default.svc.cluster.local; then exit 3; fi")
    kubectl.apply([_busybox_pod("dns-client", busybox, script)])
    client = pod_ended(kubectl, "dns-client", "default", POD_TIMEOUT_SECONDS)
    logs = kubectl.run("logs", "dns-client", "-n", "default")
    print(logs)
    assert client["status"]["phase"] == "Succeeded", logs + json.dumps(client["status"])[-2000:]
    assert f"nameserver {coredns.ADDRESS}" in logs and "search default.svc.cluster.local svc.cluster.local" in logs
    cluster_ip = kubectl.get("service", "kubernetes", "default")["spec"]["clusterIP"]
    target_ip = kubectl.get("pod", "dns-target", "default")["status"]["podIP"]
    answers = re.findall(r"^Name:\s+(\S+)\nAddress:\s+(\S+)$", logs, re.MULTILINE)  # busybox nslookup's answers
    assert ("kubernetes.default.svc.cluster.local", cluster_ip) in answers
    # the headless Service's name is its pod's address, asked in full and by the short name (through the search path)
    assert answers.count(("dns-target.default.svc.cluster.local", target_ip)) == 2 and target_ip.startswith("10.244.1.")
    assert not [name for name, _ in answers if name.startswith("missing.")]
    kubectl.run("delete", "pod", "dns-target", "dns-client", "-n", "default", "--grace-period=1")


def _team_pod(team: Team, name: str, image: str, script: str, labels: dict[str, str] | None = None,
              env: dict[str, str] | None = None) -> dict:
    """A pod the team namespace's admission lets in (Volcano, the team's queue and priority, restricted security),
    on the real CPU node."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": team.namespace, "labels": labels or {},
                         "annotations": {ANNOTATION_QUEUE_NAME: team.name}},
            "spec": {"restartPolicy": "Never", "schedulerName": "volcano", "priorityClassName": team.priority_class,
                     "nodeSelector": {"kubernetes.io/hostname": CPU_NODE}, "automountServiceAccountToken": False,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65534,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "volumes": [{"name": "www", "emptyDir": {}}],
                     "containers": [{
                         "name": "main", "image": image, "command": ["sh", "-c", script],
                         "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                         "volumeMounts": [{"name": "www", "mountPath": "/www"}],
                         "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                                       "limits": {"cpu": "50m", "memory": "32Mi"}},
                         "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}


def _pod_running(kubectl: Kubectl, name: str, namespace: str) -> dict:
    deadline = time.monotonic() + POD_TIMEOUT_SECONDS
    while (pod := kubectl.get("pod", name, namespace))["status"].get("phase") != "Running":
        assert time.monotonic() < deadline, json.dumps(pod["status"])[-2000:]
        time.sleep(1)
    return pod


def test_team_network_policies_are_enforced_on_the_real_node_and_a_clusterip_service_routes_through_kube_proxy(sim):
    """The stack's rendered NetworkPolicies (default deny, same namespace, DNS, HTTPS) in force through kube-router,
    and a ClusterIP Service through kube-proxy: a team's pod reaches its own team's server by pod address and by
    Service address, and cluster DNS, but not the other team's server, which that team's own pod reaches (the same
    server, the same node: the policy makes the difference)."""
    kubectl = sim.kubectl()
    busybox = pause.push(sim.registry())
    config = load_stack(STACK)
    teams = [config.team(name) for name in ("vision", "nlp")]
    serve = 'echo "ok-$TEAM" > /www/index.html && exec /bin/busybox httpd -f -p 8080 -h /www'
    for team in teams:
        kubectl.apply([
            _team_pod(team, "np-server", busybox, serve, {"app": "np-server"}, {"TEAM": team.name}),
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "np-server", "namespace": team.namespace},
             "spec": {"selector": {"app": "np-server"}, "ports": [{"port": 80, "targetPort": 8080}]}},
        ])
    servers = {team.name: _pod_running(kubectl, "np-server", team.namespace)["status"]["podIP"] for team in teams}
    # busybox's nc (its static wget crashes here, exit 139): an HTTP request to address $1, port $2. A new pod's
    # address joins kube-router's ipsets only at its next sync (measured: the first request of a just started client
    # refused), as a policy implementation may lag a pod's start: the allowed requests are tried for up to 30 s,
    # the denied one after them, once this pod is known
    script = ('w() { printf "GET / HTTP/1.0\\r\\n\\r\\n" | /bin/busybox nc -w 5 "$1" "$2" 2>&1; }; '
              'until_ok() { for i in $(seq 30); do out=$(w "$1" "$2"); case "$out" in *ok-*) break;; esac; sleep 1; '
              'done; echo "$out"; echo "(try $i)"; }; '
              'echo "== same"; until_ok "$SAME" 8080; echo "== service"; until_ok "$SERVICE" 80; '
              'echo "== other"; w "$OTHER" 8080; '
              'echo "== dns"; nslookup kubernetes.default.svc.cluster.local >/dev/null && echo ok')
    for team, other in (teams, teams[::-1]):
        service = kubectl.get("service", "np-server", team.namespace)["spec"]["clusterIP"]
        env = {"SAME": servers[team.name], "SERVICE": service, "OTHER": servers[other.name]}
        kubectl.apply([_team_pod(team, "np-client", busybox, script, env=env)])
        client = pod_ended(kubectl, "np-client", team.namespace, POD_TIMEOUT_SECONDS)
        logs = kubectl.run("logs", "np-client", "-n", team.namespace)
        print(team.name, env, logs)
        assert client["status"]["phase"] == "Succeeded", logs + json.dumps(client["status"])[-2000:]
        said = dict(part.split("\n", 1) for part in logs.split("== ")[1:])
        assert f"\nok-{team.name}\n(try " in said["same"] and f"\nok-{team.name}\n(try " in said["service"], logs
        assert said["dns"] == "ok\n", logs
        # kube-router REJECTs what no policy allows (pkg/controllers/netpol/pod.go at v2.1.0)
        assert f"ok-{other.name}" not in said["other"] and "Connection refused" in said["other"], logs
        kubectl.run("delete", "pod", "np-client", "-n", team.namespace, "--grace-period=1")
    for team in teams:
        kubectl.run("delete", "pod,service", "np-server", "-n", team.namespace, "--grace-period=1")


@dataclass(frozen=True)
class Gangs:
    """The sim ready for gangs on the real CPU node: the images in its registry, the CPU pool's kwok nodes cordoned
    (a gang can only land where containers run), the stack's bucket on a moto_server the pods reach."""

    kubectl: Kubectl
    config: StackConfig
    registry_prefix: str
    aws: LocalAWS

    def trainer_args(self, name: str, team: str = TEAM, **changes) -> TrainArgs:
        """The template's reference trainer arguments for ``team``'s job ``name``, with the model and data of these
        tests."""
        uri = checkpoint_uri(self.config, self.config.team(team), name)
        return trainer_args(uri, EPOCHS).model_copy(update={"model": "mlp", "dataset_size": DATASET_SIZE,
                                                            "save_every_steps": SAVE_EVERY_STEPS, **changes})

    def render(self, name: str, words: list[str], kind: str = "pytorchjob", cpu: str = "0.9", image: str = "",
               log_level: str = "INFO", env: dict[str, str] | None = None, nodes: str = "2", team: str = TEAM) -> str:
        """`gpuyard render` of the job ``name`` of ``kind`` on ``nodes`` running the command ``words`` (after `--`),
        on the kind's image in the sim's registry unless ``image`` is given, with ``env`` (`--env`): no AWS settings,
        the pods' IRSA credentials reach the sim's bucket."""
        # LOGLEVEL INFO: torchrun's agent then logs each rank's place in the rendezvous and the signals it gets
        # (torch/distributed/elastic utils/logging.py reads it; its default is WARNING)
        env = {"LOGLEVEL": log_level, **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "gpuyard.jobs.cli.main", "render", "--stack", STACK, "--team", team, "--kind", kind,
             "--name", name, "--nodes", nodes, "--gpus-per-node", "0", "--cpu", cpu, "--registry", self.registry_prefix,
             *(["--image", image] if image else []), *(f"--env={k}={v}" for k, v in env.items()), "--", *words],
            capture_output=True, text=True, check=True).stdout

    def submit(self, name: str, args: TrainArgs, kind: str = "pytorchjob", cpu: str = "0.9",
               env: dict[str, str] | None = None, nodes: str = "2", team: str = TEAM) -> float:
        """Render ``team``'s job ``name`` of ``kind`` running the reference trainer with ``args``, apply it; returns
        when."""
        rendered = self.render(name, ["-m", TRAIN_MODULE, *args.to_argv()], kind, cpu, env=env, nodes=nodes, team=team)
        self.kubectl.run("apply", "-f", "-", stdin=rendered)
        return time.monotonic()

    def checkpoints(self, args: TrainArgs) -> Checkpointer:
        """The job's checkpoints in the bucket, read as the trainer reads them (each verified against its manifest)."""
        storage = open_storage(args.checkpoint_uri)
        return Checkpointer(storage, identity(args))


@pytest.fixture(scope="module")
def gangs(sim, tmp_path_factory):
    config = load_stack(STACK)
    with real_node_bucket(sim, config) as aws:
        yield Gangs(sim.kubectl(), config, sim.registry().prefix(config), aws)


@dataclass(frozen=True)
class Ended:
    """A job as it ended: its state, how long after it was applied, the pods left."""

    state: str
    seconds: float
    pods: dict[str, dict]


def _events(logs: str, event: str) -> list[dict]:
    """The trainer's JSON lines of one kind (rank 0 prints them) in ``logs``."""
    return [json.loads(line) for line in logs.splitlines() if line.startswith(f'{{"event": "{event}"')]


def _job_state(kubectl, name: str, kind: str = "pytorchjob") -> str:
    """The phase the job's operator reports (``kind``: its kubectl resource name)."""
    return job_phase(kubectl.get(kind, name, NAMESPACE))


def _pods(kubectl, name: str) -> dict[str, dict]:
    return {pod["metadata"]["name"]: pod for pod in kubectl.items("pods", NAMESPACE, f"gpuyard.io/job={name}")}


def _ended(kubectl, name: str, applied: float, kind: str = "pytorchjob") -> Ended:
    while (state := _job_state(kubectl, name, kind)) not in (*ENDED, *FAILED) and (
            time.monotonic() < applied + JOB_TIMEOUT_SECONDS):
        time.sleep(3)
    seconds = time.monotonic() - applied
    print(f"{kind} {name} {state or 'not finished'} {seconds:.0f}s after it was applied")
    return Ended(state, seconds, _pods(kubectl, name))


def _trainer_state(pod: dict) -> dict:
    """The state of the pod's container (``{"running": ...}``, ``{"terminated": ...}``), empty before it exists:
    the trainer's under a PyTorchJob, sshd's on an MPIJob worker."""
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return statuses[0]["state"] if statuses else {}


def _running(kubectl, name: str, pods: list[str], replacing: dict[str, str] | None = None) -> dict[str, str]:
    """The UID of each of ``pods`` once the container runs in all of them, each a pod other than the one of the
    UID ``replacing`` names for it (a pod created again)."""
    deadline, replacing = time.monotonic() + POD_TIMEOUT_SECONDS, replacing or {}
    while True:
        found = _pods(kubectl, name)
        uids = {pod: found[pod]["metadata"]["uid"] for pod in pods if "running" in _trainer_state(found.get(pod, {}))}
        if len(uids) == len(pods) and not any(uid == replacing.get(pod) for pod, uid in uids.items()):
            return uids
        assert time.monotonic() < deadline, json.dumps({p: v["status"] for p, v in found.items()})[-3000:]
        time.sleep(1)


@contextmanager
def _followed_to_the_end(kubectl, pods: list[str], folder: Path, run: str) -> Iterator[dict[str, Path]]:
    """Each pod's log (``folder/<pod>.<run>.log``, from its start) followed until its container exits, which the
    block's end waits for: a job's operator deletes the pods still running when it ends (cleanPodPolicy
    `Running`: kubeflow/training-operator v1.9.4 pkg/controller.v1/common/job.go DeletePodsAndServices), logs and
    all."""
    paths = {pod: folder / f"{pod}.{run}.log" for pod in pods}
    with ExitStack() as stack:
        followers = [stack.enter_context(_following(kubectl, pod, path)) for pod, path in paths.items()]
        yield paths
        for follower in followers:
            follower.wait(timeout=JOB_TIMEOUT_SECONDS)
    for pod, path in paths.items():
        print(f"--- {pod} ({run} run)\n{path.read_text()[-3000:]}")


def _read(paths: dict[str, Path]) -> dict[str, str]:
    return {pod: path.read_text() for pod, path in paths.items()}


@contextmanager
def _following(kubectl, pod: str, path: Path) -> Iterator[subprocess.Popen]:
    """``kubectl logs -f`` of the pod's container into ``path``: it ends when the container exits (the pod and its
    logs may be gone right after)."""
    with path.open("w") as out:
        follower = subprocess.Popen(
            [str(kubectl.binary), f"--kubeconfig={kubectl.kubeconfig}", "logs", "-f", pod, "-n", NAMESPACE],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        try:
            yield follower
        finally:
            if follower.poll() is None:
                follower.kill()
            follower.wait()


def _job_events(kubectl, name: str) -> list[dict]:
    """The events the Training Operator recorded on the PyTorchJob ``name``."""
    return [event for event in kubectl.items("events", NAMESPACE)
            if (event["involvedObject"]["kind"], event["involvedObject"]["name"]) == ("PyTorchJob", name)]


def _differences(ours, theirs, path: str = "") -> list[str]:
    """Where two checkpoint states differ, bit for bit (tensors by their bytes, dtype and shape)."""
    if isinstance(ours, torch.Tensor):
        same = (isinstance(theirs, torch.Tensor) and (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape)
                and torch.equal(ours.flatten().view(torch.uint8), theirs.flatten().view(torch.uint8)))
        return [] if same else [path]
    if isinstance(ours, dict):
        if not isinstance(theirs, dict) or ours.keys() != theirs.keys():
            return [path]
        return [diff for key in ours for diff in _differences(ours[key], theirs[key], f"{path}/{key}")]
    if isinstance(ours, (list, tuple)):
        if type(ours) is not type(theirs) or len(ours) != len(theirs):
            return [path]
        return [diff for index, pair in enumerate(zip(ours, theirs)) for diff in _differences(*pair, f"{path}/{index}")]
    return [] if (type(ours), ours) == (type(theirs), theirs) else [path]


def _first_checkpoint(checkpoints: Checkpointer, running) -> None:
    """Wait until the job's first scheduled checkpoint is in the bucket (while ``running()``)."""
    deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
    while not (manifests := checkpoints.manifests()) or step_of(manifests[0]) < SAVE_EVERY_STEPS:
        assert time.monotonic() < deadline and running(), f"no checkpoint of step {SAVE_EVERY_STEPS}"
        time.sleep(1)


def _delete_pod(kubectl, pod: str) -> float:
    """`kubectl delete pod` with the pod's own grace period, not waiting; returns when."""
    kubectl.run("delete", "pod", pod, "-n", NAMESPACE, "--wait=false")
    return time.monotonic()


def _stopped(stopped: list[dict], args: TrainArgs) -> dict:
    """The one ``stopped`` line: after the first scheduled checkpoint, before the end, saved in the bucket.

    Rank 0 reports it, and its pod is not the deleted one: its stop came through the ranks' agreement, not a SIGTERM
    of its own, so the callers time the stop from the pod's deletion rather than from the line."""
    assert len(stopped) == 1, stopped
    step = stopped[0]["global_step"]
    assert SAVE_EVERY_STEPS <= step < STEPS, stopped
    assert stopped[0]["checkpoint"] == f"{args.checkpoint_uri}/{manifest_name(step)}"
    return stopped[0]


def _torchrun_stopped_by_sigterm(log: str) -> bool:
    """The kubelet's SIGTERM reached the pod's torchrun, which passed it to its rank and then exited 143, as
    gpuyard.jobs.workload.torchrun says (torch's own line, "Received 15 death signal", is missing when its metrics
    wrapper loses the signal)."""
    return re.search(r"closing signal SIGTERM\n(.*\n)*torchrun: stopped by signal 15, exit 143\n", log) is not None


def _assert_resumed_as_uninterrupted(gangs: Gangs, args: TrainArgs, resumed: list[dict], stopped: dict,
                                     done: list[dict], reference: Reference) -> None:
    """The run of ``args`` resumed once, at the step it stopped, and its final checkpoint is the reference's, bit
    for bit (model, optimizer, progress and every rank's RNG)."""
    assert [(e["global_step"], e["checkpoint"]) for e in resumed] == [(stopped["global_step"], stopped["checkpoint"])]
    assert len(done) == 1 and done[0]["weights_sha256"] == _events(reference.all_logs, "done")[0]["weights_sha256"]
    assert done[0]["checkpoint"] == f"{args.checkpoint_uri}/{manifest_name(STEPS)}"  # in the team's prefix
    ours = gangs.checkpoints(args).read(manifest_name(STEPS))
    theirs = gangs.checkpoints(gangs.trainer_args(JOB)).read(manifest_name(STEPS))
    assert sorted(ours.state) == ["model", "optimizer", "progress", "ranks", "step"]
    assert _differences(ours.state, theirs.state) == []


@dataclass(frozen=True)
class Reference:
    """The gang's run: its pods as they ran, the worker's init container's log, each trainer's log, the end."""

    running: dict[str, dict]
    init_log: str
    logs: dict[str, str]
    ended: Ended

    @property
    def all_logs(self) -> str:
        return "\n".join(self.logs.values())


@pytest.fixture(scope="module")
def reference(gangs, tmp_path_factory) -> Reference:
    """The gang trained once, uninterrupted: the first gang test's job, and what a preempted one must end as."""
    kubectl, pods = gangs.kubectl, [f"{JOB}-master-0", f"{JOB}-worker-0"]
    applied = gangs.submit(JOB, gangs.trainer_args(JOB))
    _running(kubectl, JOB, pods)
    running = _pods(kubectl, JOB)
    init_log = kubectl.run("logs", pods[1], "-n", NAMESPACE, "-c", "init-pytorch")
    with _followed_to_the_end(kubectl, pods, tmp_path_factory.mktemp("reference"), "only") as logs:
        ended = _ended(kubectl, JOB, applied)
    return Reference(running, init_log, _read(logs), ended)


def _team_role(kubectl, team: Team) -> str:
    """The IAM role the team's ServiceAccount names (infra/tenancy.py), which IRSA gives its pods."""
    account = kubectl.get("serviceaccount", team.service_account, team.namespace)
    return account["metadata"]["annotations"][irsa.ROLE_ANNOTATION]


def test_a_rendered_two_rank_pytorchjob_trains_to_succeeded_on_a_real_node_finding_its_master_through_dns(
        gangs, reference):
    pods, logs, ended = reference.running, reference.logs, reference.ended
    assert ended.state == "Succeeded", json.dumps({n: p["status"] for n, p in ended.pods.items()})[-4000:]
    assert sorted(pods) == [f"{JOB}-master-0", f"{JOB}-worker-0"]
    assert {pod["spec"]["nodeName"] for pod in pods.values()} == {CPU_NODE}
    assert all(pod["spec"]["schedulerName"] == "volcano" for pod in pods.values())
    # the worker's init container waited for the master's name (upstream's nslookup loop) and got its address
    assert pods[f"{JOB}-master-0"]["status"]["podIP"] in reference.init_log, reference.init_log
    done = _events(logs[f"{JOB}-master-0"], "done")
    assert len(done) == 1 and (done[0]["epochs"], done[0]["global_step"]) == (EPOCHS, STEPS)
    args = gangs.trainer_args(JOB)
    assert done[0]["checkpoint"] == f"{args.checkpoint_uri}/{manifest_name(STEPS)}"
    assert args.checkpoint_uri.startswith(
        f"s3://{gangs.config.checkpoint_bucket}/{gangs.config.team(TEAM).checkpoint_prefix}{JOB}")
    assert gangs.checkpoints(args).read(manifest_name(STEPS)).step == STEPS
    # the pods wrote it with the team role's credentials from the sim's STS, none given them (sim/irsa.py): the
    # token's volume and the role's variables, no keys (and the instance metadata service is closed to them)
    role = _team_role(gangs.kubectl, gangs.config.team(TEAM))
    for pod in pods.values():
        env = {item["name"]: item.get("value") for item in pod["spec"]["containers"][0]["env"]}
        assert env["AWS_ROLE_ARN"] == role and "AWS_ACCESS_KEY_ID" not in env, env
        assert irsa.VOLUME in {volume["name"] for volume in pod["spec"]["volumes"]}
    # both ranks joined one rendezvous of two and finished (torchrun's agent logs each rank's place in the group and
    # the end of its worker); the pods left (the operator deletes one still running as the job ends) exited 0
    for name, rank in ((f"{JOB}-master-0", 0), (f"{JOB}-worker-0", 1)):
        assert f"group_rank={rank}\n" in logs[name] and "group_world_size=2\n" in logs[name], logs[name][-3000:]
        assert "worker group successfully finished" in logs[name], logs[name][-3000:]
    assert ended.pods and all(_trainer_state(pod)["terminated"]["exitCode"] == 0 for pod in ended.pods.values())


def test_a_job_of_team_nlp_trains_to_succeeded_in_its_own_namespace_queue_role_and_prefix(gangs):
    """The second team's PyTorchJob (as vision's above, one epoch): its namespace, its Volcano queue, its role's
    credentials (nlp's, not vision's: sim/irsa.py per ServiceAccount), its prefix of the bucket."""
    kubectl, team = gangs.kubectl, gangs.config.team(OTHER_TEAM)
    args = gangs.trainer_args(JOB, team=OTHER_TEAM, total_epochs=1)
    applied, queues = gangs.submit(JOB, args, team=OTHER_TEAM), set()
    while (state := job_phase(kubectl.get("pytorchjob", JOB, team.namespace))) not in (*ENDED, *FAILED):
        assert time.monotonic() < applied + JOB_TIMEOUT_SECONDS, state
        # the job's PodGroup while it lives (the operator deletes it as the job ends)
        queues |= {group["spec"]["queue"] for group in kubectl.items("podgroups.scheduling.volcano.sh", team.namespace)}
        time.sleep(3)
    pods = kubectl.items("pods", team.namespace, f"gpuyard.io/job={JOB}")
    assert state == "Succeeded", json.dumps([pod["status"] for pod in pods])[-4000:]
    assert queues == {team.queue}
    assert pods and {pod["spec"]["nodeName"] for pod in pods} == {CPU_NODE}
    role = _team_role(kubectl, team)
    assert role.endswith(f"/team-{OTHER_TEAM}-irsa")
    assert {item["value"] for pod in pods for item in pod["spec"]["containers"][0]["env"]
            if item["name"] == "AWS_ROLE_ARN"} == {role}
    assert args.checkpoint_uri.startswith(f"s3://{gangs.config.checkpoint_bucket}/{team.checkpoint_prefix}{JOB}")
    assert gangs.checkpoints(args).manifests(), f"no checkpoint under {args.checkpoint_uri}"


def test_a_rank_whose_pod_is_deleted_mid_run_stops_on_the_kubelets_sigterm_and_the_recreated_gang_resumes_bitwise(
        gangs, reference, tmp_path):
    """`kubectl delete pod` of the worker (the pod's grace period, 300 s): the kubelet SIGTERMs its torchrun, which
    forwards it to rank 1; both ranks agree the stop, rank 0 saves that step and both exit 143. The Training Operator
    (kubeflow/training-operator v1.9.4 pkg/controller.v1/common/pod.go ReconcilePods: a Failed pod of an `ExitCode`
    replica with an exit code of 128 or more, pkg/util/train/train_util.go IsRetryableExitCode, is deleted and the
    job marked Restarting; a missing replica index is created again) recreates both pods, which resume from that
    checkpoint and end with the uninterrupted run's state, bit for bit. The reference ran the same image on the same
    node with the same arguments, world size and CPU limit (so the same intra-op thread count): the same computation."""
    kubectl, args = gangs.kubectl, gangs.trainer_args(PREEMPTED)
    master, worker = f"{PREEMPTED}-master-0", f"{PREEMPTED}-worker-0"
    applied = gangs.submit(PREEMPTED, args)
    first = _running(kubectl, PREEMPTED, [master, worker])
    with _followed_to_the_end(kubectl, [master, worker], tmp_path, "first") as first_logs:
        _first_checkpoint(gangs.checkpoints(args), lambda: _job_state(kubectl, PREEMPTED) != "Succeeded")
        deleted = _delete_pod(kubectl, worker)
    stop_seconds = time.monotonic() - deleted
    print(f"both trainers exited {stop_seconds:.1f}s after the worker's pod was deleted")
    assert stop_seconds < args.grace_period
    first_logs = _read(first_logs)
    assert _torchrun_stopped_by_sigterm(first_logs[worker]), first_logs[worker][-3000:]
    stopped = _stopped(_events("\n".join(first_logs.values()), "stopped"), args)
    _running(kubectl, PREEMPTED, [master, worker], replacing=first)  # the operator made both pods again
    with _followed_to_the_end(kubectl, [master, worker], tmp_path, "second") as second_logs:
        ended = _ended(kubectl, PREEMPTED, applied)
    second_logs = "\n".join(_read(second_logs).values())
    assert ended.state == "Succeeded", json.dumps({n: p["status"] for n, p in ended.pods.items()})[-4000:]
    # the operator saw the master's trainer exit 143 and restarted the job
    events = _job_events(kubectl, PREEMPTED)
    assert any(e["reason"] == "ExitedWithCode" and e["message"].endswith(f"{master} exited with code 143")
               for e in events), [e["message"] for e in events]
    assert any(e["reason"] == "PyTorchJobRestarting" for e in events), [e["message"] for e in events]
    _assert_resumed_as_uninterrupted(gangs, args, _events(second_logs, "resume"), stopped,
                                     _events(second_logs, "done"), reference)


def test_a_trainer_exiting_1_fails_the_pytorchjob_and_the_operator_recreates_no_pod(gangs, tmp_path):
    """A learning rate that makes the loss non-finite: every rank exits 1, torchrun (gpuyard.jobs.workload.torchrun) passes
    it on, and the operator fails the job (training-operator v1.9.4 pkg/controller.v1/common/pod.go ReconcilePods:
    an `ExitCode` replica's Failed pod with an exit code below 128 sets JobFailed and is left as it is; once Failed,
    pkg/util/status.go setCondition changes no condition again)."""
    kubectl, args = gangs.kubectl, gangs.trainer_args(DIVERGED, lr=5.0)
    pods = [f"{DIVERGED}-master-0", f"{DIVERGED}-worker-0"]
    applied = gangs.submit(DIVERGED, args)
    first = _running(kubectl, DIVERGED, pods)
    with _followed_to_the_end(kubectl, pods, tmp_path, "only") as logs:
        ended = _ended(kubectl, DIVERGED, applied)
    logs = "\n".join(_read(logs).values())
    assert ended.state == "Failed", json.dumps({n: p["status"] for n, p in ended.pods.items()})[-4000:]
    nonfinite = _events(logs, "nonfinite")
    assert len(nonfinite) == 1 and nonfinite[0]["checkpoint"] is None and "train: error: loss or weights not finite" in logs
    # the operator reconciles a pod's change within seconds (the preempted job's pods were made again so): no pod
    # is made again, none restarted. A pod still running when the job failed is deleted by the cleanPodPolicy
    # `Running` (kubeflow/training-operator v1.9.4 pkg/controller.v1/common/job.go DeletePodsAndServices).
    time.sleep(FINAL_WATCH_SECONDS)
    after = _pods(kubectl, DIVERGED)
    assert after and {name: pod["metadata"]["uid"] for name, pod in after.items()}.items() <= first.items()
    for pod in after.values():
        assert pod["status"]["phase"] == "Failed"
        assert _trainer_state(pod)["terminated"]["exitCode"] == 1
        assert all(status["restartCount"] == 0 for status in pod["status"]["containerStatuses"])
    assert _job_state(kubectl, DIVERGED) == "Failed"


def test_an_elastic_pytorchjob_shrunk_from_2_nodes_to_1_saves_and_resumes_on_the_one_left_to_the_end(gangs, tmp_path):
    """`--nodes 1:2`: Workers only, torchrun's c10d rendezvous on worker 0 taking 1 to 2 nodes. Its Worker replicas
    patched from 2 to 1 (what the operator's HPA does to an elastic job), the operator deletes worker 1
    (kubeflow/training-operator v1.9.4 pkg/controller.v1/common/pod.go ReconcilePods: a pod whose index is not below
    the replicas is deleted); the kubelet SIGTERMs it, both ranks agree the stop, rank 0 saves and both exit 143;
    the operator makes worker 0 again, whose torchrun forms a rendezvous of the one node, and the trainer resumes that
    checkpoint at world size 1 (the data position remapped by samples: gpuyard.jobs.workload.train) and trains every
    epoch to the end."""
    kubectl, args = gangs.kubectl, gangs.trainer_args(ELASTIC)
    workers = [f"{ELASTIC}-worker-0", f"{ELASTIC}-worker-1"]
    applied = gangs.submit(ELASTIC, args, nodes="1:2")
    first = _running(kubectl, ELASTIC, workers)
    with _followed_to_the_end(kubectl, workers, tmp_path, "first") as first_logs:
        _first_checkpoint(gangs.checkpoints(args), lambda: _job_state(kubectl, ELASTIC) != "Succeeded")
        kubectl.run("patch", "pytorchjob", ELASTIC, "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps({"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}}))
    first_logs = _read(first_logs)
    assert "group_world_size=2\n" in first_logs[workers[0]], first_logs[workers[0]][-3000:]
    stopped = _stopped(_events("\n".join(first_logs.values()), "stopped"), args)
    _running(kubectl, ELASTIC, workers[:1], replacing=first)
    with _followed_to_the_end(kubectl, workers[:1], tmp_path, "second") as second_logs:
        ended = _ended(kubectl, ELASTIC, applied)
    second_log = _read(second_logs)[workers[0]]
    assert ended.state == "Succeeded", json.dumps({n: p["status"] for n, p in ended.pods.items()})[-4000:]
    assert sorted(ended.pods) == workers[:1] and "group_world_size=1\n" in second_log, second_log[-3000:]
    resumed = _events(second_log, "resume")
    assert [(e["global_step"], e["checkpoint"], e["world_size"]) for e in resumed] == [
        (stopped["global_step"], stopped["checkpoint"], {"saved": 2, "now": 1})], second_log[-3000:]
    done = _events(second_log, "done")
    assert len(done) == 1 and done[0]["epochs"] == EPOCHS, second_log[-3000:]
    # the samples left after the stop, one rank's batch a step
    assert done[0]["global_step"] == stopped["global_step"] + (STEPS - stopped["global_step"]) * 2
    assert done[0]["checkpoint"] == f"{args.checkpoint_uri}/{manifest_name(done[0]['global_step'])}"


def _grace_told(pod: dict) -> set[float]:
    """The grace periods the pod's container is given in the contract's variables (torchrun's too, where it runs)."""
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    return {float(env[name]) for name in (ENV_GRACE_PERIOD_SECONDS, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT") if name in env}


def _diverged(gangs: Gangs, name: str, kind: str, cpu: str, resource: str, env: dict[str, str] | None = None) -> Ended:
    """The job ``name`` of ``kind`` (with ``env``) with a learning rate that makes the loss non-finite, as its operator
    ended it; a while after, no pod was made again, the state is the same and rank 0 reported the non-finite loss."""
    applied = gangs.submit(name, gangs.trainer_args(name, lr=5.0), kind=kind, cpu=cpu, env=env)
    ended = _ended(gangs.kubectl, name, applied, kind=resource)
    time.sleep(FINAL_WATCH_SECONDS)
    after = _pods(gangs.kubectl, name)
    uids = {pod["metadata"]["uid"] for pod in ended.pods.values()}
    assert after and {pod["metadata"]["uid"] for pod in after.values()} <= uids, sorted(after)
    assert _job_state(gangs.kubectl, name, resource) == ended.state
    logs = "\n".join(gangs.kubectl.run("logs", pod, "-n", NAMESPACE) for pod in after)
    nonfinite = _events(logs, "nonfinite")
    assert len(nonfinite) == 1 and nonfinite[0]["checkpoint"] is None, logs[-3000:]
    return ended


def test_a_trainer_exiting_1_fails_the_trainjob_and_jobset_never_restarts_it(gangs):
    """Both ranks exit 1 (non-finite loss): the runtime's podFailurePolicy fails the node Job (reason
    PodFailurePolicy), the JobSet's ``finalExitCodes`` rule fails the JobSet (kubernetes-sigs/jobset v0.12.0
    pkg/controllers/failure_policy.go: the first matching rule's FailJobSet) and Trainer the TrainJob; every pod is
    of the first attempt (JobSet labels each with its restart count, pkg/constants/constants.go RestartsKey)."""
    resource = JOB_RESOURCES["TrainJob"]
    ended = _diverged(gangs, "tj-diverged", "trainjob", "0.9", resource)
    assert ended.state == "Failed", json.dumps({n: p["status"] for n, p in ended.pods.items()})[-4000:]
    assert gangs.kubectl.get("jobsets.jobset.x-k8s.io", "tj-diverged", NAMESPACE)["status"].get("restarts", 0) == 0
    for pod in _pods(gangs.kubectl, "tj-diverged").values():
        assert pod["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "0"
        assert _trainer_state(pod)["terminated"]["exitCode"] == 1


# mpirun aborting on a rank's exit 1 has each orted sleep its sigkill timeout twice (the rendered 100 s: 200 s; see the
# Volcano Job test above, which sets the same): 10 s here for CI's time, the exit codes are the same
MPI_ABORT_FAST = {"OMPI_MCA_odls_base_sigkill_timeout": "10"}


def _launcher(gangs: Gangs, name: str, ended: Ended) -> tuple[dict, str]:
    """The one pod that ran mpirun for the MPIJob or Volcano Job ``name`` (its launcher, its master) and its log."""
    launchers = [pod for pod_name, pod in ended.pods.items() if "-launcher-" in pod_name or "-mpimaster-" in pod_name]
    assert len(launchers) == 1, sorted(ended.pods)
    return launchers[0], gangs.kubectl.run("logs", launchers[0]["metadata"]["name"], "-n", NAMESPACE)


def test_a_trainer_exiting_1_fails_the_mpijob_and_mpirun_is_never_run_again(gangs):
    """Rank 0 exits 1 (non-finite loss), mpirun passes it on, the launcher's `gpuyard.jobs.workload.launch` does not
    rerun it (1 and 2 are final) and exits 1; the launcher's Job has the rendered `runPolicy.backoffLimit` 0
    (kubeflow/mpi-operator v0.8.0 pkg/controller/mpi_job_controller.go newLauncherJob: BackoffLimit from the
    runPolicy), so no other launcher is made and the MPIJob fails."""
    ended = _diverged(gangs, "mpi-diverged", "mpijob", "0.45", JOB_RESOURCES["MPIJob"], MPI_ABORT_FAST)
    assert ended.state == "Failed", json.dumps({n: p["status"] for n, p in ended.pods.items()})[-4000:]
    launcher, log = _launcher(gangs, "mpi-diverged", ended)
    assert _trainer_state(launcher)["terminated"]["exitCode"] == 1 and "running it again" not in log, log[-3000:]
    assert [name for name in _pods(gangs.kubectl, "mpi-diverged") if "-launcher-" in name] == [
        launcher["metadata"]["name"]]


def test_a_trainer_exiting_1_terminates_the_volcano_job_and_volcano_never_restarts_it(gangs):
    """The same under Volcano: the master's container exits 1 and the job's `exitCode: 1` policy, TerminateJob,
    ends it (volcano v1.14.1 pkg/controllers/job/job_controller_handler.go updatePod: the pod's first container's
    exit code; pkg/controllers/job/job_controller_util.go applyPolicies: the first policy that matches, and the
    rendered exit code ones come before `PodFailed`'s RestartJob): retryCount stays 0."""
    resource = JOB_RESOURCES["Job"]
    ended = _diverged(gangs, "vc-diverged", "volcanojob", "0.45", resource, MPI_ABORT_FAST)
    assert ended.state == "Terminated", json.dumps({n: p["status"] for n, p in ended.pods.items()})[-4000:]
    master, log = _launcher(gangs, "vc-diverged", ended)
    assert _trainer_state(master)["terminated"]["exitCode"] == 1 and "running it again" not in log, log[-3000:]
    assert gangs.kubectl.get(resource, "vc-diverged", NAMESPACE)["status"].get("retryCount", 0) == 0


# A user's own script (the README's, on gpuyard's checkpoint library), as a data scientist takes it to the cluster
USER_STEPS, USER_SAVE_EVERY = 6000, 200


def _manifest_steps(gangs: Gangs, name: str) -> list[int]:
    """The steps of the checkpoints the job ``name`` published in its folder of the team's prefix."""
    bucket, prefix = checkpoint_uri(gangs.config, gangs.config.team(TEAM), name).removeprefix("s3://").split("/", 1)
    listed = gangs.aws.client("s3").list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    names = [item["Key"].rsplit("/", 1)[1] for item in listed.get("Contents", [])]
    return sorted(step_of(name) for name in names if name.startswith("ckpt-") and name.endswith(MANIFEST))


@pytest.fixture(scope="module")
def own_image(sim, gangs, tmp_path_factory) -> Iterator[str]:
    """The user's script on the pytorchjob (and trainjob) image: the ddp image."""
    with script_image(sim, gangs.registry_prefix, tmp_path_factory.mktemp("project"), TEAM, "pytorchjob") as ref:
        yield ref


@pytest.fixture(scope="module")
def own_mpi_image(sim, gangs, tmp_path_factory) -> Iterator[str]:
    """The user's script on the mpijob (and volcanojob) image: the mpi image."""
    with script_image(sim, gangs.registry_prefix, tmp_path_factory.mktemp("project"), TEAM, "mpijob") as ref:
        yield ref


def _submit_own(sim, gangs: Gangs, image: str, steps: int, kind: str = "pytorchjob", cpu: str = "0.9") -> str:
    """`gpuyard submit` of the user's script on their image; returns the new job's name."""
    return submit_script(sim, gangs.config, image, TEAM, kind, cpu, steps, USER_SAVE_EVERY)


def _running_status(sim, name: str) -> dict:
    """`gpuyard status NAME --json` once it says the job and its gang run (the operator and Volcano update them
    seconds after the pods start)."""
    deadline = time.monotonic() + POD_TIMEOUT_SECONDS
    while True:
        status = json.loads(gpuyard(sim, "status", name, "--team", TEAM, "--json").stdout)[0]
        if status["phase"] == "Running" and (status["gang"] or {}).get("phase") == "Running":
            return status
        assert time.monotonic() < deadline, status
        time.sleep(2)


def _first_manifest(gangs: Gangs, name: str, kind: str = "pytorchjob") -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
    while not _manifest_steps(gangs, name):
        assert time.monotonic() < deadline and _job_state(gangs.kubectl, name, kind) not in ENDED, "no first checkpoint"
        time.sleep(1)


def test_a_users_own_script_in_its_own_image_is_submitted_followed_preempted_resumed_and_cancelled(
        sim, gangs, own_image, own_here, tmp_path):
    """Issue 25's path on real nodes: the user's script (not the reference trainer) built into an image with
    `gpuyard images build --context`, submitted with `gpuyard submit`, followed with `gpuyard status` and `gpuyard
    logs --rank`; its worker's pod deleted mid-run, it stops where both ranks agree, saves, and the recreated gang
    resumes there and ends with the weights of the same script run here never stopped; a second job is cancelled
    with `gpuyard cancel`, its stop saved in the grace period, every pod gone."""
    kubectl = gangs.kubectl
    name = _submit_own(sim, gangs, own_image, USER_STEPS)
    assert name.startswith(f"{TEAM}-pytorchjob-"), name
    master, worker = f"{name}-master-0", f"{name}-worker-0"
    first = _running(kubectl, name, [master, worker])
    status = _running_status(sim, name)
    assert (status["queue"], status["pods"], status["bound"], status["gang"]["min_member"]) == (TEAM, 2, 2, 2)
    with _followed_to_the_end(kubectl, [master, worker], tmp_path, "first") as first_logs:
        _first_manifest(gangs, name)
        _delete_pod(kubectl, worker)
    stopped = user_lines("\n".join(_read(first_logs).values()))
    at = stopped[0]["step"]
    assert [(line["rank"], line["step"], line["exit"]) for line in stopped] == [(0, at, 143), (1, at, 143)]
    assert USER_SAVE_EVERY <= at < USER_STEPS and _manifest_steps(gangs, name)[-1] == at
    _running(kubectl, name, [master, worker], replacing=first)  # the operator made the gang again
    # rank 1 followed (`logs -f`): once the master's pod succeeds the job does, and the operator deletes a pod
    # still running (cleanPodPolicy Running), logs and all; the master's pod stays, read after the end
    followed = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.jobs.cli.main", "logs", name, "--team", TEAM, "--rank", "1", "-f"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "KUBECONFIG": str(sim.kubeconfig)})
    ended = _ended(kubectl, name, time.monotonic())
    assert ended.state == "Succeeded", json.dumps({n: p["status"] for n, p in ended.pods.items()})[-4000:]
    resumed = [user_lines(gpuyard(sim, "logs", name, "--team", TEAM, "--rank", "0").stdout),
               user_lines(followed.communicate(timeout=POD_TIMEOUT_SECONDS)[0])]
    assert [[(line["rank"], line["step"], line["exit"], line["resumed_from"]) for line in lines]
            for lines in resumed] == [[(0, USER_STEPS, 0, at)], [(1, USER_STEPS, 0, at)]], resumed
    # the operator's restart counts, though no container restarted in place (its pods were made again)
    restarted = json.loads(gpuyard(sim, "status", name, "--team", TEAM, "--json").stdout)[0]
    assert restarted["restarts"] >= 1, restarted
    assert {line["weights_sha256"] for lines in resumed for line in lines} == {own_here()}

    cancelled = _submit_own(sim, gangs, own_image, USER_STEPS * 100)
    pods = [f"{cancelled}-master-0", f"{cancelled}-worker-0"]
    _running(kubectl, cancelled, pods)
    _cancelled_once_it_checkpointed(sim, gangs, cancelled, pods, tmp_path)


def _cancelled_once_it_checkpointed(sim, gangs: Gangs, name: str, pods: list[str], tmp_path: Path,
                                    kind: str = "pytorchjob") -> None:
    """`gpuyard cancel --wait` of the running job ``name`` of ``kind`` after its first checkpoint: every pod gone,
    the job no longer listed, and ``pods``' logs show the ranks' stop at one step, saved in the grace period."""
    with _followed_to_the_end(gangs.kubectl, pods, tmp_path, "cancelled") as logs:
        _first_manifest(gangs, name, kind)
        result = gpuyard(sim, "cancel", name, "--team", TEAM, "--wait", "300")
    assert result.returncode == 0 and result.stdout.strip() == f"{name}: cancelled, every pod gone", result.stderr
    assert not _pods(gangs.kubectl, name) and name not in gpuyard(sim, "list", "--team", TEAM).stdout
    stopped = user_lines("\n".join(_read(logs).values()))
    assert {(line["step"], line["exit"]) for line in stopped} == {(stopped[0]["step"], 143)}, stopped
    assert _manifest_steps(gangs, name)[-1] == stopped[0]["step"]  # the stop's checkpoint, saved in the grace


@pytest.fixture(scope="module")
def own_here(tmp_path_factory) -> Iterator[Callable[[], str]]:
    """The user's script run here for ``USER_STEPS`` (2 ranks under torchrun), started once beside the cluster's
    runs: a call waits for it and returns its final weights' digest."""
    folder = tmp_path_factory.mktemp("here")
    with run_here(folder, folder / "here.log", USER_STEPS, USER_SAVE_EVERY) as here:
        def weights() -> str:
            assert here.wait(timeout=JOB_TIMEOUT_SECONDS) == 0, (folder / "here.log").read_text()[-3000:]
            return user_lines((folder / "here.log").read_text())[0]["weights_sha256"]
        yield weights


@dataclass(frozen=True)
class OwnKind:
    """How the user's script runs as one kind on the real node's 2 cores."""
    image: str  # the fixture of its image
    cpu: str  # of each pod (an MPI launcher or master asks 1 more)
    pods: int  # once it runs: the gang, and an MPIJob's launcher
    preempted: str  # the pod deleted mid-run (a TrainJob's: rank 1's, named at random)
    remade: str  # "one": the operator makes the deleted pod again; "all": every pod
    restarts: int  # what `gpuyard status` counts after the preemption (jobs/cli/cluster.py Cluster.restarts)


OWN_KINDS = {"trainjob": OwnKind("own_image", "0.9", 2, "rank 1", "all", 1),
             # the launcher reruns mpirun in its pod: the MPIJob's status has no failure, `status` counts its log's rerun
             "mpijob": OwnKind("own_mpi_image", "0.45", 3, "worker-1", "one", 1),
             "volcanojob": OwnKind("own_mpi_image", "0.45", 3, "mpiworker-1", "all", 1)}


def _own_running(kubectl, name: str, kind: OwnKind, replacing: set[str] = frozenset()) -> dict[str, dict]:
    """The job's pods, by name, once the container runs in ``kind.pods`` of them, none of them a pod whose UID is
    in ``replacing``."""
    deadline = time.monotonic() + POD_TIMEOUT_SECONDS
    while True:
        found = _pods(kubectl, name)
        running = {pod: found[pod] for pod in found
                   if "running" in _trainer_state(found[pod]) and found[pod]["metadata"]["uid"] not in replacing}
        if len(running) == kind.pods:
            return running
        assert time.monotonic() < deadline, json.dumps({p: v["status"] for p, v in found.items()})[-3000:]
        time.sleep(1)


def _preempted(name: str, kind: OwnKind, pods: dict[str, dict]) -> str:
    if kind.preempted == "rank 1":
        return next(pod for pod, body in pods.items() if body["metadata"]["annotations"].get(COMPLETION_INDEX) == "1")
    return f"{name}-{kind.preempted}"


@pytest.mark.parametrize("kind_name", OWN_KINDS)
def test_a_users_own_script_as_each_other_kind_is_stopped_by_the_kubelet_and_resumed_by_its_operator_to_the_same_bits(
        sim, gangs, own_here, kind_name, request, tmp_path):
    """The PyTorchJob's path above for each other kind: the same script, submitted with `gpuyard submit --kind KIND`
    on the image of its kind (torchrun's for TrainJob, mpirun's for MPIJob and Volcano Job), one worker's pod deleted
    after the first checkpoint. The kubelet SIGTERMs the deleted pod's PID 1: torchrun (TrainJob), or tini, which
    passes it to images/mpi/entrypoint.sh (sshd is not PID 1), which SIGTERMs the ranks Open MPI's daemon started
    there. The ranks agree the stop after the same step, rank 0 saves, both exit 143 within the pod's grace period
    (the one the script is told), and the kind's operator runs them again from there, to the weights of the script run
    here never stopped: the library takes the ranks whichever launcher gave them.
    - TrainJob: the node Job fails (backoffLimit 0; 143 matches no podFailurePolicy rule), which no rule of the
      JobSet's failurePolicy names, so JobSet restarts the whole JobSet (kubernetes-sigs/jobset v0.12.0
      pkg/controllers/failure_policy.go: no matching rule means ``defaultFailurePolicyRuleAction`` RestartJobSet).
    - MPIJob: the MPI Operator creates the deleted worker again (kubeflow/mpi-operator v0.8.0
      pkg/controller/mpi_job_controller.go getOrCreateWorker) and the launcher's `gpuyard.jobs.workload.launch`
      reruns mpirun in the same pod once every worker's sshd answers.
    - Volcano Job: the first pod to fail (143, below none of the ``exitCode`` policies) is a PodFailed event whose
      policy restarts the job (volcano-sh/volcano v1.14.1 pkg/controllers/job/job_controller_util.go applyPolicies;
      state/running.go RestartJob kills every pod and counts a retry).
    `gpuyard status` says how it ended and counts what the kind counts as a restart; `gpuyard logs` has both ranks'
    lines (the launcher's or master's pod for the MPI kinds, each node's with --rank for TrainJob). Cancelling is
    tested on real nodes with the PyTorchJob above and for every kind by tests/test_sim_follow.py. The MPI kinds'
    Open MPI waits are cut to 10 s (``MPI_ABORT_FAST``): they change nothing before mpirun's exit."""
    kind, kubectl = OWN_KINDS[kind_name], gangs.kubectl
    resource = JOB_RESOURCES[{"trainjob": "TrainJob", "mpijob": "MPIJob", "volcanojob": "Job"}[kind_name]]
    image = request.getfixturevalue(kind.image)
    env = [] if kind_name == "trainjob" else [f"{key}={value}" for key, value in MPI_ABORT_FAST.items()]

    name = submit_script(sim, gangs.config, image, TEAM, kind_name, kind.cpu, USER_STEPS, USER_SAVE_EVERY, env)
    assert name.startswith(f"{TEAM}-{kind_name}-"), name
    first = _own_running(kubectl, name, kind)
    deleted = _preempted(name, kind, first)
    grace = first[deleted]["spec"]["terminationGracePeriodSeconds"]
    assert grace == GRACE_PERIOD_SECONDS["on-demand"]  # the real node's pool
    if kind_name == "trainjob":  # the runtime's pods get the grace the script is told, not Kubernetes' 30 s
        assert _grace_told(first[deleted]) == {grace}, first[deleted]["spec"]["containers"][0].get("env")
    # the pods the preemption ends, followed to their end: an MPIJob's launcher and other worker run on (the
    # launcher's log, mpirun's reruns included, is read at the end)
    ending = [pod for pod in first if kind.remade == "all" or pod == deleted]
    with _followed_to_the_end(kubectl, ending, tmp_path, "first") as first_logs:
        _first_manifest(gangs, name, resource)
        deleted_at = _delete_pod(kubectl, deleted)
    stop_seconds = time.monotonic() - deleted_at
    print(f"the pods the preemption ended exited {stop_seconds:.1f}s after {deleted} was deleted")
    first_logs = _read(first_logs)
    assert stop_seconds < grace, first_logs[deleted][-3000:]
    if kind_name == "trainjob":
        assert _torchrun_stopped_by_sigterm(first_logs[deleted]), first_logs[deleted][-3000:]
    else:
        assert "entrypoint.sh: SIGTERM to ranks" in first_logs[deleted], first_logs[deleted][-3000:]
    remade = {first[pod]["metadata"]["uid"] for pod in ending}
    _own_running(kubectl, name, kind, remade)
    ended = _ended(kubectl, name, time.monotonic(), kind=resource)
    assert ended.state in ENDED, json.dumps({n: p["status"] for n, p in ended.pods.items()})[-4000:]
    status = json.loads(gpuyard(sim, "status", name, "--team", TEAM, "--json").stdout)[0]
    assert (status["phase"], status["restarts"]) == (ended.state, kind.restarts), status
    if kind_name == "trainjob":
        logs = "\n".join(gpuyard(sim, "logs", name, "--team", TEAM, "--rank", rank).stdout for rank in ("0", "1"))
    else:
        logs = gpuyard(sim, "logs", name, "--team", TEAM).stdout
    if kind_name == "mpijob":
        assert "launch: exit 143, retryable: running it again (1 of 3)" in logs, logs[-3000:]
    lines = user_lines("\n".join([*first_logs.values(), logs]))
    stopped, resumed = [line for line in lines if line["exit"] == 143], [line for line in lines if line["exit"] == 0]
    at = stopped[0]["step"] if stopped else None
    assert [(line["rank"], line["step"]) for line in stopped] == [(0, at), (1, at)], lines
    assert at is not None and USER_SAVE_EVERY <= at < USER_STEPS
    assert [(line["rank"], line["step"], line["resumed_from"]) for line in resumed] == [
        (0, USER_STEPS, at), (1, USER_STEPS, at)], lines
    assert {line["weights_sha256"] for line in resumed} == {own_here()}


def test_sim_submit_on_real_nodes_exits_0_only_once_the_jobs_containers_succeeded_else_says_what_the_kubelet_saw(
        sim, gangs, tmp_path):
    """`gpuyard sim submit` (gpuyard.sim.submit) on a cluster with real nodes follows a job to its end, not to a
    running gang: a short reference run succeeds there; a trainer given an argument it does not know exits 2, which
    the operator does not retry, and the failure names the container's exit and its last lines; an image the
    registry does not hold is reported with the kubelet's pull error when the wait ends."""
    said: list[str] = []
    short = gangs.trainer_args("short").model_copy(update={"dataset_size": 512, "save_every_steps": 4})
    (tmp_path / "short.yaml").write_text(gangs.render("short", ["-m", TRAIN_MODULE, *short.to_argv()]))
    [job] = submit(sim, [tmp_path / "short.yaml"], JOB_TIMEOUT_SECONDS, said.append)
    assert job.outcome == SUCCEEDED and set(job.nodes.values()) == {CPU_NODE}, said
    assert any(line.endswith(f"its containers ran on real nodes ({CPU_NODE}) and its operator saw them succeed")
               for line in said), said
    assert gangs.checkpoints(short).read(manifest_name(EPOCHS * 512 // 64)).step == EPOCHS * 512 // 64

    # torchrun's agent at its default log level, as a user runs it: the trainer's own error is in the last lines
    (tmp_path / "typo.yaml").write_text(gangs.render("typo", ["-m", TRAIN_MODULE, *short.to_argv(), "--no-such-flag"],
                                                     log_level="WARNING"))
    with pytest.raises(SubmitFailed) as failed:
        submit(sim, [tmp_path / "typo.yaml"], POD_TIMEOUT_SECONDS, print)
    message = str(failed.value)
    print(message)
    assert message.startswith(f"PyTorchJob {NAMESPACE}/typo Failed: ") and "container pytorch: exit 2 (Error)" in message
    assert "unrecognized arguments: --no-such-flag" in message
    # exit 2 is final: never restarted, though the operator's status update records "is restarting" for any failure
    [typo] = json.loads(gpuyard(sim, "status", "typo", "--team", TEAM, "--json").stdout)
    assert (typo["phase"], typo["restarts"]) == ("Failed", 0), typo

    (tmp_path / "unbuilt.yaml").write_text(gangs.render("unbuilt", ["-m", TRAIN_MODULE],
                                                        image=f"{gangs.registry_prefix}/never-built:0"))
    with pytest.raises(SubmitFailed) as failed:
        submit(sim, [tmp_path / "unbuilt.yaml"], 60, print)
    message = str(failed.value)
    print(message)
    assert message.startswith(f"PyTorchJob {NAMESPACE}/unbuilt not running after 60s: ") and re.search(
        r"container pytorch: (ErrImagePull|ImagePullBackOff): .*never-built:0", message), message
    gangs.kubectl.run("delete", "pytorchjob", "unbuilt", "-n", NAMESPACE, "--wait=false")
