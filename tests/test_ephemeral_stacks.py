"""Ephemeral stacks: lease config, reaping decision, and the CLI without (or with a stand-in for) the Pulumi CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from gpuyard.infra.config import ConfigError, Lease, parse_stack
from gpuyard.jobs.local_aws import free_port
from gpuyard.jobs.ephemeral.stacks import (LEASE_KEY, PULUMI_MISSING, EnvError, EnvStack, due_for_reaping, env_config,
                                   env_from_config)

REPO = Path(__file__).resolve().parent.parent
GPUYARD = str(Path(sys.executable).with_name("gpuyard"))
NOW = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)
TEMPLATE = yaml.safe_load((REPO / "stacks" / "Pulumi.ephemeral.yaml").read_text())["config"]


def env(name: str, expires_in: timedelta | None) -> EnvStack:
    lease = None if expires_in is None else Lease(owner="ana", expires_at=NOW + expires_in)
    return EnvStack(name, f"gpuyard-ephemeral-{name}", "us-west-2", lease)


# -- pure logic -------------------------------------------------------------------------


def test_reaping_takes_exactly_the_expired_leases_longest_expired_first():
    stacks = [env("fresh", timedelta(hours=3)), env("old", -timedelta(days=2)), env("prod", None),
              env("just", timedelta(0)), env("recent", -timedelta(minutes=5))]
    assert [s.name for s in due_for_reaping(stacks, NOW)] == ["old", "recent", "just"]
    assert due_for_reaping(stacks, NOW - timedelta(days=3)) == []
    assert due_for_reaping([], NOW) == []


def test_env_config_keeps_the_template_and_adds_its_own_cluster_and_lease():
    values = env_config("pr-7", TEMPLATE, "ana", "sandbox", NOW + timedelta(hours=8))
    assert values["gpuyard:cluster_name"] == "gpuyard-ephemeral-pr-7"
    assert values[LEASE_KEY] == {"owner": "ana", "team": "sandbox", "expires_at": "2026-12-02T23:00:00Z"}
    assert {k: v for k, v in values.items() if k not in ("gpuyard:cluster_name", LEASE_KEY)} == {
        k: v for k, v in TEMPLATE.items() if k != "gpuyard:cluster_name"}
    config = parse_stack("pr-7", values)
    assert config.lease == Lease(owner="ana", team="sandbox", expires_at=NOW + timedelta(hours=8))
    assert config.teams == parse_stack("ephemeral", TEMPLATE).teams


@pytest.mark.parametrize("name, owner, team, message", [
    ("pr-7", "ana", "nope", "unknown team 'nope' in stack 'ephemeral' (teams: sandbox)"),
    ("pr-7", "", None, "stack 'pr-7': gpuyard:lease.owner: String should have at least 1 character"),
    ("x" * 50, "ana", None, "cluster_name: String should have at most 63 characters"),
])
def test_env_config_rejects_bad_input_in_one_line(name, owner, team, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        env_config(name, TEMPLATE, owner, team, NOW)


def test_env_from_config_reads_the_lease_as_the_automation_api_returns_it():
    lease = {"owner": "ana", "expires_at": "2026-12-02T23:00:00Z"}
    values = {"gpuyard:cluster_name": "c", "aws:region": "eu-west-1", LEASE_KEY: json.dumps(lease)}
    assert env_from_config("pr-7", values) == EnvStack("pr-7", "c", "eu-west-1",
                                                       Lease(owner="ana", expires_at=NOW + timedelta(hours=8)))
    assert env_from_config("dev", {"gpuyard:cluster_name": "c"}).lease is None
    with pytest.raises(EnvError, match="stack 'pr-7': gpuyard:lease is not a valid lease"):
        env_from_config("pr-7", {LEASE_KEY: '{"owner": "ana"}'})


# -- the CLI --------------------------------------------------------------------------------


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def sandbox(tmp_path):
    """A copy of stacks/, an empty HOME and a PATH with no Pulumi CLI; nothing outside may change."""
    stacks = tmp_path / "stacks"
    shutil.copytree(REPO / "stacks", stacks)
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    if shutil.which("pulumi", path=path):
        pytest.skip("a Pulumi CLI is installed on this machine")
    variables = {**os.environ, "PATH": path, "HOME": str(home), "GPUYARD_STACKS_DIR": str(stacks), "COLUMNS": "200"}
    variables.pop("PULUMI_HOME", None)
    before = (_tree_digest(stacks), _tree_digest(REPO / "stacks"))
    yield {"env": variables, "stacks": stacks, "home": home, "bin": bin_dir}
    assert (_tree_digest(stacks), _tree_digest(REPO / "stacks")) == before


def gpuyard(sandbox, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GPUYARD, *args], env=sandbox["env"], text=True, capture_output=True, timeout=60)


@pytest.mark.parametrize("args", [
    ["env", "create", "pr-7", "--ttl", "8h"],
    ["env", "create", "pr-7", "--ttl", "2d", "--team", "sandbox", "--owner", "ana"],
    ["env", "destroy", "pr-7"],
    ["env", "destroy", "pr-7", "--dry-run"],
    ["env", "list"],
    ["env", "reap"],
    ["env", "reap", "--dry-run"],
])
def test_without_the_pulumi_cli_every_stack_command_says_so_in_one_line_and_changes_nothing(sandbox, args):
    result = gpuyard(sandbox, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"gpuyard: error: {PULUMI_MISSING}"]
    assert "https://get.pulumi.com" in result.stderr
    assert list(sandbox["home"].iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["env", "create", "pr-7", "--ttl", "8"], "--ttl: duration '8' out of range: from 1m to 30d"),
    (["env", "create", "pr-7", "--ttl", "45d"], "--ttl: duration '45d' out of range"),
    (["env", "create", "pr-7", "--ttl", "8 hours"], "--ttl: bad duration '8 hours': expected 90s, 30m, 8h"),
    (["env", "create", "pr-7", "--ttl", "8h", "--owner", " "], "--owner is empty"),
    (["env", "create", "pr-7", "--ttl", "8h", "--team", "nope"], "unknown team 'nope' in stack 'ephemeral'"),
    (["env", "create", "Bad_Name", "--ttl", "8h"], "bad environment name 'Bad_Name'"),
    (["env", "create", "dev", "--ttl", "8h"], "stack 'dev' already exists"),
    (["env", "destroy", "PR 7"], "bad environment name 'PR 7'"),
    (["env", "create", "pr-7"], "Missing option '--ttl'"),
])
def test_bad_input_is_one_line_and_exit_2(sandbox, args, message):
    result = gpuyard(sandbox, *args)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("gpuyard: error: ")
    assert message in result.stderr


def test_a_missing_template_is_an_unknown_stack(sandbox):
    (sandbox["stacks"] / "Pulumi.ephemeral.yaml").rename(sandbox["stacks"] / "ephemeral.yaml.bak")
    result = gpuyard(sandbox, "env", "create", "pr-7", "--ttl", "8h")
    assert result.returncode == 2
    assert result.stderr.startswith("gpuyard: error: unknown stack 'ephemeral'")
    (sandbox["stacks"] / "ephemeral.yaml.bak").rename(sandbox["stacks"] / "Pulumi.ephemeral.yaml")


# A stand-in for the absent Pulumi CLI: it answers the commands the Automation API runs
# for create, list, reap, destroy (init, config, up, output, destroy, history, rm) from
# $FAKE_PULUMI_STATE/stacks.json, logs every call, and fails loudly on anything else. With
# $FAKE_PULUMI_VPC_HELD set, destroy fails as deleting the VPC does while security groups or ENIs the
# cluster's controllers made are left in it (looked up in the AWS endpoint the test runs).
FAKE_PULUMI = r'''#!{python}
import json, os, sys
state = os.environ["FAKE_PULUMI_STATE"]
args = [a for a in sys.argv[1:] if a != "--non-interactive"]
stack = args[args.index("--stack") + 1] if "--stack" in args else None
with open(os.path.join(state, "calls.log"), "a") as log:
    log.write(" ".join(args[:2] if args[0] == "stack" else args[:1]) + (f" {{stack}}" if stack else "") + "\n")
path = os.path.join(state, "stacks.json")
stacks = json.load(open(path))
if args == ["version"]:
    print("v3.272.0")
elif args[:3] == ["stack", "ls", "--json"]:
    print(json.dumps([{{"name": name, "current": False}} for name in stacks]))
elif args[:2] == ["stack", "init"]:
    if args[2] in stacks:
        sys.exit(print(f"error: stack '{{args[2]}}' already exists", file=sys.stderr) or 255)
    stacks[args[2]] = {{}}
    json.dump(stacks, open(path, "w"))
elif stack not in stacks and args[:2] != ["stack", "rm"]:
    sys.exit(print(f"error: no stack named '{{stack}}' found", file=sys.stderr) or 255)
elif args[:2] == ["config", "set-all"]:
    stacks[stack].update(a.split("=", 1) for a in args[4:] if a != "--plaintext")
    json.dump(stacks, open(path, "w"))
elif args[:1] == ["config"]:
    print(json.dumps({{k: {{"value": v, "secret": False}} for k, v in stacks[stack].items()}}))
elif args[:2] == ["stack", "select"]:
    pass
elif args[:3] == ["stack", "output", "--json"]:  # a kubeconfig for a cluster that does not answer
    print(json.dumps({{"kubeconfig": {{
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{{"name": "c", "cluster": {{"server": os.environ["FAKE_KUBE_SERVER"]}}}}],
        "users": [{{"name": "u", "user": {{"token": "t"}}}}],
        "contexts": [{{"name": "c", "context": {{"cluster": "c", "user": "u"}}}}]}}}}))
elif args[:1] == ["destroy"]:
    print(f"Destroying ({{stack}}):")
    if os.environ.get("FAKE_PULUMI_VPC_HELD"):
        import boto3
        ec2, cluster = boto3.client("ec2"), stacks[stack]["gpuyard:cluster_name"]
        held = [g["GroupId"] for f in ([{{"Name": f"tag:kubernetes.io/cluster/{{cluster}}", "Values": ["owned"]}}],
                                       [{{"Name": "tag:elbv2.k8s.aws/cluster", "Values": [cluster]}}])
                for g in ec2.describe_security_groups(Filters=f)["SecurityGroups"]
                if not any(t["Key"] in ("aws:eks:cluster-name", "gpuyard.io/stack") for t in g.get("Tags", []))]
        if held:
            sys.exit(print(f"error: deleting EC2 VPC: DependencyViolation: held by {{held[0]}}", file=sys.stderr) or 255)
elif args[:1] == ["up"]:
    print(f"Updating ({{stack}}):")
elif args[:2] == ["stack", "history"]:
    print(json.dumps([{{"kind": "destroy", "startTime": "2026-12-02T15:00:00.000Z", "message": "",
                       "environment": {{}}, "config": {{}}, "result": "succeeded"}}]))
elif args[:3] == ["stack", "rm", "--yes"] and args[3] in stacks:
    del stacks[args[3]]
    json.dump(stacks, open(path, "w"))
else:
    sys.exit(print("fake pulumi: unsupported " + " ".join(args), file=sys.stderr) or 3)
'''


@pytest.fixture
def fake_pulumi(sandbox, tmp_path):
    state = tmp_path / "pulumi-state"
    state.mkdir()
    lease = lambda hours: json.dumps({"owner": "ana", "team": "sandbox",  # noqa: E731
                                      "expires_at": f"{(datetime.now(UTC) + timedelta(hours=hours)):%Y-%m-%dT%H:%M:%SZ}"})
    (state / "stacks.json").write_text(json.dumps({
        "dev": {"gpuyard:cluster_name": "gpuyard-dev", "aws:region": "us-west-2"},
        "pr-1": {"gpuyard:cluster_name": "gpuyard-ephemeral-pr-1", "aws:region": "us-east-1", LEASE_KEY: lease(-2)},
        "pr-2": {"gpuyard:cluster_name": "gpuyard-ephemeral-pr-2", "aws:region": "us-east-1", LEASE_KEY: lease(5)},
    }))
    script = sandbox["bin"] / "pulumi"
    script.write_text(FAKE_PULUMI.format(python=sys.executable))
    script.chmod(0o755)
    sandbox["env"]["FAKE_PULUMI_STATE"] = str(state)
    sandbox["env"]["FAKE_KUBE_SERVER"] = f"https://127.0.0.1:{free_port()}"
    return state


def _calls(state: Path) -> list[str]:
    return [line for line in (state / "calls.log").read_text().splitlines() if line != "version"]


def test_list_shows_only_leased_stacks_with_their_expiry(sandbox, fake_pulumi):
    result = gpuyard(sandbox, "env", "list")
    assert result.returncode == 0, result.stderr
    assert "pr-1" in result.stdout and "pr-2" in result.stdout and "gpuyard-dev" not in result.stdout
    assert "expired 2h" in result.stdout and "4h59m left" in result.stdout
    assert set(_calls(fake_pulumi)) == {"stack ls", "config dev", "config pr-1", "config pr-2"}


def test_reap_dry_run_names_the_expired_and_destroys_nothing(sandbox, fake_pulumi):
    result = gpuyard(sandbox, "env", "reap", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "expired (1)" in result.stdout and "pr-1" in result.stdout and "pr-2" not in result.stdout
    assert "dry run: nothing destroyed" in result.stdout
    assert set(_calls(fake_pulumi)) == {"stack ls", "config dev", "config pr-1", "config pr-2"}


def test_destroying_an_unknown_stack_is_one_line_and_exit_2(sandbox, fake_pulumi):
    result = gpuyard(sandbox, "env", "destroy", "pr-9")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["gpuyard: error: unknown stack 'pr-9' (see `gpuyard env list`)"]
    assert _calls(fake_pulumi) == ["stack select pr-9"]


@pytest.fixture
def aws_leftovers(sandbox, local_aws):
    """moto_server with Karpenter/LBC leftovers of both environments' clusters; the CLI pointed at it."""
    from test_ephemeral_cleanup import Seeder
    sandbox["env"].update(local_aws.env)
    seeder = Seeder(local_aws.endpoint_url)
    seeder.cluster_leftovers("gpuyard-ephemeral-pr-1", doomed=True)
    seeder.cluster_leftovers("gpuyard-ephemeral-pr-2", doomed=False)
    return seeder


