"""The proxy KubeRay reaches real Ray heads through (sim/ray_proxy.py), run as the sim runs it: a head Service's name
resolved by a DNS server, the request forwarded to that address as it came, the answer returned as it came.

The DNS server and the "head" here are the test's own small servers on 127.0.0.1 (the sim's are CoreDNS and a Ray
dashboard: tests/test_sim_real_ray.py): they stand for the world the proxy works in, and what the test checks is
that the proxy adds nothing of its own.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dns.message
import dns.rcode
import dns.rrset
import pytest

from gpuyard.sim.processes import free_port
from gpuyard.sim.ray_proxy import Unresolved, resolve
from gpuyard.sim.webhooks import wait_listening

HEAD_NAME = "vision-ray-abcde-head-svc.team-vision.svc.cluster.local"


def _answer(wire: bytes) -> bytes:
    """The response to the query ``wire``: HEAD_NAME's A record 127.0.0.1, NXDOMAIN for any other name."""
    query = dns.message.from_wire(wire)
    response = dns.message.make_response(query)
    question = query.question[0]
    if question.name.to_text(omit_final_dot=True) == HEAD_NAME:
        response.answer.append(dns.rrset.from_text(question.name, 5, "IN", "A", "127.0.0.1"))
    else:
        response.set_rcode(dns.rcode.NXDOMAIN)
    return response.to_wire()


@pytest.fixture
def dns_server() -> Iterator[tuple[str, int]]:
    """Answers HEAD_NAME with 127.0.0.1, every other name with NXDOMAIN."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))

        def serve() -> None:
            while True:
                try:
                    query, peer = sock.recvfrom(512)
                except OSError:
                    return
                sock.sendto(_answer(query), peer)

        threading.Thread(target=serve, daemon=True).start()
        yield sock.getsockname()


class Dashboard(BaseHTTPRequestHandler):
    """Says back what it was asked: method, path, the Host header and the body, in its own status and header."""

    def _echo(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        data = json.dumps({"method": self.command, "path": self.path, "host": self.headers["Host"], "body": body}).encode()
        self.send_response(201)
        self.send_header("X-Ray", "head")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _echo  # noqa: N815

    def log_message(self, *args) -> None:
        pass


def test_resolve_reads_the_a_record_and_names_a_name_without_one(dns_server):
    assert resolve(HEAD_NAME, dns_server) == "127.0.0.1"
    with pytest.raises(Unresolved, match="does not exist"):
        resolve("missing.team-vision.svc.cluster.local", dns_server)


@pytest.fixture
def proxied(dns_server) -> Iterator[urllib.request.OpenerDirector]:
    """The proxy on a free port, asking ``dns_server``; an opener that goes through it."""
    port = free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "gpuyard.sim.ray_proxy", f"--port={port}",
                              f"--dns={dns_server[0]}:{dns_server[1]}"], stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, 30, lambda: None)
        yield urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{port}"}))
    finally:
        proxy.terminate()
        assert proxy.wait(10) == 0


@pytest.fixture
def head() -> Iterator[int]:
    """The echoing "dashboard" on 127.0.0.1 (where the DNS server sends HEAD_NAME) at the dashboard's port, 8265,
    or the test is skipped when something else holds that port."""
    try:
        server = ThreadingHTTPServer(("127.0.0.1", 8265), Dashboard)
    except OSError as error:
        pytest.skip(f"port 8265 is taken here: {error}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield 8265
    server.shutdown()
    server.server_close()


def test_a_request_for_a_heads_dashboard_reaches_the_head_and_its_answer_comes_back_unchanged(proxied, head):
    request = urllib.request.Request(f"http://{HEAD_NAME}:{head}/api/jobs/x/stop?force=1", data=b'{"a": 1}',
                                     headers={"Content-Type": "application/json"})
    with proxied.open(request, timeout=10) as reply:
        assert (reply.status, reply.headers["X-Ray"]) == (201, "head")
        assert json.loads(reply.read()) == {"method": "POST", "path": "/api/jobs/x/stop?force=1",
                                            "host": f"{HEAD_NAME}:{head}", "body": '{"a": 1}'}


@pytest.mark.parametrize("url", [
    "http://pypi.org/simple/",  # no general proxy
    f"http://{HEAD_NAME}:8080/api/jobs/x",  # not the dashboard port
    "http://missing-head-svc.team-vision.svc.cluster.local:8265/api/jobs/x",  # no such Service: no answer made up
])
def test_anything_but_a_reachable_heads_dashboard_is_a_502_never_an_answer(proxied, url):
    with pytest.raises(urllib.error.HTTPError) as refused:
        proxied.open(url, timeout=10)
    assert refused.value.code == 502
