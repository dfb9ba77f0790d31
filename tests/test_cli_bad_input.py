"""A table of bad inputs per command and class: exit 2, exactly one stderr line naming what the user wrote (the flag,
the value), nothing written, no process left.

Classes: strict forms (numbers, node counts, durations, image references, names), flags that contradict each other,
the order of checks (input before the machine, the machine before the cluster's state), and messages in the user's
words (no Python types, no internal field names). Each case runs in a process of its own (``gpuyard_forked``)."""

from __future__ import annotations

import pytest

from cli_helpers import assert_one_line_error, gpuyard_forked, tree

NOT_PYTHON = ("NoneType", "Traceback", "<class", "object at 0x", "Value error", "input_type", "type=", "gpus_per_node",
              "memory_gib", "ttl_seconds", "max() arg", "min_nodes", "efa_devices")
JOB = ["--team", "nlp", "--kind", "mpijob"]
ELASTIC = ["--team", "nlp", "--kind", "pytorchjob"]
COUNTS = {"--epochs": ("1", "1000000"), "--gpus-per-node": ("0", "16"), "--memory-gib": ("1", "65536"),
          "--efa": ("0", "32"), "--max-restarts": ("0", "10")}
NOT_WHOLE = ["1_0", "3.0", " 3", "3 ", "٣", "0x10", "ten", "", "1e3", "--", "3,0", "nan", "1" * 40]
NOT_NUMBERS = ["nan", "NaN", "inf", "-inf", "infinity", "1_0.5", "0x10", "", "1,5", "½", "٣", "1e", ".", "2 "]

