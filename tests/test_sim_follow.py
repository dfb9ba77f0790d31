"""`gpuyard submit`, `status`, `list`, `cancel` and `logs` against the simulated cluster, as a user runs them: real
processes, the real API server, Volcano and operators. kwok's nodes run no containers, so no job trains here and no
pod has logs; what `logs` does on such a node is what is tested of it (tests/test_command_runs.py runs the commands)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from gpuyard.infra.config import load_stack
from gpuyard.infra.conventions import GPU_RESOURCE
from gpuyard.jobs.spec import stack_kinds
from sim_running import running_sim
from gpuyard.sim.submit import JOB_RESOURCES

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim"),
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
]
STACK = "dev"
KINDS = stack_kinds(load_stack(STACK))
TEAM = "vision"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with running_sim(STACK, tmp_path_factory.mktemp("sim") / "state") as cluster:
        yield cluster


@pytest.fixture
def gpuyard(sim, stacks_with_registry, tmp_path):
    """`gpuyard ARGS` with the sim's kubeconfig in KUBECONFIG, as `export KUBECONFIG=$(gpuyard sim kubeconfig)`."""
    env = {**os.environ, "KUBECONFIG": str(sim.kubeconfig), "HOME": str(tmp_path)}

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpuyard.jobs.cli.main", *args], capture_output=True, text=True,
                              timeout=timeout, env=env)
    return run


def status_of(gpuyard, name: str) -> dict:
    result = gpuyard("status", name, "--team", TEAM, "--json")
    assert result.returncode == 0, result.stderr
    [status] = json.loads(result.stdout)
    return status


def wait_for_waiting_gang(gpuyard, name: str, seconds: float = 240) -> dict:
    """Until `gpuyard status` shows the job's gang waiting in its queue with Volcano's reason."""
    deadline = time.monotonic() + seconds
    while True:
        status = status_of(gpuyard, name)
        if status["gang"] and status["waiting"]:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(2)


@contextlib.contextmanager
def queue_without_gpus(sim, queue: str):
    """The team's queue may give no GPU (deserved and capability 0): its gangs wait, and status has something to
    say while kwok, which ends a running pod after seconds, cannot end them. Put back afterwards."""
    kubectl = sim.kubectl()
    spec = kubectl.get("queues.scheduling.volcano.sh", queue)["spec"]
    zero = {field: {**spec.get(field, {}), GPU_RESOURCE: "0"} for field in ("deserved", "capability")}
    kubectl.run("patch", "queues.scheduling.volcano.sh", queue, "--type=merge", "-p", json.dumps({"spec": zero}))
    try:
        yield
    finally:
        back = {field: spec.get(field) for field in ("deserved", "capability")}
        kubectl.run("patch", "queues.scheduling.volcano.sh", queue, "--type=merge", "-p", json.dumps({"spec": back}))


@pytest.mark.timeout(1800)  # the cluster's start counts too: minutes on a loaded 2-core machine
def test_submit_status_list_and_cancel_every_kind_with_a_users_command(gpuyard, sim):
    """Each kind submitted without --name (a PyTorchJob twice: two jobs, two names) while the team's queue gives no
    GPU; status shows each gang waiting in the team's queue and Volcano's reason; cancel deletes each job and waits
    until every pod is gone. The gangs and their reasons are real; kwok runs no container."""
    names = {}
    with queue_without_gpus(sim, TEAM):
        for kind in (KINDS[0], *KINDS):
            result = gpuyard("submit", "--team", TEAM, "--kind", kind, "--nodes", "1", "--gpus-per-node", "1",
                             "--", "train_ddp.py", "--lr", "0.1")
            assert result.returncode == 0, result.stderr
            names.setdefault(kind, []).append(result.stdout.strip().splitlines()[-1])
        for kind, pair in names.items():
            status = wait_for_waiting_gang(gpuyard, pair[0])
            assert status["queue"] == TEAM and status["gang"]["phase"] in ("Pending", "Inqueue"), status
            text = gpuyard("status", pair[0], "--team", TEAM).stdout
            assert f"{pair[0]} ({status['kind']})" in text and f"in queue {TEAM}" in text and "waiting" in text
    assert len(set(names[KINDS[0]])) == 2, names
    assert all(name.startswith(f"{TEAM}-{kind}-") for kind, pair in names.items() for name in pair), names
    listed = gpuyard("list", "--team", TEAM)
    assert listed.returncode == 0, listed.stderr
    assert {line.split()[0] for line in listed.stdout.splitlines()} >= {n for pair in names.values() for n in pair}
    for pair in names.values():
        for name in pair:
            result = gpuyard("cancel", name, "--team", TEAM, "--wait", "180")
            assert result.returncode == 0 and result.stdout.strip() == f"{name}: cancelled, every pod gone", \
                result.stderr
            assert not sim.kubectl().items("pods", namespace=f"team-{TEAM}", selector=f"gpuyard.io/job={name}")
    listed = gpuyard("list", "--team", TEAM)
    assert not {line.split()[0] for line in listed.stdout.splitlines()} & {n for p in names.values() for n in p}


