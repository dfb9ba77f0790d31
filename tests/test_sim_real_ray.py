"""`gpuyard sim up --real-nodes 1`: a rendered RayJob runs the reference trainer through Ray Train on a real Ray head.

KubeRay creates the RayCluster (a head and 2 workers) on the real CPU node, waits for the real head's dashboard,
creates the K8sJobMode submitter from the rendered template, which the team namespace's `restricted` Pod Security
admits, and follows the Ray job through the head's dashboard from its own pod (sim/kuberay.py); the RayJob
Succeeds because the Ray job did, and the trainer's checkpoints are in the team's prefix of the bucket. One that
diverges (exit 1) fails the RayJob with no other attempt; a user's own script runs unchanged as a RayJob, and with a
worker deleted mid-run it stops, saves and resumes to the bits of an uninterrupted run.

CPU-only (`--gpus-per-node 0`) on the one real node of the CPU NodePool, the machine's 2 cores: the head's 1 CPU,
the submitter's 0.5 and two workers of `--cpu 0.25`. The bucket is on the sim's own endpoint, reached with the
team's IRSA credentials, as in tests/test_sim_real_gang.py. Needs what tests/test_sim_real_node.py needs (Go, the images, the pause package).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpuyard.infra.config import StackConfig, load_stack
from gpuyard.infra.tenancy import KUBERAY_NAMESPACE, PSS_LABEL
from gpuyard.jobs.spec import checkpoint_uri, trainer_args
from gpuyard.jobs.workload.args import RAY_MODULE, TrainArgs
from gpuyard.jobs.workload.checkpoint import Checkpointer, manifest_name, step_of
from gpuyard.jobs.workload.storage import open_storage
from gpuyard.jobs.workload.train import identity
from gpuyard.sim.cluster import Sim
from gpuyard.sim.kube import Kubectl
from own_script import gpuyard, run_here, script_image, submit_script, user_lines
from sim_running import CPU_NODE, jobs_removed, real_node_bucket, running_sim

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim-without-mpi-operator"),  # beside the "sim" group: no MPI Operator (sim_running.py)
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
    pytest.mark.timeout(1800),  # the cluster (about 4 min), the ray image's pull and unpack, Ray's start, training
]
STACK = "dev"
TEAM, NAMESPACE = "vision", "team-vision"
JOB, DIVERGED, UNREACHED = "ray", "ray-diverged", "ray-unreached"
KUBERAY_POLICY = "allow-kuberay-operator"  # infra/tenancy.py
# 256 steps of the mlp, a checkpoint every 64 (the preempted run is the user's script's, with its own steps)
EPOCHS, DATASET_SIZE, SAVE_EVERY_STEPS, WORKERS = 2, 8192, 64, 2
STEPS = EPOCHS * DATASET_SIZE // (32 * WORKERS)  # the template's --batch_size 32 a rank
JOB_TIMEOUT_SECONDS = 1200


@dataclass(frozen=True)
class Rays:
    """The sim ready for RayJobs on the real CPU node: the images in its registry, the CPU pool's kwok nodes
    cordoned, the stack's bucket on the sim's S3 endpoint."""

    sim: Sim
    kubectl: Kubectl
    config: StackConfig
    registry_prefix: str

    def trainer_args(self, name: str) -> TrainArgs:
        uri = checkpoint_uri(self.config, self.config.team(TEAM), name)
        return trainer_args(uri, EPOCHS).model_copy(update={"model": "mlp", "dataset_size": DATASET_SIZE,
                                                            "save_every_steps": SAVE_EVERY_STEPS})

    def submit(self, name: str, args: TrainArgs) -> None:
        """`gpuyard render --kind rayjob` of the reference Ray entry with ``args``, applied (no AWS settings: the
        pods' IRSA credentials reach the sim's bucket)."""
        rendered = subprocess.run(
            [sys.executable, "-m", "gpuyard.jobs.cli.main", "render", "--stack", STACK, "--team", TEAM, "--kind",
             "rayjob", "--name", name, "--gpus-per-node", "0", "--cpu", "0.25", "--registry", self.registry_prefix,
             "--", "-m", RAY_MODULE, *args.to_argv(),
             "--num-workers", str(WORKERS), "--no-use-gpu"],
            capture_output=True, text=True, check=True).stdout
        self.kubectl.run("apply", "-f", "-", stdin=rendered)

    def checkpoints(self, args: TrainArgs) -> Checkpointer:
        return Checkpointer(open_storage(args.checkpoint_uri), identity(args))


@pytest.fixture(scope="module")
def rays(tmp_path_factory) -> Iterator[Rays]:
    config = load_stack(STACK)
    with (running_sim(STACK, tmp_path_factory.mktemp("sim") / "state", real_nodes=1, mpi_operator=False) as sim,
          real_node_bucket(sim, config)):
        yield Rays(sim, sim.kubectl(), config, sim.registry().prefix(config))


@pytest.fixture(autouse=True)
def _nothing_left_running(rays):
    """Each test's RayJobs removed after it, passed or failed: the next one's Ray cluster needs the real node's CPU."""
    yield
    jobs_removed(rays.kubectl, NAMESPACE)


