"""Real nodes for `gpuyard sim up --real-nodes`: a kubelet and containerd (with runc) per node, pods in network
namespaces on a bridge the sim makes, cgroups nested under this process's own.

Each node stands for one node of a stack's pool: the kubelet registers under that node's name with its taints, then
the sim gives it the pool's labels and advertises its GPUs as the extended resource ``nvidia.com/gpu`` in the node's
status capacity (the kubelet keeps extended resources it finds there and copies them to allocatable:
k8s.io/kubernetes v1.35.4 pkg/kubelet/nodestatus/setters.go, MachineInfo). Its containers run on the CPU.

Isolation, so that a node leaves nothing behind and touches nothing it did not make:
- containerd and the kubelet share a mount namespace of their own (`unshare --mount`), with tmpfs over ``/run`` and
  ``/var/log`` (containerd v2.4.2 keeps its shims' sockets under /run/containerd/s, the kubelet links container logs
  in /var/log/containers: pkg/shim/util_unix.go, pkg/kubelet/kuberuntime/kuberuntime_manager.go); it ends with
  its last process.
- The kernel settings the kubelet would otherwise write on the host (vm.overcommit_memory, kernel.panic,
  kernel.panic_on_oops, ...: pkg/kubelet/cm/container_manager_linux.go setupKernelTunables) read, in that mount
  namespace only, as files holding the values it wants; the host's are left as they are.
- Every process of a node (containerd, the kubelet, the shims, the containers) lives in a cgroup under this process's
  own (cgroup v1 here: ``failCgroupV1: false``); `down` kills what is left there and removes those cgroups.
- The bridge has the pod network's first address and each node one more; nothing forwards or NATs beyond it (the
  CNI bridge plugin is no gateway and masquerades nothing; Service traffic, which kube-proxy translates, stays on
  the bridge: sim/netpol.py), the kubelets listen on their bridge addresses.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from gpuyard.infra.conventions import LABEL_CAPACITY_TYPE, LABEL_NODEPOOL, NODEPOOL_CPU
from gpuyard.sim import certs, coredns
from gpuyard.sim.controlplane import BRIDGE_ADDRESS, SERVICE_CIDR
from gpuyard.sim.kube import Kubectl, KubectlError
from gpuyard.sim.nodes import SHAPES
from gpuyard.sim.processes import Supervisor, free_port
from gpuyard.sim.registry import storage_dir

RECORD = "real-nodes.json"
POD_NETWORK = "10.244.0.0/16"
GATEWAY = BRIDGE_ADDRESS  # the bridge's own address
CGROUPS = Path("/sys/fs/cgroup")
RUN = "/run/gpuyard"  # in a node's mount namespace (a tmpfs): containerd's socket and state
# The values the kubelet wants (k8s.io/component-helpers/node/util/sysctl, used by setupKernelTunables)
KERNEL_TUNABLES = {"vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10, "kernel/panic_on_oops": 1,
                   "kernel/keys/root_maxkeys": 1000000, "kernel/keys/root_maxbytes": 25000000}
READY_TIMEOUT_SECONDS = 120
EVICTION_MEMORY = "100Mi"
CPU_NODES = 1  # real nodes of the CPU NodePool besides the GPU ones (real_manifests)


def bridge_name(state: Path) -> str:
    """The cluster's bridge, named after its state folder (15 characters at most)."""
    return "gysim" + hashlib.sha256(str(state).encode()).hexdigest()[:8]


def gateway_holder(own: str) -> str | None:
    """The link other than ``own`` with GATEWAY on it (another real-node cluster's bridge), if any: two such clusters
    would route the same pod network and cluster DNS address (coredns.ADDRESS) on two bridges."""
    listing = subprocess.run(["ip", "-o", "-4", "addr", "show"], check=True, capture_output=True, text=True).stdout
    return next((fields[1] for fields in map(str.split, listing.splitlines())
                 if f"{GATEWAY}/16" in fields and fields[1] != own), None)


