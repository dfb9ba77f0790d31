"""Volcano and the training operators as local processes, run with the flags the stack deploys them with.

Each add-on's manifests come from its upstream Go module at the pinned version (CRDs, webhook configurations,
the Deployment's container arguments, ConfigMaps); the values the stack sets on top come from infra/operators.py,
the module the Pulumi program reads. What only makes sense in a Pod (certificate paths under a mounted Secret,
in-cluster Service names, leader election namespaces, ports) is replaced by local files and free ports.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from gpuyard.infra import operators
from gpuyard.infra.tenancy import KUBERAY_NAMESPACE
from gpuyard.jobs.workload.storage import folder_locked
from gpuyard.sim import kuberay, realnode
from gpuyard.sim.certs import Pki
from gpuyard.sim.kube import Kubectl
from gpuyard.sim.paths import claim, claimed_by
from gpuyard.sim.processes import Supervisor, free_port
from gpuyard.sim.registry import Registry
from gpuyard.sim.upstream import documents, documents_in, module_dir
from gpuyard.sim.versions import TRAINING_OPERATOR_MODULE
from gpuyard.sim.webhooks import WEBHOOK_KINDS, served_locally, wait_listening

WEBHOOK_READY_SECONDS = 60
LOCAL = "127.0.0.1"
OUTSIDE = "outside.json"  # folders an upstream binary hard-codes outside the state folder, removed by `down`


@dataclass(frozen=True)
class RealNodes:
    """What an operator that runs in a pod needs: the registry its image goes to, the real node it runs on and the
    API server's loopback port, which sim/relay.py serves on the bridge."""

    registry: Registry
    node: str
    api_port: int


@dataclass(frozen=True)
class Context:
    """What an add-on needs to start: the built binaries, the cluster's files and its kubectl."""

    state: Path
    bins: dict[str, Path]
    kubeconfig: Path
    pki: Pki
    kubectl: Kubectl
    supervisor: Supervisor
    pytorch_init_image: str | None = None  # real nodes: the sim's busybox image (sim/pause.py) for upstream's alpine
    real: RealNodes | None = None  # where operators that run as pods go (KubeRay, sim/kuberay.py)
    mpi_operator: bool = True  # False: the MPIJob CRD only (Sim.mpi_operator)

    def binary(self, component: str, name: str) -> str:
        return str(self.bins[component] / name)

    def folder(self, name: str) -> Path:
        path = self.state / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def outside_folders(state: Path) -> list[Path]:
    path = state / OUTSIDE
    return [Path(p) for p in json.loads(path.read_text())] if path.is_file() else []


def _record_outside(state: Path, folder: Path) -> None:
    """Make ``folder`` for this cluster and record it for `down`; one that is there already is left out (not ours)."""
    try:
        claim(folder, state)
    except FileExistsError:
        return
    (state / OUTSIDE).write_text(json.dumps(sorted({*map(str, outside_folders(state)), str(folder)})))


def _outside_folders_locked():
    """Held from a cluster's look at the Training Operator's fixed certificate folder until its operator has read it,
    and while `down` removes the folders outside a state folder: clusters on one machine share that folder, and one
    must not remove it while another's operator waits for it. The lock is on /tmp itself."""
    return folder_locked(TRAINING_OPERATOR_CERT_DIR.parent.parent)


def remove_outside_folders(state: Path) -> None:
    """Remove the folders outside ``state`` that this cluster made (gpuyard.sim.paths.claim), and no other."""
    with _outside_folders_locked():
        for path in outside_folders(state):
            if claimed_by(path, state):
                shutil.rmtree(path, ignore_errors=True)


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("-")


def merged_args(upstream: Iterable[str], ours: dict[str, str], drop: Iterable[str] = ()) -> list[str]:
    """Upstream's arguments without the ones we set or ``drop`` (and the shell's "2>&1"), then ours."""
    replaced = set(ours) | set(drop)
    kept = [arg for arg in upstream if arg != "2>&1" and flag_name(arg) not in replaced]
    return kept + [f"--{name}={value}" for name, value in ours.items()]


