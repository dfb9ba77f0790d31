"""The Grafana dashboards: training, from the trainer's metric names (jobs/workload/metrics.py), and showback, from
the recording rules of infra/showback.py."""

from __future__ import annotations

from gpuyard.infra.showback import hours_over

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


def _panel(index: int, title: str, query: str | dict[str, str], unit: str, kind: str = "timeseries",
           legend: str = "{{namespace}} {{pod}}") -> dict:
    """A panel in a two-column grid; ``query`` is one PromQL expression or legend -> expression."""
    queries = query if isinstance(query, dict) else {legend: query}
    instant = {"format": "table", "instant": True} if kind == "table" else {}
    return {
        "id": index + 1,
        "type": kind,
        "title": title,
        "gridPos": {"x": (index % 2) * 12, "y": (index // 2) * 8, "w": 12, "h": 8},
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": name, **instant}
                    for i, (name, expr) in enumerate(queries.items())],
    }


def _dashboard(uid: str, title: str, variable: str, values_of: str, panels: list[dict], since: str) -> dict:
    return {
        "uid": uid,
        "title": title,
        "tags": ["gpuyard"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": since, "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": variable,
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": f"label_values({values_of}, {variable})",
                    "includeAll": True,
                    "multi": True,
                },
            ]
        },
        "panels": panels,
    }


def training_dashboard() -> dict:
    """Grafana dashboard JSON: throughput, loss, step time, checkpoint time and failures, GPU utilisation."""
    panels = [_panel(i, title, query, unit) for i, (title, (query, unit)) in enumerate(TRAINING_PANELS.items())]
    return _dashboard("gpuyard-training", "gpuyard / training", "namespace", "gpuyard_train_loss", panels, "now-6h")


TEAM = 'team=~"$team"'
RANGE = "$__range"


def _team_total(series: str) -> str:
    """Per team, ``series`` (a rate per hour) summed over the dashboard's time range."""
    return f"sum by (team) ({hours_over(f'{series}{{{TEAM}}}', RANGE)})"


# title -> (queries by legend, unit, panel type); every query reads a recording rule of infra/showback.py.
SHOWBACK_PANELS: dict[str, tuple[dict[str, str], str, str]] = {
    "GPUs held, used and held idle": ({
        "{{team}} held": f"gpuyard:team_gpus_allocated{{{TEAM}}}",
        "{{team}} used": f"gpuyard:team_gpus_used{{{TEAM}}}",
        "{{team}} held idle": f"gpuyard:team_gpus_allocated_idle{{{TEAM}}}",
    }, "none", "timeseries"),
    "Cost (USD / hour)": ({"{{team}}": f"gpuyard:team_cost_usd_per_hour{{{TEAM}}}"}, "currencyUSD", "timeseries"),
    "GPU-hours in range (held / used)": ({
        "{{team}} held": _team_total("gpuyard:team_gpus_allocated"),
        "{{team}} used": _team_total("gpuyard:team_gpus_used"),
    }, "none", "stat"),
    "Cost in range (USD)": ({"{{team}}": _team_total("gpuyard:team_cost_usd_per_hour")}, "currencyUSD", "stat"),
    "Jobs in range: GPU-hours and USD": ({
        "GPU-hours": f"sum by (team, gpuyard_job) ({hours_over(f'gpuyard:job_gpus_allocated{{{TEAM}}}', RANGE)})",
        "USD": f"sum by (team, gpuyard_job) ({hours_over(f'gpuyard:job_cost_usd_per_hour{{{TEAM}}}', RANGE)})",
    }, "none", "table"),
    "Cluster: GPUs no pod holds, and their cost (USD / hour)": ({
        "idle GPUs": "sum (gpuyard:node_gpus_idle)",
        "idle USD / hour": "gpuyard:idle_cost_usd_per_hour",
    }, "none", "timeseries"),
}


def showback_dashboard() -> dict:
    """Grafana dashboard JSON per team: GPUs held, used and held idle; cost now and over the range; jobs; idle."""
    panels = [_panel(i, title, queries, unit, kind)
              for i, (title, (queries, unit, kind)) in enumerate(SHOWBACK_PANELS.items())]
    return _dashboard("gpuyard-showback", "gpuyard / showback", "team", "gpuyard:team_gpus_allocated", panels, "now-24h")
