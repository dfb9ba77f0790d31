"""One simulated cluster per stack: ``up`` builds (cached) and starts everything, ``down`` stops it and removes its
state folder, ``status`` reports what runs."""

from __future__ import annotations

import json
import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from gpuyard.infra.config import load_stack
from gpuyard.infra.signals import signals_deferred
from gpuyard.sim import (addons, coredns, irsa, karpenter, kwok, monitoring, netpol, nodes, pause, realnode, registry, s3,
                         stack)
from gpuyard.sim.build import build_all, build_component
from gpuyard.sim.controlplane import ControlPlane
from gpuyard.sim.kube import Kubectl, KubectlError
from gpuyard.sim.paths import bin_dir, claim, claimed_by, state_dir
from gpuyard.sim.processes import Supervisor
from gpuyard.sim.versions import kubernetes_tag, node_components, tools

READY = "ready"  # written into the state folder once everything started


class NotOurs(RuntimeError):
    """A state folder that `gpuyard sim up` did not make: left alone."""


@dataclass(frozen=True)
class Sim:
    """The simulated cluster of ``stack``, its state in ``folder`` (default: the cache's ``state/<stack>``). With
    ``karpenter`` GPU and CPU nodes come only from Karpenter (sim/karpenter.py), whose NodePools consolidate after
    ``consolidate_after`` if given (tests) or after their own ``consolidateAfter``. With ``monitoring``
    kube-state-metrics and Prometheus evaluate the stack's showback rules (sim/monitoring.py). With ``real_nodes``
    that many of the stack's GPU nodes are real kubelets running real containers (sim/realnode.py), the others
    kwok's, and the pods reach the stack's bucket on the sim's S3 endpoint with IRSA credentials (sim/s3.py,
    sim/irsa.py). Without ``mpi_operator`` MPIJobs are admitted but nothing runs them, and the cluster can run beside
    another one (the MPI Operator's health port is hard-coded: sim/addons.py)."""

    stack: str
    folder: Path | None = None
    karpenter: bool = False
    consolidate_after: str | None = None
    monitoring: bool = False
    registry_host: str = "127.0.0.1"  # where the image registry listens (sim/registry.py)
    real_nodes: int = 0
    mpi_operator: bool = True

    @property
    def state(self) -> Path:
        return self.folder or state_dir(self.stack)

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def supervisor(self) -> Supervisor:
        return Supervisor(self.state)

    def kubectl_binary(self) -> Path:
        version = kubernetes_tag(load_stack(self.stack).cluster.kubernetes_version)
        return bin_dir("kubernetes", version) / "kubectl"

    def kubectl(self) -> Kubectl:
        return Kubectl(self.kubectl_binary(), self.kubeconfig)

    def running(self) -> bool:
        """Started completely and every server still alive."""
        if not (self.state / READY).is_file():
            return False
        recorded = self.supervisor.pids()
        return bool(recorded) and self.supervisor.running() == recorded

    def up(self, say: Callable[[str], None] = print) -> Path:
        """Build what is missing, start the cluster unless it runs; returns the kubeconfig."""
        self._refuse_foreign()
        if self.real_nodes and (holder := realnode.gateway_holder(realnode.bridge_name(self.state))):
            raise RuntimeError(f"another simulated cluster with real nodes runs (its bridge {holder} holds "
                               f"{realnode.GATEWAY}): stop it with `gpuyard sim down` before starting this one")
        config = load_stack(self.stack)
        bins = build_all(config.cluster.kubernetes_version, say)
        if self.monitoring:
            bins |= {tool.name: build_component(tool, say) for tool in tools()}
        if self.real_nodes:
            bins |= {c.name: build_component(c, say) for c in node_components(config.cluster.kubernetes_version)}
        pids = self.supervisor.pids()
        kubelets = self.real_nodes + realnode.CPU_NODES if self.real_nodes else 0
        if self.running() and (self.karpenter, self.monitoring, self.mpi_operator, kubelets) == (
                "karpenter" in pids, "prometheus" in pids, "mpi-operator" in pids,
                sum(name.startswith("kubelet-") for name in pids)):
            say(f"sim {self.stack}: already running")
            return self.kubeconfig
        self.down()
        claim(self.state, self.state)
        started = time.monotonic()
        with _stopped_on_signal(self):
            self._start(config, bins, say)
        (self.state / READY).write_text(f"{time.monotonic() - started:.1f}\n")
        say(f"sim {self.stack}: up in {time.monotonic() - started:.0f}s")
        return self.kubeconfig

    def _start(self, config, bins: dict[str, Path], say: Callable[[str], None]) -> None:
        from gpuyard.infra.plan import plan  # the Pulumi SDKs load only here

        control = ControlPlane(self.state, bins)
        self.state.mkdir(parents=True, exist_ok=True)
        say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok")
        control.start(kwok.write_config(self.state / "kwok.yaml"), (addons.TRAINING_OPERATOR_SERVICE,),
                      (addons.TRAINING_OPERATOR_CA,), kubelets=bool(self.real_nodes))
        kubectl = Kubectl(bins["kubernetes"] / "kubectl", self.kubeconfig)
        say(f"starting the image registry on {self.registry_host}")
        images = registry.start(self.supervisor, bins["registry"] / registry.NAME, self.registry_host)
        resources = plan(self.stack).resources
        pools = nodes.pools(resources, karpenter=self.karpenter)
        zones = [f"{config.region}{letter}" for letter in "abcdef"[: config.network.az_count]]
        node_list = list(nodes.node_manifests(pools, config.region, zones))
        real = realnode.real_manifests(node_list, self.real_nodes)
        names = {n["metadata"]["name"] for n in real}
        say(f"creating {len(node_list)} nodes: " + ", ".join(f"{p.name} {p.count}" for p in pools)
            + (f" ({', '.join(sorted(names))} real)" if real else ""))
        kubectl.apply(n for n in node_list if n["metadata"]["name"] not in names)
        busybox = pause.push(images) if real else None
        if real:
            say(f"starting {len(real)} real nodes (containerd, kubelet) and CoreDNS on {coredns.ADDRESS}")
            realnode.start_all(self.state, real, bins, control.pki, control.server(), images.address, busybox,
                               kubectl, self.supervisor)
            coredns.start(self.supervisor, bins["coredns"] / coredns.NAME, self.state / "coredns", self.kubeconfig)
            say("starting kube-proxy and kube-router's NetworkPolicy firewall for the real nodes")
            netpol.start(self.state, realnode.bridge_name(self.state), real[0]["metadata"]["name"], bins,
                         self.kubeconfig, kubectl, self.supervisor)
            say(f"starting the S3 and STS endpoint on {realnode.GATEWAY}:{s3.PORT} with {config.checkpoint_bucket}")
            endpoint = s3.start(self.supervisor, realnode.GATEWAY, config)
        # operators that run as pods go to the last real node: the CPU NodePool's when there is one (real_manifests)
        in_pods = addons.RealNodes(images, real[-1]["metadata"]["name"], control.ports()["apiserver"]) if real else None
        context = addons.Context(self.state, bins, self.kubeconfig, control.pki, kubectl, self.supervisor,
                                 pytorch_init_image=busybox, real=in_pods, mpi_operator=self.mpi_operator)
        for name, start in addons.STARTS.items():
            if name in bins:
                say(f"starting {name}")
                start(context)
        objects = stack.kubernetes_objects(resources)
        namespaces = stack.release_namespaces(resources, objects)
        say(f"applying the stack's Kubernetes layer ({len(objects)} objects)")
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces)
        kubectl.apply(o for o in objects if stack.simulated(o))
        if real:
            say("applying IRSA's stand-in: the team pods' credentials from the sim's STS")
            kubectl.apply(irsa.policies(objects, config.region, endpoint))
        if config.teams and any(o["kind"] == "ValidatingAdmissionPolicyBinding" for o in objects):
            say("waiting for the API server to enforce the admission policies")
            _wait_for_admission_policies(kubectl, config.teams[0].namespace)
        if real and config.teams:
            _wait_for_irsa(kubectl, config.teams[0])
        if self.karpenter:
            say("starting Karpenter with its kwok provider")
            karpenter.start_karpenter(context, resources, config.region, zones, self.consolidate_after)
        if self.monitoring:
            say("starting kube-state-metrics and Prometheus with the stack's showback rules")
            say(f"Prometheus: {monitoring.start(self.supervisor, bins, self.kubeconfig, config)}")

    def down(self) -> None:
        """Stop every server and remove the state folder (and the folders upstream hard-codes outside it): only
        folders `up` made (gpuyard.sim.paths.claim); NotOurs for a state folder it did not make."""
        if not (self.state.exists() or self.state.is_symlink()):
            return
        self._refuse_foreign()
        with signals_deferred():
            _stop_everything(self)
            addons.remove_outside_folders(self.state)
            shutil.rmtree(self.state)

    def _refuse_foreign(self) -> None:
        """NotOurs if the state folder is there but `up` did not make it (a name pointing elsewhere, a copy)."""
        if (self.state.exists() or self.state.is_symlink()) and not claimed_by(self.state, self.state):
            raise NotOurs(f"{self.state} was not made by `gpuyard sim up --stack {self.stack}`: left alone")

    def registry(self) -> registry.Registry | None:
        """The image registry this cluster started (None before it did)."""
        return registry.recorded(self.state)

    def status(self) -> dict[str, Any]:
        recorded = self.supervisor.pids()
        alive = self.supervisor.running()
        images = self.registry()
        return {
            "stack": self.stack, "running": self.running(), "state": str(self.state),
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.is_file() else None,
            "registry": images.prefix(load_stack(self.stack)) if images else None,
            "prometheus": monitoring.recorded(self.state),
            "s3_endpoint": s3.recorded(self.state),
            "processes": {name: {"pid": pid, "alive": name in alive} for name, pid in recorded.items()},
        }