RENDER = [
    *[([flag, value], f"Invalid value for '{flag}'") for flag in COUNTS for value in NOT_WHOLE],
    *[([flag, str(int(low) - 1)], f"Invalid value for '{flag}': {int(low) - 1} is out of range: from {low} to {high}")
      for flag, (low, high) in COUNTS.items()],
    *[([flag, str(int(high) + 1)], f"{int(high) + 1} is out of range") for flag, (low, high) in COUNTS.items()],
    *[(["--cpu", value], "Invalid value for '--cpu'") for value in NOT_NUMBERS],
    (["--cpu", "0"], "--cpu': 0 is out of range: from 0.001 to 1024"),
    (["--cpu", "1e400"], "--cpu': 1e400 is out of range"),
    (["--cpu", "-1"], "--cpu': -1 is out of range"),
    (["--cpu", "1025"], "--cpu': 1025 is out of range"),
    *[(["--nodes", value], f"--nodes: bad node count {value!r}") for value in
      ["1_0", "10 ", " 10", "1:", ":1", "٣", "+3", "1e1", "3.0", "two", "", "1:2:3", "1::2", "0x3", "-1", "1 :2"]],
    (["--nodes", "1" * 60], "--nodes: bad node count '1111111111"),
    (["--nodes", "0"], "--nodes 0: node counts go from 1 to 10000"),
    (["--nodes", "10001"], "--nodes 10001: node counts go from 1 to 10000"),
    (["--nodes", "1:4"], "--nodes 1:4: MIN:MAX (elastic) needs --kind pytorchjob, not mpijob"),
    *[(["--ttl", value], f"--ttl: bad duration {value!r}") for value in
      ["1h1h", "30m1h", "8H", "1M", "1d 2h", "1.5h", "-1h", "٣h", "h", "8x", "1y", "1h30", "+5m", "5 m", "1_0m", "m"]],
    (["--ttl", ""], "--ttl: bad duration ''"),
    (["--ttl", "31d"], "--ttl: duration '31d' out of range: from 0s to 30d"),
    (["--ttl", "5w"], "--ttl: duration '5w' out of range"),
    *[(["--image", value], f"--image {value!r} is not an image reference") for value in
      ["my trainer:1", "x:", ":tag", "-x", "x/", "/x", "x//y", "x..y/z", "http://r.example/y", "x:t t", "x@sha256:abc",
       "r.example:port/x", "x:" + "t" * 129, "x:-tag", "r.example/UPPER"]],
    (["--image", "x@md5:" + "a" * 32], "a digest is sha256:<64 lower-case hex digits>"),
    (["--image", "r.example/x@sha256:" + "A" * 64], "a digest is sha256:<64 lower-case hex digits>"),
    (["--image", "r.example/" + "a" * 256], "the repository path has 256 characters, at most 255"),
    (["--image", ""], "--image is empty"),
    (["--image", "  "], "--image is empty"),
    (["--name", "Big_Job"], "--name"),
    (["--name", "-x"], "--name"),
    (["--name", "x-"], "--name"),
    (["--name", "1st"], "'1st' is not a DNS-1035 label"),
    (["--name", "x.y"], "--name"),
    (["--name", "ünï"], "--name"),
    (["--name", "v" * 64], "--name"),
    (["--kind", "volcanojob", "--name", "v" * 60], "too long for a volcanojob"),
    (["--kind", "rayjob", "--name", "r" * 48], "a rayjob name has at most 47"),
    (["--name", ""], "--name is empty"),
    (["--node-pool", "Not A Pool"], "--node-pool: must be a DNS label"),
    (["--env", "A=1", "--env", "A=2"], "--env: A is set twice"),
    (["--nodes", "10000", "--gpus-per-node", "0"], "--nodes 10000 --cpu 2 --memory-gib 8: the gang of 20001 CPUs never fits"),
    (["--gpus-per-node", "0", "--cpu", "100"], "--cpu 100 --memory-gib 8: the gang of 201 CPUs never fits"),
    (["--gpus-per-node", "0", "--memory-gib", "300"], "allows 256 GiB of memory"),
    (["--node-pool", " "], "--node-pool is empty"),
    (["--node-pool", "nope"], "--node-pool nope"),
    (["--env", "NOVALUE"], "--env: bad env 'NOVALUE': expected KEY=VALUE"),
    (["--env", "=x"], "--env: bad env '=x'"),
    (["--env", "1X=2"], "--env 1X=...: '1X' is not a variable name"),
    (["--env", "A-B=1"], "--env A-B=...: 'A-B' is not a variable name"),
    (["--env", "A B=1"], "'A B' is not a variable name"),
    (["--efa", "2", "--gpus-per-node", "0"], "--efa needs GPU nodes"),
    (["--capacity-type", "reserved"], "'--capacity-type'"),
    (["--capacity-type", "Spot"], "'--capacity-type'"),
    (["-o", "xml"], "'--output' / '-o'"),
    (["-o", ""], "'--output' / '-o'"),
    (["--nodez", "3"], "--nodez"),
]
RENDER_ONLY = [
    *[(["--stack", value, "--all"], "Invalid value for '--stack'") for value in
      ["nope", "", "../..", "/tmp", "DEV", "dev ", "dev/", ".", "a" * 64, "dev.yaml", "Pulumi.dev.yaml", "-x"]],
    (["--team", "ghost", "--kind", "mpijob"], "--team: unknown team 'ghost'"),
    (["--team", "NLP", "--kind", "mpijob"], "--team: unknown team 'NLP'"),
    (["--team", "", "--kind", "mpijob"], "--team is empty"),
    (["--team", "nlp", "--kind", "tfjob"], "'--kind'"),
    (["--team", "nlp", "--kind", ""], "'--kind'"),
    (["--team", "nlp"], "--team and --kind are required"),
    (["--kind", "mpijob"], "--team and --kind are required"),
    ([], "--team and --kind are required"),
    (["--stack", "prod", "--team", "nlp", "--kind", "trainjob"], "gpuyard:addons.trainer_v2"),
    *[(["--all", flag, value], f"--all renders every team and kind at the default sizes and images: drop {flag}")
      for flag, value in [("--team", "nlp"), ("--kind", "mpijob"), ("--name", "x"), ("--nodes", "3"),
                          ("--gpus-per-node", "2"), ("--cpu", "4"), ("--memory-gib", "16"), ("--efa", "0"),
                          ("--capacity-type", "spot"), ("--node-pool", "gpu-spot"), ("--image", "r.example/x:1"),
                          ("--epochs", "5"), ("--max-restarts", "1"), ("--ttl", "1h"), ("--env", "A=1"),
                          ("--nodes", "2"), ("--epochs", "10"), ("--capacity-type", "on-demand")]],
]


def _check(result, tmp_path, before, names):
    line = assert_one_line_error(result, *names)
    assert not any(word in line for word in NOT_PYTHON), line
    assert result.stdout == "" and tree(tmp_path) == before and result.session_left == []


