"""Checkpoints on a real directory and a real moto S3 server: atomic, verified, pruned, skipped when bad."""

import io
import json

import boto3
import pytest
import torch

from gpuyard.jobs.local_aws import free_port
from gpuyard.jobs.workload.checkpoint import Checkpointer, IdentityMismatch, data_name, manifest_name, serialize
from gpuyard.jobs.workload.storage import LocalStorage, S3Storage, StorageError, open_storage
from workload_launch import FaultyProxy


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return LocalStorage(tmp_path / "ckpt")
    request.getfixturevalue("local_aws")
    boto3.client("s3").create_bucket(Bucket="ckpt")
    return S3Storage("ckpt", "runs/a")


IDENTITY = {"model": "linear", "dataset_size": 64, "seed": 0, "batch_size": 8, "lr": 0.001, "dropout": 0.0}


def _checkpointer(storage, **kwargs) -> Checkpointer:
    return Checkpointer(storage, IDENTITY, **kwargs)


def _state(step: int) -> dict:
    return {"step": step, "model": {"weight": torch.full((2, 3), float(step))}}


def _save_steps(checkpointer: Checkpointer, steps: range) -> None:
    for step in steps:
        assert checkpointer.save(step, serialize(_state(step)))


def _assert_manifests_name_existing_data(storage) -> None:
    names = storage.names()
    for manifest in (n for n in names if n.endswith(".json")):
        assert json.loads(storage.get(manifest))["data"] in names


def test_save_keeps_the_last_k_and_loads_the_newest(storage):
    saved = []
    checkpointer = _checkpointer(storage, keep=3, emit=saved.append)
    storage.check()
    _save_steps(checkpointer, range(1, 6))
    assert storage.names() == sorted(f(e) for e in (3, 4, 5) for f in (data_name, manifest_name))
    assert [e["step"] for e in saved if e["event"] == "checkpoint"] == [1, 2, 3, 4, 5]
    latest = checkpointer.load_latest()
    assert latest.step == 5 and latest.uri == f"{storage.uri}/{manifest_name(5)}"
    assert torch.equal(latest.state["model"]["weight"], torch.full((2, 3), 5.0))
    _assert_manifests_name_existing_data(storage)


