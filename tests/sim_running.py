"""A simulated cluster for one test module: started once, and stopped with no process or state left behind."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuyard.sim import netpol, realnode
from gpuyard.sim.cluster import Sim
from gpuyard.sim.processes import alive, zombie


@contextmanager
def running_sim(stack: str, state: Path, **options) -> Iterator[Sim]:
    """`Sim(stack, state, **options)` up for the block; afterwards every process it started is gone, and its state
    (with real nodes, their bridge and cgroups too)."""
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


def pod_ended(kubectl, name: str, namespace: str, timeout: float) -> dict:
    """The pod ``name`` once it Succeeded or Failed, or as it is after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        pod = kubectl.get("pod", name, namespace)
        if pod["status"].get("phase") in ("Succeeded", "Failed") or time.monotonic() > deadline:
            return pod
        time.sleep(1)
