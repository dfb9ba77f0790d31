"""`gpuyard sim up --monitoring`: kube-state-metrics and Prometheus evaluating the stack's showback rules.

kube-state-metrics (sim/go/kube-state-metrics) watches the simulated cluster with the stack's label allowlist
(infra/showback.py KSM_LABELS_ALLOWLIST, what infra/monitoring.py gives the chart); Prometheus (sim/go/prometheus)
scrapes it and evaluates the stack's PrometheusRule groups unchanged (infra/showback.py prometheus_rule_spec, once
a minute as on EKS), so `gpuyard:*` series are what the rules compute from a cluster's real objects. Not here: the
DCGM exporter (kwok nodes have no GPU: every `*_gpus_used` series is absent) and Karpenter's AWS price metric (the
kwok provider exports none: spot nodes have no price). Both servers listen on 127.0.0.1.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpuyard.infra.config import StackConfig
from gpuyard.infra.showback import KSM_LABELS_ALLOWLIST, prometheus_rule_spec, stack_instance_types
from gpuyard.sim.processes import Supervisor, free_port

RECORD = "monitoring.json"
SCRAPE_INTERVAL = "5s"  # the chart scrapes every 30 s; faster here so a test sees a gang within seconds
READY_TIMEOUT_SECONDS = 60
RESOURCES = "pods,nodes"  # what the showback rules read


def start(supervisor: Supervisor, bins: dict[str, Path], kubeconfig: Path, config: StackConfig) -> str:
    """Start kube-state-metrics and Prometheus under ``supervisor``; returns Prometheus's URL once both answer."""
    state = supervisor.state
    metrics, telemetry, web = free_port(), free_port(), free_port()
    supervisor.start("kube-state-metrics", [
        str(bins["kube-state-metrics"] / "kube-state-metrics"), f"--kubeconfig={kubeconfig}",
        "--host=127.0.0.1", f"--port={metrics}", "--telemetry-host=127.0.0.1", f"--telemetry-port={telemetry}",
        f"--resources={RESOURCES}", f"--metric-labels-allowlist={','.join(KSM_LABELS_ALLOWLIST)}",
    ])
    rules = state / "showback-rules.yaml"
    rules.write_text(yaml.safe_dump(prometheus_rule_spec(stack_instance_types(config))))
    settings = state / "prometheus.yaml"
    settings.write_text(yaml.safe_dump({
        "global": {"scrape_interval": SCRAPE_INTERVAL},
        "rule_files": [str(rules)],
        # honor_labels: kube-state-metrics' own namespace/pod/node labels name the objects (the chart's
        # ServiceMonitor sets honorLabels for it too)
        "scrape_configs": [{"job_name": "kube-state-metrics", "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{metrics}"]}]}],
    }))
    supervisor.start("prometheus", [
        str(bins["prometheus"] / "prometheus"), f"--config.file={settings}",
        f"--storage.tsdb.path={state / 'prometheus'}", f"--web.listen-address=127.0.0.1:{web}",
    ])
    url = f"http://127.0.0.1:{web}"
    _wait_ready(supervisor, url)
    (state / RECORD).write_text(json.dumps({"prometheus": url}) + "\n")
    return url


def _wait_ready(supervisor: Supervisor, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        for name in ("kube-state-metrics", "prometheus"):
            supervisor.check(name)
        targets = _get(url, "/api/v1/targets")
        if targets and any(t["health"] == "up" for t in targets["data"]["activeTargets"]):
            return
        time.sleep(0.5)
    raise RuntimeError(f"Prometheus at {url} did not scrape kube-state-metrics within {READY_TIMEOUT_SECONDS}s")


def _get(url: str, path: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url + path, timeout=5) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def recorded(state: Path) -> str | None:
    """The Prometheus URL a state folder's ``start`` recorded, if any."""
    path = state / RECORD
    return json.loads(path.read_text())["prometheus"] if path.is_file() else None


def query(url: str, expression: str) -> list[dict[str, Any]]:
    """The instant vector ``expression`` evaluates to now (Prometheus's HTTP API); a RuntimeError if it fails."""
    answer = _get(url, "/api/v1/query?" + urllib.parse.urlencode({"query": expression}))
    if not answer or answer.get("status") != "success":
        raise RuntimeError(f"Prometheus at {url} did not answer {expression!r}: {answer}")
    return answer["data"]["result"]