@pytest.mark.slow
def test_reap_destroys_first_then_cleans_up_and_removes_only_the_expired(sandbox, fake_pulumi, aws_leftovers):
    result = gpuyard(sandbox, "env", "reap")
    assert result.returncode == 0, result.stdout + result.stderr
    steps = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert steps == ["[1/4] pr-1: draining Karpenter's NodePools in cluster gpuyard-ephemeral-pr-1",
                     "[2/4] pr-1: pulumi destroy",
                     "[3/4] pr-1: deleting what Kubernetes and Karpenter left for cluster gpuyard-ephemeral-pr-1",
                     "[4/4] pr-1: pulumi stack rm"]
    assert "cluster gpuyard-ephemeral-pr-1 does not exist: nothing to drain" in result.stdout
    lines = result.stdout.splitlines()
    destroyed = lines.index("Destroying (pr-1):")
    assert destroyed < min(i for i, line in enumerate(lines) if line.startswith("deleting "))
    assert "pr-1: destroyed" in result.stdout
    assert aws_leftovers.existing() == aws_leftovers.world.kept
    pr1 = [call for call in _calls(fake_pulumi) if call not in ("stack ls", "config dev", "config pr-2")]
    assert pr1 == ["config pr-1", "stack select pr-1", "config pr-1", "destroy pr-1", "stack history pr-1", "stack rm"]
    assert set(json.loads((fake_pulumi / "stacks.json").read_text())) == {"dev", "pr-2"}