def _pods(kubectl: Kubectl, name: str) -> dict[str, dict]:
    return {pod["metadata"]["name"]: pod for pod in kubectl.items("pods", NAMESPACE, f"gpuyard.io/job={name}")}


@dataclass(frozen=True)
class Ended:
    """A RayJob as it ended: its status, every pod seen (as last seen) and the node each was bound to."""

    status: dict
    pods: dict[str, dict]


def _ended(kubectl: Kubectl, name: str) -> Ended:
    """Follow the RayJob ``name`` until KubeRay says its deployment is Complete or Failed."""
    deadline, seen = time.monotonic() + JOB_TIMEOUT_SECONDS, {}
    while True:
        status = kubectl.get("rayjob", name, NAMESPACE).get("status") or {}
        seen |= _pods(kubectl, name)
        if status.get("jobDeploymentStatus") in ("Complete", "Failed") or time.monotonic() > deadline:
            print(json.dumps(status, indent=1))
            return Ended(status, seen)
        time.sleep(3)


def _events(logs: str, event: str) -> list[dict]:
    return [json.loads(line) for line in logs.splitlines() if line.startswith(f'{{"event": "{event}"')]


def _component(pods: dict[str, dict], component: str) -> list[dict]:
    return [p for p in pods.values() if p["metadata"]["labels"].get("app.kubernetes.io/component") == component]


def _submitter_logs(kubectl: Kubectl, name: str) -> tuple[dict, str]:
    """The RayJob's one submitter pod and its log: `ray job submit`, then `ray job logs --follow` (the driver's)."""
    submitters = _component(_pods(kubectl, name), "submitter")
    assert len(submitters) == 1, sorted(_pods(kubectl, name))
    logs = kubectl.run("logs", submitters[0]["metadata"]["name"], "-n", NAMESPACE)
    print(logs[-4000:])
    return submitters[0], logs


@dataclass(frozen=True)
class Run:
    """The RayJob ``JOB`` run once, uninterrupted: its arguments, how it ended, its submitter's log."""

    args: TrainArgs
    ended: Ended
    submitter: dict
    logs: str


@pytest.fixture(scope="module")
def run(rays) -> Run:
    args = rays.trainer_args(JOB)
    started = time.monotonic()
    rays.submit(JOB, args)
    ended = _ended(rays.kubectl, JOB)
    print(f"RayJob {JOB}: {ended.status.get('jobDeploymentStatus')} {time.monotonic() - started:.0f}s after it was applied")
    return Run(args, ended, *_submitter_logs(rays.kubectl, JOB))


def test_a_rendered_rayjob_trains_through_ray_train_on_a_real_head_and_succeeds_because_the_ray_job_did(rays, run):
    status, args = run.ended.status, run.args
    assert (status.get("jobDeploymentStatus"), status.get("jobStatus")) == ("Complete", "SUCCEEDED"), (
        json.dumps(status), run.logs[-3000:])
    # the dashboard's own word, which KubeRay copied (sim/ray_head.py's would say no Ray job ran)
    assert "successfully" in status.get("message", ""), status
    done = _events(run.logs, "done")
    assert len(done) == 1 and (done[0]["epochs"], done[0]["global_step"]) == (EPOCHS, STEPS), run.logs[-3000:]
    assert done[0]["checkpoint"] == f"{args.checkpoint_uri}/{manifest_name(STEPS)}"
    assert args.checkpoint_uri.startswith(
        f"s3://{rays.config.checkpoint_bucket}/{rays.config.team(TEAM).checkpoint_prefix}{JOB}")
    assert rays.checkpoints(args).read(manifest_name(STEPS)).step == STEPS
    # head, both workers and the submitter ran on the real node, Volcano scheduling them
    pods = run.ended.pods
    assert (len(_component(pods, "head")), len(_component(pods, "worker"))) == (1, WORKERS), sorted(pods)
    assert {p["spec"]["nodeName"] for p in pods.values()} == {CPU_NODE}
    assert all(p["spec"]["schedulerName"] == "volcano" for p in pods.values())