@pytest.mark.parametrize(("args", "names"), [(JOB + a, n) for a, n in RENDER] + RENDER_ONLY,
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_render(tmp_path, args, names, stacks_with_registry):
    before = tree(tmp_path)
    _check(gpuyard_forked("render", *args, "-d", "out", cwd=tmp_path), tmp_path, before, [names])


@pytest.mark.parametrize("command", [["render", "--all"], ["demo"]], ids=["render", "demo"])
@pytest.mark.parametrize(("folder", "names"), [
    ("", "--output-dir is empty"),
    ("  ", "--output-dir is empty"),
    ("a-file", "--output-dir a-file: is not a folder"),
    ("a-file/sub", "--output-dir a-file/sub: a-file is not a folder"),
    ("a-file/sub/deeper", "a-file is not a folder"),
    ("new/" + "n" * 250, "is too long"),
    ("new/deeper/" + "n" * 300, "is too long"),
    ("/".join(["p" * 200] * 25), "the path is too long"),
])
def test_output_folders_are_checked_before_any_work(tmp_path, command, folder, names, stacks_with_registry):
    (tmp_path / "a-file").write_text("mine")
    before = tree(tmp_path)
    result = gpuyard_forked(*command, "-d", folder, cwd=tmp_path)
    _check(result, tmp_path, before, [names])


@pytest.mark.parametrize("args, names", [
    (["plan", "--stack", "nope"], "'--stack'"),
    (["plan", "--stack", "../.."], "bad stack name '../..'"),
    (["plan", "--stack", ""], "bad stack name ''"),
    (["plan", "--json=yes"], "--json"),
    (["plan", "extra"], "unexpected extra argument"),
    (["demo", "--stack", "nope"], "'--stack'"),
    (["demo", "--stack", "/etc"], "bad stack name '/etc'"),
    (["demo", "-o", "out"], "No such option: -o"),
    (["images", "build", "-i", "cuda"], "'--image' / '-i'"),
    (["images", "build", "-i", ""], "'--image' / '-i'"),
    (["images", "build", "--stack", "nope"], "'--stack'"),
    (["images", "build", "--stack", "../x"], "bad stack name"),
    (["images", "build", "--push", "--dry-run"], "gpuyard:image_registry"),
    (["images", "build", "--dry-run", "--platform", ""], "--platform ''"),
    (["images", "build", "--dry-run", "--platform", "amd64"], "--platform 'amd64'"),
    (["images", "build", "--dry-run", "--platform", "linux/AMD64"], "--platform 'linux/AMD64'"),
    (["images", "build", "--dry-run", "--platform", "linux/amd64,"], "--platform"),
    (["env", "cleanup", "--cluster", "typo!"], "--cluster 'typo!': not an EKS cluster name"),
    (["env", "cleanup", "--cluster", ""], "--cluster '': not an EKS cluster name"),
    (["env", "cleanup", "--cluster", "-x"], "--cluster '-x'"),
    (["env", "cleanup", "--cluster", "c" * 101], "not an EKS cluster name"),
    (["env", "cleanup", "--cluster", "c", "--region", "nowhere-1"], "--region 'nowhere-1': unknown AWS region"),
    (["env", "cleanup", "--cluster", "c", "--region", "US-EAST-1"], "--region 'US-EAST-1'"),
    (["env", "cleanup", "--cluster", "c", "--region", ""], "--region ''"),
    (["env", "cleanup", "--cluster", "c", "--json"], "--json cannot ask before deleting"),
    (["env", "create", "pr-1", "--ttl", "1y"], "--ttl: bad duration '1y'"),
    (["env", "create", "pr-1", "--ttl", "1h1h"], "--ttl: bad duration '1h1h'"),
    (["env", "create", "pr-1", "--ttl", "59s"], "--ttl: duration '59s' out of range"),
    (["env", "create", "pr-1", "--ttl", "31d"], "--ttl: duration '31d' out of range"),
    (["env", "create", "pr-1", "--ttl", "8h", "--owner", ""], "--owner is empty"),
    (["env", "create", "pr-1", "--ttl", "8h", "--owner", "o" * 65], "--owner: String should have at most 64"),
    (["env", "create", "pr-1", "--ttl", "8h", "--owner", "a\nb"], "--owner: must be text without control characters"),
    (["env", "create", "pr-1", "--ttl", "8h", "--owner", "ana", "--team", "ghost"], "unknown team 'ghost'"),
    (["env", "create", "pr-1", "--ttl", "8h", "--owner", "ana", "--team", "Bad Team"], "--team"),
    (["env", "create", "n" * 46, "--ttl", "8h", "--owner", "ana"], f"NAME '{'n' * 46}' is too long: its cluster"),
    (["env", "create", "n" * 34, "--ttl", "8h", "--owner", "ana"], "is too long: its checkpoint bucket"),
    (["env", "create", "PR-1", "--ttl", "8h", "--owner", "ana"], "bad environment name 'PR-1'"),
    (["env", "create", "../x", "--ttl", "8h", "--owner", "ana"], "bad environment name '../x'"),
    (["env", "create", "", "--ttl", "8h", "--owner", "ana"], "bad environment name ''"),
    (["env", "create", "dev", "--ttl", "8h", "--owner", "ana", "--dry-run"], "stack 'dev' already exists"),
    (["env", "create", "pr-1"], "Missing option '--ttl'"),
    (["env", "destroy", "PR 7"], "bad environment name 'PR 7'"),
    (["env", "destroy", "/tmp"], "bad environment name '/tmp'"),
    (["env", "destroy", ""], "bad environment name ''"),
    (["env", "reap", "--dry-run=1"], "--dry-run"),
    (["env", "list", "--json=no"], "--json"),
    (["rendr"], "No such command 'rendr'"),
    (["sim", "upp"], "No such command 'upp'"),
    (["--versoin"], "No such option: --versoin"),
])
def test_other_commands(tmp_path, args, names):
    before = tree(tmp_path)
    result = gpuyard_forked(*args, cwd=tmp_path,
                            env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
                                 "GPUYARD_CACHE": str(tmp_path / "cache")})
    _check(result, tmp_path, before, [names])


