"""Services and NetworkPolicies on the real nodes of `gpuyard sim up --real-nodes`: kube-proxy v1.35.4 (iptables mode)
and kube-router v2.1.0's firewall controller, one instance each for every real node. The kubelets, containerd and the
pods' bridge all live in the sim's network namespace (sim/realnode.py makes no other), so the rules one instance writes
there serve every real node; a second kube-proxy or kube-router in the same namespace would fight over the same chains.

Both write iptables rules and ipsets in this namespace, which is the host's, so:
- `up` refuses to start them if any ``KUBE-*`` chain or ipset is there already (not ours: `down` removes them all);
- a guard chain of ours (named after the bridge, mangle table) drops whatever the host would forward from the bridge
  to any other interface, and any Service address translated to somewhere off the bridge: nothing routes or NATs out
  of ``10.244.0.0/16`` (kwok's pods have addresses outside it; Services may select them);
- routing into the bridge is enabled on the bridge alone (``net.ipv4.conf.<bridge>.forwarding``, not ``ip_forward``),
  for a pod's Service traffic, which kube-proxy translates to another pod on the same bridge;
- `down` deletes the ``KUBE-*`` chains (and the rules jumping to them) of every table, both families, the ``KUBE-*``
  ipsets and the guard.

CoreDNS runs beside the nodes, not as a pod (it needs the API server on 127.0.0.1), while the stack's ``allow-dns``
policy opens port 53 to kube-system pods labelled ``k8s-app: kube-dns`` only, as on EKS. A Pod object stands for it:
never scheduled (its scheduler does not exist), its ``status.podIP`` CoreDNS's address, so kube-router puts that
address in the policy's ipset (pkg/controllers/netpol/policy.go at v2.1.0 takes any pod with an IP that has not
finished: utils.go isNetPolActionable).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import yaml

from gpuyard.sim import coredns
from gpuyard.sim.controlplane import SERVICE_CIDR
from gpuyard.sim.kube import Kubectl
from gpuyard.sim.processes import Supervisor, free_port

RECORD = "netpol.json"
POD_NETWORK = "10.244.0.0/16"  # sim/realnode.py POD_NETWORK
NODE_ADDRESSES = "10.244.255.0/24"  # sim/realnode.py RealNode.address (the kube-router patch in sim/versions.py)
FAMILIES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle", "raw")
DNS_LABELS = {"k8s-app": "kube-dns"}  # gpuyard.infra.tenancy KUBE_DNS, the allow-dns policy's peer
SYNC_TIMEOUT_SECONDS = 60


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=check, capture_output=True, text=True)


def kube_chains() -> dict[tuple[str, str], list[str]]:
    """(family, table) -> the ``KUBE-*`` chains there."""
    found: dict[tuple[str, str], list[str]] = {}
    for family in FAMILIES:
        for table in TABLES:
            save = _run(f"{family}-save", "-t", table, check=False).stdout
            chains = [line[1:].split()[0] for line in save.splitlines() if line.startswith(":KUBE-")]
            if chains:
                found[(family, table)] = chains
    return found


def kube_ipsets() -> list[str]:
    return [name for name in _run("ipset", "list", "-n").stdout.split() if name.startswith("KUBE-")]


def kube_proxy_config(kubeconfig: Path, node: str) -> dict:
    """KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1, k8s.io/kube-proxy v0.35.4 config/v1alpha1/types.go):
    NodePorts on the real nodes' addresses only (no ``route_localnet``), its servers on 127.0.0.1, the conntrack
    sysctls left as the host has them (0: do not set), no OOM score change (the process may not lower it)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)}, "hostnameOverride": node,
        "mode": "iptables", "clusterCIDR": POD_NETWORK, "detectLocalMode": "ClusterCIDR",
        "nodePortAddresses": [NODE_ADDRESSES], "iptables": {"localhostNodePorts": False, "masqueradeAll": False,
                                                             "syncPeriod": "30s", "minSyncPeriod": "1s"},
        "bindAddress": "127.0.0.1", "healthzBindAddress": f"127.0.0.1:{free_port()}",
        "metricsBindAddress": f"127.0.0.1:{free_port()}", "oomScoreAdj": 0,
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                      "udpTimeout": "0s", "udpStreamTimeout": "0s"},
    }


