"""Volcano and the training operators as local processes, run with the flags the stack deploys them with.

Each add-on's manifests come from its upstream Go module at the pinned version (CRDs, webhook configurations,
the Deployment's container arguments, ConfigMaps); the values the stack sets on top come from infra/operators.py,
the module the Pulumi program reads. What only makes sense in a Pod (certificate paths under a mounted Secret,
in-cluster Service names, leader election namespaces, ports) is replaced by local files and free ports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from infra import operators
from sim.certs import Pki
from sim.kube import Kubectl
from sim.processes import Supervisor, free_port
from sim.upstream import documents, module_dir
from sim.webhooks import WEBHOOK_KINDS, served_locally, wait_listening

WEBHOOK_READY_SECONDS = 60
LOCAL = "127.0.0.1"


@dataclass(frozen=True)
class Context:
    """What an add-on needs to start: the built binaries, the cluster's files and its kubectl."""

    state: Path
    bins: dict[str, Path]
    kubeconfig: Path
    pki: Pki
    kubectl: Kubectl
    supervisor: Supervisor

    def binary(self, component: str, name: str) -> str:
        return str(self.bins[component] / name)

    def folder(self, name: str) -> Path:
        path = self.state / name
        path.mkdir(parents=True, exist_ok=True)
        return path


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


def wait_crds(kubectl: Kubectl, crds: Iterable[dict[str, Any]]) -> None:
    names = [f"crd/{crd['metadata']['name']}" for crd in crds]
    if names:
        kubectl.run("wait", "--for=condition=Established", "--timeout=60s", *names)


# Volcano v1.15.1: installer/volcano-development.yaml is the chart (installer/helm/chart/volcano) rendered with its
# default values, i.e. what the stack's Helm release installs (infra/addons.py passes no values but the scheduler
# configuration, infra/operators.py VOLCANO_SCHEDULER_CONF).
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
    common = {"kubeconfig": str(context.kubeconfig), "healthz-address": f"{LOCAL}:{free_port()}"}
    context.supervisor.start("vc-webhook-manager", [
        context.binary("volcano", "vc-webhook-manager"),
        *merged_args(container_args(manifests, "volcano-admission"), {
            **common, "tls-cert-file": str(pki.serving_cert), "tls-private-key-file": str(pki.serving_key),
            "ca-cert-file": str(pki.ca), "admission-conf": str(admission_conf),
            "webhook-url": f"https://{LOCAL}:{port}", "listen-address": LOCAL, "port": str(port),
        }, drop=("webhook-namespace", "webhook-service-name")),
    ])
    context.supervisor.start("vc-controller-manager", [
        context.binary("volcano", "vc-controller-manager"),
        *merged_args(container_args(manifests, "volcano-controllers"),
                     {**common, "listen-address": f"{LOCAL}:{free_port()}"}),
    ])
    context.supervisor.start("vc-scheduler", [
        context.binary("volcano", "vc-scheduler"),
        *merged_args(container_args(manifests, "volcano-scheduler"),
                     {**common, "scheduler-conf": str(scheduler_conf), "listen-address": f"{LOCAL}:{free_port()}"}),
    ])
    wait_listening(port, WEBHOOK_READY_SECONDS, lambda: context.supervisor.check("vc-webhook-manager"))
