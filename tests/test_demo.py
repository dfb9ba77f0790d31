"""``gpuyard demo`` end to end: local S3, torchrun with 2 processes, checkpoints, a summary."""

import os
import re
import socket
import subprocess
import sys

import pytest

from gpuyard.jobs.workload.checkpoint import manifest_name
from workload_launch import REPO

pytestmark = pytest.mark.slow


def test_demo_trains_under_torchrun_checkpoints_to_local_s3_and_summarises(tmp_path):
    manifests = tmp_path / "manifests"
    result = subprocess.run([sys.executable, "-c", "from gpuyard.jobs.cli.main import main; main()", "demo", "-d", str(manifests)],
                            capture_output=True, text=True, cwd=REPO, timeout=300,
                            env={**os.environ, "COLUMNS": "160"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for epoch in (5, 10, 15, 20):
        assert f"epoch {epoch:>3} -> s3://gpuyard-demo/runs/ddp/{manifest_name(64 * epoch)}" in out
    assert re.search(r"epochs\s+│ 20 \(1280 optimizer steps\)", out)
    assert re.search(r"samples/s\s+│ [\d,]+ \(all ranks\)", out)
    assert re.search(r"checkpoints written\s+│ 4 \(every 5 epochs, 0 problems\)", out)
    assert "ckpt-000000640, ckpt-000000960, ckpt-000001280" in out
    assert re.search(r"weights sha256\s+│ [0-9a-f]{64}", out)
    port = int(re.search(r"http://127\.0\.0\.1:(\d+) \(moto, now stopped\)", out).group(1))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)

    files = sorted(manifests.iterdir())
    assert [f.name for f in files] == sorted(
        f"{team}-{kind}.yaml" for team in ("vision", "nlp")
        for kind in ("pytorchjob", "mpijob", "rayjob", "volcanojob", "trainjob"))
    assert all(str(f) in out for f in files)
    assert "kind: PyTorchJob" in (manifests / "vision-pytorchjob.yaml").read_text()
    assert re.search(r"pulumi up --stack dev would create (\d+) resources", out)
    assert re.search(r"kubernetes:helm.sh/v3:Release\s+│\s+\d+", out)


def test_demo_rejects_an_unknown_stack_in_one_line_before_training():
    result = subprocess.run([sys.executable, "-c", "from gpuyard.jobs.cli.main import main; main()", "demo", "--stack", "nope"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("gpuyard: error: Invalid value for '--stack': unknown stack 'nope'")
    assert result.stderr.count("\n") == 1
    assert "torchrun" not in result.stdout


def test_a_failed_training_names_the_workers_exception_not_torchrun_boilerplate():
    from gpuyard.jobs.cli.demo import root_cause

    launcher = "\n".join([
        "[rank1]:     digest.update(...)",
        "[rank1]: RuntimeError: Numpy is not available",
        "E1202 api.py:1002] failed (exitcode: 1) local_rank: 1",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    ])
    assert root_cause(launcher) == "[rank1]: RuntimeError: Numpy is not available"
    assert root_cause("E1202 failed (exitcode: 1)\nerror: no rendezvous") == "error: no rendezvous"
    assert root_cause("") == "see torchrun output"
