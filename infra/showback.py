"""Showback: what each team and job holds, uses and costs, as Prometheus recording rules.

The rules read series the stack's monitoring already scrapes; every name below is upstream's at the pinned version:

- kube-state-metrics (the kube-prometheus-stack chart's): ``kube_pod_container_resource_requests`` with
  ``resource="nvidia_com_gpu"`` (an extended resource's name sanitized) and ``node`` (the pod's ``spec.nodeName``,
  empty while unbound), ``kube_pod_status_phase``, ``kube_node_status_allocatable``, and ``kube_pod_labels`` /
  ``kube_node_labels`` carrying the Kubernetes labels allowed by ``--metric-labels-allowlist`` as
  ``label_<sanitized, snake_case key>`` (kubernetes/kube-state-metrics internal/store/pod.go, node.go, utils.go
  ``labelName``): ``gpuyard.io/team`` -> ``label_gpuyard_io_team``, ``eks.amazonaws.com/capacityType`` ->
  ``label_eks_amazonaws_com_capacity_type``.
- DCGM exporter: ``DCGM_FI_DEV_GPU_UTIL`` (percent busy), one series per GPU labelled with the ``namespace`` and
  ``pod`` using it (NVIDIA/dcgm-exporter internal/pkg/transformation/const.go); its ServiceMonitor must honour those
  labels (infra/monitoring.py), or Prometheus renames them ``exported_*``.
- Karpenter's AWS provider: ``karpenter_cloudprovider_instance_type_offering_price_estimate{instance_type,
  capacity_type, zone}``, USD per hour of each offering as Karpenter prices it, spot included
  (aws/karpenter-provider-aws v1.14.1 pkg/controllers/metrics/metrics.go). On-demand prices are the stack's table
  (infra/prices.py), recorded here as constant series.

A node's price is spread evenly over its GPUs; a pod is charged for the GPUs it holds (bound, not finished), so what
no pod holds is the idle cost. CPU-only nodes (system group, MPI launchers) are not charged to teams.
"""

from __future__ import annotations

from typing import Iterable

from gpuyard.infra.config import StackConfig, instance_family
from gpuyard.infra.prices import ON_DEMAND_USD_PER_HOUR, on_demand_price

RULE_GROUP = "gpuyard-showback"
EVERY_MINUTES = 1  # both groups are evaluated once a minute: a rule's samples over W, summed, / 60 is per hour
PRICE_GROUP = "gpuyard-prices"
GPU = 'resource="nvidia_com_gpu"'
OFFERING_PRICE = "karpenter_cloudprovider_instance_type_offering_price_estimate"

# Kubernetes labels kube-state-metrics must export (its chart's ``metricLabelsAllowlist``).
KSM_LABELS_ALLOWLIST = (
    "nodes=[node.kubernetes.io/instance-type,karpenter.sh/capacity-type,eks.amazonaws.com/capacityType,"
    "topology.kubernetes.io/zone,karpenter.sh/nodepool]",
    "pods=[gpuyard.io/team,gpuyard.io/job]",
)


def _renamed(expr: str, renames: dict[str, str]) -> str:
    for target, source in renames.items():
        expr = f'label_replace({expr}, "{target}", "$1", "{source}", "(.+)")'
    return expr


def _node_info() -> str:
    """One series per node: its instance type, zone and capacity type (Karpenter's label, or a managed group's)."""
    names = {"instance_type": "label_node_kubernetes_io_instance_type", "zone": "label_topology_kubernetes_io_zone"}
    karpenter = _renamed('kube_node_labels{label_karpenter_sh_capacity_type!=""}',
                         {**names, "capacity_type": "label_karpenter_sh_capacity_type"})
    managed = [
        f'label_replace({_renamed(f"kube_node_labels{{label_eks_amazonaws_com_capacity_type={value!r}}}", names)}, '
        f'"capacity_type", "{capacity_type}", "", "")'.replace("'", '"')
        for value, capacity_type in (("ON_DEMAND", "on-demand"), ("SPOT", "spot"))
    ]
    return f"max by (node, instance_type, zone, capacity_type) ({' or '.join([karpenter, *managed])})"


def _holding() -> str:
    """GPUs each pod holds: requested, bound to a node and not finished."""
    return (f'sum by (namespace, pod, node) (kube_pod_container_resource_requests{{{GPU}, node!=""}})'
            ' * on (namespace, pod) group_left () '
            '(max by (namespace, pod) (kube_pod_status_phase{phase=~"Pending|Running"}) == 1)')


def _pod_identity() -> str:
    return _renamed("max by (namespace, pod, label_gpuyard_io_team, label_gpuyard_io_job) (kube_pod_labels)",
                    {"team": "label_gpuyard_io_team", "gpuyard_job": "label_gpuyard_io_job"})


