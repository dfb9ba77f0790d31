import subprocess
import sys
import time
from pathlib import Path

from gpuyard.jobs.local_aws import LocalAWS
from gpuyard.jobs.processes import alive


def test_moto_server_serves_s3_and_keeps_its_port_across_restart(tmp_path):
    aws = LocalAWS(log_path=tmp_path / "moto.log").start()
    try:
        s3 = aws.client("s3")
        s3.create_bucket(Bucket="ckpt")
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["ckpt"]
        port = aws.port
        aws.stop()
        aws.start()
        assert aws.port == port
        assert s3.list_buckets()["Buckets"] == []  # a restarted moto_server starts empty
    finally:
        aws.stop()


def test_moto_server_ends_with_a_parent_killed_without_cleanup(tmp_path):
    """SIGKILL leaves no finally block to run (a pytest-xdist worker torn down, an OOM kill): the server goes anyway."""
    parent = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom gpuyard.jobs.local_aws import LocalAWS\n"
                               "aws = LocalAWS().start()\nprint(aws._process.pid, flush=True)\ntime.sleep(300)"],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    try:
        server = int(parent.stdout.readline())
        assert alive(server)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(server)
