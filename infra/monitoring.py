"""Monitoring: kube-prometheus-stack, the DCGM exporter, a PodMonitor for training pods, the showback recording rules
and the Grafana dashboards."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as kubernetes

from gpuyard.infra.addons import gpu_daemon_placement
from gpuyard.infra.cluster import SYSTEM_NODES
from gpuyard.infra.charts import DCGM_EXPORTER, KUBE_PROMETHEUS_STACK, Chart, release_args
from gpuyard.infra.conventions import LABEL_PART_OF, METRICS_PORT_NAME, PART_OF
from gpuyard.infra.dashboard import showback_dashboard, training_dashboard
from gpuyard.infra.showback import KSM_LABELS_ALLOWLIST, prometheus_rule_spec

NAMESPACE = "monitoring"
DASHBOARD_LABEL = "grafana_dashboard"


def prometheus_stack_values(retention: str = "15d") -> dict:
    """Prometheus picks up every PodMonitor, ServiceMonitor and PrometheusRule; kube-state-metrics exports the node
    and pod labels showback reads (infra/showback.py); Grafana's sidecar loads labelled dashboard ConfigMaps."""
    return {
        "kube-state-metrics": {"metricLabelsAllowlist": list(KSM_LABELS_ALLOWLIST)},
        "prometheus": {
            "prometheusSpec": {
                "podMonitorSelectorNilUsesHelmValues": False,
                "serviceMonitorSelectorNilUsesHelmValues": False,
                "ruleSelectorNilUsesHelmValues": False,
                "retention": retention,
                "nodeSelector": SYSTEM_NODES,
            }
        },
        "grafana": {
            "sidecar": {"dashboards": {"enabled": True, "label": DASHBOARD_LABEL, "labelValue": "1", "searchNamespace": "ALL"}}
        },
    }


def dcgm_exporter_values() -> dict:
    """GPU metrics keep the ``namespace`` and ``pod`` of the pod using the GPU (honorLabels: the scrape target's own
    ``namespace``/``pod``, the exporter's, would otherwise win and rename them ``exported_*``)."""
    return {**gpu_daemon_placement(), "serviceMonitor": {"enabled": True, "interval": "15s", "honorLabels": True}}


def training_pod_monitor_spec() -> dict:
    """Scrape the named metrics port of every gpuyard training pod, in every namespace."""
    return {
        "selector": {"matchLabels": {LABEL_PART_OF: PART_OF}},
        "namespaceSelector": {"any": True},
        "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics", "interval": "15s"}],
    }


@dataclass(frozen=True)
class MonitoringArgs:
    k8s_provider: kubernetes.Provider
    instance_types: tuple[str, ...] = ()  # what the stack may run: priced by the showback rules


class Monitoring(pulumi.ComponentResource):
    """Prometheus + Grafana, GPU metrics, training metrics and the training dashboard."""

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:monitoring:Monitoring", name, None, opts)
        self._name = name
        self._args = args
        stack = self._create_prometheus_stack()
        self._create_dcgm_exporter(stack)
        self._create_pod_monitor(stack)
        self._create_showback_rules(stack)
        self._create_dashboard(stack, "dashboard", "gpuyard-training", training_dashboard())
        self._create_dashboard(stack, "showback-dashboard", "gpuyard-showback", showback_dashboard())
        self.register_outputs({})

    def _opts(self, *depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self._args.k8s_provider, depends_on=list(depends_on))

    def _release(self, suffix: str, chart: Chart, values: dict, *depends_on: pulumi.Resource) -> kubernetes.helm.v3.Release:
        return kubernetes.helm.v3.Release(
            f"{self._name}-{suffix}", **release_args(chart, NAMESPACE), values=values, opts=self._opts(*depends_on)
        )

    def _create_prometheus_stack(self) -> kubernetes.helm.v3.Release:
        return self._release("kube-prometheus-stack", KUBE_PROMETHEUS_STACK, prometheus_stack_values())

    def _create_dcgm_exporter(self, stack: kubernetes.helm.v3.Release) -> None:
        self._release("dcgm-exporter", DCGM_EXPORTER, dcgm_exporter_values(), stack)

    def _create_pod_monitor(self, stack: kubernetes.helm.v3.Release) -> None:
        kubernetes.apiextensions.CustomResource(
            f"{self._name}-training",
            api_version="monitoring.coreos.com/v1",
            kind="PodMonitor",
            metadata={"name": "gpuyard-training", "namespace": NAMESPACE, "labels": {LABEL_PART_OF: PART_OF}},
            spec=training_pod_monitor_spec(),
            opts=self._opts(stack),
        )

    def _create_showback_rules(self, stack: kubernetes.helm.v3.Release) -> None:
        kubernetes.apiextensions.CustomResource(
            f"{self._name}-showback",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata={"name": "gpuyard-showback", "namespace": NAMESPACE, "labels": {LABEL_PART_OF: PART_OF}},
            spec=prometheus_rule_spec(self._args.instance_types),
            opts=self._opts(stack),
        )

    def _create_dashboard(self, stack: kubernetes.helm.v3.Release, suffix: str, name: str, board: dict) -> None:
        kubernetes.core.v1.ConfigMap(
            f"{self._name}-{suffix}",
            metadata={"name": f"{name}-dashboard", "namespace": NAMESPACE,
                      "labels": {DASHBOARD_LABEL: "1", LABEL_PART_OF: PART_OF}},
            data={f"{name}.json": json.dumps(board, indent=1, sort_keys=True)},
            opts=self._opts(stack),
        )
