"""The Grafana dashboard for training, built from the trainer's metric names (jobs/workload/metrics.py)."""

from __future__ import annotations

# title -> (PromQL, unit); queries group by the pod's namespace (one per team) and job label.
TRAINING_PANELS: dict[str, tuple[str, str]] = {
    "Samples / s": ("sum by (namespace) (gpuyard_train_samples_per_second{namespace=~\"$namespace\"})", "ops"),
    "Loss": ("gpuyard_train_loss{namespace=~\"$namespace\"}", "none"),
    "Step time (mean)": (
        "rate(gpuyard_train_step_seconds_sum{namespace=~\"$namespace\"}[5m])"
        " / rate(gpuyard_train_step_seconds_count{namespace=~\"$namespace\"}[5m])",
        "s",
    ),
    "Checkpoint save seconds (p95)": (
        "histogram_quantile(0.95, sum by (le, namespace) "
        "(rate(gpuyard_checkpoint_save_seconds_bucket{namespace=~\"$namespace\"}[15m])))",
        "s",
    ),
    "Checkpoint failures": (
        "increase(gpuyard_checkpoint_save_failures_total{namespace=~\"$namespace\"}[1h])",
        "none",
    ),
    "GPU utilisation": ("avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", "percent"),
}


def _panel(index: int, title: str, query: str, unit: str) -> dict:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "gridPos": {"x": (index % 2) * 12, "y": (index // 2) * 8, "w": 12, "h": 8},
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": "A", "expr": query, "legendFormat": "{{namespace}} {{pod}}"}],
    }


def training_dashboard() -> dict:
    """Grafana dashboard JSON: throughput, loss, step time, checkpoint time and failures, GPU utilisation."""
    return {
        "uid": "gpuyard-training",
        "title": "gpuyard / training",
        "tags": ["gpuyard"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "namespace",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(gpuyard_train_loss, namespace)",
                    "includeAll": True,
                    "multi": True,
                },
            ]
        },
        "panels": [_panel(i, title, query, unit) for i, (title, (query, unit)) in enumerate(TRAINING_PANELS.items())],
    }
