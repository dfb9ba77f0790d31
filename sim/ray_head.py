"""The Ray job API of the simulated cluster's Ray heads: what KubeRay asks a head's dashboard, answered on 127.0.0.1.

kwok runs no containers, so a RayCluster's head pod serves no dashboard. KubeRay v1.6.0 follows a RayJob by asking
``http://<head service>.<namespace>.svc.<cluster domain>:8265/api/jobs/<id>`` with Go's default transport
(ray-operator/controllers/ray/utils/util.go, GetRayDashboardClientFunc and FetchHeadServiceURL), which honours
``HTTP_PROXY``: a simulation without real nodes starts KubeRay with ``HTTP_PROXY`` pointing here (with real nodes,
KubeRay runs in a pod and asks the real heads, sim/kuberay.py). A job runs from the first time it is asked about
for as long as kwok runs a simulated training container (sim/kwok.py), then is STOPPED, never
SUCCEEDED: no Ray job ran, and a stand-in never reports an outcome. STOPPED is terminal for KubeRay
(ray-operator/apis/ray/v1/rayjob_types.go, IsJobTerminal), which then
ends the RayJob and deletes its RayCluster (controllers/ray/rayjob_controller.go), freeing the nodes as a finished
job would. Requests for any other host are refused: this is no general proxy.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from gpuyard.sim.kwok import TRAINING_RUNS_MILLISECONDS

DASHBOARD_PORT = 8265  # KubeRay's DefaultDashboardPort (ray-operator/controllers/ray/utils/constant.go)
HEAD_SERVICE = re.compile(r"^[a-z0-9-]+-head-svc\.[a-z0-9-]+\.svc\.[a-z0-9.-]+$")
JOB = re.compile(r"^/api/jobs/([A-Za-z0-9_.-]+)$")
STOP = re.compile(r"^/api/jobs/([A-Za-z0-9_.-]+)/stop$")


class Jobs:
    """Ray jobs as the heads report them: RUNNING for as long as kwok lets a training container run, then STOPPED."""

    def __init__(self) -> None:
        self._started: dict[str, int] = {}
        self._lock = threading.Lock()

    def info(self, job_id: str) -> dict:
        """The fields KubeRay reads, times in ms (ray-operator/controllers/ray/utils/types/dashboard_httpclient.go,
        RayJobInfo)."""
        now = int(time.time() * 1000)
        with self._lock:
            started = self._started.setdefault(job_id, now)
        done = now - started >= TRAINING_RUNS_MILLISECONDS
        return {"job_id": job_id, "submission_id": job_id, "entrypoint": "", "start_time": started,
                "status": "STOPPED" if done else "RUNNING", "end_time": now if done else 0,
                "message": "gpuyard sim: no Ray job ran (kwok runs no containers)" if done else "Job is running."}


JOBS = Jobs()


class Handler(BaseHTTPRequestHandler):
    """Answers the job API for a head service's dashboard port; 502 for anything else."""

    def _target(self) -> str | None:
        url = urlsplit(self.path)
        if url.hostname and HEAD_SERVICE.match(url.hostname) and url.port == DASHBOARD_PORT:
            return url.path
        self._reply(502, {"error": f"not a Ray head's dashboard: {self.path}"})
        return None

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self._target()
        if path is None:
            return
        match = JOB.match(path)
        self._reply(200, JOBS.info(match.group(1))) if match else self._reply(404, {"error": path})

    def do_POST(self) -> None:  # noqa: N802
        path = self._target()
        if path is None:
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if path.rstrip("/") == "/api/jobs":  # HTTPMode submission
            job_id = body.get("submission_id") or f"raysubmit_{int(time.time())}"
            self._reply(200, {"job_id": job_id, "submission_id": job_id})
        elif STOP.match(path):
            self._reply(200, {"stopped": True})
        else:
            self._reply(404, {"error": path})


def serve(handler: type[BaseHTTPRequestHandler], port: int) -> None:
    """Serve ``handler`` on 127.0.0.1:``port`` until SIGTERM (the sim's supervisor stops it so)."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with server:
        server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    serve(Handler, parser.parse_args(argv).port)


if __name__ == "__main__":
    main()
