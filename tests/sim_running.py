"""A simulated cluster for one test module: started once, and stopped with no process or state left behind."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest

from gpuyard.infra.config import StackConfig
from gpuyard.jobs.local_aws import LocalAWS
from gpuyard.jobs.workload.storage import folder_locked
from gpuyard.sim import netpol, realnode, s3
from gpuyard.sim.cluster import Sim
from gpuyard.sim.images import build_images
from gpuyard.sim.processes import alive, zombie
from gpuyard.sim.submit import JOB_RESOURCES

CPU_NODE = "cpu-m7i-2xlarge-1"  # the dev stack's first on-demand node of the cpu NodePool: a real node


def _one_with_real_nodes_at_a_time():
    """Held by a cluster with real nodes: their gateway and DNS addresses are fixed (sim/realnode.py,
    sim/coredns.py), and the `sim` tests run two clusters at once (the ones without the MPI Operator beside the
    others). The lock is on this folder."""
    return folder_locked(Path(__file__).parent)


@contextmanager
def running_sim(stack: str, state: Path, **options) -> Iterator[Sim]:
    """`Sim(stack, state, **options)` up for the block; afterwards every process it started is gone, and its state
    (with real nodes, their bridge and cgroups too)."""
    with _one_with_real_nodes_at_a_time() if options.get("real_nodes") else nullcontext():
        cluster = Sim(stack, state, **options)
        cluster.up(print)
        record = json.loads((cluster.state / realnode.RECORD).read_text()) if options.get("real_nodes") else None
        yield cluster
        started = cluster.supervisor.pids()
        cluster.down()
        assert not cluster.state.exists()
        assert not [name for name, pid in started.items() if alive(pid) and not zombie(pid)]
        if record:
            assert not Path(f"/sys/class/net/{record['bridge']}").exists()
            assert not [h for h in realnode.hierarchies() if (h / record["cgroup"].strip("/")).exists()]
            # kube-proxy's and kube-router's chains and ipsets, and the guard (sim/netpol.py): none left
            assert not netpol.kube_chains() and not netpol.kube_ipsets()
            assert record["bridge"] not in subprocess.run(["iptables-save", "-t", "mangle"], capture_output=True,
                                                          text=True, check=True).stdout


@contextmanager
def real_node_bucket(sim: Sim, config: StackConfig) -> Iterator[LocalAWS]:
    """The sim ready for jobs on its real CPU node for the block: the stack's images in its registry, the CPU pool's
    kwok nodes cordoned (a job lands where containers run), and this process's environment pointed at the sim's own
    S3 endpoint (sim/s3.py, with the stack's bucket), where it reads the checkpoints as the pods wrote them. The pods
    get nothing from the tests: their credentials come from the sim's STS through IRSA's stand-in (sim/irsa.py)."""
    kubectl = sim.kubectl()
    build_images(sim.registry(), config.stack)
    pool = kubectl.run("get", "nodes", "-o", "name", "-l", "karpenter.sh/nodepool=cpu,karpenter.sh/capacity-type=on-demand")
    others = [name for name in pool.split() if name != f"node/{CPU_NODE}"]
    assert others
    kubectl.run("cordon", *others)
    aws = s3.endpoint_of(sim.state)
    assert aws is not None, "`gpuyard sim up --real-nodes` started no S3 endpoint"
    with pytest.MonkeyPatch.context() as env:
        for key, value in {**aws.env, "AWS_DEFAULT_REGION": config.region}.items():
            env.setenv(key, value)
        yield aws


def pod_ended(kubectl, name: str, namespace: str, timeout: float) -> dict:
    """The pod ``name`` once it Succeeded or Failed, or as it is after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        pod = kubectl.get("pod", name, namespace)
        if pod["status"].get("phase") in ("Succeeded", "Failed") or time.monotonic() > deadline:
            return pod
        time.sleep(1)


def jobs_removed(kubectl, namespace: str, timeout: float = 300) -> None:
    """Every job of every kind in ``namespace`` (and KubeRay's RayClusters) deleted and its pods gone, killed after a
    second: what a test that failed mid-run started cannot hold the real node for the tests after it. The jobs
    themselves may linger behind their operators' finalizers (a RayJob's stops its Ray job), holding nothing."""
    kubectl.run("delete", ",".join([*JOB_RESOURCES.values(), "rayclusters.ray.io"]), "--all", "-n", namespace,
                "--wait=false")
    kubectl.run("delete", "pods", "--all", "-n", namespace, "--grace-period=1", "--wait=false")
    deadline = time.monotonic() + timeout
    while left := [pod["metadata"]["name"] for pod in kubectl.items("pods", namespace)]:
        assert time.monotonic() < deadline, f"pods left in {namespace}: {left}"
        time.sleep(1)
