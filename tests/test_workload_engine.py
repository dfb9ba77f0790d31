"""The sharded checkpoint engine (jobs/workload/engine.py, sharded.py) on real torchrun ranks (gloo) and a real
moto S3, faults injected on the wire (FaultyProxy in front of moto)."""

import json
import sys
from pathlib import Path

import boto3
import pytest

from gpuyard.jobs.workload.args import TrainArgs
from gpuyard.jobs.workload.engine import ShardedCheckpointer, folder_name
from gpuyard.jobs.workload.storage import S3Storage
from gpuyard.jobs.workload.train import identity
from workload_launch import FaultyProxy, done_event, events, run, torchrun_cmd, trained

pytestmark = pytest.mark.slow
RANKS = Path(__file__).with_name("engine_ranks.py")


def ranks(mode: str, uri: str, out: Path, nproc: int, *extra: str, env: dict | None = None) -> list[dict]:
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               str(RANKS), mode, uri, str(out), *extra]
    result = run(command, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(nproc)]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_two_rank_checkpoint_on_s3_restores_bitwise_on_two_ranks_and_on_one(tmp_path, local_aws, parallel):
    """Under FSDP (fully_shard, gloo) each rank holds and writes only its shard; on 1 rank DCP reshards it."""
    boto3.client("s3").create_bucket(Bucket="ckpt")
    saved = ranks("save", "s3://ckpt/run", tmp_path / "save", 2, "--steps", "3", "--save-at", "2", "3",
                  "--parallel", parallel)
    assert [e["step"] for e in saved[0]["events"] if e["event"] == "checkpoint"] == [2, 3]
    keys = {item["Key"] for item in boto3.client("s3").list_objects_v2(Bucket="ckpt")["Contents"]}
    assert {"run/ckpt-000000003/__0_0.distcp", "run/ckpt-000000003/__1_0.distcp", "run/ckpt-000000003/.metadata",
            "run/ckpt-000000003.json"} <= keys  # each rank wrote its own part

    on_two = ranks("load", "s3://ckpt/run", tmp_path / "two", 2, "--parallel", parallel)
    on_one = ranks("load", "s3://ckpt/run", tmp_path / "one", 1, "--parallel", parallel)
    for loaded in on_two + on_one:
        assert loaded["resumed"] == {"step": 3, "world_size": 2}
        mine = saved[loaded["rank"]]["states"]["3"]
        assert loaded["states"]["3"] == mine  # model, optimizer, progress and this rank's own RNG, bitwise


def test_a_shard_upload_refused_leaves_the_previous_checkpoint_the_newest(tmp_path, local_aws):
    """Rank 1's part of the second checkpoint is refused by the endpoint: DCP fails the save on every rank, rank 0
    publishes no manifest for it, and a restart loads the first one."""
    boto3.client("s3").create_bucket(Bucket="ckpt")
    proxy = FaultyProxy(local_aws.port)
    proxy.fail(f"PUT /ckpt/run/{folder_name(2)}/__1_".encode())
    saved = ranks("save", "s3://ckpt/run", tmp_path / "save", 2, "--steps", "2", "--save-at", "1", "2",
                  env={**local_aws.env, "AWS_ENDPOINT_URL": proxy.endpoint_url})
    proxy.close()
    assert proxy.failed_request and b"gpuyard-rank/1" in proxy.failed_request
    outcome = {e["event"]: e for e in saved[0]["events"]}
    assert outcome["checkpoint"]["step"] == 1 and outcome["checkpoint_failed"]["step"] == 2
    assert "rank 1" in outcome["checkpoint_failed"]["error"]
    storage = S3Storage("ckpt", "run")
    assert ShardedCheckpointer(storage, {"model": "mlp"}).newest()["step"] == 1
    assert "ckpt-000000002.json" not in storage.names()

    restarted = ranks("load", "s3://ckpt/run", tmp_path / "restart", 2)
    for loaded in restarted:
        assert loaded["resumed"] == {"step": 1, "world_size": 2}
        assert loaded["states"]["1"] == saved[loaded["rank"]]["states"]["1"]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_the_trainer_resumes_a_sharded_s3_checkpoint_bitwise_and_after_a_resize(tmp_path, local_aws, parallel):
    boto3.client("s3").create_bucket(Bucket="ckpt")
    first_half = TrainArgs(total_epochs=2, save_every=1, batch_size=32, seed=21, lease_seconds=2,
                           checkpoint_uri="s3://ckpt/run", checkpoint_format="sharded", parallel=parallel)
    done_event(run(torchrun_cmd(first_half), env=local_aws.env, timeout=300))
    full = first_half.model_copy(update={"total_epochs": 4})
    resumed = run(torchrun_cmd(full), env=local_aws.env, timeout=300)
    assert next(e for e in events(resumed.stdout) if e["event"] == "resume")["global_step"] == 64
    uninterrupted = run(torchrun_cmd(full.model_copy(update={"checkpoint_uri": None})), timeout=300)
    assert trained(done_event(resumed)) == trained(done_event(uninterrupted))

    one_rank = run(torchrun_cmd(full.model_copy(update={"total_epochs": 5}), nproc=1), env=local_aws.env, timeout=300)
    resume = next(e for e in events(one_rank.stdout) if e["event"] == "resume")
    assert resume["global_step"] == 128 and resume["world_size"] == {"saved": 2, "now": 1}
    assert done_event(one_rank)["epochs"] == 5
    manifest = json.loads(S3Storage("ckpt", "run").get("ckpt-000000128.json"))
    assert manifest["format"] == "dcp" and manifest["identity"] == identity(full)
