"""Every version the simulated cluster builds, in one place.

Each component is one Go module of ours under ``sim/go/<component>`` (its go.mod pins the upstream module at the
version below and carries upstream's ``replace`` lines); the stack's Kubernetes minor picks the control plane's tag.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from gpuyard.infra.config import ConfigError

GO_DIR = Path(__file__).resolve().parent / "go"

# The stack's `cluster.kubernetes_version` (a minor) -> the k8s.io/kubernetes tag sim/go/kubernetes/go.mod requires.
KUBERNETES_PATCHES = {"1.35": "v1.35.4"}


@dataclass(frozen=True)
class Patch:
    """One text replacement in a file of an upstream module, applied at build time to a copy of the module that a
    go.work puts in its place (sim/build.py; the module cache stays untouched); the build fails without ``old``."""

    module: str
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Component:
    """A Go module of ours under sim/go/<name> and the main packages it builds (its go.mod's ``tool`` lines)."""

    name: str
    version: str
    binaries: dict[str, str]  # binary name -> main package
    ldflags: tuple[str, ...] = ()
    patches: tuple[Patch, ...] = ()
    tags: tuple[str, ...] = ()  # Go build tags
    module: str = ""  # the folder under sim/go when it is not ``name`` (components built from one module of ours)

    @property
    def module_dir(self) -> Path:
        return GO_DIR / (self.module or self.name)

    @property
    def recipe(self) -> str:
        """A digest of what makes its binaries besides the Go toolchain: its module's go.mod and go.sum, its main
        packages, flags, tags and patches. A build of another recipe is not reused (sim/paths.py ``built``)."""
        inputs = [(self.module_dir / name).read_bytes() for name in ("go.mod", "go.sum")]
        inputs.append(repr((self.binaries, self.ldflags, self.tags, self.patches)).encode())
        return hashlib.sha256(b"\0".join(inputs)).hexdigest()[:16]


TRAINING_OPERATOR_MODULE = "github.com/kubeflow/training-operator"


def kubernetes_tag(minor: str) -> str:
    """The k8s.io/kubernetes tag for a stack's Kubernetes minor; a ConfigError names the supported minors."""
    try:
        return KUBERNETES_PATCHES[minor]
    except KeyError:
        supported = ", ".join(sorted(KUBERNETES_PATCHES))
        raise ConfigError(f"cluster.kubernetes_version {minor!r} has no simulated build (supported: {supported})") from None


def kubernetes_ldflags(tag: str) -> tuple[str, ...]:
    """The version stamp k8s hack/lib/version.sh links in, so clients and operators see a real server version."""
    major, minor = tag.removeprefix("v").split(".")[:2]
    stamp = {"gitVersion": tag, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean",
             "buildDate": "1970-01-01T00:00:00Z"}
    return tuple(
        f"-X {package}.{key}={value}"
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for key, value in stamp.items()
    )


def components(kubernetes_minor: str) -> tuple[Component, ...]:
    """Everything `gpuyard sim` runs, in build order; the versions match infra/charts.py's pins where one exists."""
    tag = kubernetes_tag(kubernetes_minor)
    kube = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
    volcano = {f"vc-{name}": f"volcano.sh/volcano/cmd/{name}" for name in ("scheduler", "controller-manager", "webhook-manager")}
    return (
        Component("kubernetes", tag, {name: f"k8s.io/kubernetes/cmd/{name}" for name in kube}, kubernetes_ldflags(tag)),
        Component("etcd", "v3.6.5", {"etcd": "go.etcd.io/etcd/server/v3"}),  # the etcd k8s v1.35.4's go.mod requires
        Component("kwok", "v0.8.0", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}),
        # v1.15.1 (the stack's chart) needs volcano.sh/apis v1.15.x, which the Go module proxy does not serve (403)
        Component("volcano", "v1.14.1", volcano),
        Component("mpi-operator", "v0.8.0", {"mpi-operator": "github.com/kubeflow/mpi-operator/cmd/mpi-operator"}),
        # training-operator v1.9.4 cmd/training-operator.v1/main.go binds its webhook server to every interface
        # (webhook.Options with a Port only): in a pod that is the pod's own address, here the host's, so the patch
        # binds it to 127.0.0.1, where the API server calls it.
        Component(
            "training-operator", "v1.9.4",
            {"training-operator": "github.com/kubeflow/training-operator/cmd/training-operator.v1"}, patches=(
                Patch(TRAINING_OPERATOR_MODULE, "cmd/training-operator.v1/main.go", "Port: webhookServerPort,",
                      'Host: "127.0.0.1", Port: webhookServerPort,'),
            ),
        ),
        Component("trainer", "v2.3.0", {
            "trainer-controller-manager": "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
            "jobset": "sigs.k8s.io/jobset",  # v0.12.0, the JobSet trainer v2.3.0's go.mod requires
        }),
        # KubeRay v1.7.0 (the stack's chart) is not served by the Go module proxy (403): v1.6.0 is the newest it has.
        Component("kuberay", "v1.6.0", {"ray-operator": "github.com/ray-project/kuberay/ray-operator"}),
        # infra/charts.py KARPENTER 1.14.1: Karpenter with its kwok cloud provider (sim/karpenter.py). Its
        # pkg/operator/operator.go binds the metrics and health probe servers to ":<port>" (every interface) and no
        # setting changes the host: the patch makes it 127.0.0.1.
        Component("karpenter", "v1.14.1", {"karpenter": "sigs.k8s.io/karpenter/kwok"}, patches=(
            Patch("sigs.k8s.io/karpenter", "pkg/operator/operator.go", 'fmt.Sprintf(":%d"', 'fmt.Sprintf("127.0.0.1:%d"'),
        )),
        *IMAGE_COMPONENTS,
    )


