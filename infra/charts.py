"""Pinned Helm charts and upstream manifests: one place to read (and bump) every add-on version."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Chart:
    """A Helm chart at a fixed version; ``repo`` is empty for OCI charts (the chart name is the full reference).
    ``deploys`` is the version of what the chart installs (its appVersion) where that differs from the chart's."""

    name: str
    version: str
    repo: str = ""
    deploys: str = ""


KARPENTER = Chart("oci://public.ecr.aws/karpenter/karpenter", "1.14.1")
NVIDIA_DEVICE_PLUGIN = Chart("nvidia-device-plugin", "0.17.4", "https://nvidia.github.io/k8s-device-plugin")
# Chart v0.5.8 installs the EFA device plugin v0.5.5 (aws/eks-charts tag v0.0.194, commit 8b25c60,
# stable/aws-efa-k8s-device-plugin/Chart.yaml: version v0.5.8, appVersion "v0.5.5"; values.yaml image.tag "v0.5.5").
EFA_DEVICE_PLUGIN = Chart("aws-efa-k8s-device-plugin", "v0.5.8", "https://aws.github.io/eks-charts", deploys="v0.5.5")
VOLCANO = Chart("volcano", "1.15.1", "https://volcano-sh.github.io/helm-charts")
KUBERAY_OPERATOR = Chart("kuberay-operator", "1.7.0", "https://ray-project.github.io/kuberay-helm/")
KUBEFLOW_TRAINER = Chart("oci://ghcr.io/kubeflow/charts/kubeflow-trainer", "2.3.0")
KUBE_PROMETHEUS_STACK = Chart("kube-prometheus-stack", "79.12.0", "https://prometheus-community.github.io/helm-charts")
DCGM_EXPORTER = Chart("dcgm-exporter", "4.6.0", "https://nvidia.github.io/dcgm-exporter/helm-charts")

# Neither operator publishes a Helm chart: Training Operator v1.9.4 is installed from its kustomize overlay,
# MPI Operator v0.8.0 from its release manifest, each pinned and patched in infra/manifests/<operator>.
MANIFESTS = Path(__file__).resolve().parent / "manifests"
TRAINING_OPERATOR_KUSTOMIZATION = str(MANIFESTS / "training-operator")
MPI_OPERATOR_KUSTOMIZATION = str(MANIFESTS / "mpi-operator")
MPI_OPERATOR_MANIFEST = "https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.0/deploy/v2beta1/mpi-operator.yaml"


def release_args(chart: Chart, namespace: str) -> dict:
    """Keyword arguments for ``kubernetes.helm.v3.Release`` installing ``chart`` into ``namespace``."""
    args = {
        "chart": chart.name,
        "version": chart.version,
        "namespace": namespace,
        "create_namespace": True,
        "atomic": True,
        "cleanup_on_fail": True,
    }
    if chart.repo:
        args["repository_opts"] = {"repo": chart.repo}
    return args
