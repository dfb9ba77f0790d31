"""Checkpoints on a real directory and a real moto S3 server: atomic, verified, pruned, skipped when bad."""

import json

import boto3
import pytest
import torch

from jobs.local_aws import free_port
from jobs.workload.checkpoint import Checkpointer, data_name, manifest_name, serialize
from jobs.workload.storage import LocalStorage, S3Storage, StorageError, open_storage


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return LocalStorage(tmp_path / "ckpt")
    request.getfixturevalue("local_aws")
    boto3.client("s3").create_bucket(Bucket="ckpt")
    return S3Storage("ckpt", "runs/a")


def _state(epochs_run: int) -> dict:
    return {"epochs_run": epochs_run, "model": {"weight": torch.full((2, 3), float(epochs_run))}}


def _save_epochs(checkpointer: Checkpointer, epochs: range) -> None:
    for epochs_run in epochs:
        checkpointer.save(epochs_run, serialize(_state(epochs_run)))


def _assert_manifests_name_existing_data(storage) -> None:
    names = storage.names()
    for manifest in (n for n in names if n.endswith(".json")):
        assert json.loads(storage.get(manifest))["data"] in names


def test_save_keeps_the_last_k_and_loads_the_newest(storage):
    saved = []
    checkpointer = Checkpointer(storage, keep=3, emit=saved.append)
    storage.check()
    _save_epochs(checkpointer, range(1, 6))
    assert storage.names() == sorted(f(e) for e in (3, 4, 5) for f in (data_name, manifest_name))
    assert [e["epoch"] for e in saved if e["event"] == "checkpoint"] == [1, 2, 3, 4, 5]
    latest = checkpointer.load_latest()
    assert latest.epochs_run == 5
    assert torch.equal(latest.state["model"]["weight"], torch.full((2, 3), 5.0))
    _assert_manifests_name_existing_data(storage)


def test_corrupt_data_is_reported_and_the_previous_checkpoint_loads(storage):
    events = []
    checkpointer = Checkpointer(storage, emit=events.append)
    storage.check()
    _save_epochs(checkpointer, range(1, 3))
    payload = bytearray(storage.get(data_name(2)))
    payload[len(payload) // 2] ^= 0xFF
    storage.put(data_name(2), bytes(payload))
    assert checkpointer.load_latest().epochs_run == 1
    skipped = [e for e in events if e["event"] == "checkpoint_skipped"]
    assert skipped == [{"event": "checkpoint_skipped", "name": manifest_name(2),
                        "reason": f"{data_name(2)}: size or sha256 differs from its manifest"}]


def test_data_without_manifest_is_a_partial_write_and_is_skipped(storage):
    events = []
    checkpointer = Checkpointer(storage, emit=events.append)
    storage.check()
    _save_epochs(checkpointer, range(1, 2))
    storage.put(data_name(2), serialize(_state(2)))  # killed before the manifest
    assert checkpointer.load_latest().epochs_run == 1
    assert events[-1] == {"event": "checkpoint_skipped", "name": data_name(2), "reason": "no manifest (partial write)"}


def test_unreadable_manifest_and_missing_data_are_skipped(storage):
    events = []
    checkpointer = Checkpointer(storage, emit=events.append)
    storage.check()
    _save_epochs(checkpointer, range(1, 4))
    storage.put(manifest_name(3), b"{not json")
    storage.delete(data_name(2))
    assert checkpointer.load_latest().epochs_run == 1
    assert [e["name"] for e in events if e["event"] == "checkpoint_skipped"] == [manifest_name(3), manifest_name(2)]


def test_no_checkpoint_yet_loads_nothing(storage):
    storage.check()
    assert Checkpointer(storage).load_latest() is None


def test_s3_save_to_an_unreachable_endpoint_is_retried_then_reported_not_raised(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    events = []
    Checkpointer(S3Storage("ckpt", "p", attempts=3, base_delay=0.01), emit=events.append).save(1, b"bytes")
    assert len(events) == 1 and events[0]["event"] == "checkpoint_failed"
    assert "put ckpt-000001.pt failed after 3 attempts" in events[0]["error"]


def test_local_write_leaves_no_temp_files(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.put("a", b"1")
    storage.put("a", b"22")
    assert [p.name for p in tmp_path.iterdir()] == ["a"] and storage.get("a") == b"22"


@pytest.mark.parametrize("uri, message", [
    ("gs://bucket/x", "unsupported scheme 'gs'"),
    ("s3:///prefix", "has no bucket"),
])
def test_bad_uri_is_one_line_storage_error(uri, message):
    with pytest.raises(StorageError, match=message):
        open_storage(uri)


def test_missing_bucket_fails_the_start_check(local_aws):
    with pytest.raises(StorageError, match="bucket 'absent' not found"):
        open_storage("s3://absent/run").check()


def test_uri_forms(tmp_path):
    assert open_storage(str(tmp_path)).uri == str(tmp_path)
    assert open_storage(f"file://{tmp_path}").uri == str(tmp_path)
    assert open_storage("s3://bucket/a/b/").uri == "s3://bucket/a/b"


def test_a_verified_object_that_is_no_checkpoint_and_a_manifest_without_keys_are_skipped(storage):
    events = []
    checkpointer = Checkpointer(storage, emit=events.append)
    storage.check()
    _save_epochs(checkpointer, range(1, 2))
    checkpointer.save(2, b"not a torch file")
    storage.put(manifest_name(3), json.dumps({"data": data_name(3)}).encode())
    assert checkpointer.load_latest().epochs_run == 1
    reasons = [e["reason"] for e in events if e["event"] == "checkpoint_skipped"]
    assert reasons[0] == "unreadable manifest: KeyError('bytes')"
    assert reasons[1].startswith(f"{data_name(2)}: not a checkpoint")


def test_a_checkpoint_above_the_multipart_threshold_round_trips_through_s3(local_aws):
    boto3.client("s3").create_bucket(Bucket="ckpt")
    checkpointer = Checkpointer(S3Storage("ckpt", "big"))
    weights = torch.rand(3 * 2**20)  # 12 MiB: a multipart upload
    checkpointer.save(1, serialize({"weights": weights}))
    assert torch.equal(checkpointer.load_latest().state["weights"], weights)
