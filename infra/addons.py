"""Add-ons: GPU device plugin, Volcano, the Kubeflow operators, KubeRay and (optionally) Kubeflow Trainer v2."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as kubernetes

from gpuyard.infra.charts import (
    EFA_DEVICE_PLUGIN,
    KUBEFLOW_TRAINER,
    KUBERAY_OPERATOR,
    MPI_OPERATOR_KUSTOMIZATION,
    NVIDIA_DEVICE_PLUGIN,
    TRAINING_OPERATOR_KUSTOMIZATION,
    VOLCANO,
    Chart,
    release_args,
)
from gpuyard.infra.cluster import SYSTEM_NODES
from gpuyard.infra.config import AddonsConfig
from gpuyard.infra.conventions import GPU_TAINT_EFFECT, GPU_TAINT_KEY, LABEL_EFA_PRESENT, LABEL_GPU_PRESENT
from gpuyard.infra.gpu_access import DEVICE_LIST_STRATEGY
from gpuyard.infra.operators import KUBERAY_BATCH_SCHEDULER, VOLCANO_SCHEDULER_CONF, VOLCANO_SCHEDULER_CONF_VALUES_KEY


def gpu_toleration() -> dict[str, str]:
    return {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}


def gpu_daemon_placement() -> dict:
    """Scheduling for per-GPU-node daemons (device plugin, DCGM exporter): nodes labelled
    ``nvidia.com/gpu.present=true`` (every GPU node group and GPU NodePool), GPU taint tolerated. The device
    plugin chart's default affinity (pci-10de, cpu vendor NVIDIA or that label) still applies and is met."""
    return {"nodeSelector": {LABEL_GPU_PRESENT: "true"}, "tolerations": [gpu_toleration()]}


def nvidia_plugin_values() -> dict:
    """The NVIDIA device plugin on GPU nodes, handing out GPUs as volume mounts (chart value ``deviceListStrategy``,
    NVIDIA/k8s-device-plugin v0.17.4 deployments/helm/nvidia-device-plugin/values.yaml): infra/gpu_access.py."""
    return {**gpu_daemon_placement(), "deviceListStrategy": DEVICE_LIST_STRATEGY}


def efa_plugin_values() -> dict:
    """The EFA device plugin runs on nodes labelled ``vpc.amazonaws.com/efa.present=true`` (EFA node groups and
    the EFA NodePool), on top of the chart's own instance-type affinity; GPU taint tolerated."""
    return {"nodeSelector": {LABEL_EFA_PRESENT: "true"}, "tolerations": [gpu_toleration()]}


def volcano_values() -> dict:
    """The scheduler configuration of gpuyard.infra.operators, where the chart reads it."""
    section, key = VOLCANO_SCHEDULER_CONF_VALUES_KEY
    return {section: {key: VOLCANO_SCHEDULER_CONF}}


def kuberay_values() -> dict:
    """KubeRay hands RayCluster/RayJob pods to Volcano for gang scheduling (--batch-scheduler=volcano)."""
    return {"batchScheduler": {"name": KUBERAY_BATCH_SCHEDULER}, "nodeSelector": SYSTEM_NODES}


def trainer_values() -> dict:
    """Kubeflow Trainer v2 with its JobSet dependency."""
    return {"jobset": {"install": True}}


@dataclass(frozen=True)
class AddonsArgs:
    config: AddonsConfig
    k8s_provider: kubernetes.Provider


class Addons(pulumi.ComponentResource):
    """Cluster-wide operators; ``volcano`` and ``trainer`` (None without Trainer v2) are exposed so queues and
    training runtimes can wait for their CRDs."""

    def __init__(self, name: str, args: AddonsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:addons:Addons", name, None, opts)
        self._name = name
        self._args = args
        self._create_device_plugins()
        self.volcano = self._create_volcano()
        self._create_training_operator()
        self._create_mpi_operator()
        self._create_kuberay()
        self.trainer = self._create_trainer_v2() if args.config.trainer_v2 else None
        self.register_outputs({})

    def _opts(self, *depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self._args.k8s_provider, depends_on=list(depends_on))

    def _release(self, suffix: str, chart: Chart, namespace: str, values: dict, *depends_on: pulumi.Resource):
        return kubernetes.helm.v3.Release(
            f"{self._name}-{suffix}", **release_args(chart, namespace), values=values, opts=self._opts(*depends_on)
        )

    def _create_device_plugins(self) -> None:
        """GPUs (``nvidia.com/gpu``) and EFA interfaces (``vpc.amazonaws.com/efa``) as schedulable resources."""
        self._release("nvidia-device-plugin", NVIDIA_DEVICE_PLUGIN, "nvidia-device-plugin", nvidia_plugin_values())
        self._release("efa-device-plugin", EFA_DEVICE_PLUGIN, "kube-system", efa_plugin_values())

    def _create_volcano(self) -> kubernetes.helm.v3.Release:
        return self._release("volcano", VOLCANO, "volcano-system", volcano_values())

    def _create_training_operator(self) -> None:
        kubernetes.kustomize.v2.Directory(
            f"{self._name}-training-operator", directory=TRAINING_OPERATOR_KUSTOMIZATION, opts=self._opts(self.volcano)
        )

    def _create_mpi_operator(self) -> None:
        kubernetes.kustomize.v2.Directory(
            f"{self._name}-mpi-operator", directory=MPI_OPERATOR_KUSTOMIZATION, opts=self._opts(self.volcano)
        )

    def _create_kuberay(self) -> None:
        self._release("kuberay-operator", KUBERAY_OPERATOR, "kuberay-system", kuberay_values(), self.volcano)

    def _create_trainer_v2(self) -> kubernetes.helm.v3.Release:
        return self._release("kubeflow-trainer", KUBEFLOW_TRAINER, "kubeflow-system", trainer_values(), self.volcano)
