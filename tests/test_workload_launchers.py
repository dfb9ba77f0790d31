"""One trainer under torchrun, mpirun, Ray Train and plain python: same seed, same weights (world size 2)."""

import json
import shutil

import boto3
import pytest

from gpuyard.jobs.workload.args import TrainArgs
from workload_launch import done_event, mpirun_cmd, python_cmd, ray_cmd, run, torchrun_cmd, trained

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
                    "weights_sha256": done["weights_sha256"], "checkpoint": str(checkpoints / "ckpt-000000128.json")}
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "ckpt-000000064.json", "ckpt-000000064.pt", "ckpt-000000128.json", "ckpt-000000128.pt"]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (openmpi-bin) is not installed")
def test_mpirun_reaches_the_same_weights(torchrun_done):
    assert trained(done_event(run(mpirun_cmd(ARGS)))) == trained(torchrun_done[0])


def test_ray_train_reaches_the_same_weights(torchrun_done):
    pytest.importorskip("ray.train.torch")
    assert trained(done_event(run(ray_cmd(ARGS), timeout=180))) == trained(torchrun_done[0])


def test_torchrun_checkpoints_to_s3_and_reaches_the_same_weights(torchrun_done, local_aws):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpt")
    args = ARGS.model_copy(update={"checkpoint_uri": "s3://ckpt/runs/ddp"})
    done = done_event(run(torchrun_cmd(args), env=local_aws.env))
    assert trained(done) == trained(torchrun_done[0]) and done["checkpoint"] == "s3://ckpt/runs/ddp/ckpt-000000128.json"
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket="ckpt")["Contents"]]
    assert keys == ["runs/ddp/ckpt-000000064.json", "runs/ddp/ckpt-000000064.pt",
                    "runs/ddp/ckpt-000000128.json", "runs/ddp/ckpt-000000128.pt"]
    manifest = json.loads(s3.get_object(Bucket="ckpt", Key="runs/ddp/ckpt-000000128.json")["Body"].read())
    assert manifest["data"] == "ckpt-000000128.pt" and len(manifest["sha256"]) == 64
    assert manifest["identity"] == {"model": "linear", "dataset_size": 2048, "seed": 3, "batch_size": 32,
                                    "lr": 0.001, "dropout": 0.0}
    assert manifest["world_size"] == 2


def test_plain_python_is_world_size_1_and_resumes_to_the_same_weights(torchrun_done, tmp_path):
    """World size 1 sees twice the steps per epoch, so its weights differ from world size 2."""
    uninterrupted = done_event(run(python_cmd(ARGS)))
    assert uninterrupted["global_step"] == 4 * 2 * STEPS_PER_EPOCH_WORLD_2
    assert uninterrupted["weights_sha256"] != torchrun_done[0]["weights_sha256"]
    first_half = ARGS.model_copy(update={"total_epochs": 2, "checkpoint_uri": str(tmp_path)})
    done_event(run(python_cmd(first_half)))
    resumed = run(python_cmd(first_half.model_copy(update={"total_epochs": 4})))
    assert trained(done_event(resumed)) == trained(uninterrupted)
    resume = next(json.loads(line) for line in resumed.stdout.splitlines() if '"resume"' in line)
    assert resume == {"event": "resume", "epoch": 2, "epoch_samples": 0, "global_step": 128,
                      "checkpoint": str(tmp_path / "ckpt-000000128.json")}
