"""One simulated cluster per stack: ``up`` builds (cached) and starts everything, ``down`` stops it and removes its
state folder, ``status`` reports what runs."""

from __future__ import annotations

import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from infra.config import load_stack
from sim import addons, karpenter, kwok, nodes, stack
from sim.build import build_all
from sim.controlplane import ControlPlane
from sim.kube import Kubectl
from sim.paths import bin_dir, state_dir
from sim.processes import Supervisor
from sim.versions import kubernetes_tag

READY = "ready"  # written into the state folder once everything started


@dataclass(frozen=True)
class Sim:
    """The simulated cluster of ``stack``, its state in ``folder`` (default: the cache's ``state/<stack>``). With
    ``karpenter`` GPU and CPU nodes come only from Karpenter (sim/karpenter.py), whose NodePools consolidate after
    ``consolidate_after`` if given (tests) or after their own ``consolidateAfter``."""

    stack: str
    folder: Path | None = None
    karpenter: bool = False
    consolidate_after: str | None = None

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
        config = load_stack(self.stack)
        bins = build_all(config.cluster.kubernetes_version, say)
        if self.running() and self.karpenter == ("karpenter" in self.supervisor.pids()):
            say(f"sim {self.stack}: already running")
            return self.kubeconfig
        self.down()
        started = time.monotonic()
        with _stopped_on_signal(self):
            self._start(config, bins, say)
        (self.state / READY).write_text(f"{time.monotonic() - started:.1f}\n")
        say(f"sim {self.stack}: up in {time.monotonic() - started:.0f}s")
        return self.kubeconfig

    def _start(self, config, bins: dict[str, Path], say: Callable[[str], None]) -> None:
        from infra.plan import plan  # the Pulumi SDKs load only here

        control = ControlPlane(self.state, bins)
        self.state.mkdir(parents=True, exist_ok=True)
        say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok")
        control.start(kwok.write_config(self.state / "kwok.yaml"), (addons.TRAINING_OPERATOR_SERVICE,),
                      (addons.TRAINING_OPERATOR_CA,))
        kubectl = Kubectl(bins["kubernetes"] / "kubectl", self.kubeconfig)
        resources = plan(self.stack).resources
        pools = nodes.pools(resources, karpenter=self.karpenter)
        zones = [f"{config.region}{letter}" for letter in "abcdef"[: config.network.az_count]]
        node_list = list(nodes.node_manifests(pools, config.region, zones))
        say(f"creating {len(node_list)} nodes: " + ", ".join(f"{p.name} {p.count}" for p in pools))
        kubectl.apply(node_list)
        context = addons.Context(self.state, bins, self.kubeconfig, control.pki, kubectl, self.supervisor)
        for name, start in addons.STARTS.items():
            if name in bins:
                say(f"starting {name}")
                start(context)
        objects = stack.kubernetes_objects(resources)
        namespaces = stack.release_namespaces(resources, objects)
        say(f"applying the stack's Kubernetes layer ({len(objects)} objects)")
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces)
        kubectl.apply(o for o in objects if stack.simulated(o))
        if self.karpenter:
            say("starting Karpenter with its kwok provider")
            karpenter.start_karpenter(context, resources, config.region, zones, self.consolidate_after)

    def down(self) -> None:
        """Stop every server and remove the state folder (and the folders upstream hard-codes outside it)."""
        if self.state.is_dir():
            self.supervisor.stop_all()
            for path in addons.outside_folders(self.state):
                shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(self.state)

    def status(self) -> dict[str, Any]:
        recorded = self.supervisor.pids()
        alive = self.supervisor.running()
        return {
            "stack": self.stack, "running": self.running(), "state": str(self.state),
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.is_file() else None,
            "processes": {name: {"pid": pid, "alive": name in alive} for name, pid in recorded.items()},
        }


@contextmanager
def _stopped_on_signal(sim: Sim) -> Iterator[None]:
    """While starting, SIGTERM/SIGINT (or any failure) stops what was started; the logs stay for a look."""
    def interrupted(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    except BaseException:
        sim.supervisor.stop_all()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
