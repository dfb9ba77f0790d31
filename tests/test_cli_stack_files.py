"""Bad stack files through every command that reads one: exit 2, one line naming the key as written, nothing written.

The table is by class: what YAML can do to a reader (aliases, merge keys, odd keys, tags, unreadable files), types
that are not what they look like (``true`` for a number), keys nobody reads (a misspelled ``aws:`` key), and values
AWS would refuse at ``pulumi up`` (VPC prefixes, instance sizes, repeated CIDRs, quotas beyond any cluster)."""

from __future__ import annotations

import copy
import json
import os
import stat

import pytest
import yaml

from cli_helpers import REPO, assert_one_line_error, gpuyard, gpuyard_forked, tree

DEV = (REPO / "stacks" / "Pulumi.dev.yaml").read_text()
DOCUMENT = yaml.safe_load(DEV)
NOT_PYTHON = ("NoneType", "Traceback", "<class", "object at 0x", "Value error", "input_type", "type=")


def dev_with(**config) -> str:
    """The dev stack with ``config`` keys set (None removes one); ``cluster``-style dicts replace whole values."""
    document = copy.deepcopy(DOCUMENT)
    document["config"].update(config)
    return yaml.safe_dump({"config": {k: v for k, v in document["config"].items() if v is not None}})


def nested(key: str, **fields) -> str:
    """The dev stack with ``fields`` set inside ``gpuyard:<key>``."""
    value = copy.deepcopy(DOCUMENT["config"].get(f"gpuyard:{key}", {}))
    value.update(fields)
    return dev_with(**{f"gpuyard:{key}": value})


def group(**fields) -> str:
    """The dev stack whose GPU node group has ``fields``."""
    cluster = copy.deepcopy(DOCUMENT["config"]["gpuyard:cluster"])
    cluster["gpu_node_groups"][0].update(fields)
    return dev_with(**{"gpuyard:cluster": cluster})


def team(**fields) -> list[dict]:
    return [{"name": "vision", **fields}]


BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{b}'] * 9)}]\n" for a, b in zip("bcdefghij", "abcdefghi"))
YAML = [
    ("- just\n- a list\n", "expected a mapping with a 'config:' key, got a list"),
    ("plain text\n", "got text"),
    ("", "got an empty document"),
    ("null\n", "got an empty document"),
    ("42\n", "got a number"),
    ("true\n", "got true/false"),
    (b"\xff\xfe\x00binary\x00", "not UTF-8 text"),
    ("config: [1, 2]\n", "'config:' must be a mapping"),
    ("config:\n", "'config:' must be a mapping"),
    ("conifg:\n  aws:region: us-west-2\n", "unknown top-level key 'conifg'"),
    ("1: x\nconfig: {}\n", "unknown top-level key 1"),
    ("config:\n  aws:region: us-west-2\n  aws:region: eu-west-1\n", "duplicate key 'aws:region'"),
    (DEV.replace("  gpuyard:network:", "  gpuyard:teams: []\n  gpuyard:network:"), "duplicate key 'gpuyard:teams'"),
    ("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + BOMB + "config: {aws:region: *j}\n", "alias bomb"),
    ("a: &a [*a]\nconfig: {}\n", "refers to a node that contains it"),
    ("config: {aws:region: *nowhere}\n", "found undefined alias"),
    ("config:\n  ? [a, b]\n  : 1\n", "a sequence cannot be a key"),
    ("config:\n  ? {a: b}\n  : 1\n", "a mapping cannot be a key"),
    ("config: {[1]: 2}\n", "a sequence cannot be a key"),
    ("config:\n  <<: [1, 2]\n", "expected a mapping for merging"),
    ("config:\n  aws:region: !!binary aGVsbG8=\n", "the YAML tag !!binary is not a config value"),
    ("config:\n  aws:region: !!timestamp 2026-01-01\n", "the YAML tag !!timestamp is not a config value"),
    ("config: !!set {a, b}\n", "the YAML tag !!set is not a config value"),
    ("config:\n  aws:region: !!python/object:os.system ls\n", "not valid YAML"),
    ("config:\n\taws:region: us-west-2\n", "not valid YAML"),
    ("config: {aws:region: us-west-2\n", "not valid YAML"),
    ("[" * 5000 + "]" * 5000, "stacks"),
    ("config:\n  network: {}\n", "config key 'network' has no namespace"),
    ("config:\n  7: x\n", "config key 7 is not text"),
    ("config:\n  ~: x\n", "config key None is not text"),
]
KEYS = [
    (DEV.replace("gpuyard:network:", "gpuyrad:network:"), "unknown namespace in 'gpuyrad:network'; did you mean 'gpuyard'"),
    (DEV.replace("gpuyard:network:", "network:"), "config key 'network' has no namespace"),
    (DEV.replace("  aws:region: us-west-2\n", ""), "missing aws:region"),
    ("config: {aws:region: us-west-2, gpuyard:cluster_name: c}\n", "missing gpuyard:teams"),
    (dev_with(**{"aws:regoin": "us-west-2"}), "unknown key 'aws:regoin'; did you mean 'region'"),
    (dev_with(**{"aws:Region": "us-west-2"}), "unknown key 'aws:Region'"),
    (dev_with(**{"aws:profle": "ci"}), "unknown key 'aws:profle'; did you mean 'profile'"),
    (dev_with(**{"aws:skipCredentialValidation": True}), "did you mean 'skipCredentialsValidation'"),
    (dev_with(**{"aws:": "x"}), "unknown key 'aws:'"),
    (dev_with(**{"kubernetes:kubeconfg": "x"}), "unknown key 'kubernetes:kubeconfg'; did you mean 'kubeconfig'"),
    (dev_with(**{"pulumi:tag": {"a": "b"}}), "unknown key 'pulumi:tag'; did you mean 'tags'"),
    (dev_with(**{"gpuyard:stack": "prod"}), "gpuyard:stack: unknown key"),
    (dev_with(**{"gpuyard:region": "eu-west-1"}), "gpuyard:region: unknown key"),
    (dev_with(**{"gpuyard:clustr_name": "x"}), "gpuyard:clustr_name: unknown key"),
    (nested("karpenter", gpu_limt=3), "gpuyard:karpenter.gpu_limt: unknown key"),
    (dev_with(**{"gpuyard:teams": team(gpu_quotas=3)}), "gpuyard:teams[0].gpu_quotas: unknown key"),
    (dev_with(**{"aws:region": "us-weast-2"}), "aws:region: unknown AWS region 'us-weast-2'"),
    (dev_with(**{"aws:region": 5}), "aws:region: Input should be a valid string (got 5)"),
    (dev_with(**{"gpuyard:teams": []}), "gpuyard:teams: "),
    (dev_with(**{"gpuyard:teams": "vision"}), "gpuyard:teams"),
    (dev_with(**{"gpuyard:teams": [{}]}), "gpuyard:teams[0].name: Field required"),
    (dev_with(**{"gpuyard:teams": team(priority_class="gpuyard-urgent")}), "gpuyard:teams[0].priority_class"),
    (dev_with(**{"gpuyard:cluster_name": "Bad Name"}), "gpuyard:cluster_name: must be a DNS label"),
]
TYPES = [
    (dev_with(**{"gpuyard:teams": team(gpu_quota=True)}), "gpuyard:teams[0].gpu_quota: Input should be a valid integer (got true)"),
    (dev_with(**{"gpuyard:teams": team(gpu_quota="8")}), 'gpuyard:teams[0].gpu_quota: Input should be a valid integer (got "8")'),
    (dev_with(**{"gpuyard:teams": team(gpu_quota=8.0)}), "gpuyard:teams[0].gpu_quota: Input should be a valid integer (got 8.0)"),
    (DEV.replace("gpu_quota: 16", "gpu_quota: 1_6"), 'gpuyard:teams[0].gpu_quota: Input should be a valid integer (got "1_6")'),
    (DEV.replace("gpu_quota: 16", "gpu_quota: 1:30"), "gpuyard:teams[0].gpu_quota"),
    (DEV.replace("gpu_quota: 16", "gpu_quota: .nan"), "no config values"),
    (DEV.replace("spot: true", "spot: yes"), 'gpuyard:karpenter.spot: Input should be a valid boolean (got "yes")'),
    (DEV.replace("spot: true", "spot: 1"), "gpuyard:karpenter.spot: Input should be a valid boolean (got 1)"),
    (DEV.replace("force_destroy: true", "force_destroy: 'true'"), "gpuyard:storage.force_destroy"),
    (DEV.replace('kubernetes_version: "1.35"', "kubernetes_version: 1.35"),
     "gpuyard:cluster.kubernetes_version: Input should be a valid string (got 1.35)"),
    (nested("network", az_count=2.5), "gpuyard:network.az_count: Input should be a valid integer (got 2.5)"),
    (nested("network", az_count=None), "gpuyard:network.az_count: Input should be a valid integer (got null)"),
    (nested("cluster", log_retention_days=True), "gpuyard:cluster.log_retention_days: cluster.log_retention_days must be one of"),
    (nested("cluster", log_retention_days=2), "gpuyard:cluster.log_retention_days"),
    (nested("cluster", endpoint_public="false"), "gpuyard:cluster.endpoint_public"),
    (nested("karpenter", gpu_families="g5"), "gpuyard:karpenter.gpu_families"),
    (dev_with(**{"gpuyard:image_tag": 1.2}), "gpuyard:image_tag: Input should be a valid string (got 1.2)"),
    (DEV.replace("  gpuyard:cluster_name: gpuyard-dev", "  gpuyard:cluster_name: 2026-01-01T10:00:00Z"),
     'gpuyard:cluster_name: must be a DNS label: lower-case letters, digits and \'-\', starting and ending with a letter '
     'or digit (got "2026-01-01T10:00:00Z")'),
]
AWS = [
    (nested("network", cidr="10.0.0.0/8"), "gpuyard:network: cidr '10.0.0.0/8' must be an IPv4 network from /16"),
    (nested("network", cidr="10.0.0.0/15"), "from /16 (the largest VPC AWS allows) to /20"),
    (nested("network", cidr="10.0.0.0/21"), "cidr '10.0.0.0/21'"),
    (nested("network", cidr="10.0.0.0/28"), "cidr '10.0.0.0/28'"),
    (nested("network", cidr="10.0.0.0/32"), "cidr '10.0.0.0/32'"),
    (nested("network", cidr="0.0.0.0/0"), "cidr '0.0.0.0/0'"),
    (nested("network", cidr="fd00::/48"), "cidr 'fd00::/48' must be an IPv4 network"),
    (nested("network", cidr="10.0.0.1/16"), "cidr: '10.0.0.1/16' is not a CIDR network (like 10.0.0.0/16, no host bits set)"),
    (nested("network", cidr="banana"), "'banana' is not a CIDR network"),
    (nested("network", cidr=""), "'' is not a CIDR network"),
    (nested("cluster", public_access_cidrs=["198.51.100.0/24", "198.51.100.0/24"]),
     "public_access_cidrs: '198.51.100.0/24' overlaps '198.51.100.0/24' listed before it"),
    (nested("cluster", public_access_cidrs=["198.51.0.0/16", "198.51.100.0/24"]), "'198.51.100.0/24' overlaps '198.51.0.0/16'"),
    (nested("cluster", public_access_cidrs=["0.0.0.0/0"]), "opens the Kubernetes API to the whole internet"),
    (nested("cluster", public_access_cidrs=["2001:db8::/32"]), "'2001:db8::/32' is not an IPv4 network"),
    (nested("cluster", public_access_cidrs=["198.51.100.1/24"]), "'198.51.100.1/24' is not a CIDR network"),
    (nested("cluster", private_access_cidrs=["10.20.0.0/16"]),
     "gpuyard:cluster.private_access_cidrs: '10.20.0.0/16' overlaps the VPC 10.20.0.0/16"),
    (nested("cluster", private_access_cidrs=["10.20.4.0/24"]), "'10.20.4.0/24' overlaps the VPC"),
    (nested("cluster", private_access_cidrs=["10.0.0.0/8"]), "'10.0.0.0/8' overlaps the VPC"),
    (nested("cluster", private_access_cidrs=["10.100.0.0/16", "10.100.0.0/16"]), "overlaps '10.100.0.0/16' listed before"),
    (group(instance_types=["g5.superhuge"]), "instance type 'g5.superhuge' does not exist: g5 comes in xlarge"),
    (group(instance_types=["g5.XLARGE"]), "instance type 'g5.XLARGE' does not exist"),
    (group(instance_types=["g5"]), "instance type 'g5' does not exist"),
    (group(instance_types=["p4d.xlarge"]), "p4d comes in 24xlarge"),
    (group(instance_types=["g5.xlarge", "g5.xlarge"]), "instance type 'g5.xlarge' listed twice"),
    (group(instance_types=[]), "gpuyard:cluster.gpu_node_groups[0].instance_types"),
    (group(instance_types=["x9.large"]), "unknown GPU instance type family 'x9'"),
    (nested("cluster", system_node_group={"instance_types": ["m6i.huge"]}), "instance type 'm6i.huge' does not exist"),
    (nested("cluster", system_node_group={"instance_types": ["t3.48xlarge"]}), "t3 comes in nano"),
    (nested("karpenter", gpu_families=["g5x"]), "unknown GPU instance type family 'g5x'"),
    (dev_with(**{"gpuyard:teams": team(gpu_quota=10**30)}), "gpuyard:teams[0].gpu_quota: Input should be less than or equal to 40000"),
    (dev_with(**{"gpuyard:teams": team(cpu_quota=10**9)}), "gpuyard:teams[0].cpu_quota: Input should be less than or equal to"),
    (dev_with(**{"gpuyard:teams": team(memory_quota_gib=10**12)}), "gpuyard:teams[0].memory_quota_gib"),
    (dev_with(**{"gpuyard:teams": team(queue_weight=0)}), "gpuyard:teams[0].queue_weight"),
    (dev_with(**{"gpuyard:teams": team(queue_weight=10**6)}), "gpuyard:teams[0].queue_weight"),
    (group(max_size=10**6), "gpuyard:cluster.gpu_node_groups[0].max_size: Input should be less than or equal to 5000"),
    (group(desired_size=10**7, max_size=10**7), "gpuyard:cluster.gpu_node_groups[0].desired_size"),
    (group(min_size=-1), "gpuyard:cluster.gpu_node_groups[0].min_size"),
    (group(disk_gib=10**9), "gpuyard:cluster.gpu_node_groups[0].disk_gib"),
    (nested("karpenter", gpu_limit=0), "gpuyard:karpenter.gpu_limit"),
    (nested("karpenter", gpu_limit=10**12), "gpuyard:karpenter.gpu_limit: Input should be less than or equal to 40000"),
    (nested("karpenter", cpu_limit=10**12), "gpuyard:karpenter.cpu_limit"),
    (nested("storage", noncurrent_days=10**6), "gpuyard:storage.noncurrent_days"),
    (dev_with(**{"gpuyard:cluster_name": "c" * 60}), "makes the checkpoint bucket " + "c" * 60 + "-checkpoints (72 characters"),
    (dev_with(**{"gpuyard:teams": team(gpu_quota=-1)}), "gpuyard:teams[0].gpu_quota"),
    (dev_with(**{"gpuyard:image_registry": "my registry.example.com"}), "gpuyard:image_registry"),
    (dev_with(**{"gpuyard:teams": team(image="my image")}), "gpuyard:teams[0].image: 'my image' is not an image reference"),
    (dev_with(**{"gpuyard:teams": team(image="r.example/Team/x:1")}), "repositories are lower-case"),
    (dev_with(**{"gpuyard:teams": team(image="r.example/x@sha256:" + "a" * 40)}), "a digest is sha256:<64 lower-case hex"),
    (dev_with(**{"gpuyard:teams": team(image="r.example/x@sha256:abc")}), "is not an image reference"),
    (dev_with(**{"gpuyard:teams": team(image="r.example/x:" + "t" * 129)}), "gpuyard:teams[0].image"),
    (dev_with(**{"gpuyard:teams": team(member_role_arns=["arn:aws:iam::1:role/x"])}), "must be an IAM role ARN"),
    (dev_with(**{"gpuyard:lease": {"owner": "ana", "expires_at": "tomorrow"}}), "gpuyard:lease.expires_at"),
    (dev_with(**{"gpuyard:lease": {"owner": "a\nb", "expires_at": "2030-01-01T00:00:00Z"}}),
     "gpuyard:lease.owner: must be text without control characters"),
]
BAD_FILES = YAML + KEYS + TYPES + AWS
COMMANDS = [
    ["render", "--stack", "bad", "--all", "--output-dir", "{out}"],
    ["plan", "--stack", "bad"],
    ["demo", "--stack", "bad", "--output-dir", "{out}"],
    ["images", "build", "--stack", "bad", "--dry-run"],
]


def _stacks(tmp_path, text: str | bytes):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.bad.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    return stacks


@pytest.mark.parametrize(("text", "names"), BAD_FILES, ids=range(len(BAD_FILES)))
def test_a_bad_stack_file_is_one_line_naming_the_key(tmp_path, text, names):
    stacks = _stacks(tmp_path, text)
    before = tree(tmp_path)
    result = gpuyard_forked("render", "--stack", "bad", "--all", "-d", "out", cwd=tmp_path,
                            env={"GPUYARD_STACKS_DIR": str(stacks)})
    line = assert_one_line_error(result, names)
    assert not any(word in line for word in NOT_PYTHON), line
    assert result.stdout == "" and tree(tmp_path) == before and result.session_left == []


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize(("text", "names"), [
    (dev_with(**{"gpuyard:karpenter": {"gpu_limit": 0}}), "gpuyard:karpenter.gpu_limit"),
    ("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + BOMB + "config: {aws:region: *j}\n", "alias bomb"),
    (dev_with(**{"aws:regoin": "us-west-2"}), "aws:regoin"),
    (nested("network", cidr="10.0.0.0/8"), "10.0.0.0/8"),
], ids=["value", "alias-bomb", "aws-typo", "vpc-prefix"])
def test_every_command_reading_a_stack_refuses_a_bad_one_before_doing_anything(tmp_path, command, text, names):
    stacks = _stacks(tmp_path, text)
    out = tmp_path / "out"
    before = tree(tmp_path)
    result = gpuyard_forked(*[arg.format(out=out) for arg in command], cwd=tmp_path,
                            env={"GPUYARD_STACKS_DIR": str(stacks)})
    assert_one_line_error(result, names)
    assert tree(tmp_path) == before and "torchrun" not in result.stdout and result.session_left == []


def test_anchors_and_merge_keys_read_like_the_expanded_file(tmp_path):
    """Valid YAML a stack file may use: an anchored team and node group, merged with overrides."""
    text = DEV.replace("  gpuyard:teams:\n    - name: vision\n", "  gpuyard:teams:\n    - &vision\n      name: vision\n")
    text = text.replace("    - name: nlp\n      queue_weight: 1\n", "    - <<: *vision\n      name: nlp\n      queue_weight: 1\n")
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.anchored.yaml").write_text(text)
    expanded = copy.deepcopy(DOCUMENT)
    vision, nlp = expanded["config"]["gpuyard:teams"]
    expanded["config"]["gpuyard:teams"][1] = {**vision, **nlp}
    (stacks / "Pulumi.expanded.yaml").write_text(yaml.safe_dump(expanded))
    plans = [gpuyard_forked("plan", "--stack", name, "--json", env={"GPUYARD_STACKS_DIR": str(stacks)}, timeout=600)
             for name in ("anchored", "expanded")]
    assert [p.returncode for p in plans] == [0, 0], [p.stderr for p in plans]
    anchored, expanded = (sorted(json.dumps(r, sort_keys=True) for r in json.loads(p.stdout)["resources"]) for p in plans)
    assert anchored == sorted(r.replace("expanded", "anchored") for r in expanded) and '"nlp"' in plans[0].stdout


UNREADABLE = ["a folder", "a fifo", "a broken symlink", "a symlink loop", "too large"]


@pytest.mark.parametrize("kind", UNREADABLE)
def test_an_unreadable_stack_file_is_one_line(tmp_path, kind):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    path = stacks / "Pulumi.bad.yaml"
    if kind == "a folder":
        path.mkdir()
    elif kind == "a fifo":
        os.mkfifo(path)
    elif kind == "a broken symlink":
        path.symlink_to(stacks / "gone.yaml")
    elif kind == "a symlink loop":
        path.symlink_to(path)
    else:
        path.write_text(dev_with() + "#" * (2 << 20))
    result = gpuyard_forked("render", "--stack", "bad", "--all", "-d", "out", cwd=tmp_path,
                            env={"GPUYARD_STACKS_DIR": str(stacks)})
    expected = "larger than 1024 KiB" if kind == "too large" else "unknown stack 'bad'"
    assert_one_line_error(result, "Pulumi.bad.yaml" if kind == "too large" else "--stack", expected)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files without read permission")
def test_a_file_without_read_permission_is_one_line(tmp_path):
    stacks = _stacks(tmp_path, dev_with())
    (stacks / "Pulumi.bad.yaml").chmod(0)
    result = gpuyard_forked("render", "--stack", "bad", "--all", env={"GPUYARD_STACKS_DIR": str(stacks)})
    assert_one_line_error(result, "cannot read it")


STRAY = {
    "Pulumi..yaml": "config: {}\n", "Pulumi.Bad Name.yaml": "x", "Pulumi.dev.yaml~": "x", "Pulumi.dev.yaml.bak": "x",
    "Pulumi.mro.yaml": "- not a stack\n", "Pulumi._x.yaml": "x", "Pulumi.__init__.yaml": "x", "Pulumi.-x.yaml": "x",
    "notes.txt": "x", "Pulumi.yaml": "name: other\n", "Pulumi.a.b.yaml": "x", "Pulumi.UPPER.yaml": "x",
}


def _stray_stacks(tmp_path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.dev.yaml").write_text(DEV)
    for name, text in STRAY.items():
        (stacks / name).write_text(text)
    (stacks / "Pulumi.folder.yaml").mkdir()
    (stacks / "Pulumi.gone.yaml").symlink_to(stacks / "nowhere")
    os.mkfifo(stacks / "Pulumi.fifo.yaml")
    (stacks / os.fsdecode(b"Pulumi.\xff.yaml")).write_text("x")
    (stacks / "unreadable.yaml").write_text("x")
    (stacks / "unreadable.yaml").chmod(stat.S_IWUSR)
    return stacks


def test_stray_files_in_stacks_break_no_command(tmp_path):
    """`--version`, help and a render run as real processes: the stack choices are read when a command starts."""
    env = {"GPUYARD_STACKS_DIR": str(_stray_stacks(tmp_path))}
    version = gpuyard("--version", env=env)
    assert version.returncode == 0 and version.stdout.startswith("gpuyard ") and version.stderr == ""
    help_text = " ".join(gpuyard("render", "-h", env=env).stdout.split())
    assert "--stack <dev|mro>" in help_text
    rendered = gpuyard("render", "--stack", "dev", "--team", "nlp", "--kind", "mpijob", "--image", "r.example/m:1",
                       env=env)
    assert rendered.returncode == 0 and rendered.stderr == ""


@pytest.mark.parametrize("name", ["folder", "gone", "fifo", "Bad Name", "", "dev.yaml", "x", "-x", "mro"])
def test_a_stray_file_named_as_a_stack_is_one_line(tmp_path, name):
    env = {"GPUYARD_STACKS_DIR": str(_stray_stacks(tmp_path))}
    result = gpuyard_forked("render", "--stack", name, "--all", env=env)
    assert_one_line_error(result, "mro" if name == "mro" else "--stack")
