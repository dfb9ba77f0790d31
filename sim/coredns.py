"""The cluster DNS of `gpuyard sim up --real-nodes`: CoreDNS with its kubernetes plugin, on an address of the sim's
bridge that every pod reaches; the kubelets' ``clusterDNS`` (sim/realnode.py) names it.

It answers for ``cluster.local`` and the reverse zones only (coredns v1.15.0 plugin/kubernetes/README.md), forwards
nothing (nothing may leave the bridge), and serves what the API server holds: a Service's ClusterIP, and for a
headless Service (the Training Operator's per-replica Services) its ready pods' addresses from the EndpointSlices.
A ClusterIP reaches its pods through kube-proxy (sim/netpol.py); headless names are the pods' own addresses.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from gpuyard.sim.processes import Supervisor, free_port

NAME = "coredns"
DOMAIN = "cluster.local"  # the kubelets' clusterDomain
ADDRESS = "10.244.255.254"  # on the sim's bridge (sim/realnode.py POD_NETWORK): the kubelets' clusterDNS
READY_TIMEOUT_SECONDS = 60


def corefile(kubeconfig: Path, ready_port: int) -> str:
    """One server block on ADDRESS:53; ``ready`` (plugin/ready) answers 200 once the kubernetes plugin has synced
    its informers. ``pods insecure`` gives the A records of pod addresses (1-2-3-4.ns.pod.cluster.local) as
    kube-dns does."""
    return f"""{DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {ADDRESS}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
    }}
    cache 5
}}
"""


def start(supervisor: Supervisor, binary: Path, folder: Path, kubeconfig: Path) -> None:
    """CoreDNS with the cluster's admin kubeconfig (as the other controllers of the sim), until it is ready."""
    folder.mkdir(parents=True, exist_ok=True)
    ready_port = free_port()
    (folder / "Corefile").write_text(corefile(kubeconfig, ready_port))
    supervisor.start(NAME, [str(binary), "-conf", str(folder / "Corefile")])
    supervisor.wait_until(NAME, lambda: _ready(ready_port), READY_TIMEOUT_SECONDS, "CoreDNS's ready endpoint")


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False
