"""The simulated Ray heads' job API (sim/ray_head.py), reached the way KubeRay reaches it: as an HTTP proxy."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from gpuyard.sim.kwok import TRAINING_RUNS_MILLISECONDS
from gpuyard.sim.processes import free_port
from gpuyard.sim.webhooks import wait_listening

HEAD = "http://vision-rayjob-abcde-head-svc.team-vision.svc.cluster.local:8265"


@pytest.fixture(scope="module")
def opener():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gpuyard.sim.ray_head", f"--port={port}"], stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, 30, lambda: None)
        yield urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{port}"}))
    finally:
        server.terminate()
        assert server.wait(10) == 0


def _json(opener, url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    with opener.open(urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}), timeout=5) as reply:
        return json.loads(reply.read())


def test_a_job_runs_as_long_as_a_simulated_training_container_then_is_stopped_never_succeeded(opener):
    first = _json(opener, f"{HEAD}/api/jobs/vision-rayjob-x1y2z")
    assert (first["submission_id"], first["status"], first["end_time"]) == ("vision-rayjob-x1y2z", "RUNNING", 0)
    time.sleep(TRAINING_RUNS_MILLISECONDS / 1000)
    done = _json(opener, f"{HEAD}/api/jobs/vision-rayjob-x1y2z")
    assert done["status"] == "STOPPED" and done["start_time"] == first["start_time"] < done["end_time"]
    assert "no Ray job ran" in done["message"]
    assert _json(opener, f"{HEAD}/api/jobs/another")["status"] == "RUNNING"


def test_a_head_accepts_a_submission_and_a_stop(opener):
    assert _json(opener, f"{HEAD}/api/jobs/", {"entrypoint": "python train.py", "submission_id": "s-1"})["job_id"] == "s-1"
    assert _json(opener, f"{HEAD}/api/jobs/s-1/stop", {}) == {"stopped": True}


@pytest.mark.parametrize("url", [
    "http://pypi.org/simple/",  # no general proxy
    "http://vision-rayjob-abcde-head-svc.team-vision.svc.cluster.local:8080/api/jobs/x",  # not the dashboard port
])
def test_anything_but_a_heads_dashboard_is_refused(opener, url):
    with pytest.raises(urllib.error.HTTPError) as refused:
        _json(opener, url)
    assert refused.value.code == 502