def of_kind(manifests: Iterable[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m.get("kind") in kinds]


def container_args(manifests: Iterable[dict[str, Any]], deployment: str) -> list[str]:
    for manifest in of_kind(manifests, "Deployment"):
        if manifest["metadata"]["name"] == deployment:
            container = manifest["spec"]["template"]["spec"]["containers"][0]
            return [*container.get("command", [])[1:], *container.get("args", [])]
    raise KeyError(f"no Deployment {deployment!r} in the upstream manifests")


def wait_crds(kubectl: Kubectl, crds: Iterable[dict[str, Any]], timeout: float = 60) -> None:
    """Wait until the API server serves every CRD (kubectl wait fails on a CRD that has no conditions yet)."""
    waiting = {crd["metadata"]["name"] for crd in crds}
    deadline = time.monotonic() + timeout
    while waiting:
        for crd in kubectl.items("customresourcedefinitions"):
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                waiting.discard(crd["metadata"]["name"])
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"CRDs not established after {timeout:.0f}s: {', '.join(sorted(waiting))}")
        time.sleep(0.2 if waiting else 0)


# Volcano (v1.14.1, see sim/versions.py): installer/volcano-development.yaml is the chart
# (installer/helm/chart/volcano) rendered with its default values, i.e. what the stack's Helm release installs but
# for the scheduler configuration, which comes from infra/operators.py VOLCANO_SCHEDULER_CONF.
VOLCANO_MODULE = "volcano.sh/volcano"


def volcano_manifests() -> list[dict[str, Any]]:
    return list(documents(module_dir("volcano", VOLCANO_MODULE) / "installer" / "volcano-development.yaml"))


def start_volcano(context: Context) -> None:
    """Volcano's CRDs, ConfigMaps and admission webhooks, then its webhook manager, controllers and scheduler."""
    manifests = volcano_manifests()
    crds = of_kind(manifests, "CustomResourceDefinition")
    context.kubectl.apply(of_kind(manifests, "Namespace", "ConfigMap") + crds)
    wait_crds(context.kubectl, crds)
    folder = context.folder("volcano")
    scheduler_conf = folder / "volcano-scheduler.conf"
    scheduler_conf.write_text(operators.VOLCANO_SCHEDULER_CONF)
    admission_conf = folder / "volcano-admission.conf"
    admission_conf.write_text(next(
        m["data"]["volcano-admission.conf"] for m in of_kind(manifests, "ConfigMap")
        if "volcano-admission.conf" in m.get("data", {})
    ))
    port = free_port()
    context.kubectl.apply(served_locally(m, port, context.pki.ca) for m in of_kind(manifests, *WEBHOOK_KINDS))
    pki = context.pki

    def common() -> dict[str, str]:
        return {"kubeconfig": str(context.kubeconfig), "healthz-address": f"{LOCAL}:{free_port()}"}

    context.supervisor.start("vc-webhook-manager", [
        context.binary("volcano", "vc-webhook-manager"),
        *merged_args(container_args(manifests, "volcano-admission"), {
            **common(), "tls-cert-file": str(pki.serving_cert), "tls-private-key-file": str(pki.serving_key),
            "ca-cert-file": str(pki.ca), "admission-conf": str(admission_conf),
            "webhook-url": f"https://{LOCAL}:{port}", "listen-address": LOCAL, "port": str(port),
        }, drop=("webhook-namespace", "webhook-service-name")),
    ])
    context.supervisor.start("vc-controller-manager", [
        context.binary("volcano", "vc-controller-manager"),
        *merged_args(container_args(manifests, "volcano-controllers"),
                     {**common(), "listen-address": f"{LOCAL}:{free_port()}"}),
    ])
    context.supervisor.start("vc-scheduler", [
        context.binary("volcano", "vc-scheduler"),
        *merged_args(container_args(manifests, "volcano-scheduler"),
                     {**common(), "scheduler-conf": str(scheduler_conf), "listen-address": f"{LOCAL}:{free_port()}"}),
    ])
    wait_listening(port, WEBHOOK_READY_SECONDS, lambda: context.supervisor.check("vc-webhook-manager"))


