"""`gpuyard render` as users run it: a real process, YAML out, one-line errors, nothing half-written."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuyard.jobs.cli.options import gpuyard_version
from gpuyard.jobs.workload.args import parse_args

GPUYARD = Path(sys.executable).with_name("gpuyard")  # the installed entry point, as users run it
GOLDEN = Path(__file__).parent / "golden"


def gpuyard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(GPUYARD), "render", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(autouse=True)
def registries(stacks_with_registry):
    """The stacks as they are once gpuyard:image_registry names their ECR registry."""


def test_without_a_registry_render_says_how_to_name_one(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUYARD_STACKS_DIR")
    result = gpuyard("--stack", "dev", "--team", "nlp", "--kind", "mpijob", "-d", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "stack 'dev' has no image registry: set gpuyard:image_registry" in result.stderr
    assert "or pass --image" in result.stderr and not (tmp_path / "out").exists()


def test_an_explicit_image_needs_no_registry(monkeypatch):
    monkeypatch.delenv("GPUYARD_STACKS_DIR")
    result = gpuyard("--stack", "dev", "--team", "nlp", "--kind", "mpijob", "--image", "registry.example/mpi:7")
    assert result.returncode == 0, result.stderr
    pods = yaml.safe_load(result.stdout)["spec"]["mpiReplicaSpecs"].values()
    assert {pod["template"]["spec"]["containers"][0]["image"] for pod in pods} == {"registry.example/mpi:7"}


def test_registry_overrides_the_stacks_image_registry_for_every_container():
    """``--registry`` is what ``gpuyard sim registry`` prints: every kind's images come from there."""
    result = gpuyard("--stack", "dev", "--all", "--registry", "127.0.0.1:5000/gpuyard-dev", "-o", "json")
    assert result.returncode == 0, result.stderr
    images = set(re.findall(r'"image": "([^"]+)"', result.stdout))
    assert images == {f"127.0.0.1:5000/gpuyard-dev/{name}:0.1.0" for name in ("ddp", "mpi", "ray")}


