"""The showback recording rules (infra/showback.py) and the showback dashboard's queries, run by `promtool test rules`
(Prometheus v3.16.0, built from its Go module like the simulated cluster's components) on synthetic series shaped
as kube-state-metrics, the DCGM exporter and Karpenter's AWS provider export them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuyard.infra.config import load_stack
from gpuyard.infra.dashboard import SHOWBACK_PANELS, training_dashboard, showback_dashboard
from gpuyard.infra.prices import on_demand_price
from gpuyard.infra.showback import prometheus_rule_spec, stack_instance_types

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="promtool is built from its Go module: no `go` on PATH")
P4D, P5, G6E = on_demand_price("p4d.24xlarge"), on_demand_price("p5.48xlarge"), 0.9  # g6e spot: Karpenter's estimate
HOURS = 3  # of synthetic series, one sample a minute


@pytest.fixture(scope="module")
def promtool() -> Path:
    from gpuyard.sim.build import build_component
    from gpuyard.sim.versions import PROMETHEUS

    return build_component(PROMETHEUS, print) / "promtool"


def _series(name: str, value: float, minutes: int = HOURS * 60, **labels: str) -> dict:
    shown = ", ".join(f'{key}="{val}"' for key, val in labels.items())
    return {"series": f"{name}{{{shown}}}", "values": f"{value!r}x{minutes}"}


def _node(node: str, instance_type: str, zone: str, gpus: int, karpenter: str = "", managed: str = "") -> list[dict]:
    labels = {"node": node, "label_node_kubernetes_io_instance_type": instance_type,
              "label_topology_kubernetes_io_zone": zone}
    if karpenter:
        labels["label_karpenter_sh_capacity_type"] = karpenter
    if managed:
        labels["label_eks_amazonaws_com_capacity_type"] = managed
    found = [_series("kube_node_labels", 1, **labels)]
    if gpus:
        found.append(_series("kube_node_status_allocatable", gpus, node=node, resource="nvidia_com_gpu", unit="integer"))
    return found


def _pod(team: str, job: str, pod: str, node: str, gpus: int, phase: str, utilisation: float | None = None) -> list[dict]:
    namespace = f"team-{team}"
    found = [
        _series("kube_pod_container_resource_requests", gpus, namespace=namespace, pod=pod, container="trainer",
                node=node, resource="nvidia_com_gpu", unit="integer"),
        _series("kube_pod_labels", 1, namespace=namespace, pod=pod, label_gpuyard_io_team=team, label_gpuyard_io_job=job),
        *(_series("kube_pod_status_phase", int(p == phase), namespace=namespace, pod=pod, phase=p)
          for p in ("Pending", "Running", "Succeeded", "Failed")),
    ]
    if utilisation is not None:
        found += [_series("DCGM_FI_DEV_GPU_UTIL", utilisation, gpu=str(i), Hostname=node, namespace=namespace, pod=pod)
                  for i in range(gpus)]
    return found


def _cluster() -> list[dict]:
    """p4d on demand (Karpenter), g6e spot (Karpenter) and p5 on demand (managed group), a CPU system node;
    vision's job holds the p4d (one pod busy, one half busy), nlp's one GPU on the spot node idles, nlp's finished
    pod and vision's unbound one hold nothing."""
    return [
        *_node("n1", "p4d.24xlarge", "us-west-2a", 8, karpenter="on-demand"),
        *_node("n2", "g6e.xlarge", "us-west-2b", 1, karpenter="spot"),
        *_node("n3", "p5.48xlarge", "us-west-2a", 8, managed="ON_DEMAND"),
        *_node("n4", "m6i.2xlarge", "us-west-2a", 0, managed="ON_DEMAND"),
        *(_series("karpenter_cloudprovider_instance_type_offering_price_estimate", price, instance_type="g6e.xlarge",
                  capacity_type="spot", zone=zone) for zone, price in (("us-west-2a", 1.1), ("us-west-2b", G6E))),
        *_pod("vision", "resnet", "resnet-worker-0", "n1", 4, "Running", 100),
        *_pod("vision", "resnet", "resnet-worker-1", "n1", 4, "Running", 50),
        *_pod("nlp", "bert", "bert-worker-0", "n2", 1, "Running", 0),
        *_pod("nlp", "gpt", "gpt-worker-0", "n3", 8, "Succeeded"),
        *_pod("vision", "vit", "vit-worker-0", "", 8, "Pending"),
    ]


