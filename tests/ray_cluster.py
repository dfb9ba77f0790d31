"""A Ray cluster of real processes for the tests, standing in for a KubeRay RayCluster's pods.

Each node is ``ray start --block`` (as in a KubeRay container) in its own session, on free ports, with
the cluster's own temp dir (a short path: Ray's socket paths are limited). ``stop_node`` ends a node
with its whole process tree, as the kubelet ends a pod after its preStop hook and grace period;
``close`` stops every node, so nothing outlives the test.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuyard.jobs.local_aws import free_port
from gpuyard.jobs.processes import stop_tree

RAY = str(Path(sys.executable).with_name("ray"))
READY = "This command will now block forever"


class RayCluster:
    """A head (no CPUs, like the RayJob template's) and worker nodes on this machine."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env, self.log_dir = env, log_dir
        self.temp_dir = tempfile.mkdtemp(prefix="ry", dir="/tmp")
        self.port, self.dashboard_port = free_port(), free_port()
        self.nodes: list[subprocess.Popen] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start_head(self) -> subprocess.Popen:
        return self._start("head", ["--head", "--port", str(self.port), "--num-cpus", "0", "--include-dashboard",
                                    "true", "--dashboard-host", "127.0.0.1", "--dashboard-port",
                                    str(self.dashboard_port), "--ray-client-server-port", str(free_port()),
                                    "--temp-dir", self.temp_dir])

    def add_node(self, cpus: int) -> subprocess.Popen:
        return self._start(f"node-{len(self.nodes)}", ["--address", self.address, "--num-cpus", str(cpus)])

    def stop_node(self, node: subprocess.Popen) -> None:
        stop_tree(node)

    def close(self) -> None:
        for node in reversed(self.nodes):
            stop_tree(node)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _start(self, name: str, options: list[str], timeout: float = 300, attempts: int = 3) -> subprocess.Popen:
        """``ray start`` of one node, started again on new ports if it exits before it is up, as the kubelet restarts
        a KubeRay container that failed (in CI a head's raylet once did not register within Ray 2's fixed 30 s,
        ray/_private/node.py ``raylet_start_wait_time_s``, while the other test worker started a Ray cluster of its own)."""
        failures = []
        for attempt in range(attempts):
            log = self.log_dir / f"ray-{name}-{attempt}.log"
            node = self._launch(options, log)
            deadline = time.monotonic() + timeout
            while READY not in log.read_text():
                if node.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            else:
                return node
            exited = node.poll() is not None
            stop_tree(node)
            self.nodes.remove(node)
            failures.append(f"attempt {attempt + 1}: {log.read_text()[-1500:]}")
            if not exited:  # still starting after ``timeout``: not a failed start to retry
                break
        raise RuntimeError(f"ray {name} did not start: " + "\n".join(failures))

    def _launch(self, options: list[str], log: Path) -> subprocess.Popen:
        ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port"]
        chosen = distinct_free_ports(len(ports) + 40)
        workers = ",".join(str(port) for port in chosen[len(ports):])
        command = [RAY, "start", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1", *options,
                   *(item for flag, port in zip(ports, chosen) for item in (flag, str(port))), "--worker-port-list",
                   workers]
        node = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True)
        self.nodes.append(node)
        return node


def distinct_free_ports(count: int) -> list[int]:
    """``count`` different free ports (one at a time, the kernel may hand the same free port out twice, which
    ``ray start`` refuses)."""
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    try:
        return [server.getsockname()[1] for server in sockets]
    finally:
        for server in sockets:
            server.close()


def cluster_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment every node (and so every driver and worker) gets: this checkout importable, no usage stats,
    no token authentication (Ray 2.60 turns it on for ``ray start`` clusters; KubeRay configures it per cluster)."""
    repo = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": repo, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra}