def kustomized(context: Context, directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a local upstream overlay (nothing remote)."""
    import yaml

    return [m for m in yaml.load_all(context.kubectl.run("kustomize", str(directory)), Loader=yaml.CSafeLoader) if m]


def webhook_secret(namespace: str, name: str, pki: Pki) -> dict[str, Any]:
    """A cert-controller webhook Secret holding the simulation's CA and serving certificate: the rotator finds it
    valid and keeps it instead of generating a CA the API server's URL-based calls would not trust."""
    import base64

    def encoded(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": name, "namespace": namespace},
            "data": {"ca.crt": encoded(pki.ca), "ca.key": encoded(pki.ca_key), "tls.crt": encoded(pki.serving_cert),
                     "tls.key": encoded(pki.serving_key)}}


# MPI Operator v0.8.0: deploy/v2beta1/mpi-operator.yaml is the release manifest the stack applies
# (infra/manifests/mpi-operator), its args replaced by infra/operators.py MPI_OPERATOR_ARGS. No webhooks.
# Its health server listens on :8080, hard-coded (cmd/mpi-operator/app/server.go healthCheckPort).
MPI_OPERATOR_MODULE = "github.com/kubeflow/mpi-operator"
MPI_OPERATOR_HEALTH_PORT = 8080


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def start_mpi_operator(context: Context) -> None:
    if context.mpi_operator and not _port_free(MPI_OPERATOR_HEALTH_PORT):
        raise RuntimeError(f"MPI Operator v0.8.0 needs port {MPI_OPERATOR_HEALTH_PORT} (its health server's, hard-coded), "
                           "which is in use (another gpuyard sim?)")
    manifests = list(documents(module_dir("mpi-operator", MPI_OPERATOR_MODULE) / "deploy" / "v2beta1" / "mpi-operator.yaml"))
    crds = of_kind(manifests, "CustomResourceDefinition")
    context.kubectl.apply(of_kind(manifests, "Namespace") + crds)
    wait_crds(context.kubectl, crds)
    if not context.mpi_operator:
        return
    context.supervisor.start("mpi-operator", [
        context.binary("mpi-operator", "mpi-operator"), *operators.MPI_OPERATOR_ARGS, f"--kubeConfig={context.kubeconfig}",
    ])


# Training Operator v1.9.4: manifests/overlays/standalone is what the stack's kustomization
# (infra/manifests/training-operator) builds on: namespace kubeflow, every CRD but mpijobs.kubeflow.org (MPI Operator
# serves it), the validating webhooks. Its cert rotation (pkg/cert/cert.go) always runs: it keeps the CA and
# certificate of Secret kubeflow/training-operator-webhook-cert when they are valid (the CA for its CA name, the
# certificate for training-operator.kubeflow.svc; open-policy-agent/cert-controller v0.16.0 pkg/rotator/rotator.go
# refreshCertIfNeeded), injects the CA into the webhooks and waits for a tls.crt at
# /tmp/k8s-webhook-server/serving-certs (a fixed path, ensureCertsMounted) before it serves; the webhook server
# itself reads controller-runtime's default folder under $TMPDIR, which the simulation points into its state folder.
# The webhook server binds 127.0.0.1 (the build's patch, sim/versions.py: webhook.Options sets only the port).
TRAINING_OPERATOR_SERVICE = "training-operator.kubeflow.svc"
TRAINING_OPERATOR_CA = "training-operator-ca"  # pkg/cert/cert.go caName
# pkg/cert/cert.go certDir, where the Pod mounts the Secret: the kubelet's part, played by the simulation
TRAINING_OPERATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")


def start_training_operator(context: Context) -> None:
    overlay = module_dir("training-operator", TRAINING_OPERATOR_MODULE) / "manifests" / "overlays" / "standalone"
    manifests = [m for m in kustomized(context, overlay)
                 if not (m["kind"] == "CustomResourceDefinition" and m["metadata"]["name"] == "mpijobs.kubeflow.org")]
    crds = of_kind(manifests, "CustomResourceDefinition")
    context.kubectl.apply(of_kind(manifests, "Namespace") + crds)
    wait_crds(context.kubectl, crds)
    context.kubectl.apply([webhook_secret("kubeflow", "training-operator-webhook-cert", context.pki)])
    folder = context.folder("training-operator")
    _serving_certs(folder / "k8s-webhook-server" / "serving-certs", context.pki)  # what the webhook server reads
    port = free_port()
    context.kubectl.apply(served_locally(m, port, context.pki.ca) for m in of_kind(manifests, *WEBHOOK_KINDS))
    with _outside_folders_locked():  # it serves once it found a tls.crt there
        if not (TRAINING_OPERATOR_CERT_DIR / "tls.crt").exists():  # what the rotator waits for; another sim's will do
            _record_outside(context.state, TRAINING_OPERATOR_CERT_DIR.parent)
            _serving_certs(TRAINING_OPERATOR_CERT_DIR, context.pki)
        context.supervisor.start("training-operator", [
            context.binary("training-operator", "training-operator"), *training_operator_args(context.pytorch_init_image),
            f"--kubeconfig={context.kubeconfig}", f"--metrics-bind-address={LOCAL}:{free_port()}",
            f"--health-probe-bind-address={LOCAL}:{free_port()}", f"--webhook-server-port={port}",
        ], env={"TMPDIR": str(folder)})  # controller-runtime's webhook server reads $TMPDIR/k8s-webhook-server/serving-certs
        wait_listening(port, WEBHOOK_READY_SECONDS, lambda: context.supervisor.check("training-operator"))


def training_operator_args(init_image: str | None = None) -> list[str]:
    """The stack's flags, the init container template read from the checkout where the Pod mounts its ConfigMap.
    With ``init_image`` the PyTorchJob workers' init container (`sh`, `seq`, `nslookup` until the master resolves)
    runs that image: upstream's default, alpine:3.10 (pkg/config/config.go PyTorchInitContainerImageDefault,
    cmd/training-operator.v1/main.go --pytorch-init-container-image), cannot be pulled here."""
    mounted = f"{operators.PYTORCH_INIT_TEMPLATE_FLAG}={operators.PYTORCH_INIT_TEMPLATE_PATH}"
    local = f"{operators.PYTORCH_INIT_TEMPLATE_FLAG}={operators.PYTORCH_INIT_TEMPLATE}"
    args = [local if arg == mounted else arg for arg in operators.TRAINING_OPERATOR_ARGS]
    return args + [f"--pytorch-init-container-image={init_image}"] if init_image else args


def _renamed(manifest: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Kubebuilder's default webhook configuration names collide between operators: prefix them as kustomize does."""
    return {**manifest, "metadata": {**manifest["metadata"], "name": f"{prefix}-{manifest['metadata']['name']}"}}


def _serving_certs(folder: Path, pki: Pki) -> Path:
    """A controller-runtime certificate folder (tls.crt, tls.key) holding the simulation's serving certificate."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tls.crt").write_bytes(pki.serving_cert.read_bytes())
    (folder / "tls.key").write_bytes(pki.serving_key.read_bytes())
    return folder


def _controller_config(base: dict[str, Any], port: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """Upstream's controller configuration with leader election off and every server on 127.0.0.1."""
    config = {**base, **overrides}
    config["webhook"] = {**base.get("webhook", {}), **overrides.get("webhook", {}), "port": port, "host": LOCAL}
    config["metrics"] = {**base.get("metrics", {}), "bindAddress": f"{LOCAL}:{free_port()}"}
    config["health"] = {**base.get("health", {}), "healthProbeBindAddress": f"{LOCAL}:{free_port()}"}
    config["leaderElection"] = {**base.get("leaderElection", {}), "leaderElect": False}
    return config


# Kubeflow Trainer v2.3.0 and the JobSet it requires (v0.12.0; the trainer chart installs it, jobset.install=true in
# infra/addons.py trainer_values): CRDs and webhooks from their kustomize bases (manifests/base, config/components),
# each controller configured by upstream's controller_manager_config.yaml with internal certificate management off
# (the simulation's certificate is in the folder the webhook server reads) and servers on 127.0.0.1.
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
JOBSET_MODULE = "sigs.k8s.io/jobset"


def start_trainer(context: Context) -> None:
    import yaml

    trainer = module_dir("trainer", TRAINER_MODULE)
    jobset = module_dir("trainer", JOBSET_MODULE)
    crds = list(documents_in(trainer / "manifests" / "base" / "crds", "trainer.kubeflow.org_*.yaml"))
    crds += list(documents_in(jobset / "config" / "components" / "crd" / "bases"))
    context.kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeflow-system"}}, *crds])
    wait_crds(context.kubectl, crds)
    for name, webhooks, base_config, management in (
        ("jobset", jobset / "config/components/webhook/manifests.yaml",
         jobset / "config/components/manager/controller_manager_config.yaml", "internalCertManagement"),
        ("trainer-controller-manager", trainer / "manifests/base/webhook/manifests.yaml",
         trainer / "manifests/base/manager/controller_manager_config.yaml", "certManagement"),
    ):
        folder = context.folder(name)
        certs = _serving_certs(folder / "k8s-webhook-server" / "serving-certs", context.pki)
        port = free_port()
        base = next(documents(base_config))
        overrides = {management: {**base.get(management, {}), "enable": False}}
        if name == "jobset":
            overrides["webhook"] = {"certDir": str(certs)}
        config_file = folder / "config.yaml"
        config_file.write_text(yaml.dump(_controller_config(base, port, overrides), Dumper=yaml.CSafeDumper))
        context.kubectl.apply(_renamed(served_locally(m, port, context.pki.ca), name)
                              for m in of_kind(documents(webhooks), *WEBHOOK_KINDS))
        # trainer's webhook server reads controller-runtime's default folder, $TMPDIR/k8s-webhook-server/serving-certs
        context.supervisor.start(name, [
            context.binary("trainer", name), f"--config={config_file}", f"--kubeconfig={context.kubeconfig}",
        ], env={"TMPDIR": str(folder)})
        wait_listening(port, WEBHOOK_READY_SECONDS, lambda: context.supervisor.check(name))


# KubeRay (v1.6.0, see sim/versions.py): CRDs from ray-operator/config/crd/bases; flags as the stack's chart sets
# them (infra/operators.py KUBERAY_OPERATOR_ARGS); the chart enables no webhooks by default (ENABLE_WEBHOOKS unset).
# With real nodes it runs as a pod (sim/kuberay.py) and reaches the real heads' dashboards as on EKS; on kwok nodes
# only it runs beside the cluster with HTTP_PROXY set to sim/ray_head.py, which never reports a success (no head
# runs there). The API server is on a loopback address, which Go never proxies.
KUBERAY_MODULE = "github.com/ray-project/kuberay/ray-operator"
API_RELAY_PORT = 6443  # on the bridge's own address: one cluster with real nodes at a time holds it (Sim.up)
KUBERAY_READY_SECONDS = 180  # the image's pull from the sim's registry and the operator's start


def start_kuberay(context: Context) -> None:
    module = module_dir("kuberay", KUBERAY_MODULE)
    crds = list(documents_in(module / "config" / "crd" / "bases"))
    context.kubectl.apply(crds)
    wait_crds(context.kubectl, crds)
    if context.real:
        return _start_kuberay_in_a_pod(context, context.real, module)
    heads = free_port()
    context.supervisor.start("ray-heads", [sys.executable, "-m", "gpuyard.sim.ray_head", f"--port={heads}"])
    wait_listening(heads, WEBHOOK_READY_SECONDS, lambda: context.supervisor.check("ray-heads"))
    context.supervisor.start("kuberay-operator", [
        context.binary("kuberay", "ray-operator"), *operators.KUBERAY_OPERATOR_ARGS, f"--kubeconfig={context.kubeconfig}",
        f"--metrics-addr={LOCAL}:{free_port()}", f"--health-probe-bind-address={LOCAL}:{free_port()}",
        "--enable-leader-election=false",
    ], env={"HTTP_PROXY": f"http://{LOCAL}:{heads}", "NO_PROXY": f"{LOCAL},localhost"})


def _start_kuberay_in_a_pod(context: Context, real: RealNodes, module: Path) -> None:
    context.supervisor.start("apiserver-relay", [
        sys.executable, "-m", "gpuyard.sim.relay", f"--listen={realnode.GATEWAY}:{API_RELAY_PORT}",
        f"--to={LOCAL}:{real.api_port}"])
    wait_listening(API_RELAY_PORT, WEBHOOK_READY_SECONDS, lambda: context.supervisor.check("apiserver-relay"),
                   host=realnode.GATEWAY)
    image = kuberay.push(real.registry, context.bins["kuberay"] / "ray-operator")
    context.kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBERAY_NAMESPACE}}])
    context.kubectl.apply(kuberay.manifests(module, image, real.node, (realnode.GATEWAY, API_RELAY_PORT)))
    context.kubectl.run("rollout", "status", f"deployment/{kuberay.NAME}", "--namespace", KUBERAY_NAMESPACE,
                        f"--timeout={KUBERAY_READY_SECONDS}s", timeout=KUBERAY_READY_SECONDS + 30)


STARTS = {"volcano": start_volcano, "mpi-operator": start_mpi_operator, "training-operator": start_training_operator,
          "trainer": start_trainer, "kuberay": start_kuberay}