# What builds, stores and runs the job images (sim/images.py, sim/registry.py). runc with seccomp (libseccomp-dev):
# Debian's runc 1.1.5 fails on this machine ("can't get final child's PID from pipe").
IMAGE_COMPONENTS = (
    Component("runc", "v1.5.3", {"runc": "github.com/opencontainers/runc"}, tags=("seccomp",)),
    Component("buildkit", "v0.34.2", {name: f"github.com/moby/buildkit/cmd/{name}" for name in ("buildkitd", "buildctl")}),
    Component("registry", "v3.1.2", {"registry": "github.com/distribution/distribution/v3/cmd/registry"}),
)


def node_components(kubernetes_minor: str) -> tuple[Component, ...]:
    """What a real node of `gpuyard sim up --real-nodes` runs besides runc (IMAGE_COMPONENTS): the kubelet and
    kube-proxy from the control plane's module and tag, containerd, the CNI plugins that put pods on the bridge, and
    the cluster DNS."""
    tag = kubernetes_tag(kubernetes_minor)
    cni = ("ipam/host-local", "main/bridge", "main/loopback")
    return (
        Component("kubernetes-node", tag, {name: f"k8s.io/kubernetes/cmd/{name}" for name in ("kubelet", "kube-proxy")},
                  kubernetes_ldflags(tag), module="kubernetes"),
        # no_btrfs: the btrfs snapshotter needs libbtrfs headers (cmd/containerd/builtins/btrfs_linux.go); pods use
        # overlayfs. Pinned and built like every other component, rather than Debian's older containerd 1.6.
        Component("containerd", "v2.4.2", {name: f"github.com/containerd/containerd/v2/cmd/{name}"
                                           for name in ("containerd", "containerd-shim-runc-v2")}, tags=("no_btrfs",)),
        Component("cni-plugins", "v1.10.0", {
            path.split("/")[1]: f"github.com/containernetworking/plugins/plugins/{path}" for path in cni
        }),
        # the cluster DNS (sim/coredns.py): CoreDNS v1.15.0 (the newest the Go module proxy serves) with the plugins
        # our main package names, not upstream's main, which links every plugin and its cloud SDKs
        Component("coredns", "v1.15.0", {"coredns": "gpuyard.dev/sim/coredns"}),
        INIT_SHELL,
        KUBE_ROUTER,
    )


# NetworkPolicy enforcement on the real nodes (sim/netpol.py): kube-router's firewall controller only (kube-proxy
# routes Services, the CNI bridge the pods). kube-router v2.1.0 is the only release the Go module proxy serves here.
# Upstream enforces policies for the pods of its own node only, those whose status.hostIP is that node's IP
# (cloudnativelabs/kube-router v2.1.0 pkg/controllers/netpol/pod.go, getLocalPods); the real nodes share one network
# namespace, so one instance serves them all: the patch takes every pod on a real node's address (10.244.255.x,
# sim/realnode.py RealNode.address) as local.
KUBE_ROUTER = Component(
    "kube-router", "v2.1.0", {"kube-router": "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"},
    ldflags=("-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=v2.1.0",),
    patches=(Patch("github.com/cloudnativelabs/kube-router/v2", "pkg/controllers/netpol/pod.go",
                   "strings.Compare(pod.Status.HostIP, nodeIP) != 0",
                   'nodeIP == "" || !strings.HasPrefix(pod.Status.HostIP, "10.244.255.")'),),
)


# The `sh` of the PyTorchJob init image (sim/pause.py): a static build of mvdan.cc/sh's POSIX shell
INIT_SHELL = Component("gosh", "v3.14.1", {"gosh": "mvdan.cc/sh/v3/cmd/gosh"}, tags=("netgo", "osusergo"))


# Monitoring: built by CI for the tests and by `gpuyard sim up --monitoring` (sim/monitoring.py) on demand.
# Prometheus and promtool (`promtool test rules`, tests/test_showback_rules.py) from the Prometheus module, which
# tags Prometheus v3.16.0 as v0.316.0; `remove_all_sd` leaves out every service discovery plugin but file and http
# (plugins/*.go build constraints): the simulation scrapes static targets. kube-state-metrics at the version the Go
# module proxy serves (sim/go/kube-state-metrics/go.mod).
PROMETHEUS = Component("prometheus", "v0.316.0", {name: f"github.com/prometheus/prometheus/cmd/{name}"
                                                  for name in ("prometheus", "promtool")}, tags=("remove_all_sd",))
KUBE_STATE_METRICS = Component("kube-state-metrics", "v2.19.1", {"kube-state-metrics": "k8s.io/kube-state-metrics/v2"})


def tools() -> tuple[Component, ...]:
    """What CI builds besides the simulated cluster (``python -m gpuyard.sim.build``)."""
    return (PROMETHEUS, KUBE_STATE_METRICS)
