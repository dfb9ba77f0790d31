"""``gpuyard plan`` as users run it, and the stack outputs the program exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from gpuyard.infra.plan import format_preview, plan_summary, policy_verdicts
from gpuyard.infra.policy.rules import RESOURCE_CHECKS, STACK_CHECKS
from infra_plans import stack_plan

CLI = [sys.executable, "-c", "from gpuyard.jobs.cli.main import main; main()", "plan"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def test_json_lists_every_resource_with_type_name_parent_inputs():
    result = run("--stack", "dev", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    resources = document["resources"]
    assert len(resources) == document["create"] == len(stack_plan("dev").resources)
    assert set(document["policies"]) == {*RESOURCE_CHECKS, *STACK_CHECKS} and not any(document["policies"].values())
    assert all(set(r) == {"type", "name", "parent", "inputs"} for r in resources)
    (cluster,) = [r for r in resources if r["type"] == "aws:eks/cluster:Cluster"]
    assert cluster["parent"] == "cluster" and cluster["inputs"]["name"] == "gpuyard-dev"
    (provider,) = [r for r in resources if r["type"] == "pulumi:providers:kubernetes"]
    assert provider["inputs"]["kubeconfig"] == "[secret]"


def test_preview_shows_every_resource_by_type_and_name_the_policies_and_a_summary():
    result = run("--stack", "prod")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    resources = stack_plan("prod").resources
    assert lines[0] == "Previewing update (prod), offline under Pulumi's mocks:"
    rows = [line for line in lines if line.startswith(" +   ")]
    assert len(rows) == len(resources) + 1  # and the stack itself
    assert any(re.fullmatch(r" \+   ├─ gpuyard:tenancy:Team\s+team-research", row) for row in rows)
    assert any(re.fullmatch(r" \+   │  ├─ aws:eks/cluster:Cluster\s+cluster-eks", row) for row in rows)
    assert "    ✅ gpuyard (infra/policy): 16 policies, 0 violations" in lines
    assert "        pass  imdsv2-required" in lines
    assert lines[-2:] == ["Resources:", f"    + {len(resources)} to create"]


def test_policy_violations_are_shown_per_resource():
    resources = [r for r in stack_plan("dev").resources if "BucketPublicAccessBlock" not in r.type]
    verdicts = policy_verdicts(resources)
    assert verdicts["buckets-encrypted-and-private"] == ["bucket storage-checkpoints has no public access block"]
    text = format_preview("dev", resources, verdicts)
    assert "    ❌ gpuyard (infra/policy): 16 policies, 1 violations" in text
    assert "        fail  buckets-encrypted-and-private\n              - bucket storage-checkpoints" in text


def test_unknown_stack_is_a_usage_error():
    result = run("--stack", "nope")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("gpuyard: error: Invalid value for '--stack': unknown stack 'nope' (stacks: ")


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


FORKED_BESIDE = '''
import asyncio, os, signal, sys
from gpuyard.infra.plan import plan
plan("dev")
child = os.fork()
if child == 0:  # a fork sitting in the parent's asyncio loop, as a forked `gpuyard plan` of the tests did
    asyncio.get_event_loop().run_forever()
try:
    for stack in ("prod", "ephemeral", "dev"):
        plan(stack)
    print("planned")
finally:
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
'''


def test_a_plan_beside_a_fork_of_its_process_does_not_share_its_event_loop():
    """A fork inherits the asyncio loop a plan ran in: its epoll and the self-pipe Pulumi's executor threads wake it
    through. A child blocked in that loop took the parent's wake-ups, and the parent's next plan waited forever (a CI
    run hung so, in `gpuyard plan` forked by a test and in the worker after it); each plan now runs in a loop of its
    own. Measured with the shared loop: this test timed out in one run of two (and a plan still waited after 180 s); with its own loop 3 of 3 passed in 5 s."""
    result = subprocess.run([sys.executable, "-c", FORKED_BESIDE], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout.strip()) == (0, "planned"), result.stderr[-3000:]