def _own_cgroup() -> str:
    """This process's cgroup path in the memory hierarchy (the one the machine nests us in)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    raise RuntimeError("no memory cgroup in /proc/self/cgroup: real nodes need cgroup v1's memory controller")


def hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (the kubelet's cgroupfs driver uses each)."""
    return sorted(p for p in CGROUPS.iterdir() if p.name != "unified" and (p / "cgroup.procs").is_file())


def make_cgroup(path: str) -> None:
    """``path`` in every hierarchy; new cpuset levels get their parent's CPUs and memory nodes."""
    for hierarchy in hierarchies():
        current = hierarchy
        for part in path.strip("/").split("/"):
            parent, current = current, current / part
            if not current.is_dir():
                current.mkdir()
                for name in ("cpuset.cpus", "cpuset.mems"):
                    if (parent / name).is_file():
                        (current / name).write_text((parent / name).read_text())


@dataclass(frozen=True)
class Network:
    """The sim's bridge for pods and kubelets, in the network namespace the sim runs in."""

    name: str

    def create(self) -> None:
        for command in (["link", "add", self.name, "type", "bridge"],
                        ["addr", "add", f"{GATEWAY}/16", "dev", self.name],
                        ["link", "set", self.name, "up"]):
            subprocess.run(["ip", *command], check=True, capture_output=True, text=True)

    def add_address(self, address: str) -> None:
        subprocess.run(["ip", "addr", "add", f"{address}/16", "dev", self.name], check=True, capture_output=True)

    def remove(self) -> None:
        if Path(f"/sys/class/net/{self.name}").exists():
            subprocess.run(["ip", "link", "del", self.name], check=True, capture_output=True)