def test_the_rayjobs_submitter_ran_as_the_namespaces_restricted_pod_security_requires(rays, run):
    """KubeRay's default submitter has no security context, which `restricted` refuses: the rendered one ran."""
    namespace = rays.kubectl.get("namespace", NAMESPACE)
    assert namespace["metadata"]["labels"][f"{PSS_LABEL}/enforce"] == "restricted"
    pod = run.submitter
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True and security["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["spec"]["containers"][0]["securityContext"]
    assert container["allowPrivilegeEscalation"] is False and container["capabilities"] == {"drop": ["ALL"]}


def test_a_trainer_exiting_1_fails_the_rayjob_and_nothing_runs_it_again(rays):
    """A learning rate that makes the loss non-finite: the ranks exit 1, the Ray entry does not run the trainer again
    (1 and 2 are final: gpuyard.jobs.workload.ray_entry), the Ray job fails, and with the rendered `backoffLimit` 0
    KubeRay makes no other attempt (ray-operator v1.6.0 controllers/ray/rayjob_controller.go
    checkBackoffLimitAndUpdateStatusIfNeeded: Retrying only while `failed` is below backoffLimit + 1)."""
    rays.submit(DIVERGED, rays.trainer_args(DIVERGED).model_copy(update={"lr": 5.0}))
    status = _ended(rays.kubectl, DIVERGED).status
    assert (status.get("jobDeploymentStatus"), status.get("jobStatus")) == ("Failed", "FAILED"), json.dumps(status)
    assert (status.get("failed"), status.get("succeeded", 0)) == (1, 0), json.dumps(status)
    submitters = _component(_pods(rays.kubectl, DIVERGED), "submitter")
    logs = "".join(rays.kubectl.run("logs", pod["metadata"]["name"], "-n", NAMESPACE) for pod in submitters)
    assert _events(logs, "nonfinite") and "running the trainer again" not in logs, logs[-3000:]


def _failed_asks(rays: Rays, operator: dict) -> list[str]:
    """KubeRay's log lines saying it could not ask a head's dashboard about the RayJob UNREACHED."""
    log = rays.kubectl.run("logs", operator["metadata"]["name"], "-n", KUBERAY_NAMESPACE)
    return [line for line in log.splitlines() if "Failed to get job info" in line and f'"{UNREACHED}"' in line]


def _touch(rays: Rays, value: str) -> None:
    """A change to the RayJob UNREACHED: KubeRay reconciles it at once (its controller watches RayJobs with no
    predicate: ray-operator v1.6.0 controllers/ray/rayjob_controller.go SetupWithManager)."""
    rays.kubectl.run("label", "rayjob", UNREACHED, "-n", NAMESPACE, f"gpuyard-test/policy={value}", "--overwrite")


def test_kuberay_runs_in_its_namespace_and_reaches_a_head_only_as_the_teams_network_policy_lets_it(rays):
    """KubeRay's operator is a pod of the stack's KubeRay namespace on the real node (sim/kuberay.py), so the team's
    default-deny ingress decides its requests to a head's dashboard as on EKS. With `allow-kuberay-operator` removed,
    the Ray job runs (the submitter, in the team's namespace, reaches the head: it publishes checkpoints) but KubeRay
    cannot ask the dashboard about it, so the RayJob never learns that it runs; with the policy back before the job
    ends, the same RayJob completes as SUCCEEDED. (Left unreached, KubeRay fails a RayJob 30 s after its submitter
    ended, ray-operator v1.6.0 controllers/ray/rayjob_controller.go ``DefaultSubmitterFinishedTimeout``: a slow CI run
    met that when this test waited for the job's end before putting the policy back.)"""
    [operator] = rays.kubectl.items("pods", KUBERAY_NAMESPACE, "app.kubernetes.io/component=kuberay-operator")
    assert operator["status"]["phase"] == "Running" and operator["spec"]["nodeName"] == CPU_NODE, operator["status"]
    policy = rays.kubectl.get("networkpolicy", KUBERAY_POLICY, NAMESPACE)
    kept = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "spec": policy["spec"],
            "metadata": {k: policy["metadata"][k] for k in ("name", "namespace", "labels", "annotations")
                         if k in policy["metadata"]}}
    rays.kubectl.run("delete", "networkpolicy", KUBERAY_POLICY, "-n", NAMESPACE)
    try:
        rays.submit(UNREACHED, rays.trainer_args(UNREACHED))
        _first_manifest(rays, UNREACHED)  # the Ray job trains: the head's dashboard answered the submitter
        before = _failed_asks(rays, operator)
        _touch(rays, "unreached")  # KubeRay asks again now, not after its backoff from the failed asks
        time.sleep(10)
        after = _failed_asks(rays, operator)
        assert len(after) > len(before) and ":8265/api/jobs/" in after[-1], after[-3:]
        status = rays.kubectl.get("rayjob", UNREACHED, NAMESPACE)["status"]
        assert status.get("jobDeploymentStatus") == "Running", status
        assert status.get("jobStatus", "") not in ("RUNNING", "SUCCEEDED", "FAILED", "STOPPED"), status
    finally:
        rays.kubectl.apply([kept])
    _touch(rays, "restored")
    ended = _ended(rays.kubectl, UNREACHED)
    assert (ended.status.get("jobDeploymentStatus"), ended.status.get("jobStatus")) == ("Complete", "SUCCEEDED"), (
        json.dumps(ended.status))