@pytest.mark.slow
def test_a_destroy_the_leftovers_hold_up_deletes_them_and_destroys_again(sandbox, fake_pulumi, aws_leftovers):
    """The load balancer controller's and the in-tree controller's groups keep the VPC from being deleted; once the
    cluster is gone (destroy deletes it before the VPC) cleanup deletes them and the second destroy finishes."""
    sandbox["env"]["FAKE_PULUMI_VPC_HELD"] = "1"
    result = gpuyard(sandbox, "env", "destroy", "pr-1", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pulumi destroy stopped with cluster gpuyard-ephemeral-pr-1 gone: deleting its leftovers" in result.stdout
    assert _calls(fake_pulumi).count("destroy pr-1") == 2
    assert aws_leftovers.existing() == aws_leftovers.world.kept
    assert "pr-1" not in json.loads((fake_pulumi / "stacks.json").read_text())


@pytest.mark.slow
def test_a_destroy_whose_cluster_api_does_not_answer_stops_in_one_line_before_deleting_anything(
        sandbox, fake_pulumi, aws_leftovers):
    """The cluster exists (EKS says so) but its API does not answer: Karpenter could still relaunch what cleanup
    terminated, so nothing is destroyed and nothing deleted."""
    aws_leftovers.eks.create_cluster(name="gpuyard-ephemeral-pr-1", roleArn="arn:aws:iam::123456789012:role/eks",
                                     resourcesVpcConfig={"subnetIds": aws_leftovers.subnets})
    before = aws_leftovers.existing()
    result = gpuyard(sandbox, "env", "destroy", "pr-1", "--yes")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    reason = "kubectl is not on PATH" if not shutil.which("kubectl", path=sandbox["env"]["PATH"]) else \
        "the API of cluster gpuyard-ephemeral-pr-1 does not answer ("
    assert line.startswith("gpuyard: error: pr-1: ") and reason in line and "nothing deleted" in line
    assert "destroy pr-1" not in _calls(fake_pulumi) and "[2/4]" not in result.stdout
    assert aws_leftovers.existing() == before
    assert "pr-1" in json.loads((fake_pulumi / "stacks.json").read_text())


@pytest.mark.slow
def test_destroy_keeps_the_stack_when_it_cannot_tell_whether_the_cluster_exists(sandbox, fake_pulumi):
    sandbox["env"].update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_MAX_ATTEMPTS": "1",
                           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    result = gpuyard(sandbox, "env", "destroy", "pr-1", "--yes")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpuyard: error: pr-1: AWS endpoint unreachable:") and line.endswith("stack not removed")
    assert "destroy pr-1" not in _calls(fake_pulumi)
    assert "pr-1" in json.loads((fake_pulumi / "stacks.json").read_text())


def test_destroy_refuses_a_stack_without_a_lease(sandbox, fake_pulumi):
    result = gpuyard(sandbox, "env", "destroy", "dev")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "gpuyard: error: stack 'dev' has no gpuyard:lease: not an ephemeral environment, refusing to destroy it"]
    assert _calls(fake_pulumi) == ["stack select dev", "config dev"]


