"""How KubeRay reaches the real Ray heads of `gpuyard sim up --real-nodes`: an HTTP proxy that forwards, never answers.

KubeRay v1.6.0 runs beside the cluster, not in a pod, and asks a head's dashboard at
``http://<head service>.<namespace>.svc.cluster.local:8265`` (ray-operator/controllers/ray/utils/util.go
FetchHeadServiceURL) with Go's default transport, which honours ``HTTP_PROXY``. That name resolves in the cluster's
DNS only: this proxy asks the sim's CoreDNS for it (the head Service is headless, ray-operator/controllers/ray/common/
service.go BuildServiceForHeadPod, so the answer is the head pod's address on the sim's bridge), sends the request
there as it came and returns the dashboard's response as it came. A name that does not resolve or a head that does
not answer is a 502, as a failed connection would be; anything but a head Service's dashboard port is refused (502).
Its connections come from the bridge's own address, a local one, which kube-router admits to every pod
(cloudnativelabs/kube-router v2.1.0 pkg/controllers/netpol/pod.go: ``--src-type LOCAL``).
"""

from __future__ import annotations

import argparse
import http.client
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

import dns.exception
import dns.resolver

from gpuyard.sim.ray_head import DASHBOARD_PORT, HEAD_SERVICE, serve

TIMEOUT_SECONDS = 30.0
# hop-by-hop headers (RFC 9110 section 7.6.1) and the length, which each side sets for the body it sends
NOT_FORWARDED = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
                 "transfer-encoding", "upgrade", "content-length"}


class Unresolved(OSError):
    """The cluster DNS has no address for a name."""


def resolve(name: str, server: tuple[str, int], timeout: float = 2.0) -> str:
    """The first A record of ``name`` from the DNS server at ``server`` (and nowhere else: no search path)."""
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers, resolver.port, resolver.lifetime = [server[0]], server[1], timeout
    try:
        return resolver.resolve(name, "A", search=False)[0].address
    except dns.exception.DNSException as error:
        raise Unresolved(f"{name}: {error}") from None


class Handler(BaseHTTPRequestHandler):
    """Forwards a request for a head Service's dashboard to the head; 502 for anything else."""

    dns: tuple[str, int] = ("127.0.0.1", 53)

    def _forward(self) -> None:
        url = urlsplit(self.path)
        if not (url.hostname and HEAD_SERVICE.match(url.hostname) and url.port == DASHBOARD_PORT):
            return self._refuse(f"not a Ray head's dashboard: {self.path}")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in NOT_FORWARDED}
        target = url.path + (f"?{url.query}" if url.query else "")
        try:
            head = http.client.HTTPConnection(resolve(url.hostname, self.dns), url.port, timeout=TIMEOUT_SECONDS)
            head.request(self.command, target, body=body or None, headers=headers)
            response = head.getresponse()
            data = response.read()
        except OSError as error:
            return self._refuse(f"{url.hostname}:{url.port}: {error}")
        self.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in NOT_FORWARDED:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self, message: str) -> None:
        data = message.encode()
        self.send_response(502)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815 (http.server's naming)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dns", required=True, help="the cluster DNS server: ADDRESS[:PORT]")
    args = parser.parse_args(argv)
    address, _, port = args.dns.partition(":")
    Handler.dns = (address, int(port or 53))
    serve(Handler, args.port)


if __name__ == "__main__":
    main()