@dataclass(frozen=True)
class RealNode:
    """Node ``index`` of the cluster in ``state``, standing for the pool node ``manifest`` (sim/nodes.py)."""

    state: Path
    index: int
    manifest: dict[str, Any]
    cgroup_root: str  # the cluster's cgroup (under this process's)

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    @property
    def folder(self) -> Path:
        return self.state / "nodes" / str(self.index)  # short: the kubelet's sockets live below (108 bytes at most)

    @property
    def address(self) -> str:
        return f"10.244.255.{self.index + 1}"

    @property
    def cgroup(self) -> str:
        return f"{self.cgroup_root}/{self.name}"

    def _procs_files(self) -> list[str]:
        return [str(h / self.cgroup.strip("/") / "runtime" / "cgroup.procs") for h in hierarchies()]

    def write_files(self, bins: dict[str, Path], pki: certs.Pki, server: str, registry: str, pause: str,
                    bridge: str) -> None:
        folder = self.folder
        for sub in ("cni", "sysctl", f"certs.d/{registry}", "kubelet", "pod-logs", "opt"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        for name, value in KERNEL_TUNABLES.items():
            (folder / "sysctl" / name.replace("/", ".")).write_text(f"{value}\n")
        # containerd v2.4.2's registry hosts (docs/hosts.md): the sim's registry speaks plain HTTP
        (folder / "certs.d" / registry / "hosts.toml").write_text(
            f'server = "http://{registry}"\n\n[host."http://{registry}"]\n  capabilities = ["pull", "resolve"]\n')
        (folder / "cni" / "10-gpuyard.conflist").write_text(json.dumps(self.cni_config(bridge), indent=1))
        (folder / "containerd.toml").write_text(self.containerd_config(bins, pause))
        seed_content(self.folder / "containerd")
        cert, key = certs.client(pki, f"node-{self.name}", f"system:node:{self.name}", "system:nodes")
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "sim", "cluster": {"server": server, "certificate-authority": str(pki.ca)}}],
            "users": [{"name": "node", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "sim", "user": "node"}}],
        }
        (folder / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        (folder / "kubelet.yaml").write_text(yaml.safe_dump(self.kubelet_config(pki)))

    def cni_config(self, bridge: str) -> dict[str, Any]:
        """containernetworking/plugins v1.10.0 bridge + host-local (plugins/main/bridge/README.md): this node's
        /24 of the pod network; no gateway role, no masquerading. The one route besides the bridge's own network:
        the Service addresses, through the bridge's address, where kube-proxy translates them (sim/netpol.py;
        pkg/ipam/ipam_linux.go ConfigureIface gives a route without ``gw`` the range's gateway)."""
        return {"cniVersion": "1.0.0", "name": "gpuyard-sim", "plugins": [{
            "type": "bridge", "bridge": bridge, "isGateway": False, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(self.folder / "ipam"), "ranges": [[{
                "subnet": POD_NETWORK, "rangeStart": f"10.244.{self.index}.2", "rangeEnd": f"10.244.{self.index}.254",
                "gateway": GATEWAY,
            }]], "routes": [{"dst": SERVICE_CIDR}]},
        }]}

    def containerd_config(self, bins: dict[str, Path], pause: str) -> str:
        """containerd v2.4.2's config (version 3; internal/cri/config/config.go for the CRI keys)."""
        q = json.dumps  # TOML basic strings share JSON's escapes
        return f"""version = 3
root = {q(str(self.folder / "containerd"))}
state = {q(RUN + "/containerd")}
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = {q(RUN + "/containerd.sock")}

# no collection at start: it would drop the blobs seed_content linked in before a pull finds them
[plugins."io.containerd.gc.v1.scheduler"]
  startup_delay = "24h"

[plugins."io.containerd.internal.v1.opt"]
  path = {q(str(self.folder / "opt"))}

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_cdi = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{q(str(bins["cni-plugins"]))}]
    conf_dir = {q(str(self.folder / "cni"))}
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {q(str(bins["runc"] / "runc"))}
        Root = {q(RUN + "/runc")}
        SystemdCgroup = false

[plugins."io.containerd.cri.v1.images"]
  discard_unpacked_layers = true
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {q(pause)}
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = {q(str(self.folder / "certs.d"))}
"""

    def kubelet_config(self, pki: certs.Pki) -> dict[str, Any]:
        """KubeletConfiguration (kubelet.config.k8s.io/v1beta1, k8s.io/kubelet v0.35.4 config/v1beta1/types.go)."""
        shape = SHAPES[self.manifest["metadata"]["labels"]["node.kubernetes.io/instance-type"]]
        allocatable = self.manifest["status"]["allocatable"]
        # memory beyond the shape's allocatable is reserved (the machine has more than a g5.xlarge; CPU it cannot add)
        target_kib = int(allocatable["memory"].removesuffix("Mi")) * 1024
        reserved_kib = max(_memtotal_kib() - target_kib - int(EVICTION_MEMORY.removesuffix("Mi")) * 1024, 0)
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup,
            "address": self.address, "port": free_port(), "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(pki.ca)}},
            "authorization": {"mode": "AlwaysAllow"},  # only clients with a certificate of the cluster's CA get in
            "containerRuntimeEndpoint": f"unix://{RUN}/containerd.sock",
            # the sim's CoreDNS (sim/coredns.py): pods of dnsPolicy ClusterFirst get it and the cluster's search path
            "clusterDNS": [coredns.ADDRESS], "clusterDomain": coredns.DOMAIN,
            "podLogsDir": str(self.folder / "pod-logs"), "resolvConf": "", "failSwapOn": False,
            "makeIPTablesUtilChains": False, "maxPods": shape.max_pods,
            "registerWithTaints": self.manifest["spec"].get("taints", []),
            "systemReserved": {"memory": f"{reserved_kib}Ki"},
            # the machine's disk is shared and nearly full (the unpacked ddp image leaves about 2 GB, under the 1%
            # of a 252 GB disk): evict only when it is all but gone, and collect no images
            "evictionHard": {"memory.available": EVICTION_MEMORY, "nodefs.available": "100Mi",
                             "imagefs.available": "100Mi", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            # others' builds fill and free the shared disk by gigabytes within minutes: a pressure that has passed
            # lets pods in again after 30 s, not the default 5 min
            "evictionPressureTransitionPeriod": "30s",
        }

    def start(self, supervisor: Supervisor, bins: dict[str, Path]) -> None:
        """containerd in a new mount namespace, then the kubelet in the same one."""
        make_cgroup(f"{self.cgroup}/runtime")
        join = "; ".join(f"echo $$ > {shlex.quote(path)}" for path in self._procs_files())
        binds = "; ".join(
            f"mount --bind {shlex.quote(str(self.folder / 'sysctl' / name.replace('/', '.')))} /proc/sys/{name}"
            for name in KERNEL_TUNABLES)
        script = (f"set -e; {join}; mount -t tmpfs -o mode=755 tmpfs /run; mkdir -p {RUN}; "
                  f"mount -t tmpfs -o mode=755 tmpfs /var/log; {binds}; "
                  f"exec {shlex.quote(str(bins['containerd'] / 'containerd'))} "
                  f"--config {shlex.quote(str(self.folder / 'containerd.toml'))}")
        path = f"{bins['containerd']}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        pid = supervisor.start(f"containerd-{self.name}",
                               ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
                               env={"PATH": path})
        socket = f"{RUN}/containerd.sock"
        in_namespace = ["nsenter", f"--target={pid}", "--mount", "--", "test", "-S", socket]
        _wait(lambda: subprocess.run(in_namespace).returncode == 0, 60, f"containerd of {self.name}",
              lambda: supervisor.check(f"containerd-{self.name}"))
        kubelet = [str(bins["kubernetes-node"] / "kubelet"), f"--config={self.folder / 'kubelet.yaml'}",
                   f"--kubeconfig={self.folder / 'kubelet.kubeconfig'}", f"--root-dir={self.folder / 'kubelet'}",
                   f"--hostname-override={self.name}", f"--node-ip={self.address}"]
        supervisor.start(f"kubelet-{self.name}", [
            "nsenter", f"--target={pid}", "--mount", "--", "sh", "-c",
            f"set -e; {join}; exec {' '.join(shlex.quote(word) for word in kubelet)}"], env={"PATH": path})

    def shape(self, kubectl: Kubectl, supervisor: Supervisor) -> None:
        """Once registered and Ready: the pool's labels, and its GPUs (and EFA interfaces) in the status capacity."""
        _wait(lambda: _ready(kubectl, self.name), READY_TIMEOUT_SECONDS, f"node {self.name} Ready",
              lambda: supervisor.check(f"kubelet-{self.name}"))
        labels = {k: v for k, v in self.manifest["metadata"]["labels"].items() if k != "type"}  # "type: kwok"
        kubectl.run("patch", "node", self.name, "--type=merge", "-p", json.dumps({"metadata": {"labels": labels}}))
        capacity = self.manifest["status"]["capacity"]
        extended = {k: v for k, v in capacity.items() if "/" in k}
        if extended:
            kubectl.run("patch", "node", self.name, "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": {"capacity": extended}}))