@pytest.mark.parametrize("endpoint", ["not a url", "http://[::1", "http://", "ftp//x", "http://a b"])
def test_a_malformed_aws_endpoint_is_one_line(tmp_path, endpoint):
    """botocore refuses the URL with a ValueError at client creation; its message may hold newlines."""
    result = gpuyard_forked("env", "cleanup", "--cluster", "gpuyard-ephemeral-x", "--region", "us-east-1", "--dry-run",
                            cwd=tmp_path, env={"AWS_ENDPOINT_URL": endpoint, "AWS_MAX_ATTEMPTS": "1"})
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "AWS_ENDPOINT_URL" in result.stderr and result.session_left == []


SUBMIT = [
    (["nofile.yaml"], "FILE nofile.yaml: no such file"),
    (["folder"], "FILE folder: is not a file"),
    (["empty.yaml"], "FILE empty.yaml: holds no Kubernetes object"),
    (["text.yaml"], "FILE text.yaml: every document must be a Kubernetes object"),
    (["list.yaml"], "FILE list.yaml: every document must be a Kubernetes object"),
    (["nokind.yaml"], "FILE nokind.yaml: every document must be a Kubernetes object"),
    (["broken.yaml"], "FILE broken.yaml: not valid YAML"),
    (["binary.yaml"], "FILE binary.yaml: not UTF-8 text"),
    (["job.yaml", "nofile.yaml"], "FILE nofile.yaml: no such file"),
    (["job.yaml", "--wait", "-1"], "Invalid value for '--wait': -1 is out of range: from 0 to 86400"),
    (["job.yaml", "--wait", "nan"], "Invalid value for '--wait': 'nan' is not a number"),
    (["job.yaml", "--wait", "inf"], "Invalid value for '--wait'"),
    (["job.yaml", "--wait", "1e9"], "1e9 is out of range"),
    (["job.yaml", "--wait", "1_0"], "'1_0' is not a number"),
    (["job.yaml", "--wait", ""], "'' is not a number"),
    (["job.yaml", "--stack", "nope"], "unknown stack 'nope'"),
    (["nofile.yaml", "--stack", "nope"], "unknown stack 'nope'"),
    ([], "Missing argument 'files'"),
]


@pytest.mark.parametrize("args, names", SUBMIT, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_sim_submit_checks_what_was_typed_before_the_cluster(tmp_path, args, names):
    """Exit 2 for the input even though no cluster runs (which alone would be exit 1, "not running")."""
    (tmp_path / "folder").mkdir()
    for name, text in {"empty.yaml": "", "text.yaml": "just text\n", "list.yaml": "- a\n- b\n",
                       "nokind.yaml": "apiVersion: v1\nmetadata: {name: x}\n", "broken.yaml": "a: [\n",
                       "job.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"}.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00")
    before = tree(tmp_path)
    result = gpuyard_forked("sim", "submit", *args, cwd=tmp_path, env={"GPUYARD_CACHE": str(tmp_path / "cache")})
    _check(result, tmp_path, before, [names])


@pytest.mark.parametrize("command", [["kubeconfig"], ["submit", "job.yaml"]], ids=" ".join)
def test_sim_says_not_running_only_for_good_input(tmp_path, command):
    (tmp_path / "job.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    result = gpuyard_forked("sim", *command, "--stack", "dev", cwd=tmp_path,
                            env={"GPUYARD_CACHE": str(tmp_path / "cache")})
    assert_one_line_error(result, "sim dev is not running (gpuyard sim up --stack dev)", code=1)


@pytest.mark.parametrize("args", [[], ["env"], ["images"], ["sim"]], ids=lambda a: " ".join(["gpuyard", *a]))
def test_a_group_without_a_command_prints_its_usage(args):
    result = gpuyard_forked(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"Usage: gpuyard {' '.join(args)}".rstrip() + " [OPTIONS] COMMAND [ARGS]...")
    assert "Commands:" in result.stderr and "error" not in result.stderr
