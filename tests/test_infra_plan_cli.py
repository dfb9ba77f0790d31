"""``gpuyard plan`` as users run it, and the stack outputs the program exports."""

from __future__ import annotations

import json
import subprocess
import sys

from infra.plan import plan_summary
from infra_plans import stack_plan

CLI = [sys.executable, "-c", "from jobs.cli.main import main; main()", "plan"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def test_json_lists_every_resource_with_type_name_parent_inputs():
    result = run("--stack", "dev", "--json")
    assert result.returncode == 0, result.stderr
    resources = json.loads(result.stdout)
    assert len(resources) == len(stack_plan("dev").resources)
    assert all(set(r) == {"type", "name", "parent", "inputs"} for r in resources)
    (cluster,) = [r for r in resources if r["type"] == "aws:eks/cluster:Cluster"]
    assert cluster["parent"] == "cluster" and cluster["inputs"]["name"] == "gpuyard-dev"
    (provider,) = [r for r in resources if r["type"] == "pulumi:providers:kubernetes"]
    assert provider["inputs"]["kubeconfig"] == "[secret]"


def test_tree_groups_by_component_with_counts():
    result = run("--stack", "prod")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    count = len(stack_plan("prod").resources)
    assert lines[0] == f"stack prod: {count} resources"
    assert "  team-research (gpuyard:tenancy:Team, 15 resources)" in lines
    assert "       2 x aws:ec2/placementGroup:PlacementGroup" in lines
    assert "totals:" in lines


def test_unknown_stack_is_a_usage_error():
    result = run("--stack", "nope")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("gpuyard: error: unknown stack 'nope'")


def test_summary_for_the_demo():
    count, per_type = plan_summary("dev")
    assert count == sum(per_type.values()) == len(stack_plan("dev").resources)
    assert per_type["kubernetes:karpenter.sh/v1:NodePool"] == 3


def test_outputs_for_render_and_operators():
    outputs = stack_plan("dev").outputs
    assert outputs["cluster_name"] == "gpuyard-dev"
    assert outputs["checkpoint_bucket"] == "gpuyard-dev-checkpoints"
    assert outputs["kubeconfig"] == "[secret]"
    assert set(outputs["ecr_repositories"]) == {"ddp", "mpi", "ray"}
    assert outputs["teams"]["vision"] == {
        "namespace": "team-vision",
        "service_account": "vision-trainer",
        "queue": "vision",
        "role_arn": "arn:aws:iam::123456789012:role/team-vision-irsa",
    }