POLICIES_TIMEOUT = 120.0


def _wait_for_admission_policies(kubectl: Kubectl, namespace: str) -> None:
    """Until the API server's policies refuse a LoadBalancer Service in a team namespace (a dry run): it compiles policies and
    bindings from its informers after they are created, so for a moment a new cluster admits what they refuse.
    Every policy was created before the first refusal, and the API server compiles them together."""
    probe = json.dumps({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpuyard-policy-probe",
                        "namespace": namespace}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}})
    deadline = time.monotonic() + POLICIES_TIMEOUT
    while True:
        try:
            kubectl.run("create", "--dry-run=server", "-f", "-", stdin=probe)
        except KubectlError as error:
            if "ValidatingAdmissionPolicy" in str(error):
                return
            if "exceeded quota" not in str(error):  # the team's quota (no load balancers) runs after the policies
                raise
        if time.monotonic() > deadline:
            raise KubectlError(f"the admission policies were not enforced after {POLICIES_TIMEOUT:.0f}s")
        time.sleep(0.5)


def _wait_for_irsa(kubectl: Kubectl, team) -> None:
    """Until a pod of the team's ServiceAccount created now gets its role's variables (a dry run): the API server
    compiles mutating policies from its informers, as the validating ones."""
    probe = json.dumps(irsa.probe_pod(team.namespace, team.service_account, team.priority_class))
    deadline = time.monotonic() + POLICIES_TIMEOUT
    while not irsa.injected(json.loads(kubectl.run("create", "--dry-run=server", "-o", "json", "-f", "-",
                                                   stdin=probe))):
        if time.monotonic() > deadline:
            raise KubectlError(f"IRSA's policies did not mutate a pod after {POLICIES_TIMEOUT:.0f}s")
        time.sleep(0.5)


def _stop_everything(sim: Sim) -> None:
    """Every server, then the real nodes' rules, shims, containers, bridge and cgroups (no servers of the
    supervisor's). The caller holds signals back: a second one must not cut this short."""
    sim.supervisor.stop_all()
    netpol.stop_all(sim.state)
    realnode.stop_all(sim.state)


@contextmanager
def _stopped_on_signal(sim: Sim) -> Iterator[None]:
    """While starting, SIGTERM/SIGINT (or any failure) stops what was started; the logs stay for a look."""
    def interrupted(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    except BaseException:
        with signals_deferred():
            _stop_everything(sim)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