def test_logs_of_a_job_on_kwok_nodes_is_one_line_exit_1_since_no_container_ran(gpuyard):
    result = gpuyard("submit", "--team", TEAM, "--kind", "pytorchjob", "--nodes", "1", "--", "train_ddp.py")
    assert result.returncode == 0, result.stderr
    name = result.stdout.strip().splitlines()[-1]
    deadline = time.monotonic() + 240
    while not (status := status_of(gpuyard, name))["bound"]:
        assert time.monotonic() < deadline, status
        time.sleep(2)
    logs = gpuyard("logs", name, "--team", TEAM, "--rank", "0", timeout=120)
    assert logs.returncode == 1 and logs.stderr.count("\n") == 1, logs.stderr
    assert f"gpuyard: error: no logs of pod {name}-master-0 of job {name}: " in logs.stderr
    gpuyard("cancel", name, "--team", TEAM)


@pytest.mark.parametrize(("args", "message"), [
    (["status", "nope"], "no job 'nope' of team vision in namespace team-vision (gpuyard list shows the team's jobs)"),
    (["cancel", "nope"], "no job 'nope' of team vision"),
    (["logs", "nope"], "no job 'nope' of team vision"),
])
def test_no_such_job_is_one_line_exit_1(gpuyard, args, message):
    result = gpuyard(*args, "--team", TEAM)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_a_job_gpuyard_did_not_make_is_not_cancelled(gpuyard, sim, tmp_path):
    manifest = tmp_path / "hand.yaml"
    result = gpuyard("render", "--team", TEAM, "--kind", "pytorchjob", "--name", "vision-by-hand", "-o", "json")
    job = json.loads(result.stdout)
    del job["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    manifest.write_text(json.dumps(job))
    sim.kubectl().run("create", "-f", str(manifest))
    result = gpuyard("cancel", "vision-by-hand", "--team", TEAM)
    assert result.returncode == 1 and "was not made by gpuyard" in result.stderr, result.stderr
    assert sim.kubectl().get(JOB_RESOURCES["PyTorchJob"], "vision-by-hand", f"team-{TEAM}")
    sim.kubectl().run("delete", "-f", str(manifest), "--wait=false")


def test_a_cluster_without_gpuyards_crds_is_one_line_exit_1(gpuyard, sim):
    """Last: the sim's job CRDs are deleted, so the cluster is one gpuyard's stack never set up (torn down after)."""
    crds = [resource for resource in JOB_RESOURCES.values()
            if sim.kubectl().run("get", "crd", resource, "--ignore-not-found", "-o", "name").strip()]
    sim.kubectl().run("delete", "crd", *crds, "--timeout=120s", timeout=180)
    for args in (["list"], ["status", "x"], ["submit", "--kind", "pytorchjob", "--", "t.py"]):
        result = gpuyard(args[0], "--team", TEAM, *args[1:])
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert "has none of gpuyard's job kinds" in result.stderr and "deploy gpuyard's stack there first" in \
            result.stderr
