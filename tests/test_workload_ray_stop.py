"""The Ray worker's preStop hook (`python -m gpuyard.jobs.workload.ray_stop`, as rendered) with no Ray head to
reach: it ends at once, exit 0, instead of waiting in `ray.init` until the kubelet's grace period runs out. Its
stop of a running trainer is tests/test_workload_ray.py's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

from gpuyard.jobs.workload.args import RAY_STOP_MODULE

TIMEOUT = 240  # the hook's --timeout: far above what it may take here


def _hook(address: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", RAY_STOP_MODULE, "--timeout", str(TIMEOUT)], capture_output=True,
                            text=True, timeout=TIMEOUT + 60, env={**os.environ, "RAY_ADDRESS": address})
    return result, time.monotonic() - started


def test_with_the_head_gone_the_hook_ends_at_once_exit_0():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused
        result, seconds = _hook(address)
    assert result.returncode == 0 and f"ray_stop: no Ray head answers at {address}: nothing to stop" in result.stderr
    assert seconds < 30, seconds


def test_a_head_that_goes_while_the_hook_joins_it_ends_the_hook_exit_0():
    """The head's port accepts at first (a listener that never speaks Ray's protocol: `ray.init` waits on it), then
    closes, as a RayCluster deleted whole takes its head away while the workers' hooks start."""
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"
    threading.Timer(10.0, server.close).start()
    result, seconds = _hook(address)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ray_stop: no Ray head answers at" in result.stderr or "could not join the Ray cluster" in result.stderr, \
        result.stderr[-3000:]
    assert 10 <= seconds < 60, seconds
