"""The preStop hook of a Ray worker pod: stop the trainer at an agreed step before the pod goes.

    python -m gpuyard.jobs.workload.ray_stop [--timeout SECONDS]

The kubelet runs it before it sends SIGTERM and counts it in the pod's grace period. It joins the Ray
cluster through this node's raylet, asks the job's stop flag (``ray_entry.STOP_ACTOR``) to stop in
this node's name and waits until the trainer has stopped, rank 0 having saved that step, or until
``--timeout``. Without a running job (no stop flag) there is nothing to stop. Always exits 0: a failing
preStop hook only delays the SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
import time

from gpuyard.jobs.workload.ray_entry import NAMESPACE, POLL_SECONDS, STOP_ACTOR


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpuyard.jobs.workload.ray_stop")
    parser.add_argument("--timeout", type=float, default=25.0, help="seconds to wait for the trainer to stop")
    deadline = time.monotonic() + parser.parse_args(argv).timeout

    import ray

    ray.init(address="auto", namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
    try:
        flag = ray.get_actor(STOP_ACTOR)
    except ValueError:
        sys.stderr.write("ray_stop: no trainer runs on this cluster\n")
        return
    ray.get(flag.request.remote(ray.get_runtime_context().get_node_id()))
    while not ray.get(flag.stopped.remote()):
        if time.monotonic() > deadline:
            sys.stderr.write("ray_stop: the trainer had not stopped by the timeout\n")
            return
        time.sleep(POLL_SECONDS)
    sys.stderr.write("ray_stop: the trainer has stopped\n")


if __name__ == "__main__":
    main(sys.argv[1:])
