"""Every kind retries a stopped trainer (143) and never a final one (1: non-finite loss, 2: lease or identity).

Each test reads the rendered manifest the way its operator does (the rule is cited in each renderer):
which exit statuses fail the job, which restart it, and who counts the restarts. The rendered launch
commands run for real in tests/test_render_runs.py.
"""

import shlex

import pytest
import yaml

from gpuyard.infra.config import Team
from gpuyard.infra.conventions import EXIT_RETRYABLE, FINAL_EXIT_CODES, GRACE_PERIOD_SECONDS
from gpuyard.infra.trainer_runtime import NODE, RuntimePool, training_runtime_spec
from gpuyard.jobs.render.mpi import SSH_PORT, SSHD_WAIT_SECONDS
from gpuyard.jobs.workload.args import LAUNCH_MODULE, RAY_STOP_MODULE, TORCHRUN_MODULE
from gpuyard.jobs.workload.interrupt import GraceBudget
from render_helpers import pod_templates, rendered


def test_pytorchjob_replicas_retry_by_exit_code_and_torchrun_never_restarts():
    """Training Operator v1.9: ExitCode recreates a pod that exited 128-255 and fails the job for 1-127; the
    status read is the ``pytorch`` container's, which is torchrun's, which gpuyard.jobs.workload.torchrun makes the
    workers' (torchrun alone exits 1 whatever happened)."""
    manifest = rendered("pytorchjob", nodes=3, max_restarts=5)
    for replica in manifest["spec"]["pytorchReplicaSpecs"].values():
        assert replica["restartPolicy"] == "ExitCode"
        command = replica["template"]["spec"]["containers"][0]["command"]
        assert command[:3] == ["python3", "-m", TORCHRUN_MODULE] and "--max-restarts=0" in command
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == 5


def test_elastic_pytorchjob_gives_torchrun_no_restarts_either():
    manifest = rendered("pytorchjob", nodes=4, min_nodes=2)
    assert manifest["spec"]["elasticPolicy"]["maxRestarts"] == 0  # the operator's PET_MAX_RESTARTS
    assert manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "ExitCode"


def test_mpijob_launcher_job_never_reruns_and_its_supervisor_retries_only_retryable_statuses():
    """MPI Operator v0.8.0's launcher Job counts every failed pod toward backoffLimit whatever its status: 0 here,
    and gpuyard.jobs.workload.launch reruns mpirun (up to max_restarts) only after a status of 128 or more."""
    manifest = rendered("mpijob", nodes=2, max_restarts=4)
    spec = manifest["spec"]
    assert spec["runPolicy"]["backoffLimit"] == 0
    launcher = spec["mpiReplicaSpecs"]["Launcher"]
    assert launcher["restartPolicy"] == "Never"
    command = launcher["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["python3", "-m", LAUNCH_MODULE]
    options = command[3:command.index("--")]
    assert options[options.index("--restarts") + 1] == "4"
    assert options[options.index("--wait-for") + 1].split(",") == [
        f"vision-mpijob-worker-{i}.vision-mpijob.team-vision.svc:{SSH_PORT}" for i in range(2)]
    assert options[options.index("--wait-seconds") + 1] == str(SSHD_WAIT_SECONDS)
    assert command[command.index("--") + 1] == "mpirun"


def test_volcano_job_terminates_on_final_exit_codes_before_restarting_on_pod_failure():
    """Volcano v1.15.1 applies the first policy that matches, reading the pod's first container's exit code."""
    spec = rendered("volcanojob", nodes=2)["spec"]
    final = [policy for policy in spec["policies"] if "exitCode" in policy]
    assert [(p["exitCode"], p["action"]) for p in final] == [(code, "TerminateJob") for code in FINAL_EXIT_CODES]
    assert spec["policies"][:len(final)] == final  # before PodFailed, which would match first otherwise
    assert [(p.get("event"), p["action"]) for p in spec["policies"][len(final):]] == [
        ("PodEvicted", "RestartJob"), ("PodFailed", "RestartJob")]
    master = spec["tasks"][0]["template"]["spec"]["containers"][0]["command"]
    assert master[4:9] == ["python3", "-m", LAUNCH_MODULE, "--", "mpirun"]  # SIGTERM: 143, not mpirun's 1


@pytest.mark.parametrize("capacity", ["on-demand", "spot"])
def test_rayjob_is_never_rerun_by_kuberay_and_gives_the_driver_its_grace(capacity):
    """KubeRay v1.7.0 reruns any FAILED Ray job, whatever the driver's status: backoffLimit 0 and the Ray entry
    retries itself; Ray's job stop waits RAY_JOB_STOP_WAIT_TIME_S (default 3 s) before SIGKILL."""
    spec = rendered("rayjob", capacity_type=capacity, max_restarts=2)["spec"]
    grace = GRACE_PERIOD_SECONDS[capacity]
    assert spec["backoffLimit"] == 0
    assert shlex.split(spec["entrypoint"])[-2:] == ["--max-restarts", "2"]
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(grace)}}


def test_every_ray_pod_stops_the_trainer_before_its_sigterm():
    manifest = rendered("rayjob", capacity_type="spot")
    budget = GraceBudget(GRACE_PERIOD_SECONDS["spot"]).seconds
    for role, _, pod in pod_templates(manifest):
        hook = pod["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert hook == ["python", "-m", RAY_STOP_MODULE, "--timeout", f"{budget:g}"], role
        assert budget < pod["spec"]["terminationGracePeriodSeconds"]


def test_trainjob_runs_torchrun_with_its_workers_status():
    trainer = rendered("trainjob")["spec"]["trainer"]
    assert trainer["command"][:3] == ["python3", "-m", TORCHRUN_MODULE] and "--max-restarts=0" in trainer["command"]


def test_training_runtime_fails_the_jobset_on_final_exit_codes_and_restarts_it_otherwise():
    """The node Job: no restart in place, backoffLimit 0, FailJob on exit 1 or 2 of the trainer container (reason
    PodFailurePolicy); JobSet v0.12.0: FailJobSet for that reason, any other failure restarts the JobSet."""
    jobset = training_runtime_spec(Team(name="t"), RuntimePool("gpu-on-demand", "on-demand", gpus=True), "img", "bucket")["template"]["spec"]
    node = jobset["replicatedJobs"][0]["template"]["spec"]
    assert node["backoffLimit"] == 0 and node["template"]["spec"]["restartPolicy"] == "Never"
    assert node["podFailurePolicy"] == {"rules": [{
        "action": "FailJob", "onExitCodes": {"containerName": NODE, "operator": "In", "values": list(FINAL_EXIT_CODES)}}]}
    assert EXIT_RETRYABLE not in FINAL_EXIT_CODES
    policy = jobset["failurePolicy"]
    assert policy["rules"] == [{"name": "finalExitCodes", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
    assert policy["maxRestarts"] >= 1
