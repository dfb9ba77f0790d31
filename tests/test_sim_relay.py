"""The TCP relay pods reach the API server through (sim/relay.py), run as the sim runs it, against a real server."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from gpuyard.sim.processes import free_port
from gpuyard.sim.webhooks import wait_listening


def _digest_server(listener: socket.socket) -> None:
    """Per connection: read to the client's end of sending, answer the SHA-256 of what came, close."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            digest = hashlib.sha256()
            while data := connection.recv(1 << 16):
                digest.update(data)
            connection.sendall(digest.hexdigest().encode())


@pytest.fixture()
def server() -> Iterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_digest_server, args=(listener,), daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def _relay(target: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    relay = subprocess.Popen([sys.executable, "-m", "gpuyard.sim.relay", f"--listen=127.0.0.1:{port}",
                              f"--to=127.0.0.1:{target}"])
    wait_listening(port, 30, lambda: None if relay.poll() is None else pytest.fail("the relay exited"))
    return relay, port


def _exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(payload)
        client.shutdown(socket.SHUT_WR)  # the server answers only once it saw the end
        answer = b""
        while data := client.recv(1 << 16):
            answer += data
    return answer


def test_bytes_pass_both_ways_as_they_came_and_the_end_of_sending_passes_too(server):
    relay, port = _relay(server)
    try:
        payloads = [b"", b"x", bytes(range(256)) * 40_000]  # 10 MB: many reads of the relay's chunk
        for payload in payloads:
            assert _exchange(port, payload) == hashlib.sha256(payload).hexdigest().encode()
    finally:
        relay.terminate()
        relay.wait(10)


def test_a_target_that_does_not_listen_closes_the_connection_and_the_relay_serves_on():
    closed = free_port()
    relay, port = _relay(closed)
    try:
        for _ in range(2):
            assert _exchange(port, b"hello") == b""
        assert relay.poll() is None
    finally:
        relay.terminate()
        relay.wait(10)
