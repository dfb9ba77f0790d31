"""sim/kube.py's reads against an API server that is slow to answer: real kubectl, a stand-in server shaping the
answers (the status a busy kube-apiserver sends), so that the retry is of kubectl's own error text."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuyard.sim.cluster import Sim
from gpuyard.sim.kube import Kubectl, KubectlError

KUBECTL = shutil.which("kubectl") or Sim("dev").kubectl_binary()
DISCOVERY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": ["get", "list"]}]},
}
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}}


def _status(code: int, reason: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": f"stand-in {reason}",
            "reason": reason, "code": code}


class _Server(ThreadingHTTPServer):
    """Answers discovery, and the pod ``p`` with ``answers`` in turn (then the pod)."""

    def __init__(self, answers: list[tuple[int, str]]):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers, self.reads = list(answers), 0


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self):  # noqa: N802 (http.server's name)
        path = self.path.split("?")[0]
        code, body = 404, _status(404, "NotFound")
        if path in DISCOVERY:
            code, body = 200, DISCOVERY[path]
        elif path == "/api/v1/namespaces/default/pods/p":
            self.server.reads += 1
            code, reason = self.server.answers.pop(0) if self.server.answers else (200, "")
            body = POD if code == 200 else _status(code, reason)
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def _kubectl(tmp_path: Path, answers: list[tuple[int, str]]) -> tuple[Kubectl, _Server]:
    server = _Server(answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
              "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}]}
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    return Kubectl(Path(KUBECTL), tmp_path / "kubeconfig"), server


pytestmark = pytest.mark.skipif(not Path(KUBECTL).is_file(), reason="no kubectl on PATH nor a gpuyard sim build")


def test_a_read_the_server_timed_out_is_asked_again_until_it_answers(tmp_path):
    kubectl, server = _kubectl(tmp_path, [(504, "Timeout"), (503, "ServiceUnavailable")])
    try:
        assert kubectl.get("pod", "p", "default") == POD
        assert server.reads == 3
    finally:
        server.shutdown()


def test_a_refusal_is_not_asked_again(tmp_path):
    kubectl, server = _kubectl(tmp_path, [(403, "Forbidden")])
    try:
        with pytest.raises(KubectlError, match="Forbidden"):
            kubectl.get("pod", "p", "default")
        assert server.reads == 1
    finally:
        server.shutdown()