def test_corrupt_data_is_reported_and_the_previous_checkpoint_loads(storage):
    events = []
    checkpointer = _checkpointer(storage, emit=events.append)
    storage.check()
    _save_steps(checkpointer, range(1, 3))
    payload = bytearray(storage.get(data_name(2)))
    payload[len(payload) // 2] ^= 0xFF
    storage.put(data_name(2), bytes(payload))
    assert checkpointer.load_latest().step == 1
    skipped = [e for e in events if e["event"] == "checkpoint_skipped"]
    assert skipped == [{"event": "checkpoint_skipped", "name": manifest_name(2),
                        "reason": f"{data_name(2)}: size or sha256 differs from its manifest"}]


def test_a_torch_file_that_is_not_a_dict_is_skipped(storage):
    events = []
    checkpointer = _checkpointer(storage, emit=events.append)
    storage.check()
    _save_steps(checkpointer, range(1, 2))
    assert checkpointer.save(2, serialize([1, 2]))  # a consistent manifest naming a list, not a state dict
    assert checkpointer.load_latest().step == 1
    assert events[-1] == {"event": "checkpoint_skipped", "name": manifest_name(2),
                          "reason": f"{data_name(2)}: not a checkpoint: holds a list, not a dict"}


@pytest.mark.parametrize(("uri", "says"), [
    ("", "--checkpoint-uri is empty"),
    (" ", "--checkpoint-uri is empty"),
    ("file://host/ckpt", "names host 'host': use file:///path"),
])
def test_checkpoint_uris_that_would_write_elsewhere_are_refused(uri, says):
    with pytest.raises(StorageError, match=says):
        open_storage(uri)


def test_file_uris_of_this_machine_are_paths(tmp_path):
    assert open_storage(f"file://{tmp_path}/a").uri == open_storage(f"file://localhost{tmp_path}/a").uri


def test_a_malformed_endpoint_names_the_variable(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "not-a-url")
    with pytest.raises(StorageError, match="^AWS_ENDPOINT_URL: Invalid endpoint: not-a-url"):
        S3Storage("ckpt", "runs")


def test_data_without_manifest_is_a_partial_write_and_is_skipped(storage):
    events = []
    checkpointer = _checkpointer(storage, emit=events.append)
    storage.check()
    _save_steps(checkpointer, range(1, 2))
    storage.put(data_name(2), serialize(_state(2)))  # killed before the manifest
    assert checkpointer.load_latest().step == 1
    assert events[-1] == {"event": "checkpoint_skipped", "name": data_name(2), "reason": "no manifest (partial write)"}


def test_unreadable_manifest_and_missing_data_are_skipped(storage):
    events = []
    checkpointer = _checkpointer(storage, emit=events.append)
    storage.check()
    _save_steps(checkpointer, range(1, 4))
    storage.put(manifest_name(3), b"{not json")
    storage.delete(data_name(2))
    assert checkpointer.load_latest().step == 1
    assert [e["name"] for e in events if e["event"] == "checkpoint_skipped"] == [manifest_name(3), manifest_name(2)]


def test_no_checkpoint_yet_loads_nothing(storage):
    storage.check()
    assert _checkpointer(storage).load_latest() is None


def test_s3_save_to_an_unreachable_endpoint_is_retried_then_reported_not_raised(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    events = []
    assert not _checkpointer(S3Storage("ckpt", "p", attempts=3, base_delay=0.01), emit=events.append).save(1, b"bytes")
    assert len(events) == 1 and events[0]["event"] == "checkpoint_failed"
    assert "put ckpt-000000001.pt failed after 3 attempts" in events[0]["error"]


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
    checkpointer = _checkpointer(storage, emit=events.append)
    storage.check()
    _save_steps(checkpointer, range(1, 2))
    checkpointer.save(2, b"not a torch file")
    storage.put(manifest_name(3), json.dumps({"step": 3, "data": data_name(3)}).encode())
    assert checkpointer.load_latest().step == 1
    reasons = [e["reason"] for e in events if e["event"] == "checkpoint_skipped"]
    assert reasons[0] == "unreadable manifest: no 'bytes'"
    assert reasons[1].startswith(f"{data_name(2)}: not a checkpoint")


def test_a_checkpoint_above_the_multipart_threshold_round_trips_through_s3(local_aws):
    boto3.client("s3").create_bucket(Bucket="ckpt")
    checkpointer = _checkpointer(S3Storage("ckpt", "big"))
    weights = torch.rand(3 * 2**20)  # 12 MiB: a multipart upload
    checkpointer.save(1, serialize({"weights": weights}))
    assert torch.equal(checkpointer.load_latest().state["weights"], weights)


def test_objects_that_are_not_ours_are_ignored_whatever_their_names(storage, tmp_path):
    storage.check()
    foreign = {"ckpt-latest.json": b"{}", "ckpt-000000009.json.bak": b"x", "ckpt-9.json": b"{}", "notes.txt": b"hi"}
    for name, body in foreign.items():
        storage.put(name, body)
    if isinstance(storage, LocalStorage):
        (storage.root / manifest_name(99)).mkdir()  # a folder named like a checkpoint
    else:  # a "folder" another tool made: our storage only writes plain names
        boto3.client("s3").put_object(Bucket="ckpt", Key=f"runs/a/{manifest_name(99)}/inside", Body=b"{}")
    checkpointer = _checkpointer(storage, keep=2)
    _save_steps(checkpointer, range(1, 5))
    assert checkpointer.load_latest().step == 4
    assert _checkpointer(storage).newest_manifest()["step"] == 4
    ours = [f(step) for step in (3, 4) for f in (data_name, manifest_name)]
    assert sorted(set(storage.names()) - set(foreign) - {f"{manifest_name(99)}/inside"}) == sorted(ours)
    assert all(storage.get(name) == body for name, body in foreign.items())


@pytest.mark.parametrize("key, value, flag", [
    ("model", "mlp", "--model 'linear' in the checkpoint, 'mlp' now"),
    ("seed", 7, "--seed 0 in the checkpoint, 7 now"),
    ("dataset_size", 128, "--dataset-size 64 in the checkpoint, 128 now"),
    ("batch_size", 16, "--batch_size 8 in the checkpoint, 16 now"),
    ("lr", 0.1, "--lr 0.001 in the checkpoint, 0.1 now"),
    ("dropout", 0.5, "--dropout 0.0 in the checkpoint, 0.5 now"),
])
def test_a_checkpoint_of_another_run_shape_is_an_identity_mismatch(tmp_path, key, value, flag):
    storage = LocalStorage(tmp_path)
    _save_steps(_checkpointer(storage), range(1, 2))
    other = Checkpointer(storage, {**IDENTITY, key: value})
    for read in (other.load_latest, other.newest_manifest):
        with pytest.raises(IdentityMismatch, match="use another --checkpoint-uri") as error:
            read()
        assert flag in str(error.value) and "\n" not in str(error.value)


def test_a_manifest_put_that_lands_but_fails_on_the_client_is_pruned_later(local_aws, monkeypatch):
    """The outage test's flake: the server stored the manifest, the client saw a reset and gave up."""
    boto3.client("s3").create_bucket(Bucket="ckpt")
    proxy = FaultyProxy(local_aws.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    storage = S3Storage("ckpt", "run", attempts=2, base_delay=0.01)
    checkpointer = _checkpointer(storage, keep=2)
    _save_steps(checkpointer, range(1, 3))
    proxy.cut_after(f"PUT /ckpt/run/{manifest_name(3)}".encode())
    assert not checkpointer.save(3, serialize(_state(3)))
    assert proxy.cut.is_set()
    proxy.up()
    _save_steps(checkpointer, range(4, 7))
    assert storage.names() == sorted(f(step) for step in (5, 6) for f in (data_name, manifest_name))
    _assert_manifests_name_existing_data(storage)
    proxy.close()


# --- corrupt checkpoints are reported and skipped, whatever they hold (issue 24, item 8) ---

def _consistent(storage, at: int, payload: bytes, **manifest_changes) -> None:
    """A checkpoint whose manifest matches its data (size and sha256), with ``manifest_changes`` applied."""
    _checkpointer(storage).save(at, payload)
    if manifest_changes:
        manifest = json.loads(storage.get(manifest_name(at))) | manifest_changes
        storage.put(manifest_name(at), json.dumps(manifest).encode())


def _skipped(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["name"], e["reason"]) for e in events if e["event"] == "checkpoint_skipped"]


def test_a_truncated_torch_file_whose_manifest_matches_is_skipped(storage):
    storage.check()
    _save_steps(_checkpointer(storage), range(1, 2))
    _consistent(storage, 2, serialize(_state(2))[:-200])
    events = []
    assert _checkpointer(storage, emit=events.append).load_latest().step == 1
    [(name, reason)] = _skipped(events)
    assert name == manifest_name(2) and reason.startswith(f"{data_name(2)}: not a checkpoint: ")


@pytest.mark.parametrize("data", ["../../outside.pt", "ckpt-000000001.pt", ["x"], 7, None, "ckpt-000000002.pt/x"])
def test_a_manifest_whose_data_is_not_its_own_object_name_is_skipped_and_nothing_else_is_read(storage, tmp_path, data):
    storage.check()
    (tmp_path / "outside.pt").write_bytes(serialize(_state(99)))
    _save_steps(_checkpointer(storage), range(1, 2))
    _consistent(storage, 2, serialize(_state(2)), data=data)
    events = []
    assert _checkpointer(storage, emit=events.append).load_latest().step == 1
    assert _skipped(events) == [(manifest_name(2), f"unreadable manifest: data is {data!r}, not {data_name(2)!r}")]


@pytest.mark.parametrize("field, value, reason", [
    ("step", 3, "unreadable manifest: step is 3, not 2"),
    ("bytes", -1, "unreadable manifest: bytes is -1"),
    ("bytes", True, "unreadable manifest: bytes is True"),
    ("sha256", "not-hex", "unreadable manifest: sha256 is not a hex digest"),
])
def test_a_manifest_with_a_field_of_the_wrong_kind_is_skipped(storage, field, value, reason):
    storage.check()
    _save_steps(_checkpointer(storage), range(1, 2))
    _consistent(storage, 2, serialize(_state(2)), **{field: value})
    events = []
    assert _checkpointer(storage, emit=events.append).load_latest().step == 1
    assert _skipped(events) == [(manifest_name(2), reason)]


def test_a_manifest_that_is_json_but_not_an_object_is_skipped(storage):
    storage.check()
    _save_steps(_checkpointer(storage), range(1, 2))
    storage.put(manifest_name(2), b"[1, 2]")
    events = []
    assert _checkpointer(storage, emit=events.append).load_latest().step == 1
    assert _skipped(events) == [(manifest_name(2), "unreadable manifest: a list, not an object")]


def test_a_data_object_that_is_a_folder_is_skipped(tmp_path):
    storage = LocalStorage(tmp_path)
    _save_steps(_checkpointer(storage), range(1, 2))
    _consistent(storage, 2, serialize(_state(2)))
    (tmp_path / data_name(2)).unlink()
    (tmp_path / data_name(2)).mkdir()
    events = []
    assert _checkpointer(storage, emit=events.append).load_latest().step == 1
    [(name, reason)] = _skipped(events)
    assert name == manifest_name(2) and reason.endswith("a folder, not a file: remove it")


def _trainer_parts(model_name: str = "linear"):
    from gpuyard.jobs.workload.data import build_model
    from gpuyard.jobs.workload.state import RankRNG, TrainProgress

    model = build_model(model_name, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return {"model": model, "optimizer": optimizer, "progress": TrainProgress()}, RankRNG(0, 0, torch.device("cpu"))


def _manager(storage, events=None, model_name: str = "linear"):
    from gpuyard.jobs.workload.dist import DistEnv
    from gpuyard.jobs.workload.manager import CheckpointManager, SaveSchedule

    shared, rng = _trainer_parts(model_name)
    manager = CheckpointManager(_checkpointer(storage, emit=(events if events is not None else []).append),
                                SaveSchedule(1), DistEnv())
    for name, stateful in shared.items():
        manager.register(name, stateful)
    manager.register("rng", rng, per_rank=True)
    return manager, shared


def _trained_step(manager, shared, step: int) -> None:
    loss = shared["model"](torch.rand(4, 20)).sum()
    loss.backward()
    shared["optimizer"].step()
    shared["progress"].advance(4)
    manager.save(step)
    manager.wait()


def test_a_checkpoint_without_model_or_of_another_model_is_skipped_for_the_previous_one(storage):
    storage.check()
    writer, shared = _manager(storage)
    _trained_step(writer, shared, 1)
    expected = {key: tensor.clone() for key, tensor in shared["model"].state_dict().items()}
    good = torch.load(io.BytesIO(storage.get(data_name(1))), weights_only=True)
    _consistent(storage, 2, serialize({key: value for key, value in good.items() if key != "model"} | {"step": 2}))
    other, other_shared = _manager(storage, model_name="mlp")
    _consistent(storage, 3, serialize(other._state(3, [{"rng": {}}])))

    events = []
    reader, loaded = _manager(storage, events)
    assert reader.load().step == 1
    assert all(torch.equal(loaded["model"].state_dict()[key], tensor) for key, tensor in expected.items())
    reasons = dict(_skipped(events))
    assert reasons[manifest_name(3)].startswith(f"{data_name(3)}: its model does not fit this run: Error(s) in loading")
    assert reasons[manifest_name(2)] == f"{data_name(2)}: not a checkpoint of this trainer: no 'model'"


def test_when_no_checkpoint_applies_the_run_starts_fresh_from_its_own_initial_state(storage):
    storage.check()
    other, _ = _manager(storage, model_name="mlp")
    _consistent(storage, 3, serialize(other._state(3, [{"rng": {}}])))
    writer, shared = _manager(storage)
    shared["model"](torch.rand(4, 20)).sum().backward()
    shared["optimizer"].step()  # weights unlike the initial ones, then a progress that does not load
    half = writer._state(4, [{"rng": {}}])
    half["progress"]["epoch"] = "not a count"
    _consistent(storage, 4, serialize(half))

    events = []
    reader, loaded = _manager(storage, events)
    initial = {key: tensor.clone() for key, tensor in _trainer_parts()[0]["model"].state_dict().items()}
    assert reader.load() is None
    assert all(torch.equal(loaded["model"].state_dict()[key], tensor) for key, tensor in initial.items())
    assert [name for name, _ in _skipped(events)] == [manifest_name(4), manifest_name(3)]
