"""One trainer under torchrun, mpirun, Ray Train and plain python: same seed, same weights (world size 2)."""

import json
import shutil

import boto3
import pytest

from jobs.workload.args import TrainArgs
from workload_launch import done_event, mpirun_cmd, python_cmd, ray_cmd, run, torchrun_cmd

pytestmark = pytest.mark.slow
ARGS = TrainArgs(total_epochs=4, save_every=2, batch_size=32, seed=3)
STEPS_PER_EPOCH_WORLD_2 = 2048 // 2 // 32


@pytest.fixture(scope="module")
def torchrun_done(tmp_path_factory):
    """The reference: torchrun, 2 processes, checkpoints to a local dir."""
    checkpoints = tmp_path_factory.mktemp("torchrun") / "ckpt"
    result = run(torchrun_cmd(ARGS.model_copy(update={"checkpoint_uri": str(checkpoints)})))
    return done_event(result), checkpoints


def test_torchrun_trains_and_checkpoints_to_a_local_dir(torchrun_done):
    done, checkpoints = torchrun_done
    assert done == {"event": "done", "epochs": 4, "global_step": 4 * STEPS_PER_EPOCH_WORLD_2,
                    "weights_sha256": done["weights_sha256"]}
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "ckpt-000002.json", "ckpt-000002.pt", "ckpt-000004.json", "ckpt-000004.pt"]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (openmpi-bin) is not installed")
def test_mpirun_reaches_the_same_weights(torchrun_done):
    assert done_event(run(mpirun_cmd(ARGS))) == torchrun_done[0]


def test_ray_train_reaches_the_same_weights(torchrun_done):
    pytest.importorskip("ray.train.torch")
    assert done_event(run(ray_cmd(ARGS), timeout=180)) == torchrun_done[0]


def test_torchrun_checkpoints_to_s3_and_reaches_the_same_weights(torchrun_done, local_aws):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpt")
    args = ARGS.model_copy(update={"checkpoint_uri": "s3://ckpt/runs/ddp"})
    assert done_event(run(torchrun_cmd(args), env=local_aws.env)) == torchrun_done[0]
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket="ckpt")["Contents"]]
    assert keys == ["runs/ddp/ckpt-000002.json", "runs/ddp/ckpt-000002.pt",
                    "runs/ddp/ckpt-000004.json", "runs/ddp/ckpt-000004.pt"]
    manifest = json.loads(s3.get_object(Bucket="ckpt", Key="runs/ddp/ckpt-000004.json")["Body"].read())
    assert manifest["data"] == "ckpt-000004.pt" and len(manifest["sha256"]) == 64


def test_plain_python_is_world_size_1_and_resumes_to_the_same_weights(torchrun_done, tmp_path):
    """World size 1 sees twice the steps per epoch, so its weights differ from world size 2."""
    uninterrupted = done_event(run(python_cmd(ARGS)))
    assert uninterrupted["global_step"] == 4 * 2 * STEPS_PER_EPOCH_WORLD_2
    assert uninterrupted["weights_sha256"] != torchrun_done[0]["weights_sha256"]
    first_half = ARGS.model_copy(update={"total_epochs": 2, "checkpoint_uri": str(tmp_path)})
    done_event(run(python_cmd(first_half)))
    resumed = run(python_cmd(first_half.model_copy(update={"total_epochs": 4})))
    assert done_event(resumed) == uninterrupted
    assert {"event": "resume", "epoch": 2, "global_step": 128} in [json.loads(line) for line in resumed.stdout.splitlines()]
