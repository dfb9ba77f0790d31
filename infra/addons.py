"""Add-ons: GPU device plugin, Volcano, the Kubeflow operators, KubeRay and (optionally) Kubeflow Trainer v2."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as kubernetes

from infra.charts import (
    EFA_DEVICE_PLUGIN,
    KUBEFLOW_TRAINER,
    KUBERAY_OPERATOR,
    MPI_OPERATOR_MANIFEST,
    NVIDIA_DEVICE_PLUGIN,
    TRAINING_OPERATOR_KUSTOMIZATION,
    VOLCANO,
    Chart,
    release_args,
)
from infra.cluster import LABEL_GPU_NODE, SYSTEM_NODES
from infra.config import AddonsConfig
from infra.conventions import GPU_TAINT_EFFECT, GPU_TAINT_KEY, LABEL_PART_OF, METRICS_PORT, METRICS_PORT_NAME, PART_OF

TORCH_RUNTIME = "torch-distributed"


def gpu_toleration() -> dict[str, str]:
    return {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}


def gpu_daemon_placement() -> dict:
    """Scheduling for per-GPU-node daemons (device plugin, DCGM exporter): GPU nodes only, taint tolerated."""
    return {"nodeSelector": {LABEL_GPU_NODE: "true"}, "tolerations": [gpu_toleration()]}


def efa_plugin_values() -> dict:
    """The EFA device plugin runs on nodes that have EFA interfaces, GPU-tainted or not."""
    return {"nodeSelector": {"vpc.amazonaws.com/efa.present": "true"}, "tolerations": [gpu_toleration()]}


def kuberay_values() -> dict:
    """KubeRay hands RayCluster/RayJob pods to Volcano for gang scheduling."""
    return {"batchScheduler": {"name": "volcano"}, "nodeSelector": SYSTEM_NODES}


def trainer_values() -> dict:
    """Kubeflow Trainer v2 with its JobSet dependency."""
    return {"jobset": {"install": True}}


def torch_runtime_spec(image: str) -> dict:
    """A ClusterTrainingRuntime for torchrun jobs: gang-scheduled by Volcano, tolerating GPU nodes, metrics port open."""
    container = {
        "name": "node",
        "image": image,
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT}],
    }
    pod = {
        "metadata": {"labels": {LABEL_PART_OF: PART_OF, "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
        "spec": {"template": {
            "metadata": {"labels": {LABEL_PART_OF: PART_OF}},
            "spec": {"tolerations": [gpu_toleration()], "containers": [container]},
        }},
    }
    return {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "podGroupPolicy": {"volcano": {}},
        "template": {"spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": pod}]}},
    }


@dataclass(frozen=True)
class AddonsArgs:
    config: AddonsConfig
    trainer_image: str
    k8s_provider: kubernetes.Provider


class Addons(pulumi.ComponentResource):
    """Cluster-wide operators; ``volcano`` is exposed so queues can wait for its CRDs."""

    def __init__(self, name: str, args: AddonsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:addons:Addons", name, None, opts)
        self._name = name
        self._args = args
        self._create_device_plugins()
        self.volcano = self._create_volcano()
        self._create_training_operator()
        self._create_mpi_operator()
        self._create_kuberay()
        if args.config.trainer_v2:
            self._create_trainer_v2()
        self.register_outputs({})

    def _opts(self, *depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self._args.k8s_provider, depends_on=list(depends_on))

    def _release(self, suffix: str, chart: Chart, namespace: str, values: dict, *depends_on: pulumi.Resource):
        return kubernetes.helm.v3.Release(
            f"{self._name}-{suffix}", **release_args(chart, namespace), values=values, opts=self._opts(*depends_on)
        )

    def _create_device_plugins(self) -> None:
        """GPUs (``nvidia.com/gpu``) and EFA interfaces (``vpc.amazonaws.com/efa``) as schedulable resources."""
        self._release("nvidia-device-plugin", NVIDIA_DEVICE_PLUGIN, "nvidia-device-plugin", gpu_daemon_placement())
        self._release("efa-device-plugin", EFA_DEVICE_PLUGIN, "kube-system", efa_plugin_values())

    def _create_volcano(self) -> kubernetes.helm.v3.Release:
        return self._release("volcano", VOLCANO, "volcano-system", {})

    def _create_training_operator(self) -> None:
        kubernetes.kustomize.v2.Directory(
            f"{self._name}-training-operator", directory=TRAINING_OPERATOR_KUSTOMIZATION, opts=self._opts(self.volcano)
        )

    def _create_mpi_operator(self) -> None:
        kubernetes.yaml.v2.ConfigFile(f"{self._name}-mpi-operator", file=MPI_OPERATOR_MANIFEST, opts=self._opts())

    def _create_kuberay(self) -> None:
        self._release("kuberay-operator", KUBERAY_OPERATOR, "kuberay-system", kuberay_values(), self.volcano)

    def _create_trainer_v2(self) -> None:
        trainer = self._release("kubeflow-trainer", KUBEFLOW_TRAINER, "kubeflow-system", trainer_values(), self.volcano)
        kubernetes.apiextensions.CustomResource(
            f"{self._name}-{TORCH_RUNTIME}",
            api_version="trainer.kubeflow.org/v1alpha1",
            kind="ClusterTrainingRuntime",
            metadata={"name": TORCH_RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch", LABEL_PART_OF: PART_OF}},
            spec=torch_runtime_spec(self._args.trainer_image),
            opts=self._opts(trainer),
        )
