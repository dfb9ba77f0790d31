"""The preStop hook of a Ray worker pod: stop the trainer at an agreed step before the pod goes.

    python -m gpuyard.jobs.workload.ray_stop [--timeout SECONDS]

The kubelet runs it before it sends SIGTERM and counts it in the pod's grace period. It joins the Ray
cluster through this node's raylet, asks the job's stop flag (``ray_entry.STOP_ACTOR``) to stop in
this node's name and waits until the trainer has stopped, rank 0 having saved that step, or until
``--timeout``. Without a running job (no stop flag) there is nothing to stop, and none without a head:
``ray.init`` waits for a Ray head that has gone for good (Ray 2.60: it retries the GCS with no end), and a
finished RayJob's cluster is deleted whole (``ttlSecondsAfterFinished``), so a hook left waiting would hold
the worker's node until the grace period ends. So the hook ends as soon as the head stops answering at
``RAY_ADDRESS``, which KubeRay gives every Ray container (ray-operator v1.6.0
controllers/ray/common/pod.go: ``<head service FQDN>:<GCS port>`` on workers). Always exits 0: a failing
preStop hook only delays the SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from typing import NoReturn

from gpuyard.jobs.workload.ray_entry import NAMESPACE, POLL_SECONDS, STOP_ACTOR

HEAD_CHECK_SECONDS = 2.0  # a TCP connect to the head's GCS port


def _answers(address: str) -> bool:
    """Whether something accepts a TCP connection at ``address`` (host:port)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=HEAD_CHECK_SECONDS).close()
    except (OSError, ValueError):
        return False
    return True


def _leave(message: str) -> NoReturn:
    sys.stderr.write(f"ray_stop: {message}\n")
    sys.stderr.flush()
    os._exit(0)  # from the watcher too, whatever the main thread waits in


def _watch(address: str, deadline: float) -> NoReturn:
    """End the hook at the deadline, or once the head stops answering."""
    while True:
        if time.monotonic() > deadline:
            _leave("the trainer had not stopped by the timeout")
        if address and not _answers(address):
            _leave(f"no Ray head answers at {address}: nothing to stop")
        time.sleep(POLL_SECONDS)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpuyard.jobs.workload.ray_stop")
    parser.add_argument("--timeout", type=float, default=25.0, help="seconds to wait for the trainer to stop")
    deadline = time.monotonic() + parser.parse_args(argv).timeout
    threading.Thread(target=_watch, args=(os.environ.get("RAY_ADDRESS", ""), deadline), daemon=True).start()

    import ray

    try:
        ray.init(address="auto", namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
    except Exception as error:  # noqa: BLE001 (whatever Ray raised, the SIGTERM comes next)
        _leave(f"could not join the Ray cluster: {error}")
    try:
        flag = ray.get_actor(STOP_ACTOR)
    except ValueError:
        _leave("no trainer runs on this cluster")
    ray.get(flag.request.remote(ray.get_runtime_context().get_node_id()))
    while not ray.get(flag.stopped.remote()):
        time.sleep(POLL_SECONDS)
    _leave("the trainer has stopped")


if __name__ == "__main__":
    main(sys.argv[1:])
