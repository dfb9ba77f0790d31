"""`gpuyard render --explain`: where a gang lands and what it costs, from the stack file alone (jobs/preflight.py),
and the queue summary the cluster part prints (sim/queues.py; read from a running cluster in tests/test_sim_replay.py)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error, gpuyard
from gpuyard.infra.config import load_stack
from gpuyard.infra.karpenter import ec2_node_class_spec
from gpuyard.infra.prices import on_demand_price
from gpuyard.jobs.preflight import describe, landing
from gpuyard.jobs.spec import SpecError, build_spec
from gpuyard.sim.queues import describe_queue, queue_summary

PROD, DEV = load_stack("prod"), load_stack("dev")
P4D = on_demand_price("p4d.24xlarge")


def _land(config, team: str, kind: str = "pytorchjob", **fields):
    return landing(config, build_spec(config, config.team(team), kind, image="registry.example/ddp:1", **fields))


def test_efa_gang_on_the_efa_nodepool_is_priced_per_node():
    land = _land(PROD, "vision", nodes=2, gpus_per_node=8, efa_devices=4)
    assert (land.pool, land.pool_kind, land.instance_type) == ("gpu-efa", "NodePool", "p4d.24xlarge")
    assert (land.nodes, land.gpus, land.efa_interfaces) == (2, 16, 4)
    assert land.usd_per_node_hour == P4D and land.usd_per_hour == round(2 * P4D, 4)
    assert land.placement_group


def test_managed_efa_group_gets_its_placement_group():
    land = _land(PROD, "nlp", kind="mpijob", nodes=2, gpus_per_node=8, efa_devices=4, node_pool="gpu-a100")
    assert (land.pool, land.pool_kind, land.placement_group) == ("gpu-a100", "managed node group", True)
    assert "placement group: yes" in "\n".join(describe(land))


def test_only_the_efa_node_class_selects_a_placement_group():
    """The pre-flight's answer for NodePools follows the EC2NodeClass: the EFA pool's selects its placement group,
    the default one none."""
    assert ec2_node_class_spec("c", "r", "sg", "c-gpu-efa")["placementGroupSelector"] == {"name": "c-gpu-efa"}
    assert "placementGroupSelector" not in ec2_node_class_spec("c", "r", "sg")
    assert not _land(DEV, "vision", nodes=2, gpus_per_node=4).placement_group


def test_smallest_fitting_size_of_the_pinned_family():
    land = _land(DEV, "vision", nodes=2, gpus_per_node=4)
    assert land.instance_type == "g5.12xlarge" and land.usd_per_hour == round(2 * on_demand_price("g5.12xlarge"), 4)
    assert land.price_note.startswith("on-demand")


def test_spot_is_priced_at_its_on_demand_ceiling():
    land = _land(DEV, "nlp", nodes=1, gpus_per_node=1, capacity_type="spot")
    assert (land.pool, land.capacity_type) == ("gpu-spot", "spot") and "at most the on-demand price" in land.price_note


def test_a_gang_the_stack_never_runs_is_refused_like_render():
    with pytest.raises(SpecError, match="never fits"):
        _land(DEV, "nlp", nodes=4, gpus_per_node=4)


def _queue(deserved: int, allocated: int) -> dict:
    return {"metadata": {"name": "vision"}, "spec": {"deserved": {"nvidia.com/gpu": str(deserved)},
                                                     "capability": {"nvidia.com/gpu": "16"}},
            "status": {"state": "Open", "allocated": {"nvidia.com/gpu": str(allocated), "cpu": "10"}}}


def _group(name: str, queue: str, phase: str, created: str, gpus: int) -> dict:
    return {"metadata": {"name": name, "namespace": f"team-{queue}", "creationTimestamp": created},
            "spec": {"queue": queue, "minResources": {"nvidia.com/gpu": str(gpus)}}, "status": {"phase": phase}}


def test_queue_summary_lists_what_waits_in_the_queue_oldest_first():
    groups = [_group("b", "vision", "Pending", "2026-01-01T00:02:00Z", 8),
              _group("a", "vision", "Inqueue", "2026-01-01T00:01:00Z", 4),
              _group("c", "vision", "Running", "2026-01-01T00:00:00Z", 8),
              _group("d", "nlp", "Pending", "2026-01-01T00:00:00Z", 8)]
    state = queue_summary(_queue(5, 8), groups)
    assert (state["deserved_gpus"], state["allocated_gpus"], state["capability_gpus"]) == (5, 8, 16)
    assert [w["podgroup"] for w in state["waiting"]] == ["team-vision/a", "team-vision/b"]
    assert "waiting ahead: 2 gang(s), 12 GPUs" in "\n".join(describe_queue(state))
    assert "nothing" in describe_queue(queue_summary(_queue(5, 0), []))[-1]


def test_render_explain_prints_the_landing_and_says_there_is_no_cluster():
    result = gpuyard("render", "--stack", "prod", "--team", "vision", "--kind", "pytorchjob", "--nodes", "2",
                         "--gpus-per-node", "8", "--efa", "4", "--explain", env={"KUBECONFIG": ""})
    assert result.returncode == 0, result.stderr
    assert "NodePool gpu-efa, on-demand, 2 x p4d.24xlarge (16 GPUs)" in result.stdout
    assert f"${2 * P4D:,.2f}/hour" in result.stdout and "no cluster" in result.stdout


def test_render_explain_json():
    result = gpuyard("render", "--stack", "dev", "--team", "nlp", "--kind", "mpijob", "--explain", "-o", "json",
                         env={"KUBECONFIG": ""})
    explained = json.loads(result.stdout)
    assert explained["queue"] == "nlp" and explained["queue_state"] is None and explained["usd_per_hour"] > 0


@pytest.mark.parametrize("args, message", [
    (("--all", "--explain"), "--explain explains one job"),
    (("--team", "nlp", "--kind", "mpijob", "--explain", "--kubeconfig", "/nonexistent/kubeconfig"),
     "--kubeconfig /nonexistent/kubeconfig: no such file"),
])
def test_render_explain_bad_input(args, message):
    result = gpuyard("render", "--stack", "dev", *args)
    assert_one_line_error(result, message)
    assert not result.stdout