def test_a_registry_that_is_no_prefix_is_one_line_exit_2(tmp_path):
    result = gpuyard("--stack", "dev", "--team", "nlp", "--kind", "mpijob", "--registry", "http://x", "-d",
                     str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--registry 'http://x': not a registry prefix" in result.stderr and not (tmp_path / "out").exists()


def test_stdout_is_one_manifest():
    result = gpuyard("--stack", "dev", "--team", "nlp", "--kind", "mpijob", "--nodes", "2", "--gpus-per-node", "4")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    assert (manifest["kind"], manifest["metadata"]["namespace"]) == ("MPIJob", "team-nlp")
    assert manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2


def test_all_on_stdout_is_one_document_per_manifest():
    result = gpuyard("--stack", "dev", "--all")
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert len(documents) == 10 and {doc["metadata"]["namespace"] for doc in documents} == {"team-vision", "team-nlp"}


def test_options_reach_the_manifest():
    result = gpuyard("--stack", "prod", "--team", "vision", "--kind", "pytorchjob", "--name", "bert", "--nodes", "2:8",
                     "--gpus-per-node", "8", "--efa", "4", "-e", "NCCL_DEBUG=INFO",
                     "--epochs", "3", "--max-restarts", "5", "--ttl", "60")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    spec = manifest["spec"]
    assert manifest["metadata"]["name"] == "bert"
    assert (spec["elasticPolicy"]["minReplicas"], spec["elasticPolicy"]["maxReplicas"]) == (2, 8)
    assert (spec["runPolicy"]["backoffLimit"], spec["runPolicy"]["ttlSecondsAfterFinished"]) == (5, 60)
    pod = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    trainer = pod["containers"][0]
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "gpu-efa", "karpenter.sh/capacity-type": "on-demand",
                                   "karpenter.k8s.aws/instance-family": "p4d"}
    assert trainer["resources"]["limits"]["vpc.amazonaws.com/efa"] == "4"
    assert "hugepages-2Mi" not in trainer["resources"]["limits"]  # Karpenter cannot size nodes for huge pages
    env = {item["name"]: item["value"] for item in trainer["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["FI_PROVIDER"] == "efa" and env["NCCL_NET"] == "AWS Libfabric"
    assert env["FI_EFA_USE_HUGE_PAGE"] == "0"
    args = parse_args(trainer["args"])
    assert args.total_epochs == 3 and args.checkpoint_uri == "s3://gpuyard-prod-checkpoints/teams/vision/bert"


def test_jobs_can_target_prods_reserved_node_group():
    result = gpuyard("--stack", "prod", "--team", "nlp", "--kind", "mpijob", "--nodes", "2", "--gpus-per-node", "8",
                     "--efa", "4", "--node-pool", "gpu-a100")
    assert result.returncode == 0, result.stderr
    worker = yaml.safe_load(result.stdout)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["nodeSelector"] == {"gpuyard.io/node-group": "gpu-a100"}
    limits = worker["containers"][0]["resources"]["limits"]
    assert (limits["vpc.amazonaws.com/efa"], limits["hugepages-2Mi"]) == ("4", "5120Mi")
    launcher = yaml.safe_load(result.stdout)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    env = {item["name"]: item["value"] for item in launcher["containers"][0]["env"]}
    assert env["NCCL_NET"] == "AWS Libfabric" and "FI_EFA_USE_HUGE_PAGE" not in env


def test_all_writes_the_golden_files(tmp_path):
    out = tmp_path / "manifests"
    result = gpuyard("--stack", "dev", "--all", "-d", str(out))
    assert result.returncode == 0, result.stderr
    files = sorted(out.iterdir())  # one flat folder: `kubectl apply -f DIR` without -R
    assert len(files) == 10 and all(path.suffix == ".yaml" for path in files)
    assert sorted(result.stdout.split()) == sorted(str(path) for path in files)
    for path in files:  # the goldens are schema-checked in test_render_golden
        team, kind = path.stem.rsplit("-", 1)
        header, body = path.read_text().split("\n", 1)
        assert header == f"# Rendered by gpuyard {gpuyard_version()} from stack dev: gpuyard render --stack dev --all -d {out}"
        assert body == (GOLDEN / kind / f"{team}.yaml").read_text()


@pytest.mark.parametrize(("args", "message"), [
    (["--stack", "nope", "--all"], "Invalid value for '--stack': unknown stack 'nope' (stacks: dev, ephemeral, prod in "),
    (["--team", "ghost", "--kind", "mpijob"], "unknown team 'ghost'"),
    (["--team", "nlp", "--kind", "tfjob"], "Invalid value for '--kind': 'tfjob' is not one of"),
    (["--team", "nlp", "--kind", "mpijob", "--nodes", "0"], "nodes"),
    (["--team", "nlp", "--kind", "mpijob", "--gpus-per-node", "1.5"], "--gpus-per-node"),
    (["--team", "nlp", "--kind", "pytorchjob", "--nodes", "4:2"], "--nodes 4:2: MIN 4 is above MAX 2"),
    (["--team", "nlp", "--kind", "mpijob", "--name", "Big_Job"], "name"),
    (["--team", "nlp", "--kind", "pytorchjob", "--name", "1st-run"], "'1st-run' is not a DNS-1035 label"),
    (["--team", "nlp", "--kind", "rayjob", "--name", "r" * 48], "a rayjob name has at most 47"),
    (["--team", "vision", "--kind", "pytorchjob", "--nodes", "2:8", "--gpus-per-node", "8", "--efa", "4"],
     "--efa 4: stack 'dev' has no EFA NodePool"),
    (["--team", "vision", "--kind", "pytorchjob", "--nodes", "2:8", "--gpus-per-node", "8"],
     "pool gpu-on-demand holds at most 8 GPUs (gpuyard:karpenter.gpu_limit); team vision's queue vision "
     "allows 16 GPUs (gang: 64)"),
    (["--stack", "prod", "--team", "nlp", "--kind", "pytorchjob", "--capacity-type", "spot"],
     "--capacity-type spot: stack 'prod' has no spot GPU NodePool"),
    (["--team", "nlp", "--kind", "pytorchjob", "--node-pool", "nonexistent"],
     "--node-pool nonexistent: stack 'dev' has no GPU pool of that name"),
    (["--team", "nlp", "--kind", "pytorchjob", "--gpus-per-node", "16"],
     "--gpus-per-node 16: no instance type of pool gpu-on-demand has that many GPUs per node (at most 8"),
    (["--stack", "prod", "--team", "nlp", "--kind", "mpijob", "--gpus-per-node", "8", "--efa", "32",
      "--node-pool", "gpu-a100"], "--efa 32: no instance type of pool gpu-a100 has that many EFA interfaces"),
    (["--stack", "prod", "--team", "nlp", "--kind", "mpijob", "--gpus-per-node", "8", "--efa", "4",
      "--node-pool", "gpu-on-demand"], "--efa 4: pool gpu-on-demand has no EFA interfaces"),
    (["--team", "nlp", "--kind", "volcanojob", "--max-restarts", "100"], "--max-restarts"),
    (["--team", "nlp", "--kind", "volcanojob", "--name", "v" * 60], "too long for a volcanojob"),
    (["--stack", "prod", "--team", "nlp", "--kind", "trainjob"], "does not install Kubeflow Trainer v2"),
    (["--team", "nlp"], "--team and --kind are required"),
    (["--all", "--team", "nlp"], "drop --team"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "out"
    result = gpuyard(*args, "-d", str(out))
    assert result.returncode == 2
    assert result.stderr.startswith("gpuyard: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_output_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "manifests"
    target.write_text("not a folder")
    result = gpuyard("--all", "-d", str(target))
    assert result.returncode == 2 and "is not a folder" in result.stderr
    assert target.read_text() == "not a folder" and sorted(tmp_path.iterdir()) == [target]
