"""A real local AWS endpoint: ``moto_server`` on 127.0.0.1 (or another local address), as a subprocess.

Used by ``gpuyard demo`` (no cloud account) and by the tests. ``stop()`` and
``start()`` keep the same port, so a test can take the endpoint away for a while.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gpuyard.jobs.processes import die_with_parent, stop_tree

HOST = "127.0.0.1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def moto_command() -> list[str]:
    beside_python = Path(sys.executable).with_name("moto_server")
    found = beside_python if beside_python.exists() else shutil.which("moto_server")
    if not found:
        raise RuntimeError("moto_server not found: pip install 'moto[server]'")
    return [str(found)]


class LocalAWS:
    """moto_server on ``host`` (127.0.0.1 unless told); ``env`` points boto3 (and child processes) at it."""

    def __init__(self, port: int | None = None, log_path: Path | None = None, host: str = HOST):
        self.host = host
        self.port = port or free_port()
        self.log_path = log_path
        self._process: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The moto_server's process id once started (for what measures the server: bench/bench_checkpoint.py)."""
        return self._process.pid if self._process else None

    @property
    def env(self) -> dict[str, str]:
        """Variables that make boto3 talk to this endpoint with dummy credentials."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint_url}

    def client(self, service: str):
        """A boto3 client for ``service`` on this endpoint, whatever this process's environment says."""
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint_url, region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def start(self, timeout: float = 30.0) -> "LocalAWS":
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self._process = subprocess.Popen(
            [*moto_command(), "-H", self.host, "-p", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **CREDENTIALS}, start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            return self._wait_ready(timeout)
        except BaseException:  # not ready, or interrupted while starting: leave nothing behind
            self.stop()
            raise

    def answers(self) -> bool:
        """Whether a moto_server answers at the endpoint (this one or one another process started)."""
        try:
            urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1).close()
            return True
        except OSError:
            return False

    def _wait_ready(self, timeout: float) -> "LocalAWS":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self._process.returncode} on port {self.port}")
            if self.answers():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"moto_server did not answer on {self.endpoint_url} within {timeout:.0f}s")

    def stop(self) -> None:
        """Stop moto_server (its own session: a terminal's Ctrl-C reaches only us) and free the port."""
        if self._process:
            stop_tree(self._process)
        self._process = None

    def __enter__(self) -> "LocalAWS":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