def _samples(record: str, rows: list[tuple[dict[str, str], float]]) -> dict:
    return {"expr": record, "eval_time": "10m", "exp_samples": [
        {"labels": record + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": value}
        for labels, value in rows]}


def _expectations() -> list[dict]:
    vision, nlp = {"team": "vision"}, {"team": "nlp"}
    return [
        _samples("gpuyard:node_price_usd_per_hour", [
            ({"node": "n1", "instance_type": "p4d.24xlarge", "zone": "us-west-2a", "capacity_type": "on-demand"}, P4D),
            ({"node": "n2", "instance_type": "g6e.xlarge", "zone": "us-west-2b", "capacity_type": "spot"}, G6E),
            ({"node": "n3", "instance_type": "p5.48xlarge", "zone": "us-west-2a", "capacity_type": "on-demand"}, P5),
            ({"node": "n4", "instance_type": "m6i.2xlarge", "zone": "us-west-2a", "capacity_type": "on-demand"},
             on_demand_price("m6i.2xlarge")),
        ]),
        _samples("gpuyard:team_gpus_allocated", [(vision, 8), (nlp, 1)]),
        _samples("gpuyard:team_gpus_used", [(vision, 6), (nlp, 0)]),
        _samples("gpuyard:team_gpus_allocated_idle", [(vision, 2), (nlp, 1)]),
        _samples("gpuyard:team_cost_usd_per_hour", [(vision, P4D), (nlp, G6E)]),
        _samples("gpuyard:job_gpus_allocated", [({"namespace": "team-vision", "team": "vision", "gpuyard_job": "resnet"}, 8),
                                                ({"namespace": "team-nlp", "team": "nlp", "gpuyard_job": "bert"}, 1)]),
        _samples("gpuyard:node_gpus_idle", [({"node": "n1"}, 0), ({"node": "n2"}, 0), ({"node": "n3"}, 8)]),
        _samples("gpuyard:idle_cost_usd_per_hour", [({}, P5)]),
    ]


def _dashboard_expectations() -> list[dict]:
    """The dashboard's range totals over the last two hours of the series: GPU-hours and dollars."""
    hours = 2
    totals = {
        ("Cost in range (USD)", "{{team}}"): [({"team": "vision"}, P4D * hours), ({"team": "nlp"}, G6E * hours)],
        ("GPU-hours in range (held / used)", "{{team}} used"): [({"team": "vision"}, 6 * hours), ({"team": "nlp"}, 0)],
    }
    tests = []
    for (title, legend), rows in totals.items():
        expr = SHOWBACK_PANELS[title][0][legend].replace('=~"$team"', '=~".+"').replace("$__range", f"{hours}h")
        tests.append({"expr": expr, "eval_time": f"{HOURS}h", "exp_samples": [
            {"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": value}
            for labels, value in rows]})
    return tests


def _run(promtool: Path, folder: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    rules = folder / "rules.yaml"
    rules.write_text(yaml.safe_dump(prometheus_rule_spec(stack_instance_types(load_stack("prod")) + ["m6i.2xlarge"])))
    spec = {"rule_files": [rules.name], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": _cluster(), "promql_expr_test": tests}]}
    (folder / "test.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=folder, capture_output=True, text=True)


def test_rules_pass_promtool_check(promtool, tmp_path):
    for stack in ("dev", "prod", "ephemeral"):
        rules = tmp_path / f"{stack}.yaml"
        rules.write_text(yaml.safe_dump(prometheus_rule_spec(stack_instance_types(load_stack(stack)))))
        result = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_showback_per_team_job_and_node(promtool, tmp_path):
    result = _run(promtool, tmp_path, _expectations())
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_range_totals(promtool, tmp_path):
    result = _run(promtool, tmp_path, _dashboard_expectations())
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails(promtool, tmp_path):
    """promtool really compares: vision holding 7 GPUs instead of 8 is reported."""
    result = _run(promtool, tmp_path, [_samples("gpuyard:team_gpus_allocated", [({"team": "vision"}, 7), ({"team": "nlp"}, 1)])])
    assert result.returncode == 1 and "gpuyard:team_gpus_allocated" in result.stdout + result.stderr


def test_dashboards_read_only_recorded_or_own_series():
    exprs = [t["expr"] for p in showback_dashboard()["panels"] for t in p["targets"]]
    assert exprs and all("gpuyard:" in e for e in exprs)
    assert {p["title"] for p in training_dashboard()["panels"]} and showback_dashboard()["uid"] == "gpuyard-showback"