# the README's own script (tests/own_script.py): steps, a checkpoint every so many
USER_STEPS, USER_SAVE_EVERY = 3000, 200


def _manifest_steps(rays: Rays, name: str) -> list[int]:
    """The steps of the checkpoints the job ``name`` published in its folder of the team's prefix."""
    return [step_of(manifest) for manifest in Checkpointer(
        open_storage(checkpoint_uri(rays.config, rays.config.team(TEAM), name)), {}).manifests()]


def _first_manifest(rays: Rays, name: str) -> None:
    """Wait until the RayJob ``name`` published its first checkpoint (while KubeRay has not completed it)."""
    deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
    while not _manifest_steps(rays, name):
        status = rays.kubectl.get("rayjob", name, NAMESPACE).get("status") or {}
        assert time.monotonic() < deadline and status.get("jobDeploymentStatus") != "Complete", status
        time.sleep(1)


def test_a_users_own_script_as_a_rayjob_is_followed_preempted_and_resumed_to_the_same_bits(
        rays, tmp_path_factory):
    """The user's script built on the rayjob image (`gpuyard images build --context --kind rayjob`) and submitted with
    `gpuyard submit --kind rayjob`: the Ray entry runs it as a child of each of the 2 Ray Train workers. One worker's
    pod deleted after the first checkpoint: its preStop hook sets the stop flag, each worker passes SIGTERM to its
    script, the ranks agree the stop, rank 0 saves, both exit 143 and the driver runs the script again, which resumes
    there and ends with the weights of the same script run here under torchrun, never stopped. `gpuyard status`
    says it ended (KubeRay counts no failure: the rerun is the driver's), `gpuyard logs` (the submitter's, the
    driver's output) has both ranks' lines of both runs. This is the RayJob's one preemption on a real node: the
    reference trainer's stop and rerun inside Ray Train, on the same preStop hook, is tested on a local Ray cluster
    (tests/test_workload_ray.py); `gpuyard cancel` of a RayJob by tests/test_sim_follow.py."""
    here_folder = tmp_path_factory.mktemp("here")
    with (script_image(rays.sim, rays.registry_prefix, tmp_path_factory.mktemp("project"), TEAM, "rayjob") as image,
          run_here(here_folder, here_folder / "here.log", USER_STEPS, USER_SAVE_EVERY) as here):
        name = submit_script(rays.sim, rays.config, image, TEAM, "rayjob", "0.25", USER_STEPS, USER_SAVE_EVERY)
        _first_manifest(rays, name)
        worker = sorted(p["metadata"]["name"] for p in _component(_pods(rays.kubectl, name), "worker"))[0]
        rays.kubectl.run("delete", "pod", worker, "-n", NAMESPACE, "--wait=false")
        ended = _ended(rays.kubectl, name)
        assert here.wait(timeout=JOB_TIMEOUT_SECONDS) == 0, (here_folder / "here.log").read_text()[-3000:]
        logs = gpuyard(rays.sim, "logs", name, "--team", TEAM).stdout
        assert (ended.status.get("jobDeploymentStatus"), ended.status.get("jobStatus")) == ("Complete", "SUCCEEDED"), (
            json.dumps(ended.status), logs[-3000:])
        assert len(_component(ended.pods, "worker")) == WORKERS + 1, sorted(ended.pods)  # the deleted one made again
        status = json.loads(gpuyard(rays.sim, "status", name, "--team", TEAM, "--json").stdout)[0]
        assert (status["phase"], status["restarts"]) == ("SUCCEEDED", 0), status
        lines = user_lines(logs)
        stopped, resumed = [line for line in lines if line["exit"] == 143], [line for line in lines if line["exit"] == 0]
        at = stopped[0]["step"] if stopped else None
        assert [(line["rank"], line["step"]) for line in stopped] == [(0, at), (1, at)], logs[-3000:]
        assert at is not None and USER_SAVE_EVERY <= at < USER_STEPS
        assert "ray_entry: running the trainer again (1 of" in logs, logs[-3000:]
        assert [(line["rank"], line["step"], line["resumed_from"]) for line in resumed] == [
            (0, USER_STEPS, at), (1, USER_STEPS, at)], logs[-3000:]
        here_lines = user_lines((here_folder / "here.log").read_text())
        assert {line["weights_sha256"] for line in resumed} == {here_lines[0]["weights_sha256"]}