def test_create_sets_the_template_config_with_its_cluster_and_lease_then_list_shows_it(sandbox, fake_pulumi):
    result = gpuyard(sandbox, "env", "create", "pr-3", "--ttl", "8h", "--team", "sandbox", "--owner", "ana")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Updating (pr-3):" in result.stdout
    assert "pr-3 is up: cluster gpuyard-ephemeral-pr-3, expires 20" in result.stdout
    assert _calls(fake_pulumi)[:3] == ["stack init", "config pr-3", "up pr-3"]
    stored = json.loads((fake_pulumi / "stacks.json").read_text())["pr-3"]
    decoded = {k: json.loads(v) if v[:1] in "[{" else v for k, v in stored.items()}  # as infra/__main__.py reads it
    config = parse_stack("pr-3", decoded)
    assert config.cluster_name == "gpuyard-ephemeral-pr-3"
    assert config.teams == parse_stack("ephemeral", TEMPLATE).teams
    assert config.lease.owner == "ana" and config.lease.team == "sandbox"
    assert timedelta(hours=7, minutes=59) < config.lease.expires_at - datetime.now(UTC) <= timedelta(hours=8)

    listed = gpuyard(sandbox, "env", "list")
    assert "pr-3" in listed.stdout and "7h59m left" in listed.stdout


def test_create_refuses_a_stack_that_exists_in_the_backend(sandbox, fake_pulumi):
    result = gpuyard(sandbox, "env", "create", "pr-1", "--ttl", "8h")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["gpuyard: error: stack 'pr-1' already exists"]
    assert _calls(fake_pulumi) == ["stack init"]