def dns_stand_in() -> dict:
    """The kube-system Pod that stands for CoreDNS (see the module's docstring)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "coredns", "namespace": "kube-system", "labels": dict(DNS_LABELS)},
            "spec": {"schedulerName": "gpuyard-sim-not-scheduled", "automountServiceAccountToken": False,
                     "containers": [{"name": "coredns", "image": "registry.k8s.io/coredns/coredns:v1.15.0",
                                     "resources": {"limits": {"cpu": "100m", "memory": "128Mi"}},
                                     "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                                         "capabilities": {"drop": ["ALL"]},
                                                         "seccompProfile": {"type": "RuntimeDefault"}}}]}}


def _guard(bridge: str) -> list[list[str]]:
    """The guard chain's rules, jumped to from mangle's FORWARD and POSTROUTING (before filter's FORWARD, where
    kube-router ACCEPTs, and nat's POSTROUTING; in POSTROUTING the first rule sees forwarded packets only)."""
    return [["-i", bridge, "!", "-o", bridge, "-j", "DROP"],
            ["-m", "conntrack", "--ctstate", "DNAT", "--ctorigdst", SERVICE_CIDR, "!", "-o", bridge, "-j", "DROP"]]


def start(state: Path, bridge: str, node: str, bins: dict[str, Path], kubeconfig: Path, kubectl: Kubectl,
          supervisor: Supervisor) -> None:
    """Guard, forwarding on the bridge, kube-proxy and kube-router (recorded first, so `down` cleans up after a
    failure), then the DNS stand-in."""
    foreign = kube_chains(), kube_ipsets()
    if any(foreign):
        raise RuntimeError(f"KUBE-* chains or ipsets exist already ({foreign}): another kube-proxy or kube-router, "
                           "or a sim not torn down, uses this network namespace; not starting ours beside it")
    folder = state / "netpol"
    folder.mkdir(parents=True, exist_ok=True)
    (state / RECORD).write_text(json.dumps({"bridge": bridge}) + "\n")
    _run("iptables", "-t", "mangle", "-N", bridge)
    for rule in _guard(bridge):
        _run("iptables", "-t", "mangle", "-A", bridge, *rule)
    for chain in ("FORWARD", "POSTROUTING"):
        _run("iptables", "-t", "mangle", "-I", chain, "-j", bridge)
    Path(f"/proc/sys/net/ipv4/conf/{bridge}/forwarding").write_text("1\n")
    (folder / "kube-proxy.yaml").write_text(yaml.safe_dump(kube_proxy_config(kubeconfig, node)))
    path = {"PATH": "/usr/sbin:/sbin:/usr/bin:/bin"}
    supervisor.start("kube-proxy", [str(bins["kubernetes-node"] / "kube-proxy"),
                                    f"--config={folder / 'kube-proxy.yaml'}"], env=path)
    # cloudnativelabs/kube-router v2.1.0 pkg/options/options.go: the firewall only; no health or metrics server
    # (the health server would listen on every interface)
    supervisor.start("kube-router", [
        str(bins["kube-router"] / "kube-router"), f"--kubeconfig={kubeconfig}", f"--hostname-override={node}",
        "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}", "--health-port=0", "--metrics-port=0"], env=path)
    kubectl.apply([dns_stand_in()])
    kubectl.run("patch", "pod", "coredns", "-n", "kube-system", "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": {"phase": "Running", "podIP": coredns.ADDRESS,
                                       "podIPs": [{"ip": coredns.ADDRESS}]}}))
    deadline = time.monotonic() + SYNC_TIMEOUT_SECONDS
    while not {"KUBE-SERVICES", "KUBE-ROUTER-FORWARD"} <= {c for cs in kube_chains().values() for c in cs}:
        supervisor.check("kube-proxy")
        supervisor.check("kube-router")
        if time.monotonic() > deadline:
            raise RuntimeError(f"kube-proxy and kube-router: no rules after {SYNC_TIMEOUT_SECONDS}s "
                               f"(see {supervisor.logs})")
        time.sleep(0.5)


def stop_all(state: Path) -> None:
    """After the supervisor stopped kube-proxy and kube-router: remove every KUBE-* rule, chain and ipset, and the
    guard of the bridge the record names (only one `sim up` made: start refuses to run beside others)."""
    path = state / RECORD
    if not path.is_file():
        return
    bridge = json.loads(path.read_text())["bridge"]
    for family in FAMILIES:
        for table in TABLES:
            save = _run(f"{family}-save", "-t", table, check=False).stdout.splitlines()
            ours = [line[1:].split()[0] for line in save if line.startswith((":KUBE-", f":{bridge} "))]
            for line in save:  # the jumps from the built-in chains into ours
                words = shlex.split(line)
                if words[:1] == ["-A"] and not words[1].startswith("KUBE-") and words[1] != bridge \
                        and "-j" in words and words[words.index("-j") + 1] in ours:
                    _run(family, "-t", table, "-D", *words[1:])
            for flag in ("-F", "-X"):
                for chain in ours:
                    _run(family, "-t", table, flag, chain)
    for name in kube_ipsets():
        _run("ipset", "destroy", name)
    path.unlink()
