"""A table of bad inputs per command: exit 2, exactly one stderr line naming the flag the user wrote, nothing written."""

from __future__ import annotations

import pytest

from cli_helpers import assert_one_line_error, gpuyard

JOB = ["--team", "nlp", "--kind", "mpijob"]
RENDER = [
    (["--epochs", "0"], "--epochs"),
    (["--epochs", "-3"], "--epochs"),
    (["--epochs", "ten"], "--epochs"),
    (["--epochs", str(10**30)], "--epochs"),
    (["--nodes", str(10**30)], "--nodes"),
    (["--nodes", "0"], "--nodes"),
    (["--nodes", "two"], "--nodes"),
    (["--nodes", "1:2:3"], "--nodes"),
    (["--nodes", "1:4"], "--nodes 1:4: MIN:MAX (elastic) needs --kind pytorchjob"),
    (["--kind", "pytorchjob", "--nodes", "4:2"], "--nodes 4:2: MIN 4 is above MAX 2"),
    (["--gpus-per-node", "17"], "--gpus-per-node"),
    (["--gpus-per-node", "-1"], "--gpus-per-node"),
    (["--gpus-per-node", "1.5"], "--gpus-per-node"),
    (["--cpu", "0"], "--cpu"),
    (["--cpu", "1e9"], "--cpu"),
    (["--cpu", "nan"], "--cpu"),
    (["--memory-gib", "0"], "--memory-gib"),
    (["--memory-gib", str(10**30)], "--memory-gib"),
    (["--efa", "33"], "--efa"),
    (["--efa", "2", "--gpus-per-node", "0"], "--efa needs GPU nodes"),
    (["--max-restarts", "-1"], "--max-restarts"),
    (["--max-restarts", str(10**30)], "--max-restarts"),
    (["--ttl", "1y"], "--ttl: bad duration '1y'"),
    (["--ttl", "-5"], "--ttl"),
    (["--ttl", "31d"], "--ttl: duration '31d' out of range"),
    (["--name", "Big_Job"], "--name"),
    (["--kind", "volcanojob", "--name", "v" * 60], "--name"),
    (["--node-pool", "Not A Pool"], "--node-pool"),
    (["--image", ""], "--image is empty"),
    (["--image", "my trainer:1"], "--image 'my trainer:1': not an image reference"),
    (["--name", ""], "--name is empty"),
    (["--node-pool", " "], "--node-pool is empty"),
    (["--env", "NOVALUE"], "--env"),
    (["--env", "1X=2"], "--env 1X"),
    (["--capacity-type", "reserved"], "'--capacity-type'"),
    (["-o", "xml"], "'--output' / '-o'"),
    (["-o", ""], "'--output' / '-o'"),
    (["--nodez", "3"], "--nodez"),
]
RENDER_ONLY = [
    (["--stack", "nope", "--all"], "'--stack'"),
    (["--team", "ghost", "--kind", "mpijob"], "--team: unknown team 'ghost'"),
    (["--team", "nlp", "--kind", "tfjob"], "'--kind'"),
    (["--team", "nlp"], "--team and --kind are required"),
    (["--all", "--team", "nlp"], "--all renders every team and kind: drop --team/--kind"),
    (["--stack", "prod", "--team", "nlp", "--kind", "trainjob"], "gpuyard:addons.trainer_v2"),
]


@pytest.mark.parametrize(("args", "names"), [(JOB + a, n) for a, n in RENDER] + RENDER_ONLY,
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_render(tmp_path, args, names, stacks_with_registry):
    result = gpuyard("render", *args, "-d", "out", cwd=tmp_path)
    assert_one_line_error(result, names)
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["render", "--all"], ["demo"]], ids=["render", "demo"])
@pytest.mark.parametrize(("folder", "names"), [
    ("", "--output-dir is empty"),
    ("  ", "--output-dir is empty"),
    ("a-file", "--output-dir a-file: is not a folder"),
    ("a-file/sub", "--output-dir a-file/sub: a-file is not a folder"),
])
def test_output_folders_are_checked_before_any_work(tmp_path, command, folder, names):
    (tmp_path / "a-file").write_text("mine")
    result = gpuyard(*command, "-d", folder, cwd=tmp_path)
    assert_one_line_error(result, names)
    assert result.stdout == "" and [p.name for p in tmp_path.iterdir()] == ["a-file"]
    assert (tmp_path / "a-file").read_text() == "mine"


@pytest.mark.parametrize("args, names", [
    (["plan", "--stack", "nope"], "'--stack'"),
    (["plan", "--json=yes"], "--json"),
    (["demo", "--stack", "nope"], "'--stack'"),
    (["demo", "-o", "out"], "No such option: -o"),
    (["images", "build", "-i", "cuda"], "'--image' / '-i'"),
    (["images", "build", "--stack", "nope"], "'--stack'"),
    (["images", "build", "--push", "--dry-run"], "gpuyard:image_registry"),
    (["env", "cleanup", "--cluster", "typo!"], "--cluster 'typo!': not an EKS cluster name"),
    (["env", "cleanup", "--cluster", "c", "--region", "nowhere-1"], "--region 'nowhere-1': unknown AWS region"),
    (["images", "build", "--dry-run", "--platform", ""], "--platform ''"),
    (["images", "build", "--dry-run", "--platform", "amd64"], "--platform 'amd64'"),
    (["env", "cleanup", "--cluster", ""], "--cluster '': not an EKS cluster name"),
    (["env", "cleanup", "--cluster", "c" * 101], "not an EKS cluster name"),
    (["env", "cleanup", "--cluster", "c", "--json"], "--json cannot ask before deleting"),
    (["env", "create", "pr-1", "--ttl", "1y"], "--ttl: bad duration '1y'"),
    (["env", "create", "pr-1", "--ttl", "59s"], "--ttl: duration '59s' out of range"),
    (["env", "create", "pr-1", "--ttl", "8h", "--owner", ""], "--owner is empty"),
    (["env", "destroy", "PR 7"], "bad environment name 'PR 7'"),
    (["env", "reap", "--dry-run=1"], "--dry-run"),
    (["rendr"], "No such command 'rendr'"),
])
def test_other_commands(tmp_path, args, names):
    result = gpuyard(*args, cwd=tmp_path, env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"})
    assert_one_line_error(result, names)
    assert list(tmp_path.iterdir()) == []
