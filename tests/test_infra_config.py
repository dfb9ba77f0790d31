"""Typed cluster config: the stack files parse, bad values fail with one line naming the problem."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuyard.infra.config import ConfigError, load_stack, parse_stack, stack_file
from gpuyard.infra.plan import plan_values, stack_values

ACCESS = {"endpoint_public": True, "public_access_cidrs": ["198.51.100.0/24"]}
BASE = {"gpuyard:cluster_name": "gpuyard-test"}


def gpu_group(**overrides) -> dict:
    return {"name": "gpu", "instance_types": ["g5.xlarge"], "min_size": 0, "desired_size": 0, "max_size": 2, **overrides}


@pytest.mark.parametrize("stack", ["dev", "prod", "ephemeral"])
def test_stack_files_parse(stack):
    config = load_stack(stack)
    assert config.teams and config.network.az_count >= 2


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gpuyard:cluster": {**ACCESS, "gpu_node_groups": [gpu_group(instance_types=["x9.large"])]}}, "unknown GPU instance type family 'x9'"),
        ({"gpuyard:cluster": {**ACCESS, "gpu_node_groups": [gpu_group(instance_types=["m6i.large"])]}}, "unknown GPU instance type family 'm6i'"),
        ({"gpuyard:cluster": {**ACCESS, "system_node_group": {"instance_types": ["p5.48xlarge"]}}}, "unknown CPU instance type family 'p5'"),
        ({"gpuyard:cluster": {**ACCESS, "gpu_node_groups": [gpu_group(min_size=3, max_size=2)]}}, "min_size 3 > max_size 2"),
        ({"gpuyard:cluster": {**ACCESS, "gpu_node_groups": [gpu_group(desired_size=5)]}}, "desired_size 5 outside [0, 2]"),
        ({"gpuyard:cluster": {**ACCESS, "gpu_node_groups": [gpu_group(efa=True)]}}, "unknown EFA-capable GPU instance type family 'g5'"),
        ({"gpuyard:cluster": {**ACCESS, "gpu_node_groups": [gpu_group(efa=True, instance_types=["g6e.48xlarge"])]}},
         "no EFA interface count known for 'g6e.48xlarge'"),
        ({"gpuyard:cluster": {**ACCESS, "gpu_node_groups": [gpu_group(efa=True, instance_types=["p4d.24xlarge", "p5.48xlarge"])]}},
         "EFA instance types with different network card counts"),
        ({"gpuyard:cluster": {**ACCESS, "gpu_node_groups": [gpu_group(), gpu_group()]}}, "duplicate node group name 'gpu'"),
        ({"gpuyard:cluster": {**ACCESS, "gpu_node_groups": [gpu_group(name="GPU_big")]}}, "gpuyard:cluster.gpu_node_groups[0].name"),
        ({"gpuyard:cluster": {**ACCESS, "endpoint_public": False, "endpoint_private": False}}, "endpoint_public and endpoint_private are both false"),
        ({"gpuyard:cluster": {**ACCESS, "kubernetes_version": "1.20"}}, "kubernetes_version '1.20' is not an EKS version"),
        ({"gpuyard:network": {"az_count": 1}}, "network.az_count"),
        ({"gpuyard:network": {"cidr": "10.0.0.0/26"}}, "gpuyard:network: cidr '10.0.0.0/26' must be an IPv4 network from /16"),
        ({"gpuyard:network": {"nat": "none"}}, "network.nat"),
        ({"gpuyard:karpenter": {"gpu_families": ["z1"]}}, "unknown GPU instance type family 'z1'"),
        ({"gpuyard:teams": [{"name": "a"}, {"name": "a"}]}, "duplicate team name 'a'"),
        ({"gpuyard:teams": [{"name": "Bad_Team"}]}, "gpuyard:teams[0].name"),
        ({"gpuyard:cluster_name": "Bad Name"}, "cluster_name"),
        ({"gpuyard:cluster": {**ACCESS, "bogus": 1}}, "cluster.bogus"),
        ({"gpuyard:teams": [{"name": "a", "namespace": "kube-system"}]}, "namespace 'kube-system' is reserved"),
        ({"gpuyard:teams": [{"name": "a", "namespace": "kube-anything"}]}, "namespace 'kube-anything' is reserved"),
        ({"gpuyard:teams": [{"name": "a", "namespace": "default"}]}, "namespace 'default' is reserved"),
        ({"gpuyard:teams": [{"name": "a", "namespace": "volcano-system"}]}, "namespace 'volcano-system' is reserved"),
        ({"gpuyard:teams": [{"name": "a", "queue": "default"}]}, "queue 'default' is Volcano's own"),
        ({"gpuyard:teams": [{"name": "root"}]}, "queue 'root' is Volcano's own"),
        ({"gpuyard:teams": [{"name": "vision"}, {"name": "nlp", "checkpoint_prefix": "teams/vision/nlp"}]},
         "team 'nlp': checkpoint_prefix 'teams/vision/nlp/' lies inside checkpoint_prefix 'teams/vision/' of team 'vision'"),
        ({"gpuyard:teams": [{"name": "a", "checkpoint_prefix": "shared"}, {"name": "b", "checkpoint_prefix": "shared/b/"}]},
         "lies inside checkpoint_prefix 'shared/' of team 'a'"),
        # a team may not read another's checkpoints through its data prefix, nor write another's data
        ({"gpuyard:teams": [{"name": "a"}, {"name": "b", "data_prefix": "teams"}]},
         "team 'a': checkpoint_prefix 'teams/a/' lies inside data_prefix 'teams/' of team 'b'"),
        ({"gpuyard:teams": [{"name": "a"}, {"name": "b", "data_prefix": "teams/a/data"}]},
         "team 'b': data_prefix 'teams/a/data/' lies inside checkpoint_prefix 'teams/a/' of team 'a'"),
    ],
)
def test_bad_config_is_one_line(values, message):
    with pytest.raises(ConfigError) as error:
        parse_stack("test", {**BASE, **values})
    text = str(error.value)
    assert message in text and "\n" not in text


def test_plan_cli_rejects_bad_stack_with_one_line(tmp_path):
    (tmp_path / "Pulumi.bad.yaml").write_text(
        "config:\n  aws:region: us-west-2\n  gpuyard:cluster_name: x\n  gpuyard:teams: [{name: a}]\n  gpuyard:cluster:\n    gpu_node_groups:\n"
        "      - {name: gpu, instance_types: [g5.xlarge], min_size: 4, max_size: 1}\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", "from gpuyard.jobs.cli.main import main; main()", "plan", "--stack", "bad"],
        capture_output=True, text=True, env={"GPUYARD_STACKS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "min_size 4 > max_size 1" in result.stderr and result.stdout == ""


def test_more_azs_than_the_region_has_is_a_config_error():
    values = stack_values("dev")
    values = {**values, "gpuyard:network": {**values["gpuyard:network"], "az_count": 5}}
    with pytest.raises(ConfigError, match="network.az_count is 5 but the region has 4 AZs"):
        plan_values("dev", values)


def test_json_encoded_structured_values_read_like_yaml_ones(tmp_path):
    """The Automation API (``gpuyard env create``) stores lists and objects as JSON strings."""
    import json

    import yaml

    written = yaml.safe_load((stack_file("dev")).read_text())["config"]
    encoded = {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in written.items()}
    (tmp_path / "Pulumi.pr-1.yaml").write_text(yaml.safe_dump({"config": encoded}))
    from_json = load_stack("pr-1", tmp_path)
    assert from_json.teams == load_stack("dev").teams
    assert from_json.cluster == load_stack("dev").cluster


@pytest.mark.parametrize(("written", "kept"), [("teams/a", "teams/a/"), ("teams/a/", "teams/a/"), ("x", "x/")])
def test_checkpoint_prefixes_end_at_a_slash(written, kept):
    config = parse_stack("test", {**BASE, "gpuyard:teams": [{"name": "a", "checkpoint_prefix": written}]})
    assert config.team("a").checkpoint_prefix == kept


def test_neighbouring_prefixes_are_apart():
    config = parse_stack("test", {**BASE, "gpuyard:teams": [{"name": "nlp"}, {"name": "nlp-2"}]})
    assert [t.checkpoint_prefix for t in config.teams] == ["teams/nlp/", "teams/nlp-2/"]
