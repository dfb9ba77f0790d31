"""`gpuyard render` as users run it: a real process, YAML out, one-line errors, nothing half-written."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobs.cli.options import gpuyard_version
from jobs.workload.args import parse_args

GPUYARD = Path(sys.executable).with_name("gpuyard")  # the installed entry point, as users run it
GOLDEN = Path(__file__).parent / "golden"


def gpuyard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(GPUYARD), "render", *args], capture_output=True, text=True, timeout=120)


def test_stdout_is_one_manifest():
    result = gpuyard("--stack", "dev", "--team", "nlp", "--kind", "mpijob", "--nodes", "3", "--gpus-per-node", "4")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    assert (manifest["kind"], manifest["metadata"]["namespace"]) == ("MPIJob", "team-nlp")
    assert manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3


def test_all_on_stdout_is_one_document_per_manifest():
    result = gpuyard("--stack", "dev", "--all")
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert len(documents) == 10 and {doc["metadata"]["namespace"] for doc in documents} == {"team-vision", "team-nlp"}


def test_options_reach_the_manifest():
    result = gpuyard("--team", "vision", "--kind", "pytorchjob", "--name", "bert", "--nodes", "2:8",
                     "--gpus-per-node", "8", "--efa", "4", "--capacity-type", "spot", "-e", "NCCL_DEBUG=INFO",
                     "--epochs", "3", "--max-restarts", "5", "--ttl", "60")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    spec = manifest["spec"]
    assert manifest["metadata"]["name"] == "bert"
    assert (spec["elasticPolicy"]["minReplicas"], spec["elasticPolicy"]["maxReplicas"]) == (2, 8)
    assert (spec["runPolicy"]["backoffLimit"], spec["runPolicy"]["ttlSecondsAfterFinished"]) == (5, 60)
    pod = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    trainer = pod["containers"][0]
    assert pod["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
    assert trainer["resources"]["limits"]["vpc.amazonaws.com/efa"] == "4"
    env = {item["name"]: item["value"] for item in trainer["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["FI_PROVIDER"] == "efa"
    args = parse_args(trainer["args"])
    assert args.total_epochs == 3 and args.checkpoint_uri == "s3://gpuyard-dev-checkpoints/teams/vision/bert"


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
    (["--stack", "nope", "--all"], "Invalid value for '--stack': 'nope' is not one of 'dev', 'ephemeral', 'prod'"),
    (["--team", "ghost", "--kind", "mpijob"], "unknown team 'ghost'"),
    (["--team", "nlp", "--kind", "tfjob"], "Invalid value for '--kind': 'tfjob' is not one of"),
    (["--team", "nlp", "--kind", "mpijob", "--nodes", "0"], "nodes"),
    (["--team", "nlp", "--kind", "mpijob", "--gpus-per-node", "1.5"], "--gpus-per-node"),
    (["--team", "nlp", "--kind", "pytorchjob", "--nodes", "4:2"], "--nodes 4:2: MIN 4 is above MAX 2"),
    (["--team", "nlp", "--kind", "mpijob", "--name", "Big_Job"], "name"),
    (["--team", "nlp", "--kind", "volcanojob", "--name", "v" * 60], "too long for a volcanojob"),
    (["--stack", "prod", "--team", "nlp", "--kind", "trainjob"], "does not install Kubeflow Trainer v2"),
    (["--team", "nlp"], "--team and --kind are required"),
    (["--all", "--team", "nlp"], "drop --team/--kind"),
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
