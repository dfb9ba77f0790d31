"""The control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the kwok
controller, started from the built binaries with every port chosen free at start and written to ``ports.json``.

Flags follow kwokctl's binary runtime (sigs.k8s.io/kwok v0.8.0, pkg/kwokctl/components/kube_apiserver.go,
kube_controller_manager.go, kube_scheduler.go, kwok_controller.go), with our own certificates.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuyard.sim import certs
from gpuyard.sim.processes import Supervisor, free_port

PORTS = "ports.json"
SERVICE_CIDR = "10.96.0.0/12"
# the real nodes' bridge (sim/realnode.py), where sim/relay.py serves the API server to pods: in its certificate
BRIDGE_ADDRESS = "10.244.0.1"
READY_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class ControlPlane:
    state: Path
    bins: dict[str, Path]  # component -> folder of its binaries

    @property
    def supervisor(self) -> Supervisor:
        return Supervisor(self.state)

    @property
    def pki(self) -> certs.Pki:
        return certs.Pki(self.state / "pki")

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    def ports(self) -> dict[str, int]:
        path = self.state / PORTS
        return json.loads(path.read_text()) if path.is_file() else {}

    def _bin(self, component: str, name: str) -> str:
        return str(self.bins[component] / name)

    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports()['apiserver']}"

    def write_kubeconfig(self) -> None:
        pki = self.pki
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "gpuyard-sim",
            "clusters": [{"name": "gpuyard-sim", "cluster": {"server": self.server(),
                                                            "certificate-authority": str(pki.ca)}}],
            "users": [{"name": "admin", "user": {"client-certificate": str(pki.admin_cert),
                                                 "client-key": str(pki.admin_key)}}],
            "contexts": [{"name": "gpuyard-sim", "context": {"cluster": "gpuyard-sim", "user": "admin"}}],
        }
        self.kubeconfig.write_text(yaml.dump(config, Dumper=yaml.CSafeDumper, sort_keys=False))

    def start(self, kwok_config: Path, webhook_services: tuple[str, ...] = (), ca_names: tuple[str, ...] = (),
              kubelets: bool = False) -> None:
        """Start every server (ports chosen now) and wait until the API server is ready; the serving certificate
        is also valid for ``webhook_services`` (in-cluster names some operators check their certificate for). With
        ``kubelets`` (real nodes) the API server reaches kubelets at their InternalIP with the admin's certificate
        (logs, exec)."""
        self.state.mkdir(parents=True, exist_ok=True)
        pki = certs.create(self.state / "pki", webhook_services, ca_names, (BRIDGE_ADDRESS,) if kubelets else ())
        names = ("etcd-client", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok")
        ports = {name: free_port() for name in names}
        (self.state / PORTS).write_text(json.dumps(ports, indent=1) + "\n")
        self.write_kubeconfig()
        run = self.supervisor
        etcd_url = f"http://127.0.0.1:{ports['etcd-client']}"
        run.start("etcd", [
            self._bin("etcd", "etcd"), "--name=sim", f"--data-dir={self.state / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
            f"--initial-cluster=sim=http://127.0.0.1:{ports['etcd-peer']}",
            "--quota-backend-bytes=4294967296", "--unsafe-no-fsync=true", "--log-level=warn",
        ])
        run.start("kube-apiserver", [
            self._bin("kubernetes", "kube-apiserver"), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={ports['apiserver']}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca}", "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--endpoint-reconciler-type=none",
            f"--cert-dir={self.state / 'pki'}",
            *([f"--kubelet-client-certificate={pki.admin_cert}", f"--kubelet-client-key={pki.admin_key}",
               "--kubelet-preferred-address-types=InternalIP",
               # the IRSA stand-in's MutatingAdmissionPolicies (sim/irsa.py): beta in 1.35, off by default
               "--feature-gates=MutatingAdmissionPolicy=true",
               "--runtime-config=admissionregistration.k8s.io/v1beta1=true"] if kubelets else []),
        ])
        self.wait_ready()
        common = [f"--kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1", "--leader-elect=false",
                  "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"]
        run.start("kube-controller-manager", [
            self._bin("kubernetes", "kube-controller-manager"), *common,
            f"--secure-port={ports['controller-manager']}", f"--root-ca-file={pki.ca}",
            f"--service-account-private-key-file={pki.service_account_key}", "--use-service-account-credentials=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
        ])
        run.start("kube-scheduler", [
            self._bin("kubernetes", "kube-scheduler"), *common, f"--secure-port={ports['scheduler']}",
        ])
        run.start("kwok", [
            self._bin("kwok", "kwok"), f"--kubeconfig={self.kubeconfig}", f"--config={kwok_config}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            "--node-ip=127.0.0.1", f"--node-port={ports['kwok']}", f"--server-address=127.0.0.1:{ports['kwok']}",
        ])

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.server() + path, context=self._context(), timeout=5) as response:
            return response.read()

    def healthy(self) -> bool:
        try:
            return self.get("/readyz") == b"ok"
        except OSError:
            return False

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            for name in ("etcd", "kube-apiserver"):
                self.supervisor.check(name)
            if time.monotonic() > deadline:
                raise RuntimeError(f"kube-apiserver not ready after {timeout:.0f}s (see {self.state / 'logs'})")
            time.sleep(0.3)