def stack_instance_types(config: StackConfig) -> list[str]:
    """Every instance type the stack may run: its node groups' and every priced size of its NodePools' families."""
    families = {*config.karpenter.gpu_families, *config.karpenter.cpu_families}
    groups = [config.cluster.system_node_group, *config.cluster.gpu_node_groups]
    return sorted({*(t for g in groups for t in g.instance_types),
                   *(t for t in ON_DEMAND_USD_PER_HOUR if instance_family(t) in families)})


def price_rules(instance_types: Iterable[str]) -> list[dict]:
    """One constant series per instance type with an on-demand price: USD per hour."""
    return [
        {"record": "gpuyard:instance_type_on_demand_price_usd_per_hour", "expr": f"vector({price!r})",
         "labels": {"instance_type": name}}
        for name in sorted(set(instance_types)) if (price := on_demand_price(name)) is not None
    ]


def showback_rules() -> list[dict]:
    """Per pod, job and team (``team``, ``gpuyard_job`` from the pods' labels): GPUs held, GPUs' worth used, held but
    idle, and USD per hour; per node its price and idle GPUs. Over a window W, ``hours_over(rule, W)`` is GPU-hours
    or dollars (a series is absent while nothing is held, so averaging would overstate)."""
    identity = "max by (namespace, pod, team, gpuyard_job) (gpuyard:pod_identity)"
    by_pod = "namespace, pod, team, gpuyard_job"
    return [
        {"record": "gpuyard:pod_identity", "expr": _pod_identity()},
        {"record": "gpuyard:node_instance:info", "expr": _node_info()},
        {"record": "gpuyard:node_price_usd_per_hour", "expr": (
            '(gpuyard:node_instance:info{capacity_type="on-demand"} * on (instance_type) group_left () '
            "gpuyard:instance_type_on_demand_price_usd_per_hour)"
            ' or (gpuyard:node_instance:info{capacity_type="spot"} * on (instance_type, zone) group_left () '
            f'max by (instance_type, zone) ({OFFERING_PRICE}{{capacity_type="spot"}}))')},
        {"record": "gpuyard:node_gpus_allocatable", "expr": f"sum by (node) (kube_node_status_allocatable{{{GPU}}}) > 0"},
        {"record": "gpuyard:node_gpu_price_usd_per_hour", "expr": (
            "max by (node) (gpuyard:node_price_usd_per_hour) / on (node) gpuyard:node_gpus_allocatable")},
        {"record": "gpuyard:pod_gpus_allocated", "expr": (
            f"{_holding()} * on (namespace, pod) group_left (team, gpuyard_job) {identity}")},
        {"record": "gpuyard:pod_gpus_used", "expr": (
            "sum by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL) / 100"
            f" * on (namespace, pod) group_left (team, gpuyard_job) {identity}")},
        {"record": "gpuyard:pod_cost_usd_per_hour", "expr": (
            "gpuyard:pod_gpus_allocated * on (node) group_left () gpuyard:node_gpu_price_usd_per_hour")},
        {"record": "gpuyard:node_gpus_idle", "expr": (
            "gpuyard:node_gpus_allocatable - on (node) group_left () "
            "(sum by (node) (gpuyard:pod_gpus_allocated) or gpuyard:node_gpus_allocatable * 0)")},
        {"record": "gpuyard:idle_cost_usd_per_hour", "expr": (
            "sum (gpuyard:node_gpus_idle * on (node) gpuyard:node_gpu_price_usd_per_hour)")},
        *(rule for level, keys in (("job", "namespace, team, gpuyard_job"), ("team", "team")) for rule in (
            {"record": f"gpuyard:{level}_gpus_allocated", "expr": f"sum by ({keys}) (gpuyard:pod_gpus_allocated)"},
            {"record": f"gpuyard:{level}_gpus_used", "expr": f"sum by ({keys}) (gpuyard:pod_gpus_used)"},
            {"record": f"gpuyard:{level}_gpus_allocated_idle", "expr": (
                f"clamp_min(sum by ({keys}) (gpuyard:pod_gpus_allocated - on ({by_pod}) group_left () "
                f"(gpuyard:pod_gpus_used or max without (node) (gpuyard:pod_gpus_allocated) * 0)), 0)")},
            {"record": f"gpuyard:{level}_cost_usd_per_hour", "expr": f"sum by ({keys}) (gpuyard:pod_cost_usd_per_hour)"},
        )),
    ]


def hours_over(series: str, window: str) -> str:
    """PromQL: the per-hour rate ``series`` summed over ``window`` (GPUs -> GPU-hours, USD/hour -> USD)."""
    return f"sum_over_time({series}[{window}]) * {EVERY_MINUTES} / 60"


def prometheus_rule_spec(instance_types: Iterable[str]) -> dict:
    """The PrometheusRule spec: the price table first (the showback rules read it)."""
    return {"groups": [
        {"name": PRICE_GROUP, "interval": f"{EVERY_MINUTES}m", "rules": price_rules(instance_types)},
        {"name": RULE_GROUP, "interval": f"{EVERY_MINUTES}m", "rules": showback_rules()},
    ]}
