"""``gpuyard env`` conventions: --json where a table is printed, --dry-run, destroy asks unless --yes."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from test_ephemeral_cleanup import CLUSTER, gpuyard as cleanup_cli, seeded  # noqa: F401 (fixture)
from test_ephemeral_stacks import GPUYARD, _calls, aws_leftovers, fake_pulumi, gpuyard, sandbox  # noqa: F401 (fixtures)


def test_list_json_is_the_leases(sandbox, fake_pulumi):
    result = gpuyard(sandbox, "env", "list", "--json")
    assert result.returncode == 0, result.stderr
    envs = json.loads(result.stdout)
    assert [(e["stack"], e["cluster"], e["region"], e["owner"], e["team"]) for e in envs] == [
        ("pr-1", "gpuyard-ephemeral-pr-1", "us-east-1", "ana", "sandbox"),
        ("pr-2", "gpuyard-ephemeral-pr-2", "us-east-1", "ana", "sandbox")]
    assert all(e["expires_at"].endswith("Z") for e in envs)


def test_create_dry_run_prints_the_config_and_creates_nothing(sandbox, fake_pulumi):
    result = gpuyard(sandbox, "env", "create", "pr-3", "--ttl", "90m", "--owner", "ana", "--dry-run")
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout.split("dry run:")[0])["config"]
    assert config["gpuyard:cluster_name"] == "gpuyard-ephemeral-pr-3" and config["gpuyard:lease"]["owner"] == "ana"
    assert "dry run: stack pr-3 not created" in result.stdout
    assert not (fake_pulumi / "calls.log").exists() or _calls(fake_pulumi) == []
    assert "pr-3" not in json.loads((fake_pulumi / "stacks.json").read_text())


@pytest.mark.parametrize("answer", ["n\n", ""], ids=["no", "end-of-input"])
def test_destroy_asks_first_and_no_destroys_nothing(sandbox, fake_pulumi, answer):
    result = subprocess.run([GPUYARD, "env", "destroy", "pr-2"], env=sandbox["env"], text=True, capture_output=True,
                            input=answer, timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["gpuyard: error: not confirmed, nothing destroyed (pass --yes to skip the question)"]
    assert "Destroy environment pr-2 and everything in cluster gpuyard-ephemeral-pr-2?" in result.stdout
    assert "destroy pr-2" not in _calls(fake_pulumi)
    assert "pr-2" in json.loads((fake_pulumi / "stacks.json").read_text())


def test_destroy_dry_run_lists_the_leftovers_and_destroys_nothing(sandbox, fake_pulumi, aws_leftovers):
    before = aws_leftovers.existing()
    result = gpuyard(sandbox, "env", "destroy", "pr-1", "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left in AWS by cluster gpuyard-ephemeral-pr-1" in result.stdout
    for _, resource_id in aws_leftovers.world.doomed:
        assert resource_id.rsplit("/", 1)[-1] in result.stdout
    assert "dry run: nothing destroyed" in result.stdout
    assert "destroy pr-1" not in _calls(fake_pulumi) and aws_leftovers.existing() == before


def test_cleanup_json_lists_then_reports_what_was_deleted(local_aws, seeded):  # noqa: F811
    listed = cleanup_cli("env", "cleanup", "--cluster", CLUSTER, "--dry-run", "--json", endpoint=local_aws.endpoint_url)
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)["found"]
    assert {(o["kind"], o["id"]) for o in found} >= {(k, i.rsplit("/", 1)[-1]) for k, i in seeded.world.doomed
                                                      if "/" not in i}
    done = cleanup_cli("env", "cleanup", "--cluster", CLUSTER, "--yes", "--json", endpoint=local_aws.endpoint_url)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "gone" in done.stderr  # progress goes beside the JSON, not into it
    assert len(report["deleted"]) == len(found) and report["failed"] == [] and report["left"] == []


def test_cleanup_json_without_yes_is_refused():
    result = cleanup_cli("env", "cleanup", "--cluster", CLUSTER, "--json", endpoint="http://127.0.0.1:9")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["gpuyard: error: --json cannot ask before deleting: add --yes, or --dry-run "
                                          "to only list"]
