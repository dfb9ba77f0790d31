"""Bad stack files through every command that reads one: exit 2, one line naming the key as written."""

from __future__ import annotations

import pytest
import yaml

from cli_helpers import REPO, assert_one_line_error, gpuyard

DEV = (REPO / "stacks" / "Pulumi.dev.yaml").read_text()


def dev_with(**config) -> str:
    document = yaml.safe_load(DEV)
    document["config"].update(config)
    return yaml.safe_dump({"config": {k: v for k, v in document["config"].items() if v is not None}})


def team(**fields) -> list[dict]:
    return [{"name": "vision", **fields}]


BAD_FILES = [
    ("- just\n- a list\n", "expected a mapping"),
    ("plain text\n", "expected a mapping"),
    (b"\xff\xfe\x00binary\x00", "not UTF-8 text"),
    ("config: [1, 2]\n", "'config:' must be a mapping"),
    ("conifg:\n  aws:region: us-west-2\n", "unknown top-level key 'conifg'"),
    ("config:\n  aws:region: us-west-2\n  aws:region: eu-west-1\n", "duplicate key 'aws:region'"),
    (DEV.replace("  gpuyard:network:", "  gpuyard:teams: []\n  gpuyard:network:"), "duplicate key 'gpuyard:teams'"),
    (DEV.replace("gpuyard:network:", "gpuyrad:network:"), "unknown namespace in 'gpuyrad:network'; did you mean 'gpuyard'"),
    (DEV.replace("gpuyard:network:", "network:"), "config key 'network' has no namespace"),
    (DEV.replace("  aws:region: us-west-2\n", ""), "missing aws:region"),
    ("config: {aws:region: us-west-2, gpuyard:cluster_name: c}\n", "missing gpuyard:teams"),
    (dev_with(**{"aws:region": "us-weast-2"}), "aws:region: unknown AWS region 'us-weast-2'"),
    (dev_with(**{"gpuyard:teams": []}), "gpuyard:teams: "),
    (dev_with(**{"gpuyard:teams": team(priority_class="gpuyard-urgent")}), "gpuyard:teams[0].priority_class"),
    (dev_with(**{"gpuyard:karpenter": {"gpu_limit": 0}}), "gpuyard:karpenter.gpu_limit"),
    (dev_with(**{"gpuyard:image_registry": "my registry.example.com"}), "gpuyard:image_registry"),
    (dev_with(**{"gpuyard:teams": team(gpu_quota=-1)}), "gpuyard:teams[0].gpu_quota"),
    (dev_with(**{"gpuyard:karpenter": {"gpu_limt": 3}}), "gpuyard:karpenter.gpu_limt"),
]
COMMANDS = [
    ["render", "--stack", "bad", "--all", "--output-dir", "{out}"],
    ["plan", "--stack", "bad"],
    ["demo", "--stack", "bad", "--output-dir", "{out}"],
    ["images", "build", "--stack", "bad", "--dry-run"],
]


@pytest.mark.parametrize(("text", "names"), BAD_FILES, ids=range(len(BAD_FILES)))
def test_a_bad_stack_file_is_one_line_naming_the_key(tmp_path, text, names):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    path = stacks / "Pulumi.bad.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out"
    result = gpuyard("render", "--stack", "bad", "--all", "-d", str(out), env={"GPUYARD_STACKS_DIR": str(stacks)})
    assert_one_line_error(result, names)
    assert result.stdout == "" and not out.exists()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_every_command_reading_a_stack_refuses_a_bad_one_before_doing_anything(tmp_path, command):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.bad.yaml").write_text(dev_with(**{"gpuyard:karpenter": {"gpu_limit": 0}}))
    out = tmp_path / "out"
    result = gpuyard(*[arg.format(out=out) for arg in command], env={"GPUYARD_STACKS_DIR": str(stacks)})
    assert_one_line_error(result, "gpuyard:karpenter.gpu_limit")
    assert not out.exists() and "torchrun" not in result.stdout
