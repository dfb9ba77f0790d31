"""The README's own-script example ("Checkpoints, resume and the stop in your script") runs as written: a user's
DDP script built on gpuyard's checkpoint library, under torchrun with 2 ranks over gloo, checkpointing to a local
S3 endpoint. Stopped by SIGTERM after its first checkpoint, it saves where it stopped and exits 143; run again, it
resumes there and ends with the weights of a run that was never stopped."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from gpuyard.jobs.local_aws import free_port
from gpuyard.jobs.workload.checkpoint import MANIFEST, step_of
from workload_launch import BIN, REPO, finished, start, wait_for

pytestmark = pytest.mark.slow
STEPS, SAVE_EVERY = 3000, 100
BUCKET = "yard"


def readme_script() -> str:
    """The python block after the paragraph that names this test."""
    readme = (REPO / "README.md").read_text()
    after = readme[readme.index("`tests/test_workload_library.py` runs this block"):]
    return re.search(r"```python\n(.*?)```", after, re.S)[1]


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(readme_script())
    return path


def torchrun(script: Path, job: str, out: Path, aws):
    """The script under torchrun (2 ranks) with the contract's checkpoint folder for ``job``."""
    env = {**aws.env, "GPUYARD_CHECKPOINT_URI": f"s3://{BUCKET}/teams/vision/{job}", "OMP_NUM_THREADS": "1"}
    return start([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                  str(free_port()), str(script), str(STEPS), str(SAVE_EVERY)], out, env)


def ranks(output: str) -> list[dict]:
    lines = [json.loads(line) for line in output.splitlines() if line.startswith('{"rank"')]
    return sorted(lines, key=lambda line: line["rank"])


def manifests(aws, job: str) -> list[int]:
    listed = aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=f"teams/vision/{job}/")
    names = [item["Key"].rsplit("/", 1)[1] for item in listed.get("Contents", [])]
    return sorted(step_of(name) for name in names if name.startswith("ckpt-") and name.endswith(MANIFEST))


def test_the_readme_script_stops_on_sigterm_and_resumes_to_the_weights_of_an_uninterrupted_run(
        script, local_aws, tmp_path):
    local_aws.client("s3").create_bucket(Bucket=BUCKET)
    whole = finished(torchrun(script, "whole", tmp_path / "whole.log", local_aws), tmp_path / "whole.log")
    assert whole.returncode == 0, whole.stdout[-3000:]
    uninterrupted = ranks(whole.stdout)
    assert [(r["step"], r["exit"], r["resumed_from"]) for r in uninterrupted] == [(STEPS, 0, None)] * 2
    assert uninterrupted[0]["weights_sha256"] == uninterrupted[1]["weights_sha256"]
    assert manifests(local_aws, "whole")[-1] == STEPS

    log = tmp_path / "stopped.log"
    run = torchrun(script, "stopped", log, local_aws)
    wait_for(lambda: manifests(local_aws, "stopped"), timeout=120, what="the first checkpoint")
    run.send_signal(signal.SIGTERM)  # as the kubelet signals the container's PID 1: torchrun forwards it
    stopped = ranks(finished(run, log).stdout)
    at = stopped[0]["step"]
    assert [(r["step"], r["exit"]) for r in stopped] == [(at, 143)] * 2, log.read_text()[-3000:]
    assert SAVE_EVERY <= at < STEPS and manifests(local_aws, "stopped")[-1] == at  # saved where every rank stopped

    again = finished(torchrun(script, "stopped", tmp_path / "again.log", local_aws), tmp_path / "again.log")
    assert again.returncode == 0, again.stdout[-3000:]
    resumed = ranks(again.stdout)
    assert [(r["step"], r["exit"], r["resumed_from"]) for r in resumed] == [(STEPS, 0, at)] * 2
    assert {r["weights_sha256"] for r in resumed} == {uninterrupted[0]["weights_sha256"]}