def seed_content(root: Path) -> int:
    """Hard-link the sim registry's blobs into containerd's content store (same file system only), so a pull finds
    the layers there instead of writing a second copy next to the unpacked one: the ddp image is 5 GB and this
    machine's disk is shared. containerd's default "shared" content policy takes a blob the store already holds
    (core/metadata/content.go, contentStore.Writer); the manifest and config are still fetched from the registry."""
    target = root / "io.containerd.content.v1.content" / "blobs" / "sha256"
    target.mkdir(parents=True, exist_ok=True)
    linked = 0
    for data in (storage_dir() / "docker" / "registry" / "v2" / "blobs" / "sha256").glob("*/*/data"):
        if data.stat().st_dev != target.stat().st_dev:
            return 0
        os.link(data, target / data.parent.name)
        linked += 1
    return linked


def _memtotal_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise RuntimeError("no MemTotal in /proc/meminfo")


def _ready(kubectl: Kubectl, name: str) -> bool:
    try:
        node = kubectl.get("node", name)
    except KubectlError:
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))


def _wait(done: Callable[[], bool], seconds: float, what: str, check: Callable[[], None]) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {seconds:.0f}s")
        time.sleep(0.5)


def real_manifests(node_list: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """What real nodes stand for (without the kwok annotation): the first ``count`` GPU nodes of the stack's pools,
    then (with any) the first on-demand node of the CPU NodePool, for CPU-only pods (a CPU-only gang's ranks)."""
    gpu = [n for n in node_list if "nvidia.com/gpu" in n["status"]["capacity"]][:count]
    if len(gpu) < count:
        raise RuntimeError(f"--real-nodes {count}: the stack's pools have {len(gpu)} GPU nodes")
    cpu = [n for n in node_list if n["metadata"]["labels"].get(LABEL_NODEPOOL) == NODEPOOL_CPU
           and n["metadata"]["labels"].get(LABEL_CAPACITY_TYPE) == "on-demand"][:CPU_NODES] if count else []
    return [{**n, "metadata": {k: v for k, v in n["metadata"].items() if k != "annotations"}} for n in gpu + cpu]


def start_all(state: Path, manifests: list[dict[str, Any]], bins: dict[str, Path], pki: certs.Pki, server: str,
              registry: str, pause: str, kubectl: Kubectl, supervisor: Supervisor) -> list[RealNode]:
    """The bridge, the cgroups and every node (recorded first, so `down` finds them even after a failure)."""
    network = Network(bridge_name(state))
    cgroup_root = f"{_own_cgroup().rstrip('/')}/gpuyard-{network.name}"
    (state / RECORD).write_text(json.dumps({"bridge": network.name, "cgroup": cgroup_root}) + "\n")
    network.create()
    network.add_address(coredns.ADDRESS)
    nodes = [RealNode(state, index, manifest, cgroup_root) for index, manifest in enumerate(manifests)]
    for node in nodes:
        network.add_address(node.address)
        node.write_files(bins, pki, server, registry, pause, network.name)
        node.start(supervisor, bins)
    for node in nodes:
        node.shape(kubectl, supervisor)
    return nodes


def _pids(cgroup: Path) -> list[int]:
    return [int(pid) for procs in cgroup.rglob("cgroup.procs") for pid in procs.read_text().split()]


def stop_all(state: Path) -> None:
    """After the supervisor stopped the kubelets and containerds: kill what is left in the nodes' cgroups (shims,
    containers), remove those cgroups and the bridge. Only what the state folder's record names."""
    path = state / RECORD
    if not path.is_file():
        return
    record = json.loads(path.read_text())
    bridge = bridge_name(state)  # a record naming anything but this state folder's bridge and cgroup is not ours
    if record.get("bridge") != bridge or not str(record.get("cgroup", "")).endswith(f"/gpuyard-{bridge}"):
        raise RuntimeError(f"{path} names a bridge or cgroup `sim up` does not make for {state}: left alone")
    # the kubelet makes its QoS cgroups in the cgroup v2 hierarchy of this hybrid setup too
    trees = [h / record["cgroup"].strip("/") for h in (*hierarchies(), CGROUPS / "unified")]
    deadline = time.monotonic() + 30
    while (pids := {pid for tree in trees if tree.is_dir() for pid in _pids(tree)}) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    for tree in trees:
        if tree.is_dir():
            for folder, _, _ in sorted(os.walk(tree), key=lambda entry: -len(entry[0])):
                os.rmdir(folder)
    Network(record["bridge"]).remove()
    path.unlink()
